#include "server/json_util.h"

#include <cmath>
#include <cstdio>

namespace metro::server {

std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when it is ill-formed (Unicode's
// "maximal subpart" rules: overlongs, surrogates and > U+10FFFF are ill-formed).
size_t valid_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return len;
}

// Bytes of the longest prefix of an ill-formed sequence at i that could have started a
// valid one (at least 1): replaced by one U+FFFD.
size_t bad_subpart_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t want = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    want = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    want = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    want = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return 1;
  size_t k = 1;
  while (k < want && i + k < s.size()) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (d < l || d > h) break;
    ++k;
  }
  return k;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_sequence_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad_subpart_length(s, i);
    }
  }
  return out;
}

std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

namespace {

std::string type_name(const nlohmann::json& v) {
  return v.is_number_float() ? "a float" : std::string("a ") + v.type_name();
}

}  // namespace

std::optional<int64_t> get_int(const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi,
                               std::optional<ApiError>* err) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (it->is_number_unsigned()) {
    const auto v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(hi) || (lo > 0 && v < static_cast<uint64_t>(lo))) {
      *err = bad_request(std::string(key) + " must be an integer in " + range, key);
      return std::nullopt;
    }
    return static_cast<int64_t>(v);
  }
  if (it->is_number_integer()) {
    const auto v = it->get<int64_t>();
    if (v < lo || v > hi) {
      *err = bad_request(std::string(key) + " must be an integer in " + range + ", got " + std::to_string(v), key);
      return std::nullopt;
    }
    return v;
  }
  *err = bad_request(std::string(key) + " must be an integer in " + range + ", got " + type_name(*it), key);
  return std::nullopt;
}

std::optional<double> get_number(const nlohmann::json& obj, const char* key, double lo, double hi,
                                 std::optional<ApiError>* err) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    *err = bad_request(std::string(key) + " must be a number, got " + type_name(*it), key);
    return std::nullopt;
  }
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {  // written so that NaN fails
    *err = bad_request(std::string(key) + " must be in [" + format_number(lo) + ", " + format_number(hi) + "], got " +
                           format_number(v),
                       key);
    return std::nullopt;
  }
  return v;
}

std::optional<bool> get_bool(const nlohmann::json& obj, const char* key, std::optional<ApiError>* err) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) {
    *err = bad_request(std::string(key) + " must be a boolean, got " + type_name(*it), key);
    return std::nullopt;
  }
  return it->get<bool>();
}

std::optional<std::string> get_string(const nlohmann::json& obj, const char* key, size_t max_bytes,
                                      std::optional<ApiError>* err) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) {
    *err = bad_request(std::string(key) + " must be a string, got " + type_name(*it), key);
    return std::nullopt;
  }
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > max_bytes) {
    *err = bad_request(std::string(key) + " is longer than " + std::to_string(max_bytes) + " bytes", key);
    return std::nullopt;
  }
  return s;
}

}  // namespace metro::server
