// metro perplexity -m MODEL -f TEXT [--ctx 512] [-t N] [--kv-type f16|q8_0]
//
// Perplexity over non-overlapping windows of --ctx tokens, scored as llama.cpp's
// llama-perplexity does so the figures compare: each window starts fresh (BOS first when
// the vocabulary adds one), and only the second half of each window is scored, so every
// scored token sees at least ctx/2 tokens of context.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace metro::cli {

int cmd_perplexity(int argc, char** argv) {
  CLI::App app{"Perplexity of a model over a text file", "metro perplexity"};
  std::string model_path, text_file;
  int n_ctx = 512, threads = default_threads(), max_chunks = 0;
  bool as_json = false;
  std::string kv_type = "f16";
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  app.add_option("-f,--file", text_file, "text file")->required();
  app.add_option("--ctx,-c", n_ctx, "window length in tokens")->check(CLI::Range(8, 1 << 16));
  app.add_option("--chunks", max_chunks, "score at most this many windows (0: all)");
  app.add_option("-t,--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_option("--kv-type", kv_type, "KV cache type, as metro serve's: f16 or q8_0")->capture_default_str();
  app.add_flag("--json", as_json, "print the result as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto kv_dtype = parse_kv_type(kv_type);
  if (!kv_dtype.ok()) return fail("perplexity", kv_dtype.status());
  std::ifstream in(text_file, std::ios::binary);
  if (!in) return fail("perplexity", io_error("cannot read the text file"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto lm = load_model(model_path);
  if (!lm.ok()) return fail("perplexity", lm.status());
  const model::Model& m = *lm->model;
  const tokenizer::Tokenizer& tok = *lm->tokenizer;
  if (n_ctx > static_cast<int>(m.hparams().n_ctx_train)) {
    return fail("perplexity", invalid_argument("--ctx exceeds the model's context"));
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
  model::Workspace ws = m.make_workspace(lim);
  const int first = n_ctx / 2;
  double nll = 0.0;
  int64_t count = 0;
  const int64_t t0 = now_ns();
  if (!as_json) std::fprintf(stderr, "perplexity: %d windows of %d tokens\n", n_chunks, n_ctx);
  for (int c = 0; c < n_chunks; ++c) {
    model::SequenceKv kv(m.hparams(), n_ctx, *kv_dtype);
    const size_t base = static_cast<size_t>(c) * static_cast<size_t>(n_ctx);
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
      for (int r = 0; r < out->n_rows; ++r) {
        const int i = start + out->batch_index[static_cast<size_t>(r)];
        const auto row = out->row(r);
        float mx = row[0];
        for (float v : row) mx = std::max(mx, v);
        double z = 0.0;
        for (float v : row) z += std::exp(static_cast<double>(v - mx));
        const int32_t next = ids[base + static_cast<size_t>(i) + 1];
        nll += (std::log(z) + mx) - row[static_cast<size_t>(next)];
        ++count;
      }
    }
    if (!as_json) {
      std::fprintf(stderr, "[%d]%.4f%s", c + 1, std::exp(nll / static_cast<double>(count)),
                   (c + 1) % 8 == 0 ? "\n" : ",");
    }
  }
  const double ppl = std::exp(nll / static_cast<double>(count));
  const double secs = static_cast<double>(now_ns() - t0) * 1e-9;
  if (as_json) {
    nlohmann::json j = {{"perplexity", ppl}, {"windows", n_chunks}, {"ctx", n_ctx},
                        {"scored_tokens", count}, {"kv_type", kv_type}, {"seconds", secs}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fprintf(stderr, "\n");
    std::printf("perplexity: %.4f over %d windows of %d tokens (%lld scored tokens, KV %s, %.1f s)\n", ppl,
                n_chunks, n_ctx, static_cast<long long>(count), kv_type.c_str(), secs);
  }
  return 0;
}

}  // namespace metro::cli
