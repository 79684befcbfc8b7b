#include "tokenizer/bert_normalizer.h"

#include <algorithm>
#include <array>

#include "tokenizer/utf8.h"

namespace metro::tokenizer {
namespace {

enum CpClass : uint8_t {
  kDefault,  // kept as is
  kDrop,     // removed
  kSpace,    // a word break
  kPunct,    // kept as a word of its own
  kCjk,      // a word of its own; may also map (compatibility ideographs)
  kHangul,   // a precomposed syllable, decomposed to its jamo
  kMapped,   // replaced by its decomposition, stripped and lowercased
};

struct CpRange {
  uint32_t first;
  uint32_t last;
  CpClass cls;
};

struct CpRun {
  uint32_t first;
  uint16_t count;
  uint8_t stride;
  int32_t delta;
};

struct CpSeq {
  uint32_t cp;
  uint16_t offset;
  uint8_t n_bytes;
  uint8_t n_chars;
};

#include "tokenizer/bert_unicode_tables.inc"

constexpr std::array<CpClass, 128> make_ascii_classes() {
  std::array<CpClass, 128> out{};
  for (const CpRange& r : kCpRanges) {
    for (uint32_t cp = r.first; cp <= r.last && cp < 128; ++cp) out[cp] = r.cls;
  }
  return out;
}
constexpr std::array<CpClass, 128> kAsciiClass = make_ascii_classes();

// What ASCII letters map to (A-Z: a-z), so the common case skips the run search.
constexpr std::array<uint8_t, 128> make_ascii_mapped() {
  std::array<uint8_t, 128> out{};
  for (const CpRun& r : kCpRuns) {
    for (uint32_t k = 0; k < r.count && r.first + k * r.stride < 128; ++k) {
      const uint32_t c = r.first + k * r.stride;
      out[c] = static_cast<uint8_t>(static_cast<int32_t>(c) + r.delta);
    }
  }
  return out;
}
constexpr std::array<uint8_t, 128> kAsciiMapped = make_ascii_mapped();

CpClass class_of(uint32_t cp) {
  if (cp < 128) return kAsciiClass[cp];
  const auto* end = std::end(kCpRanges);
  const auto* it = std::upper_bound(std::begin(kCpRanges), end, cp,
                                    [](uint32_t c, const CpRange& r) { return c < r.first; });
  if (it == std::begin(kCpRanges)) return kDefault;
  --it;
  return cp <= it->last ? it->cls : kDefault;
}

// The one code point `cp` maps to, or -1 when its mapping is longer (or it has none).
int64_t single_mapping(uint32_t cp) {
  const auto* it = std::upper_bound(std::begin(kCpRuns), std::end(kCpRuns), cp,
                                    [](uint32_t c, const CpRun& r) { return c < r.first; });
  if (it == std::begin(kCpRuns)) return -1;
  --it;
  const uint32_t k = (cp - it->first) / it->stride;
  if ((cp - it->first) % it->stride != 0 || k >= it->count) return -1;
  return int64_t{cp} + it->delta;
}

const CpSeq* long_mapping(uint32_t cp) {
  const auto* it = std::lower_bound(std::begin(kCpSeqs), std::end(kCpSeqs), cp,
                                    [](const CpSeq& s, uint32_t c) { return s.cp < c; });
  return it != std::end(kCpSeqs) && it->cp == cp ? it : nullptr;
}

// Writes `cp` (at most U+10FFFF) as UTF-8 into `buf`; returns the length.
size_t encode_utf8(uint32_t cp, char* buf) {
  if (cp < 0x80) {
    buf[0] = static_cast<char>(cp);
    return 1;
  }
  if (cp < 0x800) {
    buf[0] = static_cast<char>(0xC0 | (cp >> 6));
    buf[1] = static_cast<char>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    buf[0] = static_cast<char>(0xE0 | (cp >> 12));
    buf[1] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[2] = static_cast<char>(0x80 | (cp & 0x3F));
    return 3;
  }
  buf[0] = static_cast<char>(0xF0 | (cp >> 18));
  buf[1] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
  buf[2] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  buf[3] = static_cast<char>(0x80 | (cp & 0x3F));
  return 4;
}

// Feeds the normalized text of `text` to `sink`, which has:
//   space()                     a word break (whitespace; either side of a CJK ideograph)
//   chars(utf8, n_chars)        code points that join the current word
//   punct(utf8)                 one code point that is a word of its own
template <class Sink>
void normalize_into(std::string_view text, Sink& sink) {
  char buf[4];
  auto emit = [&](uint32_t cp, bool punct) {
    const std::string_view s(buf, encode_utf8(cp, buf));
    if (punct) {
      sink.punct(s);
    } else {
      sink.chars(s, 1);
    }
  };
  // A mapped code point: its replacement, each code point checked for punctuation.
  auto emit_mapped = [&](uint32_t cp) {
    const int64_t single = single_mapping(cp);
    if (single >= 0) {
      const auto t = static_cast<uint32_t>(single);
      emit(t, class_of(t) == kPunct);
      return true;
    }
    if (const CpSeq* seq = long_mapping(cp)) {
      // The generator checked that longer replacements hold no punctuation.
      sink.chars(std::string_view(kCpSeqBytes + seq->offset, seq->n_bytes), seq->n_chars);
      return true;
    }
    return false;
  };

  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const size_t at = i;
    uint32_t cp = p[i];
    if (cp < 0x80) {
      ++i;
    } else {
      const Utf8Scan r = utf8_scan(text.substr(i));
      i += r.len == 0 ? 1 : r.len;
      if (r.kind != Utf8Scan::kValid) continue;  // U+FFFD, which is dropped
      cp = r.cp;
    }
    switch (class_of(cp)) {
      case kDefault:
        sink.chars(text.substr(at, i - at), 1);
        break;
      case kDrop:
        break;
      case kSpace:
        sink.space();
        break;
      case kPunct:
        sink.punct(text.substr(at, i - at));
        break;
      case kCjk:
        sink.space();
        if (!emit_mapped(cp)) emit(cp, false);
        sink.space();
        break;
      case kHangul: {
        const uint32_t s = cp - 0xAC00;
        emit(0x1100 + s / 588, false);
        emit(0x1161 + (s % 588) / 28, false);
        if (s % 28 != 0) emit(0x11A7 + s % 28, false);
        break;
      }
      case kMapped:
        if (cp < 0x80 && kAsciiMapped[cp] != 0) {
          const uint8_t t = kAsciiMapped[cp];
          emit(t, kAsciiClass[t] == kPunct);
        } else if (!emit_mapped(cp)) {
          emit(cp, false);
        }
        break;
    }
  }
}

struct WordSink {
  BertWords& out;
  bool in_word = false;

  void space() { in_word = false; }
  void chars(std::string_view s, size_t n_chars) {
    if (!in_word) {
      out.words.push_back({out.text.size(), 0, 0});
      in_word = true;
    }
    out.text.append(s);
    BertWord& w = out.words.back();
    w.length += s.size();
    w.n_chars += n_chars;
  }
  void punct(std::string_view s) {
    out.words.push_back({out.text.size(), s.size(), 1});
    out.text.append(s);
    in_word = false;
  }
};

struct StringSink {
  std::string& out;
  void space() { out.push_back(' '); }
  void chars(std::string_view s, size_t) { out.append(s); }
  void punct(std::string_view s) { out.append(s); }
};

}  // namespace

void bert_split_words(std::string_view text, BertWords& out) {
  out.text.clear();
  out.words.clear();
  out.text.reserve(text.size() + 16);
  WordSink sink{out};
  normalize_into(text, sink);
}

std::string bert_normalize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  StringSink sink{out};
  normalize_into(text, sink);
  return out;
}

}  // namespace metro::tokenizer
