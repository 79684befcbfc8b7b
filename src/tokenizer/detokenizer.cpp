#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace metro::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(tokenizer),
      options_(options),
      strip_next_(strips_first_space(tokenizer.vocab(), options)) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  append_decoded(tokenizer_.vocab(), id, options_, strip_next_, pending_);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Scan r = utf8_scan(std::string_view(pending_).substr(i));
    if (r.kind == Utf8Scan::kIncomplete) break;  // wait for the rest of the character
    if (r.kind == Utf8Scan::kValid) {
      out.append(pending_, i, r.len);
    } else {
      out.append(kReplacementUtf8);
    }
    i += r.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = pending_.empty() ? std::string() : to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace metro::tokenizer
