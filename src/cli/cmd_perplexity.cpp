// metro perplexity -m MODEL -f TEXT [--ctx 512] [-t N] [--kv-type f16|q8_0] [--kl-vs B|exact]
//
// Perplexity over non-overlapping windows of --ctx tokens, scored as llama.cpp's
// llama-perplexity does so the figures compare: each window starts fresh (BOS first when
// the vocabulary adds one), and only the second half of each window is scored, so every
// scored token sees at least ctx/2 tokens of context.
//
// --kl-vs B: at every scored position, the KL divergence of MODEL's next-token distribution
// from B's, KL(B || MODEL) (B is the reference, as llama.cpp's KL-divergence mode has it),
// and whether their most likely tokens agree; mean and 99th percentile over the positions.
// B must have MODEL's vocabulary. `exact`: the reference is the double-precision forward
// pass of MODEL's own weights (model/reference_forward.h; slow: minutes per window of the
// default model), which measures the implementation's rounding rather than a format's.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <vector>

#include "base/clock.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/reference_forward.h"

namespace metro::cli {

namespace {

// log(sum(exp(row))).
double log_sum_exp(std::span<const float> row) {
  float mx = row[0];
  for (float v : row) mx = std::max(mx, v);
  double z = 0.0;
  for (float v : row) z += std::exp(static_cast<double>(v - mx));
  return std::log(z) + mx;
}

size_t arg_max(std::span<const float> row) {
  return static_cast<size_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// KL(ref || got) of the two rows' softmax distributions.
double kl_divergence(std::span<const float> ref, std::span<const float> got) {
  const double lr = log_sum_exp(ref), lg = log_sum_exp(got);
  double kl = 0.0;
  for (size_t v = 0; v < ref.size(); ++v) {
    const double log_p = ref[v] - lr;
    kl += std::exp(log_p) * (log_p - (got[v] - lg));
  }
  return std::max(0.0, kl);
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  CLI::App app{"Perplexity of a model over a text file", "metro perplexity"};
  std::string model_path, text_file;
  int n_ctx = 512, threads = default_threads(), max_chunks = 0;
  bool as_json = false;
  std::string kv_type = "f16";
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  LoraFlags lora;
  add_lora_flags(app, lora);
  app.add_option("-f,--file", text_file, "text file")->required();
  app.add_option("--ctx,-c", n_ctx, "window length in tokens")->check(CLI::Range(8, 1 << 16));
  app.add_option("--chunks", max_chunks, "score at most this many windows (0: all)");
  app.add_option("-t,--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_option("--kv-type", kv_type, "KV cache type, as metro serve's: f16 or q8_0")->capture_default_str();
  std::string kl_vs;
  app.add_option("--kl-vs", kl_vs,
                 "also the KL divergence and top-1 agreement of the model's next-token distributions against "
                 "those of this GGUF (same vocabulary), or of `exact` (the double-precision forward pass of "
                 "the model's own weights; slow)");
  app.add_flag("--json", as_json, "print the result as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto kv_dtype = parse_kv_type(kv_type);
  if (!kv_dtype.ok()) return fail("perplexity", kv_dtype.status());
  std::ifstream in(text_file, std::ios::binary);
  if (!in) return fail("perplexity", io_error("cannot read the text file '" + text_file + "'"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto lm = load_model(model_path, true, "cpu", std::chrono::milliseconds{0}, true, lora.specs());
  if (!lm.ok()) return fail("perplexity", lm.status());
  const model::Model& m = *lm->model;
  const tokenizer::Tokenizer& tok = *lm->tokenizer;
  if (n_ctx > static_cast<int>(m.max_context())) {
    return fail("perplexity", invalid_argument("--ctx exceeds the model's context"));
  }
  const bool exact = kl_vs == "exact";
  std::optional<LoadedModel> ref;
  if (!kl_vs.empty() && !exact) {
    auto r = load_model(kl_vs);
    if (!r.ok()) return fail("perplexity", r.status());
    const tokenizer::Tokenizer& rt = *r->tokenizer;
    bool same = rt.n_vocab() == tok.n_vocab() && r->model->hparams().n_vocab == m.hparams().n_vocab;
    for (int32_t id = 0; same && id < tok.n_vocab(); ++id) same = rt.token_to_piece(id) == tok.token_to_piece(id);
    if (!same) return fail("perplexity", invalid_argument("--kl-vs: the two models' vocabularies differ"));
    ref = std::move(*r);
  }
  const bool add_bos = tok.add_bos() && tok.bos_id() >= 0;
  std::vector<int32_t> ids = tok.encode(text, add_bos, false);
  int n_chunks = static_cast<int>(ids.size()) / n_ctx;
  if (max_chunks > 0) n_chunks = std::min(n_chunks, max_chunks);
  if (n_chunks < 1) {
    return fail("perplexity", invalid_argument("the text has " + std::to_string(ids.size()) +
                                               " tokens, fewer than one window of " + std::to_string(n_ctx)));
  }
  ThreadPool pool(threads);
  model::WorkspaceLimits lim;
  const int step_tokens = std::min(n_ctx, 512);
  lim.max_tokens = step_tokens;
  lim.max_logits = step_tokens;
  lim.max_seqs = 1;
  lim.max_blocks_per_seq = n_ctx / 16 + 2;
  lim.n_ctx = n_ctx;
  model::Workspace ws = m.make_workspace(lim);
  std::optional<model::Workspace> ref_ws;
  if (ref) ref_ws.emplace(ref->model->make_workspace(lim));
  const int first = n_ctx / 2;
  double nll = 0.0, ref_nll = 0.0;
  int64_t count = 0, agree = 0;
  std::vector<double> kls;
  const int64_t t0 = now_ns();
  if (!as_json) std::fprintf(stderr, "perplexity: %d windows of %d tokens\n", n_chunks, n_ctx);
  for (int c = 0; c < n_chunks; ++c) {
    model::SequenceKv kv(m.hparams(), n_ctx, *kv_dtype);
    std::optional<model::SequenceKv> ref_kv;
    if (ref) ref_kv.emplace(ref->model->hparams(), n_ctx, *kv_dtype);
    const size_t base = static_cast<size_t>(c) * static_cast<size_t>(n_ctx);
    std::vector<std::vector<float>> exact_logits;
    if (exact) {
      std::vector<int32_t> window(ids.begin() + static_cast<std::ptrdiff_t>(base),
                                  ids.begin() + static_cast<std::ptrdiff_t>(base) + n_ctx);
      if (add_bos) window[0] = tok.bos_id();
      auto e = model::reference_forward(m.file(), window);
      if (!e.ok()) return fail("perplexity", e.status());
      exact_logits = std::move(*e);
    }
    for (int start = 0; start < n_ctx; start += step_tokens) {
      model::Batch b;
      const int end = std::min(n_ctx, start + step_tokens);
      for (int i = start; i < end; ++i) {
        int32_t t = ids[base + static_cast<size_t>(i)];
        if (i == 0 && add_bos) t = tok.bos_id();
        // Logits of position i predict token i + 1; scored positions are [first, n_ctx - 1).
        b.add(t, i, 0, i >= first && i < n_ctx - 1);
      }
      auto out = m.forward(b, kv.view(), ws, pool);
      if (!out.ok()) return fail("perplexity", out.status());
      Expected<model::ForwardOutput> ref_out = model::ForwardOutput{};
      if (ref) {
        ref_out = ref->model->forward(b, ref_kv->view(), *ref_ws, pool);
        if (!ref_out.ok()) return fail("perplexity", ref_out.status());
      }
      for (int r = 0; r < out->n_rows; ++r) {
        const int i = start + out->batch_index[static_cast<size_t>(r)];
        const auto row = out->row(r);
        const int32_t next = ids[base + static_cast<size_t>(i) + 1];
        nll += log_sum_exp(row) - row[static_cast<size_t>(next)];
        ++count;
        if (kl_vs.empty()) continue;
        const std::span<const float> ref_row =
            exact ? std::span<const float>(exact_logits[static_cast<size_t>(i)]) : ref_out->row(r);
        ref_nll += log_sum_exp(ref_row) - ref_row[static_cast<size_t>(next)];
        kls.push_back(kl_divergence(ref_row, row));
        agree += arg_max(ref_row) == arg_max(row) ? 1 : 0;
      }
    }
    if (!as_json) {
      if (c == 0 && n_chunks > 1) {
        const double per = static_cast<double>(now_ns() - t0) * 1e-9;
        std::fprintf(stderr, "perplexity: %.2f s per window, ETA %.1f min\n", per, per * (n_chunks - 1) / 60.0);
      }
      std::fprintf(stderr, "[%d]%.4f%s", c + 1, std::exp(nll / static_cast<double>(count)),
                   (c + 1) % 8 == 0 ? "\n" : ",");
    }
  }
  const double ppl = std::exp(nll / static_cast<double>(count));
  const double secs = static_cast<double>(now_ns() - t0) * 1e-9;
  double kl_mean = 0.0, kl_p99 = 0.0;
  if (!kls.empty()) {
    for (double k : kls) kl_mean += k;
    kl_mean /= static_cast<double>(kls.size());
    std::vector<double> sorted = kls;
    std::sort(sorted.begin(), sorted.end());
    kl_p99 = sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)];
  }
  const double top1 = count > 0 ? static_cast<double>(agree) / static_cast<double>(count) : 0.0;
  const double ref_ppl = std::exp(ref_nll / static_cast<double>(count));
  if (as_json) {
    nlohmann::json j = {{"perplexity", ppl}, {"windows", n_chunks}, {"ctx", n_ctx},
                        {"scored_tokens", count}, {"kv_type", kv_type}, {"seconds", secs}};
    if (!kl_vs.empty()) {
      j["kl_vs"] = kl_vs;
      j["kl_mean"] = kl_mean;
      j["kl_p99"] = kl_p99;
      j["top1_agreement"] = top1;
      j["ref_perplexity"] = ref_ppl;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fprintf(stderr, "\n");
    std::printf("perplexity: %.4f over %d windows of %d tokens (%lld scored tokens, KV %s, %.1f s)\n", ppl,
                n_chunks, n_ctx, static_cast<long long>(count), kv_type.c_str(), secs);
    if (!kl_vs.empty()) {
      std::printf("vs %s: KL divergence mean %.6f, p99 %.6f; top-1 agreement %.2f%%; its perplexity %.4f\n",
                  kl_vs.c_str(), kl_mean, kl_p99, 100.0 * top1, ref_ppl);
    }
  }
  return 0;
}

}  // namespace metro::cli
