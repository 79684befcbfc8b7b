#include "server/auth.h"

#include <algorithm>
#include <charconv>
#include <cmath>
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

// `name=value` settings after the tenant name; errors name the field, never the key.
Status parse_setting(std::string_view field, TenantSettings* ts, bool* explicit_fields) {
  const size_t eq = field.find('=');
  const std::string_view name = field.substr(0, eq), value = field.substr(eq + 1);
  auto number = [&](double lo, double hi, double* out) -> Status {
    double v = 0.0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || ptr != value.data() + value.size() || !(v >= lo && v <= hi)) {
      return invalid_argument("`" + std::string(name) + "` must be a number in [" + std::to_string(static_cast<long long>(lo)) +
                              ", " + std::to_string(static_cast<long long>(hi)) + "]");
    }
    *out = v;
    return Status();
  };
  if (name == "class") {
    SlaClass c;
    if (!parse_sla_class(std::string(value), &c)) {
      return invalid_argument("`class` must be realtime, standard or batch");
    }
    ts->default_class = c;
    explicit_fields[0] = true;
  } else if (name == "tpm") {
    METRO_RETURN_IF_ERROR(number(0, 1e12, &ts->tokens_per_minute));
    explicit_fields[1] = true;
  } else if (name == "burst") {
    METRO_RETURN_IF_ERROR(number(0, 1e12, &ts->burst_tokens));
    explicit_fields[2] = true;
  } else if (name == "concurrency") {
    double v = 0;
    METRO_RETURN_IF_ERROR(number(0, 1e6, &v));
    if (v != std::floor(v)) return invalid_argument("`concurrency` must be a whole number");
    ts->max_concurrent = static_cast<int>(v);
    explicit_fields[3] = true;
  } else if (name == "capture") {
    double v = 0;
    METRO_RETURN_IF_ERROR(number(0, 1, &v));
    ts->capture_share = v;
    explicit_fields[4] = true;
  } else if (name == "cache") {
    if (value != "on" && value != "off") return invalid_argument("`cache` must be on or off");
    ts->semantic_cache = value == "on";
    explicit_fields[5] = true;
  } else {
    return invalid_argument("unknown setting `" + std::string(name) +
                            "` (class, tpm, burst, concurrency, capture, cache)");
  }
  return Status();
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
    const std::string where = "API key file line " + std::to_string(line_no) + ": ";
    for (char c : line) {
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t') return invalid_argument(where + "control character");
    }
    std::vector<std::string_view> fields;
    for (std::string_view rest = line; !rest.empty();) {
      size_t sp = 0;
      while (sp < rest.size() && !is_space(rest[sp])) ++sp;
      fields.push_back(rest.substr(0, sp));
      rest = trim(rest.substr(sp));
    }
    const std::string_view key = fields[0];
    if (key.size() < 8) return invalid_argument(where + "keys must be at least 8 characters");
    size_t next = 1;
    std::string_view tenant;
    if (next < fields.size() && fields[next].find('=') == std::string_view::npos) tenant = fields[next++];
    TenantSettings ts;
    bool given[6] = {false, false, false, false, false, false};
    for (; next < fields.size(); ++next) {
      if (fields[next].find('=') == std::string_view::npos) {
        return invalid_argument(where +
                                "expected `key [tenant] [class=C] [tpm=N] [burst=N] [concurrency=N] [capture=R] "
                                "[cache=on]`");
      }
      if (Status s = parse_setting(fields[next], &ts, given); !s.ok()) return invalid_argument(where + s.message());
    }
    const bool any = given[0] || given[1] || given[2] || given[3] || given[4] || given[5];
    auto known = std::find_if(keys.tenants_.begin(), keys.tenants_.end(),
                              [&](const auto& t) { return t.first == tenant; });
    if (known == keys.tenants_.end()) {
      keys.tenants_.emplace_back(std::string(tenant), ts);
    } else if (any) {
      if (known->second != TenantSettings{} && known->second != ts) {
        return invalid_argument(where + "tenant '" + std::string(tenant) + "' has other settings on an earlier line");
      }
      known->second = ts;
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

const TenantSettings* ApiKeys::tenant_settings(const std::string& tenant) const {
  for (const auto& [name, ts] : tenants_) {
    if (name == tenant) return &ts;
  }
  return nullptr;
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
