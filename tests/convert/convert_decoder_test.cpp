// `metro convert` of tiny Hugging Face checkpoints (tests/fixtures/hf_checkpoints, made by
// make_fixture.py there, tokenizers trained by Hugging Face's `tokenizers` or by
// `sentencepiece`): llama (byte-level BPE and SentencePiece), gemma3, qwen2, qwen3 and the
// qwen3_moe and mixtral mixtures of experts convert to GGUFs whose tokenizer gives the reference tokenizer's ids and whose
// model computes the logits of a float64 forward pass written from the Hugging Face
// definitions, and of llama.cpp on the same conversion; a nomic-bert encoder gives their
// embeddings. Block formats load and stay close; unsupported tokenizers and checkpoints
// are refused with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "support/model_run.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace metro::convert {
namespace {

using nlohmann::json;
using Rows = std::vector<std::vector<float>>;
namespace fs = std::filesystem;

const json& references() {
  static const json j = [] {
    std::ifstream in(metro::testing::source_path("tests/fixtures/hf_checkpoints/references.json"));
    return json::parse(in);
  }();
  return j;
}

const json& case_named(const std::string& dir) {
  for (const json& c : references()["cases"]) {
    if (c["dir"] == dir) return c;
  }
  ADD_FAILURE() << "no fixture " << dir;
  return references()["cases"][0];
}

std::string case_dir(const json& c) {
  return metro::testing::source_path("tests/fixtures/hf_checkpoints/" + c["dir"].get<std::string>());
}

// The rows of `all` (every position) at the fixture's positions.
Rows at_positions(const Rows& all, const json& c) {
  Rows out;
  for (int p : c["positions"].get<std::vector<int>>()) out.push_back(all.at(static_cast<size_t>(p)));
  return out;
}

struct Converted {
  std::vector<uint8_t> bytes;
  ConvertReport report;
};

Converted convert_or_die(const std::string& dir, kernels::DType type) {
  ConvertOptions opts;
  opts.type = type;
  Converted c;
  auto bytes = convert_hf(dir, opts, &c.report);
  EXPECT_TRUE(bytes.ok()) << dir << ": " << bytes.status().message();
  if (bytes.ok()) c.bytes = std::move(*bytes);
  return c;
}

Rows logits_of(const std::vector<uint8_t>& bytes, const json& c) {
  auto f = gguf::File::parse(bytes);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return {};
  auto m = model::Model::from_file(std::move(*f));
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return {};
  return at_positions(metro::testing::sequence_logits(**m, c["prompt_ids"].get<std::vector<int32_t>>(), 16), c);
}

TEST(ConvertDecoder, TokenizersGiveHuggingFacesIdsAndLlamaCppsToo) {
  for (const json& c : references()["cases"]) {
    SCOPED_TRACE(c["dir"].get<std::string>());
    const Converted conv = convert_or_die(case_dir(c), kernels::DType::kF32);
    auto f = gguf::File::parse(conv.bytes);
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto tok = tokenizer::Tokenizer::from_gguf(*f);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ(tok->n_vocab(), c["n_vocab"].get<int>());
    EXPECT_EQ(conv.report.n_vocab, c["n_vocab"].get<int>());
    ASSERT_TRUE(f->has("tokenizer.chat_template"));
    int same = 0;
    for (const json& t : c["texts"]) {
      const std::string text = t["text"].get<std::string>();
      const auto want = t["hf_ids"].get<std::vector<int32_t>>();
      const auto got = tok->encode(text, /*add_special=*/true, /*parse_special=*/true);
      EXPECT_EQ(got, want) << "text " << json(text).dump();
      ASSERT_TRUE(t.contains("llama_cpp_ids"));
      EXPECT_EQ(t["llama_cpp_ids"].get<std::vector<int32_t>>(), want);
      same += got == want;
      // And back: decoding gives the text (special tokens printed, after a BOS if added).
      tokenizer::DecodeOptions dopt;
      dopt.render_special = true;
      const std::string round = tok->decode(got, dopt);
      EXPECT_TRUE(round.size() >= text.size() && round.compare(round.size() - text.size(), text.size(), text) == 0)
          << json(round).dump() << " from " << json(text).dump();
    }
    std::printf("convert %s: %d of %zu texts tokenized as Hugging Face does\n", c["dir"].get<std::string>().c_str(),
                same, c["texts"].size());
  }
}

TEST(ConvertDecoder, ModelsComputeTheHuggingFaceForwardAndMatchLlamaCpp) {
  for (const json& c : references()["cases"]) {
    SCOPED_TRACE(c["dir"].get<std::string>());
    const Converted conv = convert_or_die(case_dir(c), kernels::DType::kF32);
    const Rows got = logits_of(conv.bytes, c);
    const Rows hf = c["hf_logits"].get<Rows>();
    ASSERT_EQ(got.size(), hf.size());
    const double d_hf = metro::testing::max_abs_diff(got, hf);
    ASSERT_TRUE(c.contains("llama_cpp_logits"));
    const double d_lc = metro::testing::max_abs_diff(got, c["llama_cpp_logits"].get<Rows>());
    // F32 weights; the KV cache in F16 and the summation order differ from the float64
    // reference. The logits spread over several units, so a wrong rotation order, scaling
    // or norm shows as differences of the order of 1.
    std::printf("convert %s: largest logit difference %.4f from the Hugging Face forward, %.4f from llama.cpp\n",
                c["dir"].get<std::string>().c_str(), d_hf, d_lc);
    EXPECT_LT(d_hf, 0.02);
    EXPECT_LT(d_lc, 0.02);
  }
}

TEST(ConvertDecoder, HalfAndBlockFormatsLoadAndStayClose) {
  const json& c = case_named("llama_tiny");
  const Rows hf = c["hf_logits"].get<Rows>();
  for (auto [type, bound] : {std::pair{kernels::DType::kF16, 0.05}, std::pair{kernels::DType::kBF16, 0.3},
                             std::pair{kernels::DType::kQ8_0, 0.3}}) {
    const Converted conv = convert_or_die(case_dir(c), type);
    auto f = gguf::File::parse(conv.bytes);
    ASSERT_TRUE(f.ok());
    const gguf::TensorInfo* q = f->find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type(), kernels::traits(type).ggml) << kernels::traits(type).name;
    const gguf::TensorInfo* n = f->find_tensor("blk.0.attn_norm.weight");
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->type(), kernels::traits(kernels::DType::kF32).ggml);
    const double d = metro::testing::max_abs_diff(logits_of(conv.bytes, c), hf);
    std::printf("convert %s as %s: largest logit difference %.4f\n", c["dir"].get<std::string>().c_str(),
                std::string(kernels::traits(type).name).c_str(), d);
    EXPECT_LT(d, bound) << kernels::traits(type).name;
  }
}

// A writable copy of a fixture directory, changed by the test.
class DirCopy {
 public:
  explicit DirCopy(const std::string& from) {
    metro::testing::TempFile t("");
    path_ = t.path() + ".d";
    fs::copy(from, path_, fs::copy_options::recursive);
  }
  ~DirCopy() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  json read(const std::string& name) const {
    std::ifstream in(path_ + "/" + name);
    return json::parse(in);
  }
  void write(const std::string& name, const json& j) const { std::ofstream(path_ + "/" + name) << j.dump(); }

 private:
  std::string path_;
};

std::string refusal(const std::string& dir) {
  auto r = convert_hf(dir, ConvertOptions{});
  return r.ok() ? std::string("(converted)") : std::string(r.status().message());
}

TEST(ConvertDecoder, RefusesWhatItWouldGetWrongAndSaysWhy) {
  const std::string llama = case_dir(case_named("llama_tiny")), qwen2 = case_dir(case_named("qwen2_tiny"));
  {
    DirCopy d(llama);  // SentencePiece-style BPE
    json t = d.read("tokenizer.json");
    t["model"]["byte_fallback"] = true;
    d.write("tokenizer.json", t);
    EXPECT_NE(refusal(d.path()).find("byte fallback"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(llama);  // a split pattern of another model
    json t = d.read("tokenizer.json");
    t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\p{L}+|\p{N}+)";
    d.write("tokenizer.json", t);
    EXPECT_NE(refusal(d.path()).find("split pattern"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(qwen2);  // Qwen2's split with ignore_merges, which metro does not pair
    json t = d.read("tokenizer.json");
    t["model"]["ignore_merges"] = true;
    d.write("tokenizer.json", t);
    EXPECT_NE(refusal(d.path()).find("ignore_merges"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(llama);  // a prefix space before every text
    json t = d.read("tokenizer.json");
    t["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
    d.write("tokenizer.json", t);
    EXPECT_NE(refusal(d.path()).find("add_prefix_space"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(llama);  // a merge of a token that does not exist
    json t = d.read("tokenizer.json");
    t["model"]["merges"].push_back(json::array({"\xC4\xA0zzzz", "q"}));
    d.write("tokenizer.json", t);
    EXPECT_NE(refusal(d.path()).find("lacks"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(llama);  // more heads than the weights have rows for
    json cfg = d.read("config.json");
    cfg["num_attention_heads"] = 8;
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("has shape"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(llama);
    json cfg = d.read("config.json");
    cfg["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("dynamic"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(llama);
    json cfg = d.read("config.json");
    cfg["hidden_act"] = "gelu";
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("hidden_act"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(qwen2);  // a vocabulary larger than the embedding
    json cfg = d.read("config.json");
    cfg["vocab_size"] = 100;
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("vocab_size"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(case_dir(case_named("gemma2_tiny")));  // a layer pattern metro does not run
    json cfg = d.read("config.json");
    cfg["layer_types"][0] = "full_attention";
    cfg["layer_types"][1] = "sliding_attention";
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("alternate"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(case_dir(case_named("gemma2_tiny")));  // a query scale llama.cpp would not use
    json cfg = d.read("config.json");
    cfg["query_pre_attn_scalar"] = 24;
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("query_pre_attn_scalar"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(case_dir(case_named("gemma3_tiny")));  // gemma3 has no attention cap
    json cfg = d.read("config.json");
    cfg["attn_logit_softcapping"] = 50.0;
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("attn_logit_softcapping"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(llama);
    json cfg = d.read("config.json");
    cfg["model_type"] = "gpt_neox";
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("gpt_neox"), std::string::npos) << refusal(d.path());
  }
}

// The safetensors file at `path` with its tensors renamed by `rename` (offsets unchanged) and
// `extra` (an F32 tensor of 4 values) added at the end of the data.
void rewrite_names(const std::string& path, const std::function<std::string(const std::string&)>& rename,
                   const std::string& extra) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  std::string data = bytes.substr(8 + n);
  json out = json::object();
  for (const auto& [k, v] : header.items()) out[k == "__metadata__" ? k : rename(k)] = v;
  const float four[4] = {1, 2, 3, 4};
  out[extra] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {data.size(), data.size() + 16}}};
  data.append(reinterpret_cast<const char*>(four), 16);
  const std::string hs = out.dump();
  std::string file(8, '\0');
  const uint64_t hn = hs.size();
  std::memcpy(file.data(), &hn, 8);
  std::ofstream(path, std::ios::binary) << file << hs << data;
}

// gemma2's settings reach the file as llama.cpp names them, and metro reads them back.
TEST(ConvertDecoder, Gemma2KeepsItsCapsAndItsLayerPattern) {
  const Converted conv = convert_or_die(case_dir(case_named("gemma2_tiny")), kernels::DType::kF32);
  auto f = gguf::File::parse(conv.bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->get_string("general.architecture"), "gemma2");
  EXPECT_FLOAT_EQ(*f->get_f32("gemma2.attn_logit_softcapping"), 1.5f);
  EXPECT_FLOAT_EQ(*f->get_f32("gemma2.final_logit_softcapping"), 3.0f);
  EXPECT_EQ(*f->get_u32("gemma2.attention.sliding_window"), 8u);
  EXPECT_FALSE(f->has("gemma2.rope.freq_base_swa"));
  auto hp = model::HParams::from_gguf(*f);
  ASSERT_TRUE(hp.ok()) << hp.status().message();
  EXPECT_TRUE(hp->is_local_layer(0) && !hp->is_local_layer(1) && hp->is_local_layer(2));
  EXPECT_FALSE(hp->has_qk_norm);
  EXPECT_TRUE(hp->has_post_norms);
}

// granite: its four multipliers under llama.cpp's names, Q and K permuted as for llama (the
// logits checks of every case show the rotation), the head tied.
TEST(ConvertDecoder, GraniteKeepsItsFactors) {
  const Converted conv = convert_or_die(case_dir(case_named("granite_tiny")), kernels::DType::kF32);
  auto f = gguf::File::parse(conv.bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->get_string("general.architecture"), "granite");
  EXPECT_FLOAT_EQ(*f->get_f32("granite.embedding_scale"), 12.0f);
  EXPECT_FLOAT_EQ(*f->get_f32("granite.attention.scale"), 0.015625f);
  EXPECT_FLOAT_EQ(*f->get_f32("granite.residual_scale"), 0.22f);
  EXPECT_FLOAT_EQ(*f->get_f32("granite.logit_scale"), 8.0f);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  auto hp = model::HParams::from_gguf(*f);
  ASSERT_TRUE(hp.ok()) << hp.status().message();
  EXPECT_TRUE(hp->tied_output);
  EXPECT_FLOAT_EQ(hp->residual_scale, 0.22f);
}

// olmo2: no attn_norm or ffn_norm, the post norms under llama.cpp's names, Q and K norms
// as wide as the projections, Q and K not permuted (it rotates NeoX pairs).
TEST(ConvertDecoder, Olmo2KeepsItsPostNormsAndWholeQkNorms) {
  const Converted conv = convert_or_die(case_dir(case_named("olmo2_tiny")), kernels::DType::kF32);
  auto f = gguf::File::parse(conv.bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->get_string("general.architecture"), "olmo2");
  EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_norm.weight"), nullptr);
  EXPECT_NE(f->find_tensor("blk.1.post_attention_norm.weight"), nullptr);
  EXPECT_NE(f->find_tensor("blk.1.post_ffw_norm.weight"), nullptr);
  const gguf::TensorInfo* qn = f->find_tensor("blk.0.attn_q_norm.weight");
  const gguf::TensorInfo* kn = f->find_tensor("blk.0.attn_k_norm.weight");
  ASSERT_TRUE(qn != nullptr && kn != nullptr);
  EXPECT_EQ(qn->ne[0], 64u);
  EXPECT_EQ(kn->ne[0], 32u);
  auto hp = model::HParams::from_gguf(*f);
  ASSERT_TRUE(hp.ok()) << hp.status().message();
  EXPECT_TRUE(hp->qk_norm_full && !hp->pre_norms && hp->has_post_norms && !hp->tied_output);
}

// phi3: the fused matrices kept fused, three quarters of each head rotated, LongRoPE as
// llama.cpp's phi3 converter writes it (factor tensors, original context, the cos/sin factor
// sqrt(1 + ln 8 / ln 16) for 128 over 16); what it cannot carry is refused.
TEST(ConvertDecoder, Phi3KeepsItsFusedMatricesAndLongRope) {
  const std::string dir = case_dir(case_named("phi3_tiny"));
  const Converted conv = convert_or_die(dir, kernels::DType::kF32);
  auto f = gguf::File::parse(conv.bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->get_u32("phi3.rope.dimension_count"), 12u);
  EXPECT_EQ(*f->get_u32("phi3.rope.scaling.original_context_length"), 16u);
  EXPECT_NEAR(*f->get_f32("phi3.rope.scaling.attn_factor"), std::sqrt(1.0 + std::log(8.0) / std::log(16.0)), 1e-6);
  for (const char* t : {"blk.0.attn_qkv.weight", "blk.1.ffn_up.weight", "rope_factors_long.weight", "rope_factors_short.weight"}) {
    EXPECT_NE(f->find_tensor(t), nullptr) << t;
  }
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up.weight")->ne[1], 2u * 96u);
  auto hp = model::HParams::from_gguf(*f);
  ASSERT_TRUE(hp.ok()) << hp.status().message();
  EXPECT_TRUE(hp->fused_qkv && hp->fused_gate_up && hp->has_longrope);
  EXPECT_EQ(hp->n_rot, 12u);
  {
    DirCopy d(dir);
    json cfg = d.read("config.json");
    cfg["rope_scaling"]["long_factor"].erase(0);
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("long_factor"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(dir);
    json cfg = d.read("config.json");
    cfg["rope_scaling"]["long_mscale"] = 1.2;
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("long_mscale"), std::string::npos) << refusal(d.path());
  }
  {
    DirCopy d(dir);
    json cfg = d.read("config.json");
    cfg["partial_rotary_factor"] = 0.3;
    d.write("config.json", cfg);
    EXPECT_NE(refusal(d.path()).find("partial_rotary_factor"), std::string::npos) << refusal(d.path());
  }
}

// Gemma3ForConditionalGeneration saves the language model under a prefix, its settings under
// text_config, beside a vision tower: the language model converts to the same file.
TEST(ConvertDecoder, MultimodalGemma3ConvertsItsLanguageModel) {
  const std::string dir = case_dir(case_named("gemma3_tiny"));
  DirCopy p(dir);  // the name written is the config's, not the directory's
  json text = p.read("config.json");
  text["_name_or_path"] = "tiny";
  p.write("config.json", text);
  auto plain = convert_hf(p.path(), ConvertOptions{});
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  DirCopy d(dir);
  text.erase("_name_or_path");
  const json outer = {{"model_type", "gemma3"}, {"architectures", {"Gemma3ForConditionalGeneration"}},
                      {"_name_or_path", "tiny"}, {"text_config", text}, {"vision_config", {{"hidden_size", 16}}}};
  d.write("config.json", outer);
  rewrite_names(d.path() + "/model.safetensors",
                [](const std::string& k) { return "language_model." + k; }, "vision_tower.patch.weight");
  auto mm = convert_hf(d.path(), ConvertOptions{});
  ASSERT_TRUE(mm.ok()) << mm.status().message();
  EXPECT_EQ(*mm, *plain);
}

// A directory with both tokenizer files: a byte-fallback tokenizer.json defers to
// tokenizer.model (whose scores and piece types it lacks), adding its added tokens.
TEST(ConvertDecoder, SentencePieceModelIsReadBesideItsTokenizerJson) {
  const json& c = case_named("llama2_tiny");
  DirCopy d(case_dir(c));
  const json tj = {{"version", "1.0"},
                   {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                                 {{"id", 601}, {"content", "<|extra|>"}, {"special", true}}})},
                   {"model", {{"type", "BPE"}, {"byte_fallback", true}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}}};
  d.write("tokenizer.json", tj);
  json cfg = d.read("config.json");
  const int rows = cfg["vocab_size"].get<int>();
  auto r = convert_hf(d.path(), ConvertOptions{});
  ASSERT_FALSE(r.ok());  // the added token makes the vocabulary one longer than the rows
  EXPECT_NE(std::string(r.status().message()).find("vocab_size"), std::string::npos) << r.status().message();
  json tj2 = tj;
  tj2["added_tokens"].erase(1);
  d.write("tokenizer.json", tj2);
  const Converted conv = convert_or_die(d.path(), kernels::DType::kF32);
  auto f = gguf::File::parse(conv.bytes);
  ASSERT_TRUE(f.ok());
  auto tok = tokenizer::Tokenizer::from_gguf(*f);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->n_vocab(), rows);
  const json& t = c["texts"][1];
  EXPECT_EQ(tok->encode(t["text"].get<std::string>(), true, true), t["hf_ids"].get<std::vector<int32_t>>());
  // Without tokenizer.model the byte-fallback tokenizer.json is refused with the reason.
  fs::remove(d.path() + "/tokenizer.model");
  auto no_model = convert_hf(d.path(), ConvertOptions{});
  ASSERT_FALSE(no_model.ok());
  EXPECT_NE(std::string(no_model.status().message()).find("tokenizer.model"), std::string::npos)
      << no_model.status().message();
}

// nomic-embed-text's layout (model_type nomic_bert): a WordPiece vocabulary whose rows are
// padded to a multiple of 64, rotary positions, a fused QKV matrix, fc11 * silu(fc12):
// the same ids as Hugging Face's tokenizer and the embeddings of a float64 NomicBertModel
// forward and of llama.cpp on the conversion, in F32 and Q8_0.
TEST(ConvertDecoder, NomicBertEmbeddingsMatchTheReferenceAndLlamaCpp) {
  const json& enc = references()["encoders"][0];
  const std::string dir = metro::testing::source_path("tests/fixtures/hf_checkpoints/" + enc["dir"].get<std::string>());
  for (auto [type, bound] : {std::pair{kernels::DType::kF32, 0.99999}, std::pair{kernels::DType::kQ8_0, 0.999}}) {
    const Converted conv = convert_or_die(dir, type);
    EXPECT_EQ(conv.report.architecture, "nomic-bert");
    auto f = gguf::File::parse(conv.bytes);
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto tok = tokenizer::Tokenizer::from_gguf(*f);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ(tok->n_vocab(), enc["n_vocab"].get<int>());
    auto m = model::Model::from_file(std::move(*f));
    ASSERT_TRUE(m.ok()) << m.status().message();
    std::vector<std::vector<int32_t>> seqs;
    for (const json& t : enc["texts"]) {
      const auto ids = t["hf_ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(tok->encode(t["text"].get<std::string>(), true, false), ids) << t["text"];
      EXPECT_EQ(t["llama_cpp_ids"].get<std::vector<int32_t>>(), ids);
      seqs.push_back(ids);
    }
    const auto got = metro::testing::mean_pooled_embeddings(**m, seqs);
    ASSERT_EQ(got.size(), seqs.size());
    double worst_ref = 1.0, worst_lc = 1.0;
    for (size_t i = 0; i < got.size(); ++i) {
      const json& t = enc["texts"][i];
      worst_ref = std::min(worst_ref, metro::testing::cosine(got[i], t["embedding"].get<std::vector<float>>()));
      worst_lc = std::min(worst_lc, metro::testing::cosine(got[i], t["llama_cpp_embedding"].get<std::vector<float>>()));
    }
    std::printf("convert nomic-bert as %s: worst cosine %.7f to the reference, %.7f to llama.cpp (%zu texts)\n",
                std::string(kernels::traits(type).name).c_str(), worst_ref, worst_lc, got.size());
    EXPECT_GT(worst_ref, bound);
    EXPECT_GT(worst_lc, bound);
  }
  DirCopy d(dir);  // a partly rotated head is refused
  json cfg = d.read("config.json");
  cfg["rotary_emb_fraction"] = 0.5;
  d.write("config.json", cfg);
  EXPECT_NE(refusal(d.path()).find("rotary_emb_fraction"), std::string::npos) << refusal(d.path());
}

// The CLI's path: the file streamed a tensor at a time is the in-memory conversion's bytes,
// in a float and a block format; a conversion that fails leaves nothing at the destination.
TEST(ConvertDecoder, StreamedFileEqualsTheInMemoryConversion) {
  for (const char* dir : {"qwen3_tiny", "gemma3_tiny"}) {
    for (kernels::DType type : {kernels::DType::kF16, kernels::DType::kQ4_K}) {
      ConvertOptions opts;
      opts.type = type;
      uint64_t last_done = 0, calls = 0;
      opts.on_tensor = [&](uint64_t done, uint64_t total, std::string_view) {
        EXPECT_GT(done, last_done);
        EXPECT_LE(done, total);
        last_done = done;
        ++calls;
      };
      ConvertReport mem_rep, file_rep;
      auto mem = convert_hf(case_dir(case_named(dir)), opts, &mem_rep);
      ASSERT_TRUE(mem.ok()) << mem.status().message();
      last_done = 0;
      metro::testing::TempFile out;
      const Status st = convert_hf_to_file(case_dir(case_named(dir)), out.path(), opts, &file_rep);
      ASSERT_TRUE(st.ok()) << st.message();
      std::ifstream in(out.path(), std::ios::binary);
      const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(file, *mem) << dir;
      EXPECT_EQ(file_rep.bytes, mem->size());
      EXPECT_EQ(file_rep.n_tensors, mem_rep.n_tensors);
      EXPECT_EQ(calls, 2u * static_cast<uint64_t>(mem_rep.n_tensors));  // once per tensor in each
    }
  }
  DirCopy d(case_dir(case_named("qwen2_tiny")));
  std::filesystem::resize_file(d.path() + "/model.safetensors", 100);  // a damaged checkpoint
  metro::testing::TempFile out;
  std::filesystem::remove(out.path());
  EXPECT_FALSE(convert_hf_to_file(d.path(), out.path(), ConvertOptions{}).ok());
  EXPECT_FALSE(std::filesystem::exists(out.path()));
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(out.path()).parent_path())) {
    EXPECT_EQ(e.path().string().find(std::filesystem::path(out.path()).filename().string() + ".tmp."),
              std::string::npos);
  }
}

// Experts are stacked per layer into the 3-D tensors llama.cpp names, quantized like the
// other matrices, the router kept F32; a config that does not rescale the chosen experts'
// weights says so in the file.
TEST(ConvertDecoder, ExpertsStackIntoOneTensorPerLayerAndKind) {
  const Converted conv = convert_or_die(case_dir(case_named("qwen3moe_tiny")), kernels::DType::kQ8_0);
  auto f = gguf::File::parse(conv.bytes);
  ASSERT_TRUE(f.ok());
  const gguf::TensorInfo* down = f->find_tensor("blk.1.ffn_down_exps.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->n_dims, 3u);
  EXPECT_EQ(down->ne[0], 32u);  // each expert's down matrix: 32 wide, 64 rows, 8 experts
  EXPECT_EQ(down->ne[1], 64u);
  EXPECT_EQ(down->ne[2], 8u);
  EXPECT_EQ(down->type(), gguf::GgmlType::kQ8_0);
  ASSERT_NE(f->find_tensor("blk.0.ffn_gate_inp.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate_inp.weight")->type(), gguf::GgmlType::kF32);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_FALSE(f->has("qwen3moe.expert_weights_norm"));
  DirCopy d(case_dir(case_named("qwen3moe_tiny")));
  json cfg = d.read("config.json");
  cfg["norm_topk_prob"] = false;
  d.write("config.json", cfg);
  const Converted plain = convert_or_die(d.path(), kernels::DType::kF32);
  auto g = gguf::File::parse(plain.bytes);
  ASSERT_TRUE(g.ok());
  auto norm = g->get_bool("qwen3moe.expert_weights_norm");
  ASSERT_TRUE(norm.ok());
  EXPECT_FALSE(*norm);
  auto m = model::Model::from_file(std::move(*g));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE((*m)->hparams().expert_weights_norm);
  cfg["mlp_only_layers"] = {0};
  d.write("config.json", cfg);
  EXPECT_NE(refusal(d.path()).find("mlp_only_layers"), std::string::npos) << refusal(d.path());
}

// qwen2_moe: the shared expert's three matrices, its gate as one F32 vector (a [1, 64]
// matrix in the checkpoint), the shared width, and no rescaling key (qwen2moe keeps the
// chosen probabilities unless the file says otherwise, and this config does not).
TEST(ConvertDecoder, Qwen2MoeSharedExpertAndItsGate) {
  const Converted conv = convert_or_die(case_dir(case_named("qwen2moe_tiny")), kernels::DType::kQ8_0);
  auto f = gguf::File::parse(conv.bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->get_string("general.architecture"), "qwen2moe");
  EXPECT_EQ(*f->get_u32("qwen2moe.expert_shared_feed_forward_length"), 64u);
  EXPECT_FALSE(f->has("qwen2moe.expert_weights_norm"));
  const gguf::TensorInfo* gate = f->find_tensor("blk.1.ffn_gate_inp_shexp.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->n_dims, 1u);
  EXPECT_EQ(gate->ne[0], 64u);
  EXPECT_EQ(gate->type(), gguf::GgmlType::kF32);
  for (const char* t : {"blk.0.ffn_gate_shexp.weight", "blk.0.ffn_up_shexp.weight", "blk.0.ffn_down_shexp.weight"}) {
    ASSERT_NE(f->find_tensor(t), nullptr) << t;
    EXPECT_EQ(f->find_tensor(t)->type(), gguf::GgmlType::kQ8_0) << t;
  }
  auto m = model::Model::from_file(std::move(*f));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->hparams().n_ff_shexp, 64u);
  EXPECT_TRUE((*m)->hparams().has_shexp_gate);
  EXPECT_FALSE((*m)->hparams().expert_weights_norm);
}

// llama.cpp's Q4_K_M mix: Q6_K for the head and for attn_v / ffn_down of the layers given
// more bits (of 2 layers, the second), the base format elsewhere; these tiny rows (64 wide)
// do not divide into 256-blocks, so each lands in its 32-block stand-in (Q6_K -> Q8_0,
// Q4_K -> Q5_0), as llama.cpp's quantizer does.
TEST(ConvertDecoder, Q4KMMixGivesTheHeadAndChosenLayersMoreBits) {
  ConvertOptions opts;
  opts.type = kernels::DType::kQ4_K;
  opts.preset = "q4_k_m";
  auto bytes = convert_hf(case_dir(case_named("llama_tiny")), opts);
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  auto f = gguf::File::parse(*bytes);
  ASSERT_TRUE(f.ok());
  auto type_of = [&](const char* name) { return f->find_tensor(name)->type(); };
  EXPECT_EQ(type_of("output.weight"), gguf::GgmlType::kQ8_0);
  EXPECT_EQ(type_of("blk.1.attn_v.weight"), gguf::GgmlType::kQ8_0);
  EXPECT_EQ(type_of("blk.1.ffn_down.weight"), gguf::GgmlType::kQ8_0);
  EXPECT_EQ(type_of("blk.0.attn_v.weight"), gguf::GgmlType::kQ5_0);
  EXPECT_EQ(type_of("blk.0.ffn_down.weight"), gguf::GgmlType::kQ5_0);
  EXPECT_EQ(type_of("blk.1.attn_q.weight"), gguf::GgmlType::kQ5_0);
  EXPECT_EQ(type_of("blk.0.attn_norm.weight"), gguf::GgmlType::kF32);
  opts.preset = "q9_k_m";
  EXPECT_FALSE(convert_hf(case_dir(case_named("llama_tiny")), opts).ok());
}

// The untied llama's head is required; the tied qwen2 has none and converts without one.
TEST(ConvertDecoder, TiedAndSeparateHeads) {
  const Converted llama = convert_or_die(case_dir(case_named("llama_tiny")), kernels::DType::kF32);
  const Converted qwen2 = convert_or_die(case_dir(case_named("qwen2_tiny")), kernels::DType::kF32);
  auto fl = gguf::File::parse(llama.bytes);
  auto fq = gguf::File::parse(qwen2.bytes);
  ASSERT_TRUE(fl.ok() && fq.ok());
  EXPECT_NE(fl->find_tensor("output.weight"), nullptr);
  EXPECT_NE(fl->find_tensor("rope_freqs.weight"), nullptr);  // llama3 scaling
  EXPECT_EQ(fq->find_tensor("output.weight"), nullptr);
  EXPECT_NE(fq->find_tensor("blk.1.attn_k.bias"), nullptr);
}

}  // namespace
}  // namespace metro::convert
