#include "tokenizer/special_split.h"

namespace metro::tokenizer {
namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

void split_special(const Vocab& vocab, std::string_view text, bool parse_special,
                   std::vector<Fragment>& out) {
  out.clear();
  if (text.empty()) return;
  METRO_CHECK(text.size() <= UINT32_MAX);
  out.push_back({0, static_cast<uint32_t>(text.size()), -1});

  std::vector<Fragment> next;
  for (const int32_t id : vocab.special_text_tokens()) {
    const TokenData& tok = vocab.token(id);
    if (!parse_special && (tok.attrs & (attr::kControl | attr::kUnknown))) continue;
    const std::string_view needle = tok.text;
    // Most special strings never occur: one search rejects them before any rebuilding.
    if (text.find(needle) == std::string_view::npos) continue;

    next.clear();
    bool changed = false;
    for (const Fragment& f : out) {
      if (f.is_token()) {
        next.push_back(f);
        continue;
      }
      size_t begin = f.offset;
      size_t end = size_t{f.offset} + f.length;
      while (begin < end) {
        const size_t at = text.substr(0, end).find(needle, begin);
        if (at == std::string_view::npos) break;
        changed = true;
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
    if (changed) out.swap(next);
  }
}

}  // namespace metro::tokenizer
