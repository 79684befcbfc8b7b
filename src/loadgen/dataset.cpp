#include "loadgen/dataset.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loadgen/prompt_text.h"

namespace metro::loadgen {
namespace {

using nlohmann::json;

bool is_generated_kind(const std::string& s) {
  return s == "synthetic" || s == "shared-prefix" || s == "multi-turn";
}

Status check_common(const DatasetOptions& o) {
  if (o.num_requests > 10'000'000) return invalid_argument("--num-requests above 10000000");
  return Status::ok_status();
}

Expected<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return not_found("--dataset '" + path +
                     "': cannot open it; use synthetic, shared-prefix, multi-turn or a .jsonl file");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("--dataset '" + path + "': read failed");
  return ss.str();
}

}  // namespace

size_t Workload::n_requests() const {
  size_t n = 0;
  for (const auto& s : sessions) n += s.turns.size();
  return n;
}

Expected<std::vector<Session>> parse_jsonl_sessions(std::string_view text, std::string_view origin,
                                                    int64_t default_max_tokens) {
  std::vector<Session> out;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.remove_suffix(1);
    }
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    auto where = [&] { return std::string(origin) + ":" + std::to_string(line_no) + ": "; };
    json rec = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (rec.is_discarded()) return invalid_argument(where() + "not valid JSON");
    if (!rec.is_object()) return invalid_argument(where() + "a record must be a JSON object");
    Session s;
    s.class_name = std::string(kDefaultClass);
    Turn t;
    t.max_tokens = default_max_tokens;
    if (auto it = rec.find("prompt"); it != rec.end()) {
      if (!it->is_string()) return invalid_argument(where() + "\"prompt\" must be a string");
      t.user = it->get<std::string>();
    } else if (auto m = rec.find("messages"); m != rec.end()) {
      if (!m->is_array() || m->empty()) {
        return invalid_argument(where() + "\"messages\" must be a non-empty array");
      }
      for (const auto& msg : *m) {
        if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string() ||
            !msg.contains("content") || !msg["content"].is_string()) {
          return invalid_argument(where() +
                                  "each message needs string \"role\" and \"content\" fields");
        }
        t.messages.push_back({msg["role"].get<std::string>(), msg["content"].get<std::string>()});
      }
    } else {
      return invalid_argument(where() + "expected a \"prompt\" string or a \"messages\" array");
    }
    if (auto it = rec.find("max_tokens"); it != rec.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 1'000'000) {
        return invalid_argument(where() + "\"max_tokens\" must be an integer in [1, 1000000]");
      }
      t.max_tokens = it->get<int64_t>();
    }
    if (auto it = rec.find("class"); it != rec.end()) {
      if (!it->is_string()) return invalid_argument(where() + "\"class\" must be a string");
      s.class_name = it->get<std::string>();
      if (Status st = validate_class_name(s.class_name); !st.ok()) {
        return invalid_argument(where() + st.message());
      }
    }
    s.turns.push_back(std::move(t));
    out.push_back(std::move(s));
  }
  if (out.empty()) return invalid_argument(std::string(origin) + ": no records");
  return out;
}

Expected<Workload> build_workload(const DatasetOptions& o) {
  METRO_RETURN_IF_ERROR(check_common(o));
  Workload w;
  Rng class_rng = Rng::stream(o.seed, "classes");
  Rng len_rng = Rng::stream(o.seed, "lengths");
  Rng word_rng = Rng::stream(o.seed, "words");

  if (!is_generated_kind(o.dataset)) {
    METRO_ASSIGN_OR_RETURN(std::string text, read_file(o.dataset));
    METRO_ASSIGN_OR_RETURN(auto records, parse_jsonl_sessions(text, o.dataset, 0));
    w.kind = "jsonl";
    const size_t n = o.num_requests == 0 ? records.size() : o.num_requests;
    for (size_t i = 0; i < n; ++i) {
      Session s = records[i % records.size()];  // a short file is cycled
      for (auto& t : s.turns) {
        if (t.max_tokens == 0) t.max_tokens = o.output_len.sample(len_rng);
      }
      // Classes the file names win; the mix fills in the rest.
      const std::string& drawn = o.classes.pick(class_rng);
      if (s.class_name == kDefaultClass) s.class_name = drawn;
      w.sessions.push_back(std::move(s));
    }
    return w;
  }

  w.kind = o.dataset;
  const size_t n = o.num_requests == 0 ? kDefaultNumRequests : o.num_requests;
  if (o.dataset == "synthetic") {
    for (size_t i = 0; i < n; ++i) {
      Session s;
      s.class_name = o.classes.pick(class_rng);
      Turn t;
      t.input_words = o.input_len.sample(len_rng);
      t.max_tokens = o.output_len.sample(len_rng);
      t.user = random_words(t.input_words, word_rng);
      s.turns.push_back(std::move(t));
      w.sessions.push_back(std::move(s));
    }
    return w;
  }

  if (o.dataset == "shared-prefix") {
    if (o.num_prefixes < 1 || o.num_prefixes > 100'000) {
      return invalid_argument("--num-prefixes must be in [1, 100000]");
    }
    if (o.prefix_len < 1 || o.prefix_len > 1'000'000) {
      return invalid_argument("--prefix-len must be in [1, 1000000]");
    }
    if (o.input_len.kind == LengthDist::Kind::kFixed && o.input_len.fixed <= o.prefix_len) {
      return invalid_argument("shared-prefix: --input-len (" + std::to_string(o.input_len.fixed) +
                              ") must exceed --prefix-len (" + std::to_string(o.prefix_len) +
                              "): each user adds words of its own after the shared prompt");
    }
    Rng prefix_rng = Rng::stream(o.seed, "prefixes");
    std::vector<std::string> prefixes;
    for (int k = 0; k < o.num_prefixes; ++k) prefixes.push_back(random_words(o.prefix_len, prefix_rng));
    for (size_t i = 0; i < n; ++i) {
      Session s;
      s.class_name = o.classes.pick(class_rng);
      s.prefix_index = static_cast<int>(i % prefixes.size());
      s.system = prefixes[static_cast<size_t>(s.prefix_index)];
      Turn t;
      const int64_t suffix = std::max<int64_t>(1, o.input_len.sample(len_rng) - o.prefix_len);
      t.input_words = o.prefix_len + suffix;
      t.max_tokens = o.output_len.sample(len_rng);
      t.user = random_words(suffix, word_rng);
      s.turns.push_back(std::move(t));
      w.sessions.push_back(std::move(s));
    }
    return w;
  }

  // multi-turn
  if (o.turns < 1 || o.turns > 1000) return invalid_argument("--turns must be in [1, 1000]");
  for (size_t done = 0; done < n;) {
    Session s;
    s.class_name = o.classes.pick(class_rng);
    const size_t k = std::min(static_cast<size_t>(o.turns), n - done);
    for (size_t j = 0; j < k; ++j) {
      Turn t;
      t.input_words = o.input_len.sample(len_rng);
      t.max_tokens = o.output_len.sample(len_rng);
      t.user = random_words(t.input_words, word_rng);
      s.turns.push_back(std::move(t));
    }
    done += k;
    w.sessions.push_back(std::move(s));
  }
  return w;
}

std::vector<ChatMessage> request_messages(const Session& session, size_t turn,
                                          std::span<const ChatMessage> history) {
  METRO_CHECK(turn < session.turns.size());
  const Turn& t = session.turns[turn];
  if (!t.messages.empty()) return t.messages;
  std::vector<ChatMessage> out;
  out.reserve(history.size() + 2);
  if (!session.system.empty()) out.push_back({"system", session.system});
  out.insert(out.end(), history.begin(), history.end());
  out.push_back({"user", t.user});
  return out;
}

std::string completion_prompt(std::span<const ChatMessage> messages) {
  std::string out;
  for (const auto& m : messages) {
    if (!out.empty()) out += "\n\n";
    out += m.content;
  }
  return out;
}

}  // namespace metro::loadgen
