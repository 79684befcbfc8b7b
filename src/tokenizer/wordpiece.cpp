#include "tokenizer/wordpiece.h"

#include <algorithm>

namespace metro::tokenizer {
namespace {

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581

bool is_continuation_byte(char c) { return (static_cast<uint8_t>(c) & 0xC0) == 0x80; }

// The id of piece `text`, or -1 when it is no WordPiece piece.
int32_t find_piece(const Vocab& vocab, std::string_view text) {
  const int32_t id = vocab.find(text);
  if (id < 0 || (vocab.attrs(id) & (attr::kSpecialText | attr::kByte))) return -1;
  return id;
}

}  // namespace

void wordpiece_encode_word(const Vocab& vocab, std::string_view word, size_t n_chars,
                           std::vector<int32_t>& out, WordPieceScratch& scratch) {
  const size_t before = out.size();
  auto unknown = [&] {
    out.resize(before);
    if (vocab.unk_id() >= 0) out.push_back(vocab.unk_id());
  };
  if (word.empty()) return;
  if (n_chars > kWordPieceMaxChars) return unknown();

  scratch.key.assign(kWordStart);
  scratch.key.append(word);
  const std::string_view key = scratch.key;
  // No piece is longer than this, so longer candidates need no lookup.
  const size_t max_bytes = vocab.max_token_bytes();

  size_t start = 0;
  while (start < word.size()) {
    // A continuation spelled with a leading U+2581 would be read as a word-initial piece
    // (the two spellings coincide), so a rest that starts with U+2581 matches nothing.
    if (start > 0 && word.substr(start).starts_with(kWordStart)) return unknown();
    const size_t prefix = start == 0 ? kWordStart.size() : 0;
    size_t end = std::min(word.size(), start + (max_bytes > prefix ? max_bytes - prefix : 0));
    while (end > start && end < word.size() && is_continuation_byte(word[end])) --end;
    int32_t id = -1;
    while (end > start) {
      id = start == 0 ? find_piece(vocab, key.substr(0, prefix + end))
                      : find_piece(vocab, word.substr(start, end - start));
      if (id >= 0) break;
      do {
        --end;
      } while (end > start && is_continuation_byte(word[end]));
    }
    if (id < 0) return unknown();
    out.push_back(id);
    start = end;
  }
}

}  // namespace metro::tokenizer
