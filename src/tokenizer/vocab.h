// A tokenizer vocabulary read from GGUF metadata (`tokenizer.ggml.*`).
//
// The file is untrusted: every id, array length and byte token is checked here, once, so the
// encoders and decoders downstream can index without checks of their own. What cannot be
// used is refused with an error (no tokens, wrong array types, arrays shorter than the
// vocabulary, a token longer than kMaxTokenBytes) or ignored with a warning (special ids out
// of range, duplicate strings, malformed byte tokens and merges); warnings are logged and
// kept in warnings() for `metro inspect` and tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "tokenizer/pre_tokenizer.h"

namespace metro::tokenizer {

inline constexpr size_t kMaxVocabSize = size_t{1} << 24;
inline constexpr size_t kMaxTokenBytes = 4096;

enum class VocabKind : uint8_t {
  kBpe,  // "gpt2": byte-level BPE with ranked merges and a regex pre-tokenizer
  kSpm,  // "llama": SentencePiece BPE by scores with <0xNN> byte fallback
  kWpm,  // "bert": WordPiece, word-initial pieces marked with U+2581 (wordpiece.h)
};

// Token attributes as bits: a file's token_type gives one of the first six; the loader adds
// kControl to tokens that are end-of-turn markers by name, and kLStrip/kRStrip for the few
// models whose special tokens swallow neighbouring spaces.
namespace attr {
inline constexpr uint16_t kUndefined = 0;
inline constexpr uint16_t kNormal = 1 << 0;
inline constexpr uint16_t kUnknown = 1 << 1;
inline constexpr uint16_t kControl = 1 << 2;
inline constexpr uint16_t kUserDefined = 1 << 3;
inline constexpr uint16_t kUnused = 1 << 4;
inline constexpr uint16_t kByte = 1 << 5;
inline constexpr uint16_t kLStrip = 1 << 6;
inline constexpr uint16_t kRStrip = 1 << 7;
inline constexpr uint16_t kEog = 1 << 8;  // ends generation (EOS, EOT, <|im_end|>, ...)
// Rendered only on request (decode with render_special).
inline constexpr uint16_t kHidden = kUnknown | kControl;
// Matched in text before the model's own splitting (control and unknown ones only when
// parse_special is on; user-defined ones always).
inline constexpr uint16_t kSpecialText = kUnknown | kControl | kUserDefined;
}  // namespace attr

struct TokenData {
  std::string text;   // as stored in the file (byte-level alphabet for BPE, ▁ for SPM/WPM)
  std::string piece;  // the raw bytes this token decodes to
  float score = 0.0f;
  uint16_t attrs = attr::kNormal;
};

// A merge rule "A B" of a BPE vocabulary, as token ids; rank = position in the file.
struct BpeMerge {
  int32_t left;
  int32_t right;
  int32_t result;
};

class Vocab {
 public:
  static Expected<Vocab> from_gguf(const gguf::File& file);

  Vocab(Vocab&&) = default;
  Vocab& operator=(Vocab&&) = default;
  // Not copyable: text_to_id_ holds views into tokens_.
  Vocab(const Vocab&) = delete;
  Vocab& operator=(const Vocab&) = delete;

  VocabKind kind() const { return kind_; }
  std::string_view model_name() const { return model_name_; }
  // tokenizer.ggml.pre as written ("default" when absent).
  std::string_view pre_name() const { return pre_name_; }
  // BPE: the pre-tokenizer in use (GPT-2's for an unknown name); nullptr for SPM and WPM.
  const PreTokenizerSpec* pre_spec() const { return pre_spec_; }
  // False when tokenizer.ggml.pre named a pre-tokenizer metro does not know.
  bool pre_recognized() const { return pre_recognized_; }

  int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  bool valid(int32_t id) const { return id >= 0 && id < n_tokens(); }
  // Precondition for the accessors below: valid(id).
  const TokenData& token(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }
  uint16_t attrs(int32_t id) const { return token(id).attrs; }

  // The id whose file text is exactly `text`, or -1. For duplicate strings, the first id.
  int32_t find(std::string_view text) const;

  // The token for byte `b`: the byte-level character (BPE) or <0xNN> (SPM, falling back to
  // the one-byte string). -1 when the vocabulary lacks it.
  int32_t byte_token(uint8_t b) const { return byte_token_[b]; }

  // The most input bytes one token can stand for: its decoded bytes, or for a token matched
  // as special text, that text. So a text of n bytes is at least n / max_token_bytes()
  // tokens (a cheap bound before tokenizing). Not for WordPiece, whose normalizer drops
  // control characters and combining marks: there the bound holds for the bytes it keeps.
  size_t max_token_bytes() const { return max_token_bytes_; }

  // Ids of tokens matched in text before model splitting, longest text first.
  const std::vector<int32_t>& special_text_tokens() const { return special_text_tokens_; }

  // BPE merges in rank order, those naming unknown tokens dropped (see warnings()).
  const std::vector<BpeMerge>& merges() const { return merges_; }

  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  int32_t eot_id() const { return eot_; }
  int32_t eom_id() const { return eom_; }
  int32_t pad_id() const { return pad_; }
  int32_t unk_id() const { return unk_; }
  // WordPiece's [SEP], [CLS] and [MASK] (-1 elsewhere). For WPM the BOS is [CLS] unless
  // the file names another (llama.cpp's converters write [CLS] as either key).
  int32_t sep_id() const { return sep_; }
  int32_t cls_id() const { return cls_; }
  int32_t mask_id() const { return mask_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // WPM: encoding with add_special ends with [SEP] (tokenizer.ggml.add_sep_token, default
  // on), once: not again when add_eos already put the same token there.
  bool add_sep() const { return add_sep_; }
  // SPM: a space goes before the first text (and after each special token), and decoding
  // from the start drops it again.
  bool add_space_prefix() const { return add_space_prefix_; }
  bool is_eog(int32_t id) const { return valid(id) && (attrs(id) & attr::kEog); }
  const std::vector<int32_t>& eog_ids() const { return eog_; }

  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  Vocab() = default;
  friend class VocabLoader;

  VocabKind kind_ = VocabKind::kBpe;
  std::string model_name_;
  std::string pre_name_;
  const PreTokenizerSpec* pre_spec_ = nullptr;
  bool pre_recognized_ = true;
  std::vector<TokenData> tokens_;
  std::unordered_map<std::string_view, int32_t> text_to_id_;
  int32_t byte_token_[256];
  std::vector<int32_t> special_text_tokens_;
  size_t max_token_bytes_ = 1;
  std::vector<BpeMerge> merges_;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, pad_ = -1, unk_ = -1;
  int32_t sep_ = -1, cls_ = -1, mask_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_sep_ = false, add_space_prefix_ = false;
  std::vector<int32_t> eog_;  // sorted
  std::vector<std::string> warnings_;
};

}  // namespace metro::tokenizer
