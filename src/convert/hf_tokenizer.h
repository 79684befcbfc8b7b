// A Hugging Face WordPiece tokenizer (tokenizer.json, with tokenizer_config.json and
// special_tokens_map.json when present) written as GGUF tokenizer metadata in llama.cpp's
// "bert" convention, which metro's tokenizer reads back (tokenizer/vocab.h):
//
//   tokenizer.ggml.model = "bert", tokenizer.ggml.pre = "default"
//   tokenizer.ggml.tokens       continuation "##ing" as "ing", other normal tokens "play" as
//                               "\u2581play", added tokens ([CLS], [SEP], ...) unchanged;
//                               ids missing from the file filled with unused "[PADn]"
//   tokenizer.ggml.token_type   3 (control) for added special tokens, 4 (user-defined) for
//                               other added tokens, 5 (unused) for fillers, 1 otherwise
//   tokenizer.ggml.token_type_count   config.json's type_vocab_size (2 when absent)
//   tokenizer.ggml.{unknown,seperator,padding,cls,mask}_token_id   (llama.cpp's spelling)
//   tokenizer.ggml.bos_token_id, eos_token_id, add_bos_token, add_eos_token, add_sep_token
//                               the tokens the post-processor puts around a sequence
//                               ([CLS] ... [SEP] for BERT) and whether it does
//
// Only what metro's WordPiece reproduces is accepted: model WordPiece with 100 characters a
// word, normalizer BertNormalizer lowercasing (accents stripped), pre-tokenizer
// BertPreTokenizer.
//
// A byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) is written in llama.cpp's "gpt2"
// convention: tokens as the file spells them, merges "a b", `pre` named by the pre-tokenizer
// found (ByteLevel alone: gpt-2; Digits then ByteLevel: starcoder; Split with Llama 3's
// pattern then ByteLevel: llama-bpe, or smaug-bpe without ignore_merges; Split with Qwen2's:
// qwen2), BOS / EOS / PAD / UNK from tokenizer_config.json, special_tokens_map.json or
// config.json's ids, add_bos_token from tokenizer_config.json or the post-processor, rows of
// config.json's vocab_size beyond the tokens filled with unused "[PADn]". Byte-fallback BPE
// (SentencePiece style) and other splits are refused.
//
// A SentencePiece BPE model (tokenizer.model, as Llama 2, Mistral and Gemma ship theirs; used
// when tokenizer.json is absent or is its byte-fallback BPE) is written in llama.cpp's
// "llama" convention: the pieces with their scores and types, add_space_prefix from the
// model's dummy prefix, the added tokens of tokenizer.json and tokenizer_config.json's
// added_tokens_decoder, BOS added unless the files say otherwise. Unigram models and
// normalizing rules (NFKC) are refused.
//
// All write tokenizer_config.json's chat template (or chat_template.jinja's) when there is
// one. Anything else is refused with an error that says what was found.
// The files are untrusted: sizes, nesting and every id are checked; nothing is written to
// the Writer unless the whole tokenizer is good.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/writer.h"

namespace metro::convert {

struct TokenizerInfo {
  int32_t n_vocab = 0;
  // -1 when the tokenizer has none.
  int32_t unk_id = -1;
  int32_t cls_id = -1;
  int32_t sep_id = -1;
  int32_t pad_id = -1;
  int32_t mask_id = -1;
  // What encoding a single text puts before and after it (-1: nothing): [CLS] and [SEP].
  int32_t first_id = -1;
  int32_t last_id = -1;
  uint32_t token_type_count = 2;
  // Byte-level BPE: the GGUF pre-tokenizer name written, the merges, BOS and EOS (-1: none).
  std::string pre;
  int32_t n_merges = 0;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool sentencepiece = false;  // written from tokenizer.model
  // Settings of the files metro does not carry over (padding, truncation, lstrip on an
  // added token, ...), one line each.
  std::vector<std::string> warnings;
};

// The contents of a model directory's tokenizer files; nullopt: the file is absent.
struct HfTokenizerFiles {
  std::string tokenizer_json;
  std::optional<std::string> tokenizer_config_json;
  std::optional<std::string> special_tokens_map_json;
  std::optional<std::string> config_json;
  std::optional<std::string> chat_template_jinja;
  // tokenizer.model (a SentencePiece model); tokenizer_json may then be empty.
  std::optional<std::string> sentencepiece_model;
};

// Reads the files from `hf_dir`; tokenizer.json or tokenizer.model must exist.
Expected<HfTokenizerFiles> read_hf_tokenizer_files(const std::string& hf_dir);

// Adds the tokenizer keys to `w`; fills `info` when given.
Status write_hf_tokenizer(const HfTokenizerFiles& files, gguf::Writer& w,
                          TokenizerInfo* info = nullptr);
Status write_hf_tokenizer(const std::string& hf_dir, gguf::Writer& w,
                          TokenizerInfo* info = nullptr);

}  // namespace metro::convert
