// BERT's text normalization and word splitting, as Hugging Face tokenizers does them for
// uncased BERT vocabularies: BertNormalizer(clean_text, handle_chinese_chars, lowercase,
// accents stripped) followed by BertPreTokenizer.
//
// Per code point of the input: NUL, U+FFFD and "other" characters (control, format, private
// use) are dropped; whitespace (tab, newline and carriage return included) breaks words;
// a CJK ideograph is a word of its own; everything else is decomposed (NFD), stripped of
// nonspacing marks and lowercased, and a punctuation character in the result (ASCII
// punctuation or Unicode P*) is a word of its own. The data comes from the reference
// implementation itself, per code point (scripts/gen_unicode_tables.py), because it mixes
// Unicode versions: Unicode 8.0 categories, newer case mappings and decompositions.
//
// Differences from the reference, both out of reach of valid text in practice:
//   - NFD's canonical reordering is not done. It matters only when two combining marks that
//     survive stripping (spacing marks with a nonzero combining class, marks newer than
//     Unicode 8.0) stand next to each other out of order.
//   - Invalid UTF-8, which the reference cannot receive: each maximal ill-formed subpart is
//     read as U+FFFD and so dropped.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace metro::tokenizer {

// A word of BertWords::text.
struct BertWord {
  size_t offset;   // bytes
  size_t length;   // bytes, > 0
  size_t n_chars;  // code points (WordPiece's length limit counts these)
};

// Scratch and result of bert_split_words; reuse one across calls to keep its capacity.
struct BertWords {
  std::string text;             // the normalized words, back to back, as UTF-8
  std::vector<BertWord> words;  // in order
};

// Normalizes `text` (any bytes) and cuts it into words, replacing `out`.
void bert_split_words(std::string_view text, BertWords& out);

// The normalizer alone, as the reference's normalize_str gives it: dropped characters gone,
// each whitespace character a space, CJK ideographs with a space either side.
std::string bert_normalize(std::string_view text);

}  // namespace metro::tokenizer
