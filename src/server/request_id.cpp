#include "server/request_id.h"

#include <random>

namespace metro::server {

namespace {

bool id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == ':' || c == '/' || c == '+' || c == '=' || c == '@';
}

bool lower_hex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool all_zero(std::string_view s) { return s.find_first_not_of('0') == std::string_view::npos; }

}  // namespace

std::string request_id_for(std::string_view incoming) {
  bool usable = !incoming.empty() && incoming.size() <= 128;
  for (char c : incoming) usable = usable && id_char(c);
  return usable ? std::string(incoming) : random_id("req_");
}

std::string random_id(std::string_view prefix) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

std::optional<TraceContext> parse_traceparent(std::string_view h) {
  // version "-" trace-id "-" parent-id "-" flags; a later version may append fields.
  if (h.size() < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  const std::string_view version = h.substr(0, 2), trace = h.substr(3, 32), parent = h.substr(36, 16),
                         flags = h.substr(53, 2);
  if (!lower_hex(version) || version == "ff" || !lower_hex(trace) || !lower_hex(parent) || !lower_hex(flags)) {
    return std::nullopt;
  }
  if (version == "00" && h.size() != 55) return std::nullopt;
  if (version != "00" && h.size() > 55 && h[55] != '-') return std::nullopt;
  if (all_zero(trace) || all_zero(parent)) return std::nullopt;
  TraceContext t;
  t.trace_id = std::string(trace);
  t.parent_id = std::string(parent);
  t.sampled = (std::stoi(std::string(flags), nullptr, 16) & 1) != 0;
  return t;
}

}  // namespace metro::server
