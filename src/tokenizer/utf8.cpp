#include "tokenizer/utf8.h"

namespace metro::tokenizer {

Utf8Scan utf8_scan(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  if (n == 0) return {Utf8Scan::kIncomplete, 0, 0};
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {Utf8Scan::kValid, 1, b0};
  size_t need;
  uint32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Scan::kInvalid, 1, 0};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) return {Utf8Scan::kIncomplete, static_cast<uint8_t>(i), 0};
    const uint8_t b = p[i];
    const uint8_t l = i == 1 ? lo : 0x80;
    const uint8_t h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Utf8Scan::kInvalid, static_cast<uint8_t>(i), 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Scan::kValid, static_cast<uint8_t>(need), cp};
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    Utf8Scan r = utf8_scan(s.substr(i));
    if (r.kind != Utf8Scan::kValid) return false;
    i += r.len;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    Utf8Scan r = utf8_scan(s.substr(i));
    if (r.kind == Utf8Scan::kValid) {
      out.append(s.data() + i, r.len);
      i += r.len;
    } else {
      out.append(kReplacementUtf8);
      i += r.len;  // an incomplete tail is the rest of the input
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= 0x10FFFF) {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.append(kReplacementUtf8);
  }
}

ByteLevelMap::ByteLevelMap() {
  dec_.fill(-1);
  auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : static_cast<uint32_t>(next++);
    std::string utf8;
    append_utf8(utf8, cp);
    enc_len_[b] = static_cast<uint8_t>(utf8.size());
    for (size_t i = 0; i < utf8.size(); ++i) enc_[b][i] = utf8[i];
    dec_[cp] = static_cast<int16_t>(b);
  }
}

std::string byte_level_decode(const ByteLevelMap& map, std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    Utf8Scan r = utf8_scan(text.substr(i));
    if (r.kind == Utf8Scan::kValid) {
      const int b = map.decode(r.cp);
      if (b >= 0) {
        out.push_back(static_cast<char>(b));
      } else {
        out.append(text.data() + i, r.len);
      }
      i += r.len;
    } else {
      const size_t n = r.len == 0 ? 1 : r.len;
      out.append(text.data() + i, n);
      i += n;
    }
  }
  return out;
}

std::string byte_level_encode(const ByteLevelMap& map, std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out.append(map.encode(static_cast<uint8_t>(c)));
  return out;
}

std::string quoted_for_message(std::string_view s, size_t max_bytes) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  if (s.size() > max_bytes) out += "...";
  return out + "'";
}

}  // namespace metro::tokenizer
