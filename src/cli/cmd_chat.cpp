// metro chat -m MODEL [--system TEXT] [-n N] [--ctx N] [--temp X] [--top-p P] [--top-k K]
//            [--min-p P] [--repeat-penalty R] [--seed S] [--chat-template FILE] [-t N]
// An interactive chat in the terminal: each line is a user turn, the answer streams as it is
// generated, the conversation goes back through the model's chat template each turn (the
// prefix cache keeps what it has already computed). On a terminal, lines are read with GNU
// readline when the system has it (editing, history kept in ~/.metro_chat_history); from a
// pipe, one turn per line. Commands: /reset, /system [TEXT], /save FILE, /help, /quit.
// Ctrl-C stops an answer; Ctrl-D (or /quit) leaves.
#include <dlfcn.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "base/clock.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "server/openai_request.h"
#include "tokenizer/chat_template.h"

namespace metro::cli {

namespace {

std::atomic<bool> g_interrupted{false};

void on_sigint(int) { g_interrupted.store(true); }

// GNU readline, loaded at run time where the system has it (Debian's libreadline8): line
// editing and history on a terminal with no build dependency; plain lines otherwise.
class LineReader {
 public:
  LineReader(bool terminal, std::string history_file) : history_file_(std::move(history_file)) {
    if (!terminal) return;
    for (const char* name : {"libreadline.so.8", "libreadline.so"}) {
      lib_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib_ != nullptr) break;
    }
    if (lib_ == nullptr) return;
    readline_ = reinterpret_cast<char* (*)(const char*)>(dlsym(lib_, "readline"));
    add_history_ = reinterpret_cast<void (*)(const char*)>(dlsym(lib_, "add_history"));
    read_history_ = reinterpret_cast<int (*)(const char*)>(dlsym(lib_, "read_history"));
    write_history_ = reinterpret_cast<int (*)(const char*)>(dlsym(lib_, "write_history"));
    if (readline_ == nullptr || add_history_ == nullptr) {
      dlclose(lib_);
      lib_ = nullptr;
      return;
    }
    if (read_history_ != nullptr && !history_file_.empty()) read_history_(history_file_.c_str());
  }
  ~LineReader() {
    if (lib_ == nullptr) return;
    if (write_history_ != nullptr && !history_file_.empty()) write_history_(history_file_.c_str());
    dlclose(lib_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  bool editing() const { return lib_ != nullptr; }

  // The next line, without its newline; nullopt at the end of input.
  std::optional<std::string> read(const char* prompt) {
    if (lib_ != nullptr) {
      char* line = readline_(prompt);
      if (line == nullptr) return std::nullopt;
      std::string s(line);
      std::free(line);
      if (!s.empty()) add_history_(s.c_str());
      return s;
    }
    if (prompt[0] != '\0' && isatty(STDIN_FILENO)) {
      std::fputs(prompt, stdout);
      std::fflush(stdout);
    }
    std::string s;
    if (!std::getline(std::cin, s)) return std::nullopt;
    if (!s.empty() && s.back() == '\r') s.pop_back();
    return s;
  }

 private:
  std::string history_file_;
  void* lib_ = nullptr;
  char* (*readline_)(const char*) = nullptr;
  void (*add_history_)(const char*) = nullptr;
  int (*read_history_)(const char*) = nullptr;
  int (*write_history_)(const char*) = nullptr;
};

constexpr const char* kHelp =
    "  /reset          start a new conversation (the system prompt stays)\n"
    "  /system [TEXT]  set the system prompt (none without TEXT) and start a new conversation\n"
    "  /save FILE      write the conversation as a chat request body ({\"messages\": [...]})\n"
    "  /help           this list\n"
    "  /quit           leave (Ctrl-D too); Ctrl-C stops an answer\n";

}  // namespace

int cmd_chat(int argc, char** argv) {
  CLI::App app{"Chat with a model in the terminal", "metro chat"};
  std::string model_path, chat_template_file, system_prompt;
  int n_predict = -1, threads = default_threads(), n_ctx = 4096, top_k = 40;
  float temp = 0.7f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
  int64_t seed = -1;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  LoraFlags lora;
  add_lora_flags(app, lora);
  app.add_option("--system", system_prompt, "system prompt");
  app.add_option("-n,--n-predict", n_predict, "most tokens per answer (-1: the rest of the context)")
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("--ctx", n_ctx, "context of the conversation in tokens; the oldest turns give way beyond it")
      ->check(CLI::Range(64, 1 << 20))
      ->capture_default_str();
  app.add_option("--temp", temp, "temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-p", top_p, "nucleus sampling mass (1: off)")->capture_default_str();
  app.add_option("--top-k", top_k, "keep the k most likely tokens (0: off)")->capture_default_str();
  app.add_option("--min-p", min_p, "drop tokens below min-p x the best one's probability (0: off)")
      ->capture_default_str();
  app.add_option("--repeat-penalty", repeat_penalty, "repetition penalty (1: off)");
  app.add_option("--seed", seed, "sampling seed (-1: random)");
  app.add_option("--chat-template", chat_template_file, "Jinja chat template file (overrides the model's)");
  app.add_option("-t,--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto lm = load_model(model_path, true, "cpu", std::chrono::milliseconds{0}, true, lora.specs());
  if (!lm.ok()) return fail("chat", lm.status());
  const tokenizer::Tokenizer& tok = *lm->tokenizer;
  Expected<tokenizer::ChatTemplate> tmpl = chat_template_of(*lm->model, chat_template_file);
  if (!tmpl.ok()) return fail("chat", tmpl.status());

  engine::EngineConfig ec;
  ec.n_threads = threads;
  ec.max_seqs = 1;
  ec.max_batch_tokens = 512;
  ec.n_ctx = n_ctx;
  ec.ctx_total = n_ctx + 256;
  auto eng = engine::Engine::create(lm->model, tok, ec);
  if (!eng.ok()) return fail("chat", eng.status());
  n_ctx = (*eng)->n_ctx();

  // The server's rendering: message content that spells a control token stays text.
  server::PromptContext ctx;
  ctx.tokenizer = &tok;
  ctx.chat_template = &*tmpl;
  ctx.n_ctx = n_ctx;

  const bool terminal = isatty(STDIN_FILENO) != 0;
  const char* home = std::getenv("HOME");
  LineReader reader(terminal, home != nullptr ? std::string(home) + "/.metro_chat_history" : std::string());
  if (terminal) {
    std::fprintf(stderr, "metro chat: %s, context %d tokens%s. /help lists the commands.\n", model_path.c_str(),
                 n_ctx, reader.editing() ? "" : " (no line editing: libreadline not found)");
  }
  struct sigaction sa{};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_sa{};

  nlohmann::json turns = nlohmann::json::array();
  while (auto line = reader.read(terminal ? "> " : "")) {
    std::string text = *line;
    if (text.empty()) continue;
    if (text[0] == '/') {
      const size_t sp = text.find(' ');
      const std::string cmd = text.substr(0, sp);
      const std::string arg = sp == std::string::npos ? "" : text.substr(sp + 1);
      if (cmd == "/quit" || cmd == "/exit") break;
      if (cmd == "/help") {
        std::fputs(kHelp, stderr);
      } else if (cmd == "/reset") {
        turns = nlohmann::json::array();
        std::fputs("(new conversation)\n", stderr);
      } else if (cmd == "/system") {
        system_prompt = arg;
        turns = nlohmann::json::array();
        std::fputs(arg.empty() ? "(no system prompt; new conversation)\n" : "(system prompt set; new conversation)\n",
                   stderr);
      } else if (cmd == "/save") {
        if (arg.empty()) {
          std::fputs("/save needs a file name\n", stderr);
          continue;
        }
        nlohmann::ordered_json messages = nlohmann::ordered_json::array();
        if (!system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", system_prompt}});
        for (const auto& t : turns) messages.push_back({{"role", t["role"]}, {"content", t["content"]}});
        std::ofstream out(arg, std::ios::binary | std::ios::trunc);
        out << nlohmann::ordered_json{{"messages", messages}}.dump(2) << "\n";
        out.close();
        if (out) {
          std::fprintf(stderr, "(saved %zu messages to %s)\n", messages.size(), arg.c_str());
        } else {
          std::fprintf(stderr, "metro chat: cannot write '%s'\n", arg.c_str());
        }
      } else {
        std::fprintf(stderr, "unknown command %s\n%s", cmd.c_str(), kHelp);
      }
      continue;
    }
    turns.push_back({{"role", "user"}, {"content", text}});
    // The conversation as a prompt; the oldest exchanges give way when it does not fit.
    std::vector<int32_t> ids;
    std::string error;
    while (true) {
      nlohmann::json messages = nlohmann::json::array();
      if (!system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", system_prompt}});
      for (const auto& t : turns) messages.push_back(t);
      auto r = server::detail::chat_prompt(nlohmann::json{{"messages", messages}}, ctx);
      if (!r.ok()) {
        error = r.error().message;
        break;
      }
      // Room for an answer: what -n asks, up to 64 tokens; below it older turns give way.
      const int room = n_ctx - static_cast<int>(r->size());
      const int wanted = n_predict > 0 ? std::min(n_predict, 64) : 64;
      if (room >= wanted || turns.size() <= 1) {
        if (room < 1) error = "the message does not fit the context of " + std::to_string(n_ctx) + " tokens";
        ids = std::move(*r);
        break;
      }
      turns.erase(turns.begin(), turns.begin() + static_cast<long>(std::min<size_t>(2, turns.size() - 1)));
    }
    if (!error.empty()) {
      std::fprintf(stderr, "metro chat: %s\n", error.c_str());
      turns.erase(turns.end() - 1);
      continue;
    }
    engine::Request req;
    req.prompt = ids;
    const int room = n_ctx - static_cast<int>(ids.size());
    req.stop.max_tokens = n_predict > 0 ? std::min(n_predict, room) : room;
    req.sampling.temperature = temp;
    req.sampling.top_p = top_p;
    req.sampling.top_k = top_k;
    req.sampling.min_p = min_p;
    req.sampling.repetition_penalty = repeat_penalty;
    if (seed >= 0) {
      req.sampling.seed = static_cast<uint64_t>(seed) + turns.size();
      req.sampling.has_seed = true;
    }
    auto h = (*eng)->submit(req);
    if (!h.ok()) return fail("chat", h.status());
    g_interrupted.store(false);
    sigaction(SIGINT, &sa, &old_sa);
    std::string answer;
    int n_tokens = 0;
    int64_t t_first = 0, t_last = 0;
    bool stopped = false, failed = false;
    for (;;) {
      if (g_interrupted.exchange(false) && !stopped) {
        (*eng)->abort(h->id);
        stopped = true;
      }
      auto e = h->stream->pop(std::chrono::milliseconds(100));
      if (!e) continue;
      if (e->kind == engine::Event::Kind::kDelta) {
        if (n_tokens == 0) t_first = e->time_ns;
        t_last = e->time_ns;
        n_tokens += static_cast<int>(e->tokens.size());
        answer += e->text;
        std::fwrite(e->text.data(), 1, e->text.size(), stdout);
        std::fflush(stdout);
      } else if (e->kind == engine::Event::Kind::kFinish) {
        if (e->reason == engine::FinishReason::kError) {
          std::fprintf(stderr, "\nmetro chat: %s\n", e->message.c_str());
          failed = true;
        }
      } else if (e->kind == engine::Event::Kind::kDone) {
        break;
      }
    }
    sigaction(SIGINT, &old_sa, nullptr);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (failed) {
      turns.erase(turns.end() - 1);
      continue;
    }
    turns.push_back({{"role", "assistant"}, {"content", answer}});
    if (terminal) {
      const double s = static_cast<double>(t_last - t_first) * 1e-9;
      std::fprintf(stderr, "  [%d tokens, %.1f tokens/s%s]\n", n_tokens, s > 0 && n_tokens > 1 ? (n_tokens - 1) / s : 0.0,
                   stopped ? ", stopped" : "");
    }
  }
  return 0;
}

}  // namespace metro::cli
