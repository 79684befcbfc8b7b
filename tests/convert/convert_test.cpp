// `metro convert` on small Hugging Face directories written here: a tiny random BERT
// converts, loads and computes what a double-precision BERT forward written in this test
// computes; sharded checkpoints give the same file; malformed checkpoints and unsupported
// models are refused with the reason. And the safetensors parser on hostile headers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "base/thread_pool.h"
#include "convert/convert.h"
#include "convert/safetensors.h"
#include "gguf/gguf.h"
#include "model/model.h"

namespace metro::convert {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr int kEmbd = 32, kHeads = 2, kFf = 64, kLayers = 2, kCtx = 16, kVocab = 9, kTypes = 2;

struct Tensor {
  std::vector<uint64_t> shape;
  std::vector<float> v;
};

std::string safetensors_bytes(const std::map<std::string, Tensor>& ts) {
  json h = json::object();
  std::string data;
  for (const auto& [name, t] : ts) {
    const size_t b = data.size();
    data.append(reinterpret_cast<const char*>(t.v.data()), t.v.size() * 4);
    h[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {b, data.size()}}};
  }
  const std::string hs = h.dump();
  std::string out(8, '\0');
  const uint64_t n = hs.size();
  std::memcpy(out.data(), &n, 8);
  return out + hs + data;
}

json tokenizer_json() {
  json vocab = json::object();
  int id = 0;
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "!"}) vocab[t] = id++;
  json added = json::array();
  int i = 0;
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    added.push_back({{"id", i++}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
                          {"strip_accents", nullptr}, {"lowercase", true}}},
          {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
          {"post_processor", {{"type", "BertProcessing"}, {"sep", {"[SEP]", 3}}, {"cls", {"[CLS]", 2}}}},
          {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
                     {"max_input_chars_per_word", 100}, {"vocab", vocab}}}};
}

json config() {
  return {{"model_type", "bert"},          {"hidden_size", kEmbd},  {"num_hidden_layers", kLayers},
          {"num_attention_heads", kHeads}, {"intermediate_size", kFf}, {"max_position_embeddings", kCtx},
          {"type_vocab_size", kTypes},     {"vocab_size", kVocab},  {"layer_norm_eps", 1e-12},
          {"hidden_act", "gelu"},          {"_name_or_path", "tiny-bert"}};
}

// A random BertModel's tensors, by their Hugging Face names.
std::map<std::string, Tensor> bert_tensors(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  auto t = [&](std::vector<uint64_t> shape, float offset = 0.0f) {
    Tensor x{shape, {}};
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    for (uint64_t i = 0; i < n; ++i) x.v.push_back(offset + d(rng));
    return x;
  };
  const uint64_t e = kEmbd, f = kFf;
  std::map<std::string, Tensor> ts;
  ts["embeddings.word_embeddings.weight"] = t({kVocab, e});
  ts["embeddings.position_embeddings.weight"] = t({kCtx, e});
  ts["embeddings.token_type_embeddings.weight"] = t({kTypes, e});
  ts["embeddings.LayerNorm.weight"] = t({e}, 1.0f);
  ts["embeddings.LayerNorm.bias"] = t({e});
  ts["embeddings.position_ids"] = Tensor{{1, kCtx}, std::vector<float>(kCtx * 2, 0.0f)};  // I64 in real files
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    for (const char* m : {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"}) {
      ts[p + m + ".weight"] = t({e, e});
      ts[p + m + ".bias"] = t({e});
    }
    ts[p + "attention.output.LayerNorm.weight"] = t({e}, 1.0f);
    ts[p + "attention.output.LayerNorm.bias"] = t({e});
    ts[p + "intermediate.dense.weight"] = t({f, e});
    ts[p + "intermediate.dense.bias"] = t({f});
    ts[p + "output.dense.weight"] = t({e, f});
    ts[p + "output.dense.bias"] = t({e});
    ts[p + "output.LayerNorm.weight"] = t({e}, 1.0f);
    ts[p + "output.LayerNorm.bias"] = t({e});
  }
  ts["pooler.dense.weight"] = t({e, e});  // not used by an embedding model: skipped
  return ts;
}

class Dir {
 public:
  Dir() {
    char tmpl[] = "/tmp/metro-convert-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~Dir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path_ + "/" + name, std::ios::binary) << bytes;
  }
  void write_model(const json& cfg, const std::map<std::string, Tensor>& ts) const {
    write("config.json", cfg.dump());
    write("tokenizer.json", tokenizer_json().dump());
    write("model.safetensors", safetensors_bytes(ts));
  }

 private:
  std::string path_;
};

// position_ids is I64 in real checkpoints: write it so.
std::map<std::string, Tensor> without_ids(std::map<std::string, Tensor> ts) {
  ts.erase("embeddings.position_ids");
  return ts;
}

// --- A double-precision BERT forward over the Hugging Face tensors -----------------------

using Mat = std::vector<std::vector<double>>;

Mat linear(const Mat& x, const Tensor& w, const Tensor& b) {
  const size_t out = w.shape[0], in = w.shape[1];
  Mat y(x.size(), std::vector<double>(out));
  for (size_t t = 0; t < x.size(); ++t) {
    for (size_t o = 0; o < out; ++o) {
      double s = b.v[o];
      for (size_t i = 0; i < in; ++i) s += x[t][i] * w.v[o * in + i];
      y[t][o] = s;
    }
  }
  return y;
}

void layer_norm(Mat& x, const Tensor& w, const Tensor& b) {
  for (auto& r : x) {
    double m = 0, v = 0;
    for (double a : r) m += a;
    m /= static_cast<double>(r.size());
    for (double a : r) v += (a - m) * (a - m);
    v /= static_cast<double>(r.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = (r[i] - m) / std::sqrt(v + 1e-12) * w.v[i] + b.v[i];
  }
}

Mat reference_forward(const std::map<std::string, Tensor>& ts, const std::vector<int32_t>& ids) {
  const size_t n = ids.size(), e = kEmbd, hd = kEmbd / kHeads;
  Mat x(n, std::vector<double>(e));
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < e; ++i) {
      x[t][i] = ts.at("embeddings.word_embeddings.weight").v[static_cast<size_t>(ids[t]) * e + i] +
                ts.at("embeddings.position_embeddings.weight").v[t * e + i] +
                ts.at("embeddings.token_type_embeddings.weight").v[i];
    }
  }
  layer_norm(x, ts.at("embeddings.LayerNorm.weight"), ts.at("embeddings.LayerNorm.bias"));
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    auto W = [&](const std::string& s) -> const Tensor& { return ts.at(p + s + ".weight"); };
    auto B = [&](const std::string& s) -> const Tensor& { return ts.at(p + s + ".bias"); };
    const Mat q = linear(x, W("attention.self.query"), B("attention.self.query"));
    const Mat k = linear(x, W("attention.self.key"), B("attention.self.key"));
    const Mat v = linear(x, W("attention.self.value"), B("attention.self.value"));
    Mat att(n, std::vector<double>(e, 0.0));
    for (size_t h = 0; h < static_cast<size_t>(kHeads); ++h) {
      for (size_t i = 0; i < n; ++i) {
        std::vector<double> s(n);
        double mx = -1e300, tot = 0.0;
        for (size_t j = 0; j < n; ++j) {
          double d = 0;
          for (size_t c = 0; c < hd; ++c) d += q[i][h * hd + c] * k[j][h * hd + c];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        for (double& a : s) tot += (a = std::exp(a - mx));
        for (size_t j = 0; j < n; ++j) {
          for (size_t c = 0; c < hd; ++c) att[i][h * hd + c] += s[j] / tot * v[j][h * hd + c];
        }
      }
    }
    Mat o = linear(att, W("attention.output.dense"), B("attention.output.dense"));
    for (size_t t = 0; t < n; ++t) {
      for (size_t i = 0; i < e; ++i) x[t][i] += o[t][i];
    }
    layer_norm(x, W("attention.output.LayerNorm"), B("attention.output.LayerNorm"));
    Mat u = linear(x, W("intermediate.dense"), B("intermediate.dense"));
    for (auto& r : u) {
      for (double& a : r) a = 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
    }
    Mat dn = linear(u, W("output.dense"), B("output.dense"));
    for (size_t t = 0; t < n; ++t) {
      for (size_t i = 0; i < e; ++i) x[t][i] += dn[t][i];
    }
    layer_norm(x, W("output.LayerNorm"), B("output.LayerNorm"));
  }
  return x;
}

Expected<std::unique_ptr<model::Model>> load(const std::vector<uint8_t>& bytes) {
  METRO_ASSIGN_OR_RETURN(gguf::File f, gguf::File::copy_of(bytes));
  return model::Model::from_file(std::move(f));
}

TEST(Convert, TinyBertMatchesADoublePrecisionForward) {
  Dir dir;
  const auto ts = without_ids(bert_tensors(1));
  dir.write_model(config(), ts);
  for (kernels::DType type : {kernels::DType::kF32, kernels::DType::kF16}) {
    ConvertOptions opts;
    opts.type = type;
    ConvertReport rep;
    auto bytes = convert_hf(dir.path(), opts, &rep);
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    EXPECT_EQ(rep.architecture, "bert");
    EXPECT_EQ(rep.n_tensors, 5 + 16 * kLayers);
    EXPECT_EQ(rep.n_vocab, kVocab);
    auto m = load(*bytes);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const std::vector<int32_t> ids = {2, 5, 6, 7, 8, 3};
    ThreadPool pool(2);
    model::WorkspaceLimits lim;
    lim.max_tokens = 8;
    model::Workspace ws = (*m)->make_workspace(lim);
    model::SequenceKv kv(**m, kCtx);
    model::Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], static_cast<int32_t>(i), 0, false);
    model::ForwardOptions fo;
    fo.want_hidden = true;
    auto out = (*m)->forward(b, kv.view(), ws, pool, fo);
    ASSERT_TRUE(out.ok()) << out.status().message();
    const Mat want = reference_forward(ts, ids);
    double worst = 0.0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* h = out->hidden_row(static_cast<int>(t), kEmbd);
      for (int i = 0; i < kEmbd; ++i) worst = std::max(worst, std::fabs(h[i] - want[t][static_cast<size_t>(i)]));
    }
    // F32: float rounding only (measured below 1e-5); F16 adds the weights' rounding
    // (measured 0.0024). Normalized states are of order 1.
    EXPECT_LT(worst, type == kernels::DType::kF32 ? 1e-3 : 0.02) << kernels::dtype_name(type);
    std::printf("[ tiny bert %s ] worst |state - double reference|: %.5f\n",
                std::string(kernels::dtype_name(type)).c_str(), worst);
  }
}

TEST(Convert, ShardedCheckpointGivesTheSameFile) {
  Dir one, two;
  const auto ts = without_ids(bert_tensors(2));
  one.write_model(config(), ts);
  std::map<std::string, Tensor> a, b;
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (const auto& [name, t] : ts) {
    const bool first = name.starts_with("embeddings") || name.find("layer.0.") != std::string::npos;
    (first ? a : b)[name] = t;
    index["weight_map"][name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  two.write("config.json", config().dump());
  two.write("tokenizer.json", tokenizer_json().dump());
  two.write("model-00001-of-00002.safetensors", safetensors_bytes(a));
  two.write("model-00002-of-00002.safetensors", safetensors_bytes(b));
  two.write("model.safetensors.index.json", index.dump());
  auto x = convert_hf(one.path(), {});
  auto y = convert_hf(two.path(), {});
  ASSERT_TRUE(x.ok() && y.ok()) << (x.ok() ? y.status().message() : x.status().message());
  EXPECT_EQ(*x, *y);
  // A block format goes through the requantizer: matrices Q8_0, position rows still F32.
  ConvertOptions q;
  q.type = kernels::DType::kQ8_0;
  auto z = convert_hf(one.path(), q);
  ASSERT_TRUE(z.ok()) << z.status().message();
  auto f = gguf::File::copy_of(*z);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type(), gguf::GgmlType::kQ8_0);
  EXPECT_EQ(f->find_tensor("position_embd.weight")->type(), gguf::GgmlType::kF32);
  EXPECT_TRUE(load(*z).ok());
}

void expect_refused(const Dir& d, const std::string& needle) {
  auto r = convert_hf(d.path(), {});
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(Convert, RefusesWhatItCannotConvertFaithfully) {
  const auto ts = without_ids(bert_tensors(3));
  {
    Dir d;
    json c = config();
    c["model_type"] = "gpt2";
    d.write_model(c, ts);
    expect_refused(d, "model_type 'gpt2'");
  }
  {
    Dir d;
    json c = config();
    c["hidden_act"] = "relu";
    d.write_model(c, ts);
    expect_refused(d, "hidden_act 'relu'");
  }
  {
    Dir d;
    auto missing = ts;
    missing.erase("encoder.layer.1.output.dense.bias");
    d.write_model(config(), missing);
    expect_refused(d, "blk.1.ffn_down.bias");
  }
  {
    Dir d;
    auto wrong = ts;
    wrong["encoder.layer.0.intermediate.dense.weight"].shape = {kEmbd, kFf};
    d.write_model(config(), wrong);
    expect_refused(d, "config.json says [64, 32]");
  }
  {
    Dir d;
    auto extra = ts;
    extra["encoder.layer.0.crossattention.self.query.weight"] = Tensor{{2}, {0.0f, 0.0f}};
    d.write_model(config(), extra);
    expect_refused(d, "crossattention");
  }
  {
    Dir d;
    d.write_model(config(), ts);
    d.write("config.json", "{not json");
    expect_refused(d, "config.json is not a JSON object");
  }
  {
    Dir d;
    d.write("config.json", config().dump());
    d.write("tokenizer.json", tokenizer_json().dump());
    expect_refused(d, "model.safetensors");
  }
}

TEST(Safetensors, RefusesHostileHeaders) {
  auto parse = [](const std::string& bytes) {
    return parse_safetensors(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                             "t");
  };
  auto with_header = [](const std::string& h, const std::string& data) {
    std::string out(8, '\0');
    const uint64_t n = h.size();
    std::memcpy(out.data(), &n, 8);
    return out + h + data;
  };
  const std::string ok = with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", std::string(8, 'x'));
  ASSERT_TRUE(parse(ok).ok());
  EXPECT_EQ(parse(ok)->at(0).numel(), 2u);
  struct Case {
    std::string bytes, needle;
  };
  const Case cases[] = {
      {"abc", "shorter than"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "does not fit"},
      {with_header("[1, 2]", ""), "not a JSON object"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", std::string(8, 'x')), "fall outside"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", std::string(8, 'x')), "8 bytes for 3"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
                   std::string(8, 'x')), "overlap"},
      {with_header(R"({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}})", "x"), "dtype 'Q4'"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", ""), "non-negative"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 0]}})", ""), "too large"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [1]}})", "xxxx"), "lacks"},
  };
  for (const Case& c : cases) {
    auto r = parse(c.bytes);
    ASSERT_FALSE(r.ok()) << c.needle;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace metro::convert
