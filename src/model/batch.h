// The per-step API of the model: a flat batch of tokens, each with its position, its
// sequence slot and whether it wants logits.
//
// Precondition checked by Model::forward: the tokens of one sequence form one contiguous
// run with consecutive positions (a decode token or a prefill chunk), and every earlier
// position of that sequence is already in the KV cache.
#pragma once

#include <cstdint>
#include <vector>

namespace metro::model {

struct Batch {
  std::vector<int32_t> token;   // [n] token ids
  std::vector<int32_t> pos;     // [n] position in its sequence
  std::vector<int32_t> seq;     // [n] sequence slot: index into KvView::tables
  std::vector<uint8_t> logits;  // [n] 1 when the caller wants this token's logits
  // [n] the LoRA adapter each token runs with (1..Model::n_adapters(); 0: none), or empty
  // when no token of the batch has one.
  std::vector<int16_t> adapter;

  void add(int32_t token_id, int32_t position, int32_t seq_slot, bool want_logits) {
    token.push_back(token_id);
    pos.push_back(position);
    seq.push_back(seq_slot);
    logits.push_back(want_logits ? 1 : 0);
    if (!adapter.empty()) adapter.push_back(0);
  }
  // The same, the token running with LoRA adapter `lora` (0: none).
  void add(int32_t token_id, int32_t position, int32_t seq_slot, bool want_logits, int16_t lora) {
    if (lora == 0 && adapter.empty()) {
      add(token_id, position, seq_slot, want_logits);
      return;
    }
    adapter.resize(token.size(), 0);  // the earlier tokens ran with none
    adapter.push_back(lora);
    token.push_back(token_id);
    pos.push_back(position);
    seq.push_back(seq_slot);
    logits.push_back(want_logits ? 1 : 0);
  }
  void clear() {
    token.clear();
    pos.clear();
    seq.clear();
    logits.clear();
    adapter.clear();
  }
  int size() const { return static_cast<int>(token.size()); }
  bool empty() const { return token.empty(); }
};

}  // namespace metro::model
