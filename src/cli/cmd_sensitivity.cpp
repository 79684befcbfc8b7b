// metro sensitivity -m MODEL -f TEXT [--types q8_0,q4_0,q3_k,q2_k] [--tensors PATTERN]
//                   [--ctx 256] [--chunks 1] [--budget-bytes N -o PLAN.json] [--json]
//
// What lowering each weight matrix alone costs: for every 2-D tensor and every format of the
// list with fewer bytes than the tensor has now (and whose blocks divide its rows), the
// model with only that tensor requantized is scored against the model as it is: the mean KL
// divergence of its next-token distributions over the scored positions of the windows
// (scored as `metro perplexity --kl-vs` scores them). Printed as a table, cheapest KL per
// byte saved first.
//
// With --budget-bytes and -o, a mixed-precision plan for that many bytes of matrices:
// greedily, the move with the least KL per byte saved first (KL of moves taken as adding
// up), until the matrices fit. The plan is `metro quantize --plan`'s format, with "type":
// "keep" (what it does not name stays as it is):
//   metro quantize MODEL OUT.gguf --plan PLAN.json
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "kernels/dtype.h"
#include "model/model.h"
#include "model/requantize.h"

namespace metro::cli {

namespace {

// Log-softmax rows of the scored positions of every window.
using Rows = std::vector<std::vector<float>>;

struct Windows {
  std::vector<int32_t> ids;
  int n_ctx = 0, n_chunks = 0;
  bool add_bos = false;
  int32_t bos = -1;
};

Expected<Rows> score(const model::Model& m, const Windows& w, ThreadPool& pool) {
  model::WorkspaceLimits lim;
  lim.max_tokens = w.n_ctx;
  lim.max_logits = w.n_ctx;
  lim.max_seqs = 1;
  lim.max_blocks_per_seq = w.n_ctx / 16 + 2;
  lim.n_ctx = w.n_ctx;
  model::Workspace ws = m.make_workspace(lim);
  Rows rows;
  const int first = w.n_ctx / 2;
  for (int c = 0; c < w.n_chunks; ++c) {
    model::SequenceKv kv(m.hparams(), w.n_ctx, kernels::DType::kF16);
    model::Batch b;
    for (int i = 0; i < w.n_ctx; ++i) {
      int32_t t = w.ids[static_cast<size_t>(c) * static_cast<size_t>(w.n_ctx) + static_cast<size_t>(i)];
      if (i == 0 && w.add_bos) t = w.bos;
      b.add(t, i, 0, i >= first && i < w.n_ctx - 1);
    }
    METRO_ASSIGN_OR_RETURN(model::ForwardOutput out, m.forward(b, kv.view(), ws, pool));
    for (int r = 0; r < out.n_rows; ++r) {
      const auto row = out.row(r);
      float mx = row[0];
      for (float v : row) mx = std::max(mx, v);
      double z = 0.0;
      for (float v : row) z += std::exp(static_cast<double>(v - mx));
      const float lse = static_cast<float>(std::log(z)) + mx;
      std::vector<float> lp(row.size());
      for (size_t v = 0; v < row.size(); ++v) lp[v] = row[v] - lse;
      rows.push_back(std::move(lp));
    }
  }
  return rows;
}

// Mean KL(ref || got) over the rows.
double mean_kl(const Rows& ref, const Rows& got) {
  double sum = 0.0;
  for (size_t r = 0; r < ref.size(); ++r) {
    double kl = 0.0;
    for (size_t v = 0; v < ref[r].size(); ++v) {
      const double lp = ref[r][v];
      kl += std::exp(lp) * (lp - got[r][v]);
    }
    sum += std::max(0.0, kl);
  }
  return ref.empty() ? 0.0 : sum / static_cast<double>(ref.size());
}

// The file's bytes with tensor `which` requantized to `type`, the rest as they are.
Expected<std::vector<uint8_t>> with_tensor_as(const gguf::File& f, size_t which, kernels::DType type) {
  model::QuantPlan plan;
  plan.tensors.emplace_back(std::string(f.tensors()[which].name), type);
  return model::requantize(f, plan);
}

struct Move {
  std::string tensor;
  kernels::DType type;
  uint64_t bytes_before = 0, bytes_after = 0;
  double kl = 0.0;
  double per_byte() const { return kl / static_cast<double>(bytes_before - bytes_after); }
};

}  // namespace

int cmd_sensitivity(int argc, char** argv) {
  CLI::App app{"What lowering each weight matrix alone costs, and a mixed-precision plan for a byte budget",
               "metro sensitivity"};
  std::string model_path, text_file, types_arg = "q8_0,q4_0,q3_k,q2_k", plan_path, only = "*";
  int n_ctx = 256, max_chunks = 1, threads = default_threads();
  uint64_t budget = 0;
  bool as_json = false;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  app.add_option("-f,--file", text_file, "calibration text")->required();
  app.add_option("--types", types_arg, "formats to try, comma-separated")->capture_default_str();
  app.add_option("--tensors", only, "only the matrices whose names match (`*`: any run of characters)")
      ->capture_default_str();
  app.add_option("--ctx,-c", n_ctx, "window length in tokens")->check(CLI::Range(8, 4096))->capture_default_str();
  app.add_option("--chunks", max_chunks, "windows scored")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("-t,--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_option("--budget-bytes", budget, "bytes of weight matrices the plan must fit in");
  app.add_option("-o,--output", plan_path, "write the plan (with --budget-bytes) to this file");
  app.add_flag("--json", as_json, "print the table as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if ((budget > 0) != !plan_path.empty()) {
    return fail("sensitivity", invalid_argument("--budget-bytes and -o go together"));
  }
  std::vector<kernels::DType> types;
  {
    std::stringstream ss(types_arg);
    std::string name;
    while (std::getline(ss, name, ',')) {
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      bool found = false;
      for (int i = 0; i < kernels::kNumDTypes; ++i) {
        const auto t = static_cast<kernels::DType>(i);
        std::string n(kernels::dtype_name(t));
        std::transform(n.begin(), n.end(), n.begin(), ::tolower);
        if (n == name && t != kernels::DType::kQ8_1 && t != kernels::DType::kQ8_K) {
          types.push_back(t);
          found = true;
        }
      }
      if (!found) return fail("sensitivity", invalid_argument("--types: unknown format '" + name + "'"));
    }
  }
  std::ifstream in(text_file, std::ios::binary);
  if (!in) return fail("sensitivity", io_error("cannot read the text file '" + text_file + "'"));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto lm = load_model(model_path);
  if (!lm.ok()) return fail("sensitivity", lm.status());
  const model::Model& base = *lm->model;
  const tokenizer::Tokenizer& tok = *lm->tokenizer;
  Windows w;
  w.add_bos = tok.add_bos() && tok.bos_id() >= 0;
  w.bos = tok.bos_id();
  w.ids = tok.encode(text, w.add_bos, false);
  w.n_ctx = std::min<int>(n_ctx, static_cast<int>(base.max_context()));
  w.n_chunks = std::min(max_chunks, static_cast<int>(w.ids.size()) / w.n_ctx);
  if (w.n_chunks < 1) return fail("sensitivity", invalid_argument("the text is shorter than one window"));
  ThreadPool pool(threads);
  auto ref = score(base, w, pool);
  if (!ref.ok()) return fail("sensitivity", ref.status());

  const gguf::File& f = base.file();
  std::vector<Move> moves;
  uint64_t matrix_bytes = 0;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const gguf::TensorInfo& t = f.tensors()[i];
    const auto src = kernels::dtype_from_ggml(t.type());
    if (t.n_dims != 2 || !src) continue;
    matrix_bytes += t.n_bytes;
    if (!model::glob_match(only, t.name)) continue;
    for (kernels::DType type : types) {
      const int64_t cols = static_cast<int64_t>(t.ne[0]);
      if (cols % kernels::traits(type).block_size != 0) continue;
      const uint64_t after = kernels::row_bytes(type, cols) * t.ne[1];
      if (after >= t.n_bytes) continue;
      auto bytes = with_tensor_as(f, i, type);
      if (!bytes.ok()) return fail("sensitivity", bytes.status());
      auto pf = gguf::File::parse(*bytes);
      if (!pf.ok()) return fail("sensitivity", pf.status());
      auto m = model::Model::from_file(std::move(*pf));
      if (!m.ok()) return fail("sensitivity", m.status());
      auto got = score(**m, w, pool);
      if (!got.ok()) return fail("sensitivity", got.status());
      moves.push_back(Move{std::string(t.name), type, t.n_bytes, after, mean_kl(*ref, *got)});
      if (!as_json) {
        std::fprintf(stderr, "\rsensitivity: %zu tried, %-40.40s", moves.size(), std::string(t.name).c_str());
      }
    }
  }
  if (!as_json) std::fprintf(stderr, "\n");
  std::sort(moves.begin(), moves.end(), [](const Move& a, const Move& b) { return a.per_byte() < b.per_byte(); });

  // The plan: cheapest KL per byte first, each move taken when it makes its tensor smaller
  // than the moves taken before made it.
  nlohmann::ordered_json plan_tensors = nlohmann::ordered_json::object();
  uint64_t total = matrix_bytes;
  double plan_kl = 0.0;
  if (budget > 0) {
    std::map<std::string, const Move*> taken;
    for (const Move& mv : moves) {
      if (total <= budget) break;
      auto it = taken.find(mv.tensor);
      const uint64_t now = it == taken.end() ? mv.bytes_before : it->second->bytes_after;
      if (mv.bytes_after >= now) continue;
      total -= now - mv.bytes_after;
      plan_kl += mv.kl - (it == taken.end() ? 0.0 : it->second->kl);
      taken[mv.tensor] = &mv;
    }
    for (const auto& [name, mv] : taken) {
      std::string tn(kernels::dtype_name(mv->type));
      std::transform(tn.begin(), tn.end(), tn.begin(), ::tolower);
      plan_tensors[name] = tn;
    }
    std::ofstream out(plan_path);
    out << nlohmann::ordered_json{{"type", "keep"}, {"tensors", plan_tensors}}.dump(2) << "\n";
    if (!out) return fail("sensitivity", io_error("cannot write " + plan_path));
  }
  if (as_json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const Move& mv : moves) {
      j.push_back({{"tensor", mv.tensor},
                   {"type", std::string(kernels::dtype_name(mv.type))},
                   {"bytes_before", mv.bytes_before},
                   {"bytes_after", mv.bytes_after},
                   {"kl_mean", mv.kl}});
    }
    nlohmann::ordered_json doc = {{"moves", j}, {"matrix_bytes", matrix_bytes}};
    if (budget > 0) doc["plan"] = {{"bytes", total}, {"kl_sum", plan_kl}, {"tensors", plan_tensors}};
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("%-32s %-5s %12s %12s %10s\n", "tensor", "type", "bytes", "saved", "KL mean");
    for (const Move& mv : moves) {
      std::printf("%-32s %-5s %12llu %12llu %10.6f\n", mv.tensor.c_str(),
                  std::string(kernels::dtype_name(mv.type)).c_str(), static_cast<unsigned long long>(mv.bytes_after),
                  static_cast<unsigned long long>(mv.bytes_before - mv.bytes_after), mv.kl);
    }
    if (budget > 0) {
      std::printf("plan: %zu tensors lowered, matrices %llu -> %llu bytes (budget %llu), KL of the moves %.6f -> %s\n",
                  plan_tensors.size(), static_cast<unsigned long long>(matrix_bytes),
                  static_cast<unsigned long long>(total), static_cast<unsigned long long>(budget), plan_kl,
                  plan_path.c_str());
    }
  }
  if (budget > 0 && total > budget) {
    std::fprintf(stderr, "metro sensitivity: the formats tried cannot bring the matrices under the budget\n");
    return 1;
  }
  return 0;
}

}  // namespace metro::cli
