// A SentencePiece model file (tokenizer.model, a serialized ModelProto) read for conversion:
// the pieces with their scores and types, what the trainer says of the model (BPE or not,
// byte fallback, the ids of UNK, BOS, EOS and PAD) and the normalizer's settings.
//
// The file is untrusted: every length and varint is bounded, fields metro does not read are
// skipped by their wire type, and anything malformed is an error, never a read out of bounds.
// Only the fields named below are read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace metro::convert {

struct SpPiece {
  std::string text;
  float score = 0.0f;
  int32_t type = 1;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
};

struct SpModel {
  std::vector<SpPiece> pieces;
  // TrainerSpec
  int32_t model_type = 1;  // 1 unigram, 2 BPE, 3 word, 4 char
  bool byte_fallback = false;
  bool whitespace_as_suffix = false;
  int32_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  // NormalizerSpec
  std::string normalizer;  // the rule's name ("identity", "nmt_nfkc", ...)
  bool has_charsmap = false;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// At most this many pieces (the vocabulary's limit).
Expected<SpModel> parse_sentencepiece_model(std::string_view bytes);

}  // namespace metro::convert
