#include "tokenizer/bpe.h"

#include <algorithm>
#include <bit>

#include "tokenizer/utf8.h"

namespace metro::tokenizer {

MergeTable::MergeTable(std::span<const BpeMerge> merges) {
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, merges.size() * 2));
  entries_.resize(capacity);
  mask_ = capacity - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge& m = merges[rank];
    const uint64_t key = pack(m.left, m.right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      Entry& e = entries_[i];
      if (e.key == key) break;  // a repeated pair keeps its first (best) rank
      if (e.key == kEmpty) {
        e = {key, static_cast<int32_t>(rank), m.result};
        ++size_;
        break;
      }
    }
  }
}

BpeModel::BpeModel(const Vocab& vocab, bool ignore_merges)
    : vocab_(vocab), merges_(vocab.merges()), byte_pairs_(256 * 256), ignore_merges_(ignore_merges) {
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const int32_t la = vocab.byte_token(static_cast<uint8_t>(a));
      const int32_t lb = vocab.byte_token(static_cast<uint8_t>(b));
      if (la < 0 || lb < 0) continue;
      if (const MergeTable::Entry* e = merges_.find(la, lb)) byte_pairs_[static_cast<size_t>(a << 8 | b)] = *e;
    }
  }
}

namespace {
// Min-heap order: lower rank first, then the leftmost pair.
struct LaterCandidate {
  bool operator()(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};
}  // namespace

void BpeModel::push_candidate(BpeScratch& s, int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return;
  const int32_t lid = s.symbols[static_cast<size_t>(left)].id;
  const int32_t rid = s.symbols[static_cast<size_t>(right)].id;
  if (lid < 0 || rid < 0) return;
  const MergeTable::Entry* e = merges_.find(lid, rid);
  if (e == nullptr) return;
  s.heap.push_back({e->rank, left, right, lid, rid, e->result});
  std::push_heap(s.heap.begin(), s.heap.end(), LaterCandidate{});
}

void BpeModel::emit_byte(uint8_t b, std::vector<int32_t>& out) const {
  // Some vocabularies lack a few of the 256 byte characters (SmolLM2 has no token for
  // bytes like 0x14 or 0xF1). Like llama.cpp, such bytes are dropped: an UNK there could be
  // a document separator (SmolLM2's UNK is <|endoftext|>).
  const int32_t id = vocab_.byte_token(b);
  if (id >= 0) out.push_back(id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out,
                           BpeScratch& s) const {
  const size_t n = word.size();
  if (n == 0) return;
  if (ignore_merges_) {
    s.encoded.clear();
    for (char c : word) s.encoded.append(byte_map_.encode(static_cast<uint8_t>(c)));
    if (const int32_t id = vocab_.find(s.encoded); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (n == 1) {
    emit_byte(static_cast<uint8_t>(word[0]), out);
    return;
  }
  METRO_CHECK(n < (size_t{1} << 31));
  s.symbols.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.symbols[i] = {vocab_.byte_token(static_cast<uint8_t>(word[i])), static_cast<int32_t>(i) - 1,
                    i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  s.heap.clear();
  for (size_t i = 0; i + 1 < n; ++i) {
    const auto pair = static_cast<size_t>(static_cast<uint8_t>(word[i]) << 8 | static_cast<uint8_t>(word[i + 1]));
    const MergeTable::Entry& e = byte_pairs_[pair];
    if (e.key == MergeTable::kEmpty) continue;
    const auto l = static_cast<int32_t>(i);
    s.heap.push_back({e.rank, l, l + 1, s.symbols[i].id, s.symbols[i + 1].id, e.result});
  }
  std::make_heap(s.heap.begin(), s.heap.end(), LaterCandidate{});

  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), LaterCandidate{});
    const BpeScratch::Candidate c = s.heap.back();
    s.heap.pop_back();
    BpeScratch::Symbol& l = s.symbols[static_cast<size_t>(c.left)];
    BpeScratch::Symbol& r = s.symbols[static_cast<size_t>(c.right)];
    // Stale when either side has merged since (ids change, the right side dies).
    if (l.id != c.left_id || r.id != c.right_id || l.next != c.right) continue;
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) s.symbols[static_cast<size_t>(r.next)].prev = c.left;
    r.id = -2;
    r.next = -1;
    push_candidate(s, l.prev, c.left);
    push_candidate(s, c.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = s.symbols[static_cast<size_t>(i)].next) {
    const int32_t id = s.symbols[static_cast<size_t>(i)].id;
    if (id >= 0) {
      out.push_back(id);
    } else {
      emit_byte(static_cast<uint8_t>(word[static_cast<size_t>(i)]), out);
    }
  }
}

}  // namespace metro::tokenizer
