// libFuzzer target: the tokenizer on any bytes. No crash, no out-of-range id, no leak, and
// the invariants that must hold for every input:
//   - byte-level BPE with all 256 byte tokens: decode(encode(x)) == x, for any bytes;
//   - SentencePiece: the same up to spaces written as U+2581 next to broken UTF-8;
//   - WordPiece (normalizing, so no round trip): encoding the decoded text, special tokens
//     shown and parsed, gives the same ids again;
//   - streaming equals decoding with ill-formed bytes replaced, in valid UTF-8 chunks.
// Input: a flags byte, then text. Inputs that start with "GGUF" are vocabulary files
// instead: loading must fail cleanly or give a tokenizer that survives the same checks.
// Inputs that start with '{' are Hugging Face tokenizer.json files: converting must fail
// cleanly or give metadata that loads and survives them too. Inputs that start with "SPM:"
// are SentencePiece tokenizer.model files after it, converted alike.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/log.h"
#include "convert/hf_tokenizer.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "tokenizer/spm.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using metro::tokenizer::Tokenizer;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzz: invariant broken: %s\n", what);
    __builtin_trap();
  }
}

Tokenizer load(const std::vector<uint8_t>& bytes) {
  auto f = metro::gguf::File::parse(bytes);
  require(f.ok(), "seed vocabulary parses");
  auto t = Tokenizer::from_gguf(*f);
  require(t.ok(), "seed vocabulary loads");
  return *t;
}

// A byte-level BPE vocabulary with every byte, some English merges, and special tokens.
std::vector<uint8_t> bpe_vocab(const char* pre) {
  metro::tokenizer::ByteLevelMap map;
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(map.encode(static_cast<uint8_t>(b)));
    types.push_back(1);
  }
  const char* pairs[][2] = {{" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {" ", "a"},
                            {"e", "r"}, {"o", "n"}, {" a", "n"}, {"an", "d"}, {"in", "g"},
                            {"\xC3", "\xA9"}, {" ", " "}, {"  ", "  "}, {"\n", "\n"}};
  for (const auto& p : pairs) {
    const std::string a = metro::tokenizer::byte_level_encode(map, p[0]);
    const std::string b = metro::tokenizer::byte_level_encode(map, p[1]);
    merges.push_back(a + " " + b);
    tokens.push_back(a + b);
    types.push_back(1);
  }
  for (const char* s : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}) {
    tokens.emplace_back(s);
    types.push_back(3);
  }
  tokens.emplace_back("<tool>");
  types.push_back(4);
  metro::gguf::Writer w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", merges);
  w.add_u32("tokenizer.ggml.bos_token_id", 270);
  w.add_u32("tokenizer.ggml.eos_token_id", 271);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  return w.serialize();
}

std::vector<uint8_t> spm_vocab() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.emplace_back(buf);
    types.push_back(6);
    scores.push_back(0);
  }
  const std::string sp = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  const std::vector<std::string> pieces = {sp, sp + "t", "he", sp + "the", "in", "ing", sp + "a",
                                           "an", sp + "an", "d", sp + "and", "e", "t", "h", "a",
                                           "n", "i", "g", sp + sp, "\xC3\xA9", "\xE5\xAE\xB6"};
  for (size_t i = 0; i < pieces.size(); ++i) {
    tokens.emplace_back(pieces[i]);
    types.push_back(1);
    scores.push_back(-static_cast<float>(i));
  }
  tokens.emplace_back("<|im_start|>");
  types.push_back(3);
  scores.push_back(0);
  tokens.emplace_back("<tool>");
  types.push_back(4);
  scores.push_back(0);
  metro::gguf::Writer w;
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  return w.serialize();
}

// A WordPiece vocabulary in llama.cpp's spelling: every lowercase letter and digit as a
// word start and a continuation, a few whole words, punctuation, CJK, Cyrillic, Greek.
std::vector<uint8_t> wpm_vocab() {
  const std::string ws = "\xE2\x96\x81";  // U+2581
  std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  std::vector<int32_t> types = {3, 3, 3, 3, 3};
  auto add = [&](std::string t) {
    tokens.push_back(std::move(t));
    types.push_back(1);
  };
  for (char c = 'a'; c <= 'z'; ++c) {
    add(ws + c);
    add(std::string(1, c));
  }
  for (char c = '0'; c <= '9'; ++c) add(ws + c);
  for (const char* w : {"the", "and", "hello", "world", ",", ".", "!", "?", "'", "-", "[", "]",
                        "\xE4\xB8\xAD", "\xE6\x96\x87", "\xD0\xB6", "\xCE\xB1"}) {
    add(ws + w);
  }
  for (const char* w : {"ing", "ed", "es", "\xD0\xB8"}) add(w);
  metro::gguf::Writer w;
  w.add_string("tokenizer.ggml.model", "bert");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.unknown_token_id", 1);
  w.add_u32("tokenizer.ggml.cls_token_id", 2);
  w.add_u32("tokenizer.ggml.seperator_token_id", 3);
  return w.serialize();
}

struct Tokenizers {
  std::vector<Tokenizer> all;
  Tokenizers() {
    metro::set_log_level(metro::LogLevel::kError);
    for (const char* pre : {"gpt-2", "smollm", "llama-bpe", "qwen2", "default", "deepseek-llm",
                            "deepseek-v3", "tekken", "gpt-4o", "falcon", "poro-chat"}) {
      all.push_back(load(bpe_vocab(pre)));
    }
    all.push_back(load(spm_vocab()));
    all.push_back(load(wpm_vocab()));
  }
};

void check(const Tokenizer& tok, std::string_view text, uint8_t flags, bool exact) {
  const bool add_special = flags & 1;
  const bool parse_special = flags & 2;
  metro::tokenizer::DecodeOptions opt;
  opt.render_special = flags & 4;
  opt.strip_leading_space = !(flags & 8);

  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids) require(tok.valid_id(id), "encode returns ids in the vocabulary");
  const std::string back = tok.decode(ids, opt);

  if (exact && !parse_special && !add_special && opt.strip_leading_space) {
    if (tok.kind() == metro::tokenizer::VocabKind::kBpe) {
      require(back == text, "byte-level BPE round trip");
    } else if (tok.kind() == metro::tokenizer::VocabKind::kSpm) {
      require(metro::tokenizer::spm_escape_spaces(back) == metro::tokenizer::spm_escape_spaces(text),
              "SentencePiece round trip");
    }
  }
  if (exact && tok.kind() == metro::tokenizer::VocabKind::kWpm) {
    metro::tokenizer::DecodeOptions shown;
    shown.render_special = true;
    require(tok.encode(tok.decode(ids, shown), false, true) == ids, "WordPiece re-encoding");
  }

  metro::tokenizer::IncrementalDetokenizer detok(tok, opt);
  std::string streamed;
  for (int32_t id : ids) {
    std::string chunk = detok.push(id);
    require(metro::tokenizer::is_valid_utf8(chunk), "streamed chunks are valid UTF-8");
    streamed += chunk;
  }
  streamed += detok.flush();
  require(streamed == metro::tokenizer::to_valid_utf8(back), "streaming equals decoding");

  // The same bytes read as token ids, most of them out of range.
  std::vector<int32_t> wild(text.size() / 4);
  for (size_t i = 0; i < wild.size(); ++i) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(static_cast<uint8_t>(text[i * 4 + k])) << (8 * k);
    wild[i] = static_cast<int32_t>(v % 1024) - 8;
  }
  const std::string wild_text = tok.decode(wild, opt);
  metro::tokenizer::IncrementalDetokenizer d2(tok, opt);
  std::string s2;
  for (int32_t id : wild) s2 += d2.push(id);
  s2 += d2.flush();
  require(s2 == metro::tokenizer::to_valid_utf8(wild_text), "streaming random ids");
}

void fuzz_vocab_file(const uint8_t* data, size_t size) {
  auto f = metro::gguf::File::parse(std::span<const uint8_t>(data, size));
  if (!f.ok()) return;
  auto tok = Tokenizer::from_gguf(*f);
  if (!tok.ok()) return;
  for (std::string_view text : {"Hello world, it's 12345!", "<s><|im_start|>x\xFF\xC3", "  \n\t"}) {
    check(*tok, text, 3, false);
    check(*tok, text, 4, false);
  }
}

// Converts `files`; a conversion that succeeds must load and survive the checks.
void fuzz_conversion(const metro::convert::HfTokenizerFiles& files) {
  metro::gguf::Writer w;
  if (!metro::convert::write_hf_tokenizer(files, w).ok()) return;
  const std::vector<uint8_t> bytes = w.serialize();
  auto f = metro::gguf::File::parse(bytes);
  require(f.ok(), "converted tokenizer parses");
  auto tok = Tokenizer::from_gguf(*f);
  require(tok.ok(), "converted tokenizer loads");
  for (std::string_view text : {"Hello [CLS] World, it's 12345!", "caf\xC3\xA9 \xE4\xB8\xAD\xFF\xC3", "  \n\t"}) {
    check(*tok, text, 3, false);
    check(*tok, text, 4, false);
  }
}

void fuzz_tokenizer_json(const uint8_t* data, size_t size) {
  metro::convert::HfTokenizerFiles files;
  files.tokenizer_json.assign(reinterpret_cast<const char*>(data), size);
  fuzz_conversion(files);
}

void fuzz_sentencepiece_model(const uint8_t* data, size_t size) {
  metro::convert::HfTokenizerFiles files;
  files.sentencepiece_model.emplace(reinterpret_cast<const char*>(data), size);
  fuzz_conversion(files);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 4 && data[0] == 'G' && data[1] == 'G' && data[2] == 'U' && data[3] == 'F') {
    fuzz_vocab_file(data, size);
    return 0;
  }
  if (size >= 4 && data[0] == 'S' && data[1] == 'P' && data[2] == 'M' && data[3] == ':') {
    fuzz_sentencepiece_model(data + 4, size - 4);
    return 0;
  }
  if (size >= 1 && data[0] == '{') {
    fuzz_tokenizer_json(data, size);
    return 0;
  }
  static const Tokenizers tokenizers;
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& tok = tokenizers.all[(flags >> 4) % tokenizers.all.size()];
  check(tok, text, flags, true);
  return 0;
}
