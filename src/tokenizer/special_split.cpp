#include "tokenizer/special_split.h"

#include <cstring>
#include <optional>

namespace metro::tokenizer {
namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// Vocabularies with hundreds or thousands of special strings (Llama 3's reserved tokens,
// Gemma's <unusedN>) would cost one search of the whole text each. One pass over the text
// records which 4-byte prefixes occur; a string whose prefix is absent cannot occur.
class PrefixFilter {
 public:
  static constexpr size_t kMinTokens = 32;
  static constexpr int kBits = 20;

  explicit PrefixFilter(std::string_view text) : bits_((size_t{1} << kBits) / 64) {
    for (size_t i = 0; i + 4 <= text.size(); ++i) set(slot(text.data() + i));
  }
  // False only when `needle` (at least 4 bytes) certainly does not occur.
  bool may_occur(std::string_view needle) const { return test(slot(needle.data())); }

 private:
  static uint32_t slot(const char* p) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    return (w * 0x9E3779B1u) >> (32 - kBits);
  }
  void set(uint32_t s) { bits_[s >> 6] |= uint64_t{1} << (s & 63); }
  bool test(uint32_t s) const { return (bits_[s >> 6] >> (s & 63)) & 1; }
  std::vector<uint64_t> bits_;
};

}  // namespace

void split_special(const Vocab& vocab, std::string_view text, bool parse_special,
                   std::vector<Fragment>& out) {
  out.clear();
  if (text.empty()) return;
  METRO_CHECK(text.size() <= UINT32_MAX);
  out.push_back({0, static_cast<uint32_t>(text.size()), -1});

  std::vector<int32_t> candidates;
  for (const int32_t id : vocab.special_text_tokens()) {
    if (!parse_special && (vocab.attrs(id) & (attr::kControl | attr::kUnknown))) continue;
    candidates.push_back(id);
  }
  std::optional<PrefixFilter> filter;
  if (candidates.size() >= PrefixFilter::kMinTokens) filter.emplace(text);

  std::vector<Fragment> next;
  for (const int32_t id : candidates) {
    const TokenData& tok = vocab.token(id);
    const std::string_view needle = tok.text;
    if (filter && needle.size() >= 4 && !filter->may_occur(needle)) continue;
    // Most special strings never occur: one search rejects them before any rebuilding.
    if (text.find(needle) == std::string_view::npos) continue;

    next.clear();
    for (const Fragment& f : out) {
      if (f.is_token()) {
        next.push_back(f);
        continue;
      }
      size_t begin = f.offset;
      const size_t end = size_t{f.offset} + f.length;
      while (begin < end) {
        const size_t at = text.substr(0, end).find(needle, begin);
        if (at == std::string_view::npos) break;
        size_t left_end = at;
        if (tok.attrs & attr::kLStrip) {
          while (left_end > begin && is_ascii_space(text[left_end - 1])) --left_end;
        }
        if (left_end > begin) {
          next.push_back({static_cast<uint32_t>(begin), static_cast<uint32_t>(left_end - begin), -1});
        }
        next.push_back({static_cast<uint32_t>(at), static_cast<uint32_t>(needle.size()), id});
        begin = at + needle.size();
        if (tok.attrs & attr::kRStrip) {
          while (begin < end && is_ascii_space(text[begin])) ++begin;
        }
      }
      if (begin < end) {
        next.push_back({static_cast<uint32_t>(begin), static_cast<uint32_t>(end - begin), -1});
      }
    }
    out.swap(next);
  }
}

}  // namespace metro::tokenizer
