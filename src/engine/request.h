// What callers hand the engine (Request) and what comes back on a request's stream (Event).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/adaptive/tier_controller.h"
#include "engine/sampling.h"
#include "grammar/matcher.h"
#include "sched/seq_state.h"

namespace metro::engine {

enum class RequestKind : uint8_t {
  kGenerate,  // sample tokens after the prompt
  kEmbed,     // mean-pooled, L2-normalised final hidden state of the prompt
};

struct StopConditions {
  int max_tokens = 16;                  // generated tokens per choice, >= 1
  std::vector<std::string> stop;        // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;  // extra stop tokens (not included in the output)
  bool ignore_eos = false;              // keep going past end-of-generation tokens
};

struct Request {
  RequestKind kind = RequestKind::kGenerate;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopConditions stop;
  int n = 1;  // choices sampled from the same prompt (they share its KV blocks)
  SlaClass sla_class = SlaClass::kStandard;
  std::string tenant;
  // Steady-clock time by which the first output (a token; an embedding's vector) must be
  // out; 0 for none. Past it without one, the request is ended: finish kAbort with code
  // "deadline_missed" (HTTP 503), its KV freed.
  int64_t deadline_ns = 0;
  // A request that has begun its output and then gets no new token for this long (paused or
  // preempted by higher classes) is ended the same way; 0: never.
  int64_t max_stall_ns = 0;
  uint64_t prefix_hash = 0;  // hash of the template / system prompt (length prediction)
  int64_t arrival_ns = 0;    // when the request reached the server; 0: at submit()
  // Speculative decoding: the expected output (OpenAI `prediction`), a source of drafts;
  // and whether this request may be drafted for at all (the engine's proposer decides how).
  std::vector<int32_t> prediction;
  bool speculative = true;
  // Structured output: every choice's text is a sentence of this grammar (the sampler only
  // draws tokens it allows; the choice stops once the grammar is complete). Null: free text.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // When set, the grammar holds only from the first occurrence of this text in the output
  // on (the text free before it; the grammar must start with it): a tool call the model may
  // open or not. Should the grammar refuse what follows the trigger in its token, the rest
  // of the output stays free.
  std::string grammar_trigger;
  // Precision tiers: the tier this request runs in whatever the load (unset: the engine's
  // pins by class, else the controller's pick).
  std::optional<adaptive::Tier> tier;
  // The LoRA adapter the request runs with: 1..the model's n_adapters() (0: none). Requests
  // with different adapters share steps; each adapter's prefixes are cached apart.
  int16_t adapter = 0;
};

enum class FinishReason : uint8_t {
  kStop,    // end-of-generation token, stop token or stop string
  kLength,  // max_tokens or the context window
  kAbort,   // abort() or a client that stopped reading
  kError,
};

const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

struct Usage {
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;   // served from the prefix cache
  int completion_tokens = 0;      // over all choices
  // Drafts taken from the request's `prediction` that the model kept / discarded.
  int accepted_prediction_tokens = 0;
  int rejected_prediction_tokens = 0;
  // Precision tiers: bit (1 << tier) for each tier that computed any of the request's tokens
  // (0 on an engine with one tier).
  uint8_t tiers = 0;
  // Time from its arrival until a step first computed any of it (waiting in the queue).
  int64_t queue_ns = 0;
};

struct TokenInfo {
  int32_t id = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // when requested
};

struct Event {
  enum class Kind : uint8_t {
    kDelta,    // new text (and tokens) of choice `index`
    kFinish,   // choice `index` finished with `reason`
    kDone,     // every choice finished; `usage` is final; the stream ends here
    kEmbedding,  // an embedding request's vector, then kDone
  };
  Kind kind = Kind::kDelta;
  int index = 0;
  std::string text;
  std::vector<TokenInfo> tokens;  // the tokens behind `text` (may be ahead of or behind it)
  FinishReason reason = FinishReason::kStop;
  std::string message;            // for kError and kAbort finishes
  std::string code;               // for kAbort finishes: an API error code ("" means "aborted")
  Usage usage;
  std::vector<float> embedding;
  int64_t time_ns = 0;            // steady clock when the engine emitted it
  int8_t tier = -1;               // kDelta: the precision tier of its last token (-1: one tier)
};

}  // namespace metro::engine
