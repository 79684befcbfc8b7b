#include "tokenizer/spm.h"

#include <algorithm>
#include <string>

#include "tokenizer/utf8.h"

namespace metro::tokenizer {
namespace {

// Max-heap order: higher score first, then the leftmost pair.
struct LaterCandidate {
  bool operator()(const SpmScratch::Candidate& a, const SpmScratch::Candidate& b) const {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  }
};

void push_candidate(const Vocab& vocab, std::string_view text, SpmScratch& s, int32_t left,
                    int32_t right) {
  if (left < 0 || right < 0) return;
  const SpmScratch::Symbol& l = s.symbols[static_cast<size_t>(left)];
  const SpmScratch::Symbol& r = s.symbols[static_cast<size_t>(right)];
  // Adjacent symbols are contiguous in the text, so their concatenation is a substring.
  const int32_t id = vocab.find(text.substr(l.start, l.len + r.len));
  if (id < 0) return;
  s.heap.push_back({vocab.token(id).score, left, right, l.len + r.len});
  std::push_heap(s.heap.begin(), s.heap.end(), LaterCandidate{});
}

void emit_symbol(const Vocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  if (const int32_t id = vocab.find(piece); id >= 0) {
    out.push_back(id);
    return;
  }
  for (char c : piece) {
    const int32_t id = vocab.byte_token(static_cast<uint8_t>(c));
    if (id >= 0) {
      out.push_back(id);
    } else if (vocab.unk_id() >= 0) {
      out.push_back(vocab.unk_id());
    }
  }
}

}  // namespace

std::string spm_escape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ') {
      out.append("\xE2\x96\x81");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out,
                SpmScratch& s) {
  if (text.empty()) return;
  METRO_CHECK(text.size() < (size_t{1} << 31));
  s.symbols.clear();
  s.heap.clear();
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_lead_len(static_cast<uint8_t>(text[off])), text.size() - off);
    const auto idx = static_cast<int32_t>(s.symbols.size());
    s.symbols.push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(len), idx - 1,
                         off + len < text.size() ? idx + 1 : -1});
    off += len;
  }
  const auto n = static_cast<int32_t>(s.symbols.size());
  for (int32_t i = 1; i < n; ++i) push_candidate(vocab, text, s, i - 1, i);

  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), LaterCandidate{});
    const SpmScratch::Candidate c = s.heap.back();
    s.heap.pop_back();
    SpmScratch::Symbol& l = s.symbols[static_cast<size_t>(c.left)];
    SpmScratch::Symbol& r = s.symbols[static_cast<size_t>(c.right)];
    // Stale when either side merged since it was pushed.
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) s.symbols[static_cast<size_t>(r.next)].prev = c.left;
    push_candidate(vocab, text, s, l.prev, c.left);
    push_candidate(vocab, text, s, c.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = s.symbols[static_cast<size_t>(i)].next) {
    const SpmScratch::Symbol& sym = s.symbols[static_cast<size_t>(i)];
    emit_symbol(vocab, text.substr(sym.start, sym.len), out);
  }
}

}  // namespace metro::tokenizer
