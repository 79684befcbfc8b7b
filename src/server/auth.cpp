#include "server/auth.h"

#include <fstream>
#include <sstream>

namespace metro::server {

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Walk the longer length so the time says nothing about the first differing byte.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

Expected<ApiKeys> ApiKeys::parse(std::string_view text) {
  ApiKeys keys;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    size_t sp = 0;
    while (sp < line.size() && !is_space(line[sp])) ++sp;
    std::string_view key = line.substr(0, sp);
    std::string_view tenant = trim(line.substr(sp));
    if (key.size() < 8) {
      return invalid_argument("API key file line " + std::to_string(line_no) + ": keys must be at least 8 characters");
    }
    if (tenant.find_first_of(" \t") != std::string_view::npos) {
      return invalid_argument("API key file line " + std::to_string(line_no) +
                              ": expected `key [tenant]`, found more fields");
    }
    for (char c : line) {
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
        return invalid_argument("API key file line " + std::to_string(line_no) + ": control character");
      }
    }
    keys.entries_.push_back({std::string(key), std::string(tenant)});
  }
  if (keys.entries_.empty()) return invalid_argument("the API key file holds no key");
  return keys;
}

Expected<ApiKeys> ApiKeys::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot read the API key file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str());
}

std::optional<std::string> ApiKeys::authenticate(std::string_view header) const {
  header = trim(header);
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() <= kBearer.size()) return std::nullopt;
  // The scheme is case-insensitive (RFC 7235).
  for (size_t i = 0; i < kBearer.size(); ++i) {
    const char c = header[i];
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    const char want = kBearer[i];
    const char want_lower = (want >= 'A' && want <= 'Z') ? static_cast<char>(want - 'A' + 'a') : want;
    if (lower != want_lower) return std::nullopt;
  }
  const std::string_view presented = trim(header.substr(kBearer.size()));
  const Entry* found = nullptr;
  for (const Entry& e : entries_) {
    if (constant_time_equal(presented, e.key) && found == nullptr) found = &e;
  }
  if (!found) return std::nullopt;
  return found->tenant;
}

}  // namespace metro::server
