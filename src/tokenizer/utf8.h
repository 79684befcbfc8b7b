// UTF-8 helpers for the tokenizer: sequence lengths, strict validation, replacement of
// ill-formed bytes with U+FFFD, and GPT-2's byte <-> printable-character map.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace metro::tokenizer {

inline constexpr uint32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// The length a sequence announces by its first byte: 1 for ASCII and for bytes that cannot
// start a sequence (continuation bytes, 0xF8..0xFF), else 2, 3 or 4. The same rule
// SentencePiece-style tokenizers use to cut text into characters.
inline size_t utf8_lead_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Result of looking at the bytes at the start of `s` under Unicode's well-formedness table
// (no overlongs, no surrogates, nothing above U+10FFFF).
struct Utf8Scan {
  enum Kind : uint8_t { kValid, kInvalid, kIncomplete } kind;
  // kValid: the sequence length. kInvalid: the length of the maximal ill-formed subpart,
  // which is replaced by one U+FFFD. kIncomplete: bytes present (a valid prefix that ran
  // out of input).
  uint8_t len;
  uint32_t cp;  // the code point when kValid
};
Utf8Scan utf8_scan(std::string_view s);

bool is_valid_utf8(std::string_view s);
// Text from a file, safe to print in an error message: quoted, printable ASCII kept, other
// bytes as \xNN, cut after `max_bytes` ("..." marks the cut).
std::string quoted_for_message(std::string_view s, size_t max_bytes = 40);
// Replaces each maximal ill-formed subpart with U+FFFD (a truncated tail included).
std::string to_valid_utf8(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);

// GPT-2 byte-level BPE writes every byte as one printable code point: printable Latin-1
// bytes stand for themselves, the other 68 bytes map to U+0100.. in byte order. Vocab
// strings are in that alphabet; tokenizing maps bytes in, decoding maps them back out.
class ByteLevelMap {
 public:
  ByteLevelMap();
  // The UTF-8 text of the code point that stands for `b`.
  std::string_view encode(uint8_t b) const { return {enc_[b].data(), enc_len_[b]}; }
  // The byte a code point stands for, or -1 when it is not in the alphabet.
  int decode(uint32_t cp) const { return cp < 512 ? dec_[cp] : -1; }

 private:
  std::array<std::array<char, 2>, 256> enc_{};
  std::array<uint8_t, 256> enc_len_{};
  std::array<int16_t, 512> dec_{};
};

// Byte-level text -> raw bytes. Code points outside the alphabet (malformed vocabularies)
// are copied through as their own UTF-8 bytes.
std::string byte_level_decode(const ByteLevelMap& map, std::string_view text);
std::string byte_level_encode(const ByteLevelMap& map, std::string_view bytes);

}  // namespace metro::tokenizer
