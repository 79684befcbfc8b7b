#include "jinja/string.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "jinja/error.h"

namespace metro::jinja {
namespace {

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char to_upper(char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c; }
char to_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

// Code points of `chars`, for strip(chars).
std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    out.push_back(decode_utf8(s, i, &len));
    i += len;
  }
  return out;
}

// Byte offsets of whitespace-separated fields, for split() without a separator.
struct Field {
  size_t begin, end;
};

std::vector<Field> whitespace_fields(std::string_view s) {
  std::vector<Field> fields;
  size_t i = 0;
  bool in_field = false;
  size_t start = 0;
  while (i < s.size()) {
    size_t len = 1;
    const bool space = is_py_space(decode_utf8(s, i, &len));
    if (space && in_field) {
      fields.push_back({start, i});
      in_field = false;
    } else if (!space && !in_field) {
      start = i;
      in_field = true;
    }
    i += len;
  }
  if (in_field) fields.push_back({start, s.size()});
  return fields;
}

}  // namespace

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

uint32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *len = 1;
  if (b0 < 0x80) return b0;
  size_t n = 0;
  uint32_t cp = 0;
  uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return b0;
  }
  if (i + n > s.size()) return b0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return b0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return b0;
  *len = n;
  return cp;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const uint32_t cp = decode_utf8(s, i, &len);
    if (len == 1 && cp >= 0x80) return false;
    i += len;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t code_point_count(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    size_t len = 1;
    decode_utf8(s, i, &len);
    i += len;
  }
  return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    size_t len = 1;
    decode_utf8(s, i, &len);
    i += len;
  }
  offsets.push_back(s.size());
  return offsets;
}

bool is_py_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars,
                     StripSide side) {
  std::vector<uint32_t> set;
  if (chars) set = code_points(*chars);
  auto strippable = [&](uint32_t cp) {
    if (!chars) return is_py_space(cp);
    for (uint32_t c : set) {
      if (c == cp) return true;
    }
    return false;
  };
  size_t begin = 0;
  size_t end = s.size();
  if (side != StripSide::kRight) {
    while (begin < end) {
      size_t len = 1;
      if (!strippable(decode_utf8(s, begin, &len))) break;
      begin += len;
    }
  }
  if (side != StripSide::kLeft && begin < end) {
    const std::vector<size_t> offs = code_point_offsets(s.substr(begin, end - begin));
    size_t k = offs.size() - 1;  // index of the end sentinel
    while (k > 0) {
      size_t len = 1;
      if (!strippable(decode_utf8(s, begin + offs[k - 1], &len))) break;
      --k;
    }
    end = begin + offs[k];
  }
  return std::string(s.substr(begin, end - begin));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (!sep) {
    std::vector<Field> fields = whitespace_fields(s);
    if (fields.empty()) return out;
    if (maxsplit < 0 || static_cast<uint64_t>(maxsplit) + 1 >= fields.size()) {
      for (const Field& f : fields) out.emplace_back(s.substr(f.begin, f.end - f.begin));
      return out;
    }
    const auto keep = static_cast<size_t>(maxsplit);
    if (!from_right) {
      for (size_t i = 0; i < keep; ++i) {
        out.emplace_back(s.substr(fields[i].begin, fields[i].end - fields[i].begin));
      }
      // The remainder runs from the next field to the end, as is.
      out.emplace_back(s.substr(fields[keep].begin));
    } else {
      const size_t first_kept = fields.size() - keep;
      out.emplace_back(s.substr(0, fields[first_kept - 1].end));
      for (size_t i = first_kept; i < fields.size(); ++i) {
        out.emplace_back(s.substr(fields[i].begin, fields[i].end - fields[i].begin));
      }
    }
    return out;
  }
  if (sep->empty()) throw_type_error("empty separator");
  if (!from_right) {
    size_t pos = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
      ++n;
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::vector<std::string> rev;
  size_t end = s.size();
  int64_t n = 0;
  while (maxsplit < 0 || n < maxsplit) {
    if (end < sep->size()) break;
    const size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    rev.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
    ++n;
  }
  rev.emplace_back(s.substr(0, end));
  out.assign(rev.rbegin(), rev.rend());
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const uint32_t cp = decode_utf8(s, i, &len);
    const bool is_break = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C ||
                          cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 ||
                          cp == 0x2029;
    if (is_break) {
      out.emplace_back(s.substr(start, i - start));
      if (cp == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++len;
      start = i + len;
    }
    i += len;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to,
                       int64_t count, size_t max_bytes) {
  std::string out;
  auto append = [&](std::string_view piece) {
    if (out.size() + piece.size() > max_bytes) {
      throw Error(ErrorKind::kLimit, "replace() result exceeds the output size limit");
    }
    out.append(piece);
  };
  int64_t done = 0;
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    for (size_t i = 0; i < s.size();) {
      if (count >= 0 && done >= count) {
        append(s.substr(i));
        return out;
      }
      size_t len = 1;
      decode_utf8(s, i, &len);
      append(to);
      append(s.substr(i, len));
      ++done;
      i += len;
    }
    if (count < 0 || done < count) append(to);
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    append(s.substr(pos, hit - pos));
    append(to);
    pos = hit + from.size();
    ++done;
  }
  append(s.substr(pos));
  return out;
}

int64_t py_find(std::string_view s, std::string_view sub) {
  const size_t hit = s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return static_cast<int64_t>(code_point_count(s.substr(0, hit)));
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(code_point_count(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) {
    ++n;
  }
  return n;
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_upper(c);
  return out;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_lower(c);
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = to_upper(out[0]);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    if (is_ascii_alpha(c)) {
      c = prev_cased ? to_lower(c) : to_upper(c);
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  // Words begin after runs of '-', whitespace, '(', '{', '[', '<'; each word is
  // capitalized (first character upper, the rest lower).
  std::string out(s);
  bool word_start = true;
  for (char& c : out) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_ascii_space(c);
    if (sep) {
      word_start = true;
      continue;
    }
    c = word_start ? to_upper(c) : to_lower(c);
    word_start = false;
  }
  return out;
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form: "-d.ddde+XX".
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  const size_t e_pos = sci.find('e');
  std::string_view mant = sci.substr(0, e_pos);
  const int exp10 = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  std::string out;
  if (!mant.empty() && mant[0] == '-') {
    out += '-';
    mant.remove_prefix(1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 >= 0) {
      const auto int_len = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_len) {
        out += digits;
        out.append(int_len - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, int_len);
        out += '.';
        out += digits.substr(int_len);
      }
    } else {
      out += "0.";
      out.append(static_cast<size_t>(-exp10 - 1), '0');
      out += digits;
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  out += exp_buf;
  return out;
}

void append_py_repr_string(std::string& out, std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out += quote;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const uint32_t cp = decode_utf8(s, i, &len);
    char buf[16];
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F || (len == 1 && cp >= 0x80)) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      out += buf;
    } else if ((cp >= 0x80 && cp < 0xA0) || cp == 0xAD || cp == 0x2028 || cp == 0x2029) {
      // Non-printable per Python's repr (C1 controls, soft hyphen, line/para separators).
      std::snprintf(buf, sizeof(buf), cp < 0x100 ? "\\x%02x" : "\\u%04x", cp);
      out += buf;
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  out += quote;
}

std::optional<int64_t> parse_py_int(std::string_view s, int base) {
  s = std::string_view(s);
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  auto has_prefix = [&](char lower) {
    return s.size() >= 2 && s[0] == '0' && (s[1] == lower || s[1] == to_upper(lower));
  };
  if ((base == 0 || base == 16) && has_prefix('x')) {
    base = 16, s.remove_prefix(2);
  } else if ((base == 0 || base == 8) && has_prefix('o')) {
    base = 8, s.remove_prefix(2);
  } else if ((base == 0 || base == 2) && has_prefix('b')) {
    base = 2, s.remove_prefix(2);
  } else if (base == 0) {
    base = 10;
    // Python refuses leading zeros in base 0 ("010"), except for zero itself.
    if (s.size() > 1 && s[0] == '0' && s.find_first_not_of("0_") != std::string_view::npos) {
      return std::nullopt;
    }
  }
  if (base < 2 || base > 36 || s.empty() || s.front() == '_' || s.back() == '_') return std::nullopt;
  uint64_t value = 0;
  bool prev_underscore = false;
  for (char c : s) {
    if (c == '_') {
      if (prev_underscore) return std::nullopt;
      prev_underscore = true;
      continue;
    }
    prev_underscore = false;
    int d = 0;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (is_ascii_alpha(c)) {
      d = to_lower(c) - 'a' + 10;
    } else {
      return std::nullopt;
    }
    if (d >= base) return std::nullopt;
    if (value > (static_cast<uint64_t>(INT64_MAX) + 1 - static_cast<uint64_t>(d)) /
                    static_cast<uint64_t>(base)) {
      return std::nullopt;
    }
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  if (!negative && value > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  if (negative) return value == static_cast<uint64_t>(INT64_MAX) + 1 ? INT64_MIN : -static_cast<int64_t>(value);
  return static_cast<int64_t>(value);
}

std::optional<double> parse_py_float(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  std::string text;
  for (char c : s) {
    if (c != '_') text += to_lower(c);
  }
  bool negative = false;
  std::string_view body(text);
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") return negative ? -INFINITY : INFINITY;
  if (body == "nan") return NAN;
  if (body.empty()) return std::nullopt;
  for (char c : body) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == '+' || c == '-')) return std::nullopt;
  }
  double v = 0;
  const auto res = std::from_chars(body.data(), body.data() + body.size(), v);
  if (res.ec != std::errc() || res.ptr != body.data() + body.size()) return std::nullopt;
  return negative ? -v : v;
}

}  // namespace metro::jinja
