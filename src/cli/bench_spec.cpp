// metro bench --spec MODE -f PROMPT_FILE [-f ...] [--chat] [-n 256]: decode speed of one
// sequence through the engine, greedy, with speculative decoding off and on (and, where a
// file PROMPT.prediction sits beside PROMPT.txt, with it as the request's `prediction`).
// Each run has an engine of its own, so the n-gram pool starts empty; the three kinds of run
// take turns, -r times each, and the median of each is reported. The outputs of all runs
// must be the same tokens (speculation never changes them), which is checked.
#include "cli/bench_spec.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "cli/common.h"
#include "tokenizer/chat_template.h"

namespace metro::cli {

namespace {

Expected<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct RunResult {
  std::vector<int32_t> tokens;
  double decode_s = 0.0;  // first token to last
  uint64_t drafts = 0, accepted = 0, drafting_steps = 0;
};

Expected<RunResult> run_once(const LoadedModel& lm, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& prediction, const SpecBenchOptions& o, bool spec_on) {
  engine::EngineConfig ec;
  ec.n_threads = o.threads;
  ec.max_seqs = 1;
  ec.max_batch_tokens = 512;
  ec.ctx_total = static_cast<int>(prompt.size()) + o.n_gen + 128;
  SpecFlags flags = o.spec;
  if (!spec_on) flags = SpecFlags{};
  METRO_RETURN_IF_ERROR(apply_spec_flags(flags, ec, lm.model));
  METRO_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> eng, engine::Engine::create(lm.model, *lm.tokenizer, ec));
  auto generate = [&](const std::vector<int32_t>& ids, int n, const std::vector<int32_t>& pred,
                      RunResult* out) -> Status {
    engine::Request r;
    r.prompt = ids;
    r.stop.max_tokens = n;
    r.sampling.temperature = 0.0f;
    r.prediction = pred;
    METRO_ASSIGN_OR_RETURN(engine::Handle h, eng->submit(r));
    int64_t t_first = 0, t_last = 0;
    for (;;) {
      auto e = h.stream->pop(std::chrono::milliseconds(120000));
      if (!e) return internal_error("no progress for 120 s");
      if (e->kind == engine::Event::Kind::kDelta) {
        if (t_first == 0) t_first = e->time_ns;
        t_last = e->time_ns;
        for (const auto& t : e->tokens) out->tokens.push_back(t.id);
      } else if (e->kind == engine::Event::Kind::kDone) {
        break;
      }
    }
    out->decode_s = static_cast<double>(t_last - t_first) * 1e-9;
    return Status::ok_status();
  };
  RunResult warm;
  METRO_RETURN_IF_ERROR(generate(lm.tokenizer->encode("Hello there.", true, false), 4, {}, &warm));
  const engine::EngineStats before = eng->stats();
  RunResult res;
  METRO_RETURN_IF_ERROR(generate(prompt, o.n_gen, prediction, &res));
  const engine::EngineStats st = eng->stats();
  res.drafts = st.draft_tokens - before.draft_tokens;
  res.accepted = st.accepted_tokens - before.accepted_tokens;
  for (size_t k = 1; k < st.spec_steps_by_k.size(); ++k) {
    res.drafting_steps += st.spec_steps_by_k[k] - (k < before.spec_steps_by_k.size() ? before.spec_steps_by_k[k] : 0);
  }
  return res;
}

double tok_per_s(const RunResult& r) {
  return r.decode_s > 0.0 && r.tokens.size() > 1 ? static_cast<double>(r.tokens.size() - 1) / r.decode_s : 0.0;
}

RunResult median(std::vector<RunResult> runs) {
  std::sort(runs.begin(), runs.end(), [](const RunResult& a, const RunResult& b) { return tok_per_s(a) < tok_per_s(b); });
  return runs[runs.size() / 2];
}

}  // namespace

Expected<std::vector<int32_t>> chat_prompt_ids(const LoadedModel& lm, const std::string& user_text) {
  const tokenizer::Tokenizer& tok = *lm.tokenizer;
  METRO_ASSIGN_OR_RETURN(tokenizer::ChatTemplate tmpl, tokenizer::ChatTemplate::from_gguf(lm.model->file()));
  nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", user_text}}});
  tokenizer::ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  if (tok.bos_id() >= 0) opts.bos_token = tok.token_to_piece(tok.bos_id());
  if (tok.eos_id() >= 0) opts.eos_token = tok.token_to_piece(tok.eos_id());
  METRO_ASSIGN_OR_RETURN(std::string text, tmpl.render(messages, opts));
  std::vector<int32_t> ids = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
  if (tok.add_bos() && tok.bos_id() >= 0 && (ids.empty() || ids[0] != tok.bos_id())) ids.insert(ids.begin(), tok.bos_id());
  return ids;
}

int bench_speculation(const LoadedModel& lm, const SpecBenchOptions& o) {
  if (o.files.empty()) return fail("bench", invalid_argument("--spec needs prompts: -f FILE (one prompt per file)"));
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::printf("| prompt | tokens | off tok/s | %s tok/s | x | accepted | per drafting step | +prediction tok/s | x | "
                "same output |\n|---|---|---|---|---|---|---|---|---|---|\n",
                o.spec.mode.c_str());
  }
  for (const std::string& file : o.files) {
    auto text = read_text(file);
    if (!text.ok()) return fail("bench", text.status());
    std::vector<int32_t> prompt;
    if (o.chat) {
      auto ids = chat_prompt_ids(lm, *text);
      if (!ids.ok()) return fail("bench", ids.status());
      prompt = std::move(*ids);
    } else {
      prompt = lm.tokenizer->encode(*text, true, false);
    }
    std::vector<int32_t> prediction;
    const std::filesystem::path pred_path = std::filesystem::path(file).replace_extension(".prediction");
    if (std::filesystem::exists(pred_path)) {
      auto p = read_text(pred_path.string());
      if (!p.ok()) return fail("bench", p.status());
      prediction = lm.tokenizer->encode(*p, false, false);
    }
    // Off, on and with the prediction in turn, reps times (the machine's drift hits all three).
    std::vector<RunResult> offs, ons, preds;
    for (int i = 0; i < o.reps; ++i) {
      auto a = run_once(lm, prompt, {}, o, false);
      if (!a.ok()) return fail("bench", a.status());
      offs.push_back(std::move(*a));
      auto b = run_once(lm, prompt, {}, o, true);
      if (!b.ok()) return fail("bench", b.status());
      ons.push_back(std::move(*b));
      if (!prediction.empty()) {
        auto c = run_once(lm, prompt, prediction, o, true);
        if (!c.ok()) return fail("bench", c.status());
        preds.push_back(std::move(*c));
      }
    }
    const std::optional<RunResult> off = median(std::move(offs));
    const std::optional<RunResult> on = median(std::move(ons));
    std::optional<RunResult> with_pred;
    if (!preds.empty()) with_pred = median(std::move(preds));
    const bool same = on->tokens == off->tokens && (!with_pred || with_pred->tokens == off->tokens);
    const double t_off = tok_per_s(*off), t_on = tok_per_s(*on);
    const double acc = on->drafts ? static_cast<double>(on->accepted) / static_cast<double>(on->drafts) : 0.0;
    const double per_step =
        on->drafting_steps ? static_cast<double>(on->accepted) / static_cast<double>(on->drafting_steps) : 0.0;
    const std::string name = std::filesystem::path(file).filename().string();
    nlohmann::json row = {{"prompt", name},       {"prompt_tokens", prompt.size()}, {"tokens", off->tokens.size()},
                          {"off_tok_s", t_off},   {"spec_tok_s", t_on},            {"speedup", t_off > 0 ? t_on / t_off : 0},
                          {"acceptance", acc},    {"accepted_per_drafting_step", per_step},
                          {"same_output", same}};
    if (with_pred) {
      row["prediction_tok_s"] = tok_per_s(*with_pred);
      row["prediction_speedup"] = t_off > 0 ? tok_per_s(*with_pred) / t_off : 0;
      row["prediction_acceptance"] =
          with_pred->drafts ? static_cast<double>(with_pred->accepted) / static_cast<double>(with_pred->drafts) : 0.0;
    }
    rows.push_back(row);
    if (!o.json) {
      char pred_cols[64] = "| - | -";
      if (with_pred) {
        std::snprintf(pred_cols, sizeof pred_cols, "| %.1f | %.2f", tok_per_s(*with_pred),
                      t_off > 0 ? tok_per_s(*with_pred) / t_off : 0.0);
      }
      std::printf("| %s | %zu | %.1f | %.1f | %.2f | %.0f%% | %.2f %s | %s |\n", name.c_str(), off->tokens.size(), t_off,
                  t_on, t_off > 0 ? t_on / t_off : 0.0, 100.0 * acc, per_step, pred_cols, same ? "yes" : "NO");
      std::fflush(stdout);
    }
    if (!same) std::fprintf(stderr, "metro bench: %s: outputs differ with speculation\n", name.c_str());
  }
  if (o.json) std::printf("%s\n", nlohmann::json{{"speculation", o.spec.mode}, {"threads", o.threads}, {"rows", rows}}.dump(2).c_str());
  return 0;
}

}  // namespace metro::cli
