// metro embed -m MODEL [-p TEXT | -f FILE] [-t N] [--quiet]
//
// One embedding per input line (or the -p text): the model's pooled, L2-normalized final
// states, as /v1/embeddings answers them (an encoder's pooling, or a decoder's mean). Every
// line is submitted at once and the engine batches them. Writes one JSON array per line to
// stdout (none with --quiet) and the throughput to stderr: llama.cpp's llama-embedding is
// the peer it is measured against (docs/benchmarks.md).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "cache/embedder.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "engine/request_stream.h"
#include "model/model.h"

namespace metro::cli {

int cmd_embed(int argc, char** argv) {
  CLI::App app{"Embed texts: one normalized vector per input line", "metro embed"};
  std::string model_path, text, file;
  int threads = default_threads();
  bool quiet = false;
  app.add_option("-m,--model", model_path, "GGUF model file (an encoder such as all-MiniLM-L6-v2, or a decoder)")
      ->required();
  auto* p_opt = app.add_option("-p,--prompt", text, "one text to embed");
  app.add_option("-f,--file", file, "a file of texts, one per line (empty lines skipped)")->excludes(p_opt);
  app.add_option("-t,--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_flag("--quiet", quiet, "print only the throughput");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<std::string> texts;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return fail("embed", io_error("cannot read '" + file + "'"));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) texts.push_back(line);
    }
  } else if (!text.empty()) {
    texts.push_back(text);
  }
  if (texts.empty()) return fail("embed", invalid_argument("nothing to embed: give -p TEXT or -f FILE"));
  auto lm = load_model(model_path);
  if (!lm.ok()) return fail("embed", lm.status());
  engine::EngineConfig ec;
  ec.n_threads = threads;
  ec.prefix_cache = false;
  ec.max_seqs = 64;
  ec.max_batch_tokens = 512;
  auto eng = engine::Engine::create(lm->model, *lm->tokenizer, ec);
  if (!eng.ok()) return fail("embed", eng.status());
  const int64_t t0 = now_ns();
  std::vector<engine::Request> reqs;
  int64_t n_tokens = 0;
  for (const std::string& t : texts) {
    engine::Request r;
    r.kind = engine::RequestKind::kEmbed;
    r.prompt = cache::embedding_input(*lm->tokenizer, t, (*eng)->n_ctx());
    n_tokens += static_cast<int64_t>(r.prompt.size());
    reqs.push_back(std::move(r));
  }
  std::vector<Expected<engine::Handle>> handles = (*eng)->submit_all(std::move(reqs));
  std::vector<std::vector<float>> out(texts.size());
  for (size_t i = 0; i < handles.size(); ++i) {
    if (!handles[i].ok()) return fail("embed", handles[i].status());
    for (;;) {
      auto e = handles[i]->stream->pop(std::chrono::milliseconds(120000));
      if (!e) return fail("embed", internal_error("no progress for 120 s"));
      if (e->kind == engine::Event::Kind::kEmbedding) out[i] = std::move(e->embedding);
      if (e->kind == engine::Event::Kind::kFinish && e->reason != engine::FinishReason::kStop) {
        return fail("embed", internal_error("line " + std::to_string(i + 1) + ": " + e->message));
      }
      if (e->kind == engine::Event::Kind::kDone) break;
    }
  }
  const double s = static_cast<double>(now_ns() - t0) * 1e-9;
  if (!quiet) {
    std::string line;
    for (const auto& v : out) {
      line = "[";
      char buf[32];
      for (size_t d = 0; d < v.size(); ++d) {
        std::snprintf(buf, sizeof(buf), d == 0 ? "%.7g" : ",%.7g", static_cast<double>(v[d]));
        line += buf;
      }
      line += "]\n";
      std::fwrite(line.data(), 1, line.size(), stdout);
    }
  }
  std::fprintf(stderr, "metro embed: %zu texts, %lld tokens in %.3f s: %.1f texts/s, %.0f tokens/s (%d threads)\n",
               texts.size(), static_cast<long long>(n_tokens), s, static_cast<double>(texts.size()) / s,
               static_cast<double>(n_tokens) / s, threads);
  return 0;
}

}  // namespace metro::cli
