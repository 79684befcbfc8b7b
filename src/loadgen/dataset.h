// Workloads: the requests a run sends, generated in-process from a seed or read from JSONL.
//
// A workload is a list of sessions. A session is one conversation: its turns go out one
// after another, each resending the history (earlier user turns and the server's actual
// replies). Single-request datasets have one turn per session. The arrival process releases
// sessions; a later turn is released when the turn before it ends.
//
//   synthetic      one turn of --input-len random words, --output-len max tokens
//   shared-prefix  K system prompts of --prefix-len words (K = --num-prefixes); session i
//                  uses prompt i mod K, so each is shared by M = N / K users, followed by a
//                  user message of (--input-len - --prefix-len) words of its own
//   multi-turn     sessions of --turns turns, each a new user message of --input-len words
//   FILE.jsonl     one request per line: {"prompt": "..."} or {"messages": [{"role": ...,
//                  "content": ...}, ...]}, with optional "max_tokens" and "class"
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "loadgen/classes.h"
#include "loadgen/length_dist.h"

namespace metro::loadgen {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct Turn {
  std::string user;                   // this turn's user text (the prompt, for completions)
  std::vector<ChatMessage> messages;  // a file record's explicit messages (then user is empty)
  int64_t input_words = 0;            // generated words in system + user (0 for file records)
  int64_t max_tokens = 0;
};

struct Session {
  std::string class_name;
  std::string system;     // the shared prefix (shared-prefix), empty otherwise
  int prefix_index = -1;  // which of the K prefixes
  std::vector<Turn> turns;
};

struct Workload {
  std::string kind;  // "synthetic", "shared-prefix", "multi-turn" or "jsonl"
  std::vector<Session> sessions;
  size_t n_requests() const;
};

struct DatasetOptions {
  std::string dataset = "synthetic";  // a kind above, or a path to a .jsonl file
  size_t num_requests = 0;            // 0: 64 for generated kinds, every record of a file
  LengthDist input_len;
  LengthDist output_len;
  int num_prefixes = 4;      // shared-prefix: K
  int64_t prefix_len = 448;  // shared-prefix: words in each shared system prompt
  int turns = 4;             // multi-turn: turns per session
  ClassMix classes;
  uint64_t seed = 0;
};

inline constexpr size_t kDefaultNumRequests = 64;

Expected<Workload> build_workload(const DatasetOptions& options);

// Parses JSONL text (one record per non-empty line); `origin` names it in errors.
Expected<std::vector<Session>> parse_jsonl_sessions(std::string_view text, std::string_view origin,
                                                    int64_t default_max_tokens);

// The messages of one request: the session's system prompt, the history of earlier turns
// (user and assistant messages, oldest first), then this turn's user message. A file record
// with explicit messages is sent as it is.
std::vector<ChatMessage> request_messages(const Session& session, size_t turn,
                                          std::span<const ChatMessage> history);

// The same request as one completion prompt: the messages' contents joined by blank lines,
// so that a shared system prompt is a shared text prefix.
std::string completion_prompt(std::span<const ChatMessage> messages);

}  // namespace metro::loadgen
