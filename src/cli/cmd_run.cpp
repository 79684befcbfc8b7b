// metro run -m MODEL [-p PROMPT | -f FILE] [-n 128] [--temp 0.8] [--top-p P] [--top-k K] [--seed S]
//           [--chat] [-t N] [--spec off|ngram] [--spec-max-k K] [--prediction FILE]
// Streams the generated text (only the text) to stdout, statistics to stderr. Without -p or
// -f the prompt is read from stdin.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "base/clock.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "tokenizer/chat_template.h"

namespace metro::cli {

int cmd_run(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt", "metro run"};
  std::string model_path, prompt, prompt_file, chat_template_file;
  int n_predict = 128, threads = default_threads(), top_k = 40;
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
  int64_t seed = -1;
  bool chat = false, ignore_eos = false, no_repack = false;
  std::string device = "cpu";
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  LoraFlags lora;
  add_lora_flags(app, lora);
  auto* prompt_opt = app.add_option("-p,--prompt", prompt, "prompt text (neither -p nor -f: read from stdin)");
  app.add_option("-f,--file", prompt_file, "read the prompt from a file")->excludes(prompt_opt);
  app.add_option("-n,--n-predict", n_predict, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  app.add_option("--temp", temp, "temperature (0: greedy)");
  app.add_option("--top-p", top_p, "nucleus sampling mass (1: off)");
  app.add_option("--top-k", top_k, "keep the k most likely tokens (0: off)");
  app.add_option("--min-p", min_p, "drop tokens below min-p x the best one's probability (0: off)");
  app.add_option("--repeat-penalty", repeat_penalty, "repetition penalty (1: off)");
  app.add_option("--seed", seed, "sampling seed (-1: random)");
  app.add_flag("--chat", chat, "apply the model's chat template to the prompt as one user message");
  app.add_option("--chat-template", chat_template_file, "Jinja chat template file (overrides the model's)");
  app.add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-generation tokens");
  app.add_flag("--no-repack", no_repack, "use weights in their GGUF layout");
  app.add_option("--device", device, "where the model runs: " + backends::device_names())->capture_default_str();
  app.add_option("-t,--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  SpecFlags spec;
  add_spec_flags(app, spec, "off");
  std::string prediction_file;
  app.add_option("--prediction", prediction_file, "file with the expected output (a source of drafts)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!prompt_file.empty()) {
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) return fail("run", io_error("cannot read the prompt file '" + prompt_file + "'"));
    prompt.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else if (app.count("--prompt") == 0) {
    prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    // A prompt typed or piped as a line: the line's end is not part of it.
    if (!prompt.empty() && prompt.back() == '\n') prompt.pop_back();
  }
  auto lm = load_model(model_path, !no_repack, device, std::chrono::milliseconds{0}, true, lora.specs());
  if (!lm.ok()) return fail("run", lm.status());
  const tokenizer::Tokenizer& tok = *lm->tokenizer;

  std::vector<int32_t> ids;
  if (chat) {
    Expected<tokenizer::ChatTemplate> tmpl = chat_template_of(*lm->model, chat_template_file);
    if (!tmpl.ok()) return fail("run", tmpl.status());
    nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", prompt}}});
    tokenizer::ChatTemplateOptions opts;
    opts.add_generation_prompt = true;
    if (tok.bos_id() >= 0) opts.bos_token = tok.token_to_piece(tok.bos_id());
    if (tok.eos_id() >= 0) opts.eos_token = tok.token_to_piece(tok.eos_id());
    auto text = tmpl->render(messages, opts);
    if (!text.ok()) return fail("run", text.status());
    // The template spells special tokens out: parse them; add BOS only if the template did not.
    ids = tok.encode(*text, /*add_special=*/false, /*parse_special=*/true);
    if (tok.add_bos() && tok.bos_id() >= 0 && (ids.empty() || ids[0] != tok.bos_id())) {
      ids.insert(ids.begin(), tok.bos_id());
    }
  } else {
    ids = tok.encode(prompt, /*add_special=*/true, /*parse_special=*/false);
  }
  if (ids.empty()) return fail("run", invalid_argument("the prompt is empty"));

  engine::EngineConfig ec;
  ec.n_threads = threads;
  ec.max_seqs = 1;
  ec.max_batch_tokens = 512;
  ec.ctx_total = static_cast<int>(ids.size()) + n_predict + 64;
  if (Status st = apply_spec_flags(spec, ec, lm->model); !st.ok()) return fail("run", st);
  auto eng = engine::Engine::create(lm->model, tok, ec);
  if (!eng.ok()) return fail("run", eng.status());

  engine::Request req;
  req.prompt = ids;
  if (!prediction_file.empty()) {
    std::ifstream pin(prediction_file, std::ios::binary);
    if (!pin) return fail("run", io_error("cannot read the prediction file '" + prediction_file + "'"));
    const std::string text((std::istreambuf_iterator<char>(pin)), std::istreambuf_iterator<char>());
    req.prediction = tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
  }
  req.stop.max_tokens = n_predict;
  req.stop.ignore_eos = ignore_eos;
  req.sampling.temperature = temp;
  req.sampling.top_p = top_p;
  req.sampling.top_k = top_k;
  req.sampling.min_p = min_p;
  req.sampling.repetition_penalty = repeat_penalty;
  if (seed >= 0) {
    req.sampling.seed = static_cast<uint64_t>(seed);
    req.sampling.has_seed = true;
  }
  const int64_t t0 = now_ns();
  auto h = (*eng)->submit(req);
  if (!h.ok()) return fail("run", h.status());
  int64_t t_first = 0, t_last = 0;
  int n_tokens = 0;
  std::string finish = "?";
  engine::Usage usage;
  for (;;) {
    auto e = h->stream->pop(std::chrono::milliseconds(60000));
    if (!e) return fail("run", internal_error("no progress for 60 s"));
    if (e->kind == engine::Event::Kind::kDelta) {
      if (n_tokens == 0) t_first = e->time_ns;
      t_last = e->time_ns;
      n_tokens += static_cast<int>(e->tokens.size());
      std::fwrite(e->text.data(), 1, e->text.size(), stdout);
      std::fflush(stdout);
    } else if (e->kind == engine::Event::Kind::kFinish) {
      finish = engine::finish_reason_name(e->reason);
      if (e->reason == engine::FinishReason::kAbort || e->reason == engine::FinishReason::kError) {
        std::fprintf(stderr, "\nmetro run: %s\n", e->message.c_str());
      }
    } else if (e->kind == engine::Event::Kind::kDone) {
      usage = e->usage;
      break;
    }
  }
  std::fputc('\n', stdout);
  const double prompt_s = static_cast<double>(t_first - t0) * 1e-9;
  const double gen_s = static_cast<double>(t_last - t_first) * 1e-9;
  std::fprintf(stderr,
               "\nmetro run: load %.2f s | prompt %d tokens, %.1f ms (%.1f tokens/s) | "
               "generated %d tokens, %.1f tokens/s | finish %s | %d threads\n",
               lm->load_seconds, usage.prompt_tokens, prompt_s * 1e3,
               prompt_s > 0 ? usage.prompt_tokens / prompt_s : 0.0, n_tokens,
               gen_s > 0 && n_tokens > 1 ? (n_tokens - 1) / gen_s : 0.0, finish.c_str(), threads);
  if (ec.proposer) {
    const engine::EngineStats st = (*eng)->stats();
    uint64_t verify_steps = 0;
    for (size_t k = 1; k < st.spec_steps_by_k.size(); ++k) verify_steps += st.spec_steps_by_k[k];
    std::fprintf(stderr,
                 "metro run: speculation %s | %llu drafts, %llu accepted (%.1f%%) | %.2f accepted per drafting step "
                 "| %llu of %llu decode steps drafted | fitted step %.2f ms + %.3f ms per draft row\n",
                 spec.mode.c_str(), static_cast<unsigned long long>(st.draft_tokens),
                 static_cast<unsigned long long>(st.accepted_tokens),
                 st.draft_tokens ? 100.0 * static_cast<double>(st.accepted_tokens) / static_cast<double>(st.draft_tokens)
                                 : 0.0,
                 verify_steps ? static_cast<double>(st.accepted_tokens) / static_cast<double>(verify_steps) : 0.0,
                 static_cast<unsigned long long>(verify_steps),
                 static_cast<unsigned long long>(st.steps), st.spec_fixed_s * 1e3, st.spec_draft_row_s * 1e3);
  }
  return 0;
}

}  // namespace metro::cli
