// Text <-> token ids for a model, from the vocabulary inside its GGUF file.
//
//   auto tok = tokenizer::Tokenizer::from_gguf(file);        // Expected<Tokenizer>
//   std::vector<int32_t> ids = tok->encode(text, /*add_special=*/true, /*parse_special=*/false);
//   std::string bytes = tok->decode(ids);
//
// Three vocabulary kinds: byte-level BPE ("gpt2": SmolLM2, Llama 3, Qwen2, ...) and
// SentencePiece BPE ("llama": Llama 2, Mistral, Phi-3, ...), whose ids agree with
// llama.cpp's tokenizer on the same file; and WordPiece ("bert": uncased BERT encoders such
// as all-MiniLM-L6-v2), whose ids agree with Hugging Face tokenizers' on the model's
// tokenizer.json (BertNormalizer, BertPreTokenizer, WordPiece; see bert_normalizer.h).
// tests/fixtures/tokenizer holds the evidence; known differences are listed in docs of this
// header's functions.
//
// A Tokenizer is a cheap handle to shared immutable state (plus an internally locked word
// cache): copy it freely and call its const methods from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "tokenizer/vocab.h"

namespace metro::tokenizer {

struct DecodeOptions {
  // Control and unknown tokens (<|im_start|>, <s>, ...) as their text; hidden otherwise.
  bool render_special = false;
  // SPM vocabularies with add_space_prefix: drop the one space encoding put before the
  // first text and after each special token, so decode(encode(x)) == x. WordPiece: no space
  // before the first word. Set false when decoding a continuation (generated tokens after a
  // prompt), whose leading space is real.
  bool strip_leading_space = true;
};

struct TokenizerOptions {
  // Words remembered with their BPE or WordPiece ids (0: no cache). 64 bytes each.
  size_t word_cache_entries = 32768;
};

class Tokenizer {
 public:
  static Expected<Tokenizer> from_gguf(const gguf::File& file) {
    return from_gguf(file, TokenizerOptions{});
  }
  static Expected<Tokenizer> from_gguf(const gguf::File& file, const TokenizerOptions& options);

  // add_special: BOS/EOS as the vocabulary asks (add_bos_token, add_eos_token); WordPiece:
  // [CLS] first and [SEP] last.
  // parse_special: text spelling a control token ("<|im_start|>") becomes that token;
  // off for user content, where it stays plain text. Hugging Face tokenizers always matches
  // special tokens in text: WordPiece ids equal its encode(text) with parse_special on
  // (and add_special on for its default add_special_tokens=True).
  // WordPiece normalizes (lowercase, accents stripped, control characters dropped) and so
  // does not round-trip; it drops invalid UTF-8. BPE and SPM accept any bytes: invalid UTF-8
  // is encoded byte for byte (BPE) or by byte fallback (SPM) rather than replaced with
  // U+FFFD as llama.cpp does, so it round-trips. Exception, as in llama.cpp: a byte-level
  // vocabulary may lack tokens for a few bytes (SmolLM2: 21 control and 0xC0/0xC1/0xF1..
  // 0xFF bytes); those bytes are dropped. A byte an SPM vocabulary cannot spell becomes UNK.
  // Precondition: text under 2 GiB (callers bound request sizes far below that).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes of a token sequence, possibly invalid UTF-8 (a character may be split across
  // tokens: stream with IncrementalDetokenizer). Ids outside the vocabulary are skipped.
  std::string decode(std::span<const int32_t> ids) const { return decode(ids, DecodeOptions{}); }
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options) const;

  // One token's bytes, special tokens as their text; empty for an id out of range.
  std::string token_to_piece(int32_t id) const;

  int32_t n_vocab() const;
  bool valid_id(int32_t id) const { return id >= 0 && id < n_vocab(); }
  // -1 when the vocabulary has none.
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t eot_id() const;
  int32_t pad_id() const;
  int32_t unk_id() const;
  // End of generation: EOS, EOT and the other turn-end tokens (<|im_end|>, <|eot_id|>,
  // <end_of_turn>, ...). llama.cpp picks EOT among several candidates in hash order; metro
  // takes the first of a fixed preference list, so eot_id() may differ while the set of
  // end-of-generation tokens is the same.
  bool is_eog(int32_t id) const;
  bool add_bos() const;
  bool add_eos() const;
  // True for control/unknown tokens, which decode hides unless asked.
  bool is_control(int32_t id) const;

  VocabKind kind() const;
  // tokenizer.ggml.pre as written in the file ("default" when absent).
  std::string_view pre_tokenizer_name() const;
  // False when that name is unknown and GPT-2's split is used instead (a warning says so).
  bool pre_tokenizer_recognized() const;
  // Problems found in the vocabulary metadata and worked around.
  const std::vector<std::string>& warnings() const;

  const Vocab& vocab() const;

 private:
  friend class IncrementalDetokenizer;
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Streams decoded text token by token without ever splitting a UTF-8 character: push()
// returns only complete, valid characters and holds back the bytes of one still being
// formed; bytes that can never form a character come out as U+FFFD at once, and flush()
// turns a held incomplete tail into U+FFFD. The concatenation of every push() and the final
// flush() is decode(ids) with ill-formed bytes replaced, hence equal to it for valid UTF-8.
// One instance per stream; not thread-safe.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options = {});

  std::string push(int32_t id);
  std::string flush();
  // Bytes held back waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  DecodeOptions options_;
  bool strip_next_;
  std::string pending_;
};

}  // namespace metro::tokenizer
