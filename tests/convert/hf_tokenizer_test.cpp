// Hugging Face tokenizer.json -> GGUF tokenizer metadata (convert/hf_tokenizer.h): the
// all-MiniLM-L6-v2 tokenizer written, loaded by metro's tokenizer and checked id for id
// against Hugging Face tokenizers (tests/fixtures/tokenizer/minilm_wordpiece.json, made by
// scripts/make_wordpiece_fixture.py); and the refusals of tokenizers metro cannot reproduce
// or files that are malformed.
#include <gtest/gtest.h>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "convert/hf_tokenizer.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace metro {
namespace {

using convert::HfTokenizerFiles;
using convert::TokenizerInfo;
using nlohmann::json;
using testing::escaped;
using testing::ids_string;

struct Converted {
  TokenizerInfo info;
  std::vector<uint8_t> gguf;
};

// The MiniLM tokenizer through a GGUF file on disk, as `metro convert` would write it.
const tokenizer::Tokenizer& minilm_tokenizer(TokenizerInfo* info_out = nullptr) {
  static TokenizerInfo info;
  static const tokenizer::Tokenizer tok = [] {
    gguf::Writer w;
    w.add_string("general.architecture", "bert");
    const Status st = convert::write_hf_tokenizer(testing::minilm_dir(), w, &info);
    if (!st.ok()) throw std::runtime_error(st.message());
    testing::TempFile file;
    if (!w.write(file.path()).ok()) throw std::runtime_error("cannot write " + file.path());
    auto f = gguf::File::open(file.path());
    if (!f.ok()) throw std::runtime_error(f.status().message());
    auto t = tokenizer::Tokenizer::from_gguf(*f);
    if (!t.ok()) throw std::runtime_error(t.status().message());
    return *t;
  }();
  if (info_out != nullptr) *info_out = info;
  return tok;
}

json load_fixture() {
  std::ifstream f(testing::source_path("tests/fixtures/tokenizer/minilm_wordpiece.json"));
  if (!f) throw std::runtime_error("missing fixture minilm_wordpiece.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

TEST(HfTokenizer, MiniLmMatchesHuggingFace) {
  REQUIRE_MINILM();
  const auto& tok = minilm_tokenizer();
  const json fx = load_fixture();
  size_t matched = 0;
  for (const json& c : fx["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    // Hugging Face matches special-token text always and adds [CLS] ... [SEP] by default.
    const auto got = tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
    if (got == want) {
      ++matched;
    } else {
      ADD_FAILURE() << "text " << escaped(text) << "\n  HF:    " << ids_string(want)
                    << "\n  metro: " << ids_string(got);
    }
    if (want.size() >= 2) {
      EXPECT_EQ(tok.encode(text, false, true), std::vector<int32_t>(want.begin() + 1, want.end() - 1))
          << escaped(text);
    }
  }
  EXPECT_GE(fx["cases"].size(), 80u);
  EXPECT_EQ(matched, fx["cases"].size());
}

TEST(HfTokenizer, MiniLmMetadata) {
  REQUIRE_MINILM();
  TokenizerInfo info;
  const auto& tok = minilm_tokenizer(&info);
  EXPECT_EQ(info.n_vocab, 30522);
  EXPECT_EQ(tok.n_vocab(), 30522);
  EXPECT_EQ(info.unk_id, 100);
  EXPECT_EQ(info.cls_id, 101);
  EXPECT_EQ(info.sep_id, 102);
  EXPECT_EQ(info.pad_id, 0);
  EXPECT_EQ(info.mask_id, 103);
  EXPECT_EQ(info.first_id, 101);
  EXPECT_EQ(info.last_id, 102);
  EXPECT_EQ(info.token_type_count, 2u);
  EXPECT_EQ(tok.kind(), tokenizer::VocabKind::kWpm);
  EXPECT_TRUE(tok.warnings().empty()) << tok.warnings().front();
  // The file asks for padding and truncation to 128 tokens; both are reported, not applied.
  EXPECT_EQ(info.warnings.size(), 2u);

  const tokenizer::Vocab& v = tok.vocab();
  EXPECT_EQ(v.token(101).text, "[CLS]");
  EXPECT_EQ(v.token(7592).text, "\xE2\x96\x81hello");
  EXPECT_EQ(v.token(1).text, "\xE2\x96\x81[unused0]");
  EXPECT_EQ(v.find("ing"), 2075);  // "##ing"
  EXPECT_TRUE(tok.is_control(101));
  EXPECT_TRUE(tok.is_control(100));
  EXPECT_FALSE(tok.is_control(7592));
  EXPECT_EQ(tok.bos_id(), 101);
  EXPECT_EQ(tok.unk_id(), 100);
  EXPECT_EQ(v.sep_id(), 102);
  EXPECT_EQ(tok.encode("", true, true), (std::vector<int32_t>{101, 102}));
}

TEST(HfTokenizer, MiniLmDecode) {
  REQUIRE_MINILM();
  const auto& tok = minilm_tokenizer();
  const auto ids = tok.encode("Hello, unaffable World!", true, true);
  EXPECT_EQ(tok.decode(ids), "hello , unaffable world !");
  tokenizer::DecodeOptions render;
  render.render_special = true;
  EXPECT_EQ(tok.decode(ids, render), "[CLS] hello , unaffable world ! [SEP]");
  EXPECT_EQ(tok.decode(tok.encode("Caf\xC3\xA9 \xE6\x9D\xB1\xE4\xBA\xAC", false, true)),
            "cafe \xE6\x9D\xB1 \xE4\xBA\xAC");
  EXPECT_EQ(tok.decode(tok.encode("xyzzyq", false, true)), "xyzzyq");  // xy ##zz ##y ##q
  EXPECT_EQ(tok.decode(tok.encode(std::string(101, 'a') + " b", false, true), render), "[UNK] b");
  // Decoding and re-encoding a decoded text gives the same ids.
  const auto again = tok.encode(tok.decode(ids, render), false, true);
  EXPECT_EQ(again, ids);
}

TEST(HfTokenizer, WritesNothingOnError) {
  gguf::Writer w;
  const size_t empty_size = w.serialize().size();
  HfTokenizerFiles files;
  files.tokenizer_json = R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})";
  EXPECT_FALSE(convert::write_hf_tokenizer(files, w).ok());
  EXPECT_EQ(w.serialize().size(), empty_size);
}

// A small valid WordPiece tokenizer.json, as Hugging Face writes BERT's.
json small_tokenizer() {
  json vocab = json::object();
  int id = 0;
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "!"}) {
    vocab[t] = id++;
  }
  json added = json::array();
  const char* specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (int i = 0; i < 5; ++i) {
    added.push_back({{"id", i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
                      {"strip_accents", nullptr}, {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}})},
        {"special_tokens",
         {{"[CLS]", {{"id", "[CLS]"}, {"ids", {2}}, {"tokens", {"[CLS]"}}}},
          {"[SEP]", {{"id", "[SEP]"}, {"ids", {3}}, {"tokens", {"[SEP]"}}}}}}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
                 {"max_input_chars_per_word", 100}, {"vocab", vocab}}}};
}

Status convert_json(const json& j, TokenizerInfo* info = nullptr, gguf::Writer* out = nullptr) {
  HfTokenizerFiles files;
  files.tokenizer_json = j.dump();
  gguf::Writer w;
  return convert::write_hf_tokenizer(files, out != nullptr ? *out : w, info);
}

TEST(HfTokenizer, SmallTokenizerRoundTrip) {
  TokenizerInfo info;
  gguf::Writer w;
  ASSERT_TRUE(convert_json(small_tokenizer(), &info, &w).ok());
  EXPECT_EQ(info.n_vocab, 9);
  EXPECT_EQ(info.first_id, 2);
  EXPECT_EQ(info.last_id, 3);
  EXPECT_TRUE(info.warnings.empty());
  auto tok = testing::tokenizer_from(w.serialize());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->encode("Hello worlds!", true, true), (std::vector<int32_t>{2, 5, 6, 7, 8, 3}));

  // Without a post-processor nothing is added around a text.
  json j = small_tokenizer();
  j["post_processor"] = nullptr;
  gguf::Writer w2;
  ASSERT_TRUE(convert_json(j, &info, &w2).ok());
  EXPECT_EQ(info.first_id, -1);
  auto plain = testing::tokenizer_from(w2.serialize());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->encode("hello", true, true), (std::vector<int32_t>{5}));

  // Older files: BertProcessing; ids beyond the vocabulary filled with unused tokens.
  j = small_tokenizer();
  j["post_processor"] = {{"type", "BertProcessing"}, {"sep", {"[SEP]", 3}}, {"cls", {"[CLS]", 2}}};
  j["model"]["vocab"]["later"] = 12;
  ASSERT_TRUE(convert_json(j, &info).ok());
  EXPECT_EQ(info.n_vocab, 13);
  EXPECT_EQ(info.first_id, 2);
  EXPECT_EQ(info.last_id, 3);
}

TEST(HfTokenizer, SpecialNamesFromConfigFiles) {
  HfTokenizerFiles files;
  json j = small_tokenizer();
  j["model"]["vocab"]["<mask>"] = 9;
  files.tokenizer_json = j.dump();
  files.tokenizer_config_json = R"({"mask_token": {"content": "<mask>", "lstrip": true}})";
  files.special_tokens_map_json = R"({"mask_token": "[MASK]", "sep_token": "[PAD]"})";
  gguf::Writer w;
  TokenizerInfo info;
  ASSERT_TRUE(convert::write_hf_tokenizer(files, w, &info).ok());
  EXPECT_EQ(info.mask_id, 9);  // tokenizer_config.json first
  EXPECT_EQ(info.sep_id, 0);   // then special_tokens_map.json
  EXPECT_EQ(info.cls_id, 2);   // then the usual name
}

// A byte-level BPE written by hand in the older spellings: merges as "a b" strings, the
// EOS named by config.json's id list, named chat templates, rows of config.json's
// vocab_size past the tokens. (tests/convert/convert_decoder_test.cpp checks whole
// tokenizers trained by Hugging Face's library.)
TEST(HfTokenizer, ByteLevelBpeInOlderSpellings) {
  json j = {{"version", "1.0"},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
            {"added_tokens", json::array({{{"id", 6}, {"content", "<|end|>"}, {"special", true}}})},
            {"model",
             {{"type", "BPE"},
              {"vocab", {{"h", 0}, {"i", 1}, {"\xC4\xA0", 2}, {"hi", 3}, {"\xC4\xA0h", 4}, {"\xC4\xA0hi", 5}}},
              {"merges", json::array({"\xC4\xA0 h", "h i", "\xC4\xA0h i"})}}}};
  HfTokenizerFiles files;
  files.tokenizer_json = j.dump();
  files.config_json = R"({"vocab_size": 10, "eos_token_id": [6, 3]})";
  files.tokenizer_config_json =
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  gguf::Writer w;
  TokenizerInfo info;
  const Status st = convert::write_hf_tokenizer(files, w, &info);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(info.pre, "gpt-2");
  EXPECT_EQ(info.n_merges, 3);
  EXPECT_EQ(info.n_vocab, 10);
  EXPECT_EQ(info.eos_id, 6);
  EXPECT_EQ(info.bos_id, -1);
  const auto bytes = w.serialize();
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  auto tmpl = f->get_string("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(*tmpl, "D");
  auto tok = testing::tokenizer_from(bytes);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->n_vocab(), 10);
  EXPECT_EQ(tok->encode("hi hi<|end|>", true, true), (std::vector<int32_t>{3, 5, 6}));
  // A merge of tokens the vocabulary lacks, and a space inside a pair's part.
  j["model"]["merges"].push_back("x y");
  files.tokenizer_json = j.dump();
  EXPECT_FALSE(convert::write_hf_tokenizer(files, w).ok());
  j["model"]["merges"].back() = json::array({"h i", "i"});
  files.tokenizer_json = j.dump();
  const Status sp = convert::write_hf_tokenizer(files, w);
  EXPECT_NE(sp.message().find("space inside"), std::string::npos) << sp.message();
}

// A SentencePiece ModelProto written here field by field.
std::string pb_varint(uint64_t v) {
  std::string out;
  do {
    out.push_back(static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return out;
}
std::string pb_len(uint32_t field, const std::string& bytes) {
  return pb_varint(field << 3 | 2) + pb_varint(bytes.size()) + bytes;
}
std::string pb_int(uint32_t field, int64_t v) { return pb_varint(field << 3) + pb_varint(static_cast<uint64_t>(v)); }
std::string pb_piece(const std::string& text, float score, int type) {
  std::string f(4, '\0');
  std::memcpy(f.data(), &score, 4);
  return pb_len(1, pb_len(1, text) + pb_varint(2 << 3 | 5) + f + pb_int(3, type));
}

std::string sp_model_bytes(int model_type, const std::string& normalizer, bool dummy_prefix) {
  std::string m;
  m += pb_piece("<unk>", 0, 2);
  m += pb_piece("<s>", 0, 3);
  m += pb_piece("</s>", 0, 3);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    m += pb_piece(name, 0, 6);
  }
  const char* pieces[] = {"\xE2\x96\x81h", "\xE2\x96\x81hi", "h", "i", "\xE2\x96\x81"};
  const float scores[] = {-1, -2, -3, -4, -5};
  for (int i = 0; i < 5; ++i) m += pb_piece(pieces[i], scores[i], 1);
  m += pb_len(2, pb_int(3, model_type) + pb_int(35, 1) + pb_int(40, 0) + pb_int(41, 1) + pb_int(42, 2) +
                     pb_int(43, -1));
  m += pb_len(3, pb_len(1, normalizer) + pb_int(3, dummy_prefix ? 1 : 0) + pb_int(4, 0));
  return m;
}

TEST(HfTokenizer, SentencePieceModelFile) {
  HfTokenizerFiles files;
  files.sentencepiece_model = sp_model_bytes(2, "identity", true);
  gguf::Writer w;
  TokenizerInfo info;
  const Status st = convert::write_hf_tokenizer(files, w, &info);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(info.sentencepiece);
  EXPECT_EQ(info.n_vocab, 3 + 256 + 5);
  EXPECT_EQ(info.bos_id, 1);
  EXPECT_EQ(info.unk_id, 0);
  const auto bytes = w.serialize();
  auto tok = testing::tokenizer_from(bytes);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // A space before the text, "hi" from the pieces, "!" through its byte.
  EXPECT_EQ(tok->encode("hi!", true, false), (std::vector<int32_t>{1, 260, 33 + 3}));
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  auto types = f->get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_EQ((*types)[0], 2);    // unknown
  EXPECT_EQ((*types)[3], 6);    // byte
  EXPECT_EQ((*types)[259], 1);  // normal

  auto refused = [&](const std::string& model, const char* needle) {
    HfTokenizerFiles bad;
    bad.sentencepiece_model = model;
    gguf::Writer bw;
    const Status s = convert::write_hf_tokenizer(bad, bw);
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  refused(sp_model_bytes(1, "identity", true), "unigram");
  refused(sp_model_bytes(2, "nmt_nfkc", true), "'nmt_nfkc'");
  refused(pb_varint(9 << 3 | 3), "wire type 3");
  refused(std::string("\x0a\xff\xff\xff\xff\x0f", 6), "runs past the end");
  // Every prefix of a good file parses or is refused; none is read past its end.
  const std::string good = *files.sentencepiece_model;
  for (size_t n = 0; n < good.size(); n += 7) {
    HfTokenizerFiles cut;
    cut.sentencepiece_model = good.substr(0, n);
    gguf::Writer cw;
    (void)convert::write_hf_tokenizer(cut, cw);
  }
}

struct Refusal {
  const char* name;
  void (*edit)(json&);
  ErrorCode code;
  const char* message;  // a piece of the error message
};

const Refusal kRefusals[] = {
    {"bpe_with_wordpiece_prefix", [](json& j) { j["model"]["type"] = "BPE"; }, ErrorCode::kUnimplemented,
     "BPE continuing_subword_prefix is set"},
    {"bpe_without_byte_level",
     [](json& j) {
       j["model"] = {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", json::array()}};
       j.erase("normalizer");
     },
     ErrorCode::kUnimplemented, "is not one metro reproduces"},
    {"unigram", [](json& j) { j["model"]["type"] = "Unigram"; }, ErrorCode::kUnimplemented,
     "byte-level BPE tokenizers and SentencePiece BPE models (tokenizer.model); this one is 'Unigram'"},
    {"no_model", [](json& j) { j.erase("model"); }, ErrorCode::kInvalidArgument, "no 'model' object"},
    {"cased", [](json& j) { j["normalizer"]["lowercase"] = false; }, ErrorCode::kUnimplemented,
     "lowercase=false"},
    {"accents_kept", [](json& j) { j["normalizer"]["strip_accents"] = false; }, ErrorCode::kUnimplemented,
     "strip_accents=false"},
    {"other_normalizer", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, ErrorCode::kUnimplemented,
     "'NFKC'"},
    {"no_normalizer", [](json& j) { j["normalizer"] = nullptr; }, ErrorCode::kUnimplemented, "no normalizer"},
    {"whitespace_pre", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; },
     ErrorCode::kUnimplemented, "'Whitespace'"},
    {"long_words", [](json& j) { j["model"]["max_input_chars_per_word"] = 200; }, ErrorCode::kUnimplemented,
     "max_input_chars_per_word is 200"},
    {"vocab_not_object", [](json& j) { j["model"]["vocab"] = json::array({"a"}); },
     ErrorCode::kInvalidArgument, "model.vocab is not an object"},
    {"vocab_empty", [](json& j) { j["model"]["vocab"] = json::object(); }, ErrorCode::kInvalidArgument,
     "model.vocab is empty"},
    {"id_not_integer", [](json& j) { j["model"]["vocab"]["hello"] = "5"; }, ErrorCode::kInvalidArgument,
     "is not an integer"},
    {"id_shared", [](json& j) { j["model"]["vocab"]["hello"] = 6; }, ErrorCode::kInvalidArgument, "share id 6"},
    {"id_negative", [](json& j) { j["model"]["vocab"]["hello"] = -3; }, ErrorCode::kInvalidArgument,
     "has id -3"},
    {"ids_sparse", [](json& j) { j["model"]["vocab"]["hello"] = 1 << 22; }, ErrorCode::kInvalidArgument,
     "ids run up to 4194304"},
    {"token_too_long", [](json& j) { j["model"]["vocab"][std::string(5000, 'a')] = 9; },
     ErrorCode::kInvalidArgument, "bytes long"},
    {"unk_missing", [](json& j) { j["model"]["unk_token"] = "<unk>"; }, ErrorCode::kInvalidArgument,
     "unknown token '<unk>' is not in the vocabulary"},
    {"added_bad", [](json& j) { j["added_tokens"].push_back({{"id", "x"}}); }, ErrorCode::kInvalidArgument,
     "added_tokens"},
    {"added_far", [](json& j) { j["added_tokens"].push_back({{"id", 1 << 23}, {"content", "<x>"}}); },
     ErrorCode::kInvalidArgument, "leaves most ids below it unused"},
    {"template_two_before",
     [](json& j) {
       auto& single = j["post_processor"]["single"];
       single.insert(single.begin(), single[0]);
     },
     ErrorCode::kUnimplemented, "at most one token before a text"},
    {"template_multi_id",
     [](json& j) { j["post_processor"]["special_tokens"]["[CLS]"]["ids"] = {2, 3}; },
     ErrorCode::kUnimplemented, "exactly one id"},
    {"template_id_out_of_range",
     [](json& j) { j["post_processor"]["special_tokens"]["[SEP]"]["ids"] = {99}; },
     ErrorCode::kInvalidArgument, "outside the vocabulary"},
    {"other_post_processor", [](json& j) { j["post_processor"] = {{"type", "Mystery"}}; },
     ErrorCode::kUnimplemented, "'Mystery'"},
};

TEST(HfTokenizer, RefusesWhatMetroCannotReproduce) {
  for (const Refusal& r : kRefusals) {
    json j = small_tokenizer();
    r.edit(j);
    const Status st = convert_json(j);
    ASSERT_FALSE(st.ok()) << r.name;
    EXPECT_EQ(st.code(), r.code) << r.name << ": " << st.message();
    EXPECT_NE(st.message().find(r.message), std::string::npos) << r.name << ": " << st.message();
  }
}

TEST(HfTokenizer, RefusesMalformedFiles) {
  HfTokenizerFiles files;
  gguf::Writer w;
  for (const char* text : {"", "{", "[1, 2]", "null", "{\"model\": 5}", "\xFF\xFE"}) {
    files.tokenizer_json = text;
    const Status st = convert::write_hf_tokenizer(files, w);
    EXPECT_FALSE(st.ok()) << escaped(text);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << escaped(text) << ": " << st.message();
  }
  files.tokenizer_json = std::string(100000, '[') + std::string(100000, ']');
  Status st = convert::write_hf_tokenizer(files, w);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("nested deeper"), std::string::npos) << st.message();

  files.tokenizer_json = small_tokenizer().dump();
  files.tokenizer_config_json = "{not json";
  st = convert::write_hf_tokenizer(files, w);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tokenizer_config.json"), std::string::npos) << st.message();
}

TEST(HfTokenizer, MissingFiles) {
  gguf::Writer w;
  Status st = convert::write_hf_tokenizer(std::string("/nonexistent/dir"), w);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_NE(st.message().find("tokenizer.json is missing"), std::string::npos) << st.message();

  // A slow tokenizer's directory: vocab.txt only.
  testing::TempFile dir("_hf");
  std::filesystem::create_directory(dir.path());
  std::ofstream(dir.path() + "/vocab.txt") << "[PAD]\n[UNK]\n";
  st = convert::write_hf_tokenizer(dir.path(), w);
  std::filesystem::remove_all(dir.path());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_NE(st.message().find("vocab.txt but no tokenizer.json"), std::string::npos) << st.message();
}

// Byte flips and cuts of a valid file: an error or a tokenizer, never a crash.
TEST(HfTokenizer, SurvivesDamagedFiles) {
  const std::string good = small_tokenizer().dump();
  std::mt19937 rng(7);
  size_t accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0: text[at] = static_cast<char>(rng() % 256); break;
        case 1: text.erase(at, 1 + rng() % 8); break;
        default: text.insert(at, 1, "{}[]\",:0-9e\\"[rng() % 12]); break;
      }
      if (text.empty()) text = "{";
    }
    HfTokenizerFiles files;
    files.tokenizer_json = text;
    gguf::Writer w;
    if (!convert::write_hf_tokenizer(files, w).ok()) continue;
    ++accepted;
    auto tok = testing::tokenizer_from(w.serialize());
    if (!tok.ok()) continue;
    for (int32_t id : tok->encode("Hello [CLS] worlds!", true, true)) EXPECT_TRUE(tok->valid_id(id));
  }
  EXPECT_GT(accepted, 0u);
}

}  // namespace
}  // namespace metro
