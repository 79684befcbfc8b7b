#include "tokenizer/tokenizer_test_util.h"

#include <cstdio>
#include <limits>
#include <stdexcept>

#include "gguf/writer.h"
#include "support/test_util.h"
#include "tokenizer/utf8.h"

namespace metro::testing {

std::vector<uint8_t> vocab_gguf(const VocabSpec& spec) {
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", spec.model);
  if (spec.pre) w.add_string("tokenizer.ggml.pre", *spec.pre);
  w.add_string_array("tokenizer.ggml.tokens", spec.tokens);
  if (!spec.types.empty()) w.add_i32_array("tokenizer.ggml.token_type", spec.types);
  if (!spec.scores.empty()) w.add_f32_array("tokenizer.ggml.scores", spec.scores);
  if (spec.merges) w.add_string_array("tokenizer.ggml.merges", *spec.merges);
  for (const auto& [k, v] : spec.ints) {
    if (v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()) {
      w.add_i32(k, static_cast<int32_t>(v));
    } else {
      w.add_i64(k, v);
    }
  }
  for (const auto& [k, v] : spec.bools) w.add_bool(k, v);
  for (const auto& [k, v] : spec.strings) w.add_string(k, v);
  return w.serialize();
}

VocabSpec byte_level_spec(const std::vector<std::pair<std::string, std::string>>& merges,
                          const std::vector<std::string>& control_tokens) {
  tokenizer::ByteLevelMap map;
  VocabSpec s;
  for (int b = 0; b < 256; ++b) {
    s.tokens.emplace_back(map.encode(static_cast<uint8_t>(b)));
    s.types.push_back(1);
  }
  for (const auto& [a, b] : merges) {
    const std::string ea = tokenizer::byte_level_encode(map, a);
    const std::string eb = tokenizer::byte_level_encode(map, b);
    s.merges->push_back(ea + " " + eb);
    s.tokens.push_back(ea + eb);
    s.types.push_back(1);
  }
  for (const auto& t : control_tokens) {
    s.tokens.push_back(t);
    s.types.push_back(3);
  }
  return s;
}

VocabSpec spm_spec(const std::vector<std::string>& pieces) {
  VocabSpec s;
  s.model = "llama";
  s.pre.reset();
  s.merges.reset();
  auto add = [&](std::string t, int32_t type, float score) {
    s.tokens.push_back(std::move(t));
    s.types.push_back(type);
    s.scores.push_back(score);
  };
  add("<unk>", 2, 0);
  add("<s>", 3, 0);
  add("</s>", 3, 0);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    add(buf, 6, 0);
  }
  for (size_t i = 0; i < pieces.size(); ++i) add(pieces[i], 1, -static_cast<float>(i));
  return s;
}

Expected<tokenizer::Tokenizer> tokenizer_from(const std::vector<uint8_t>& gguf_bytes) {
  METRO_ASSIGN_OR_RETURN(gguf::File f, gguf::File::parse(gguf_bytes));
  return tokenizer::Tokenizer::from_gguf(f);
}

std::vector<uint8_t> smollm2_with_pre(const gguf::File& f, std::string_view pre) {
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", std::string(*f.get_string("tokenizer.ggml.model")));
  w.add_string("tokenizer.ggml.pre", pre);
  auto strings = [&](const char* key) {
    auto span = *f.get_string_array(key);
    return std::vector<std::string>(span.begin(), span.end());
  };
  w.add_string_array("tokenizer.ggml.tokens", strings("tokenizer.ggml.tokens"));
  w.add_string_array("tokenizer.ggml.merges", strings("tokenizer.ggml.merges"));
  auto types64 = *f.get_int_array("tokenizer.ggml.token_type");
  w.add_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(types64.begin(), types64.end()));
  for (const char* k : {"bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"}) {
    const std::string key = std::string("tokenizer.ggml.") + k;
    if (auto v = f.get_u32(key); v.ok()) w.add_u32(key, *v);
  }
  for (const char* k : {"add_bos_token", "add_eos_token", "add_space_prefix"}) {
    const std::string key = std::string("tokenizer.ggml.") + k;
    if (auto v = f.get_bool(key); v.ok()) w.add_bool(key, *v);
  }
  return w.serialize();
}

const tokenizer::Tokenizer& smollm2_tokenizer() {
  static const tokenizer::Tokenizer tok = [] {
    auto f = gguf::File::open(default_model_path());
    if (!f.ok()) throw std::runtime_error("cannot open the default model: " + f.status().message());
    auto t = tokenizer::Tokenizer::from_gguf(*f);
    if (!t.ok()) throw std::runtime_error("cannot load its tokenizer: " + t.status().message());
    return *t;
  }();
  return tok;
}

const tokenizer::Tokenizer& tiny_spm_tokenizer() {
  static const tokenizer::Tokenizer tok = [] {
    auto f = gguf::File::open(source_path("tests/fixtures/tokenizer/tiny_spm.gguf"));
    if (!f.ok()) throw std::runtime_error("cannot open tiny_spm.gguf: " + f.status().message());
    auto t = tokenizer::Tokenizer::from_gguf(*f);
    if (!t.ok()) throw std::runtime_error("cannot load tiny_spm.gguf: " + t.status().message());
    return *t;
  }();
  return tok;
}

std::string escaped(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out + "\"";
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + "]";
}

std::string random_utf8(std::mt19937& rng, size_t max_codepoints) {
  struct Range {
    uint32_t lo, hi;
  };
  static constexpr Range kRanges[] = {
      {'a', 'z'},       {'A', 'Z'},       {'0', '9'},       {' ', ' '},       {' ', '/'},
      {':', '@'},       {'[', '`'},       {'{', '~'},       {'\t', '\r'},     {0x00, 0x1F},
      {0x80, 0xFF},     {0x0100, 0x017F}, {0x0300, 0x036F}, {0x0391, 0x03C9}, {0x0410, 0x044F},
      {0x0600, 0x06FF}, {0x0900, 0x097F}, {0x2000, 0x206F}, {0x3000, 0x303F}, {0x3040, 0x30FF},
      {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xFE00, 0xFE0F}, {0xFF00, 0xFFEF}, {0x1F300, 0x1F64F},
      {0x1F3FB, 0x1F3FF}, {0x200D, 0x200D}, {0x1F900, 0x1F9FF}, {0x10000, 0x10FFFF},
  };
  std::uniform_int_distribution<size_t> len_dist(0, max_codepoints);
  std::uniform_int_distribution<size_t> range_dist(0, std::size(kRanges) - 1);
  std::string out;
  const size_t n = len_dist(rng);
  for (size_t i = 0; i < n; ++i) {
    const Range r = kRanges[range_dist(rng)];
    uint32_t cp = std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    tokenizer::append_utf8(out, cp);
  }
  return out;
}

std::string random_bytes(std::mt19937& rng, size_t max_len) {
  std::uniform_int_distribution<size_t> len_dist(0, max_len);
  std::uniform_int_distribution<int> kind(0, 3);
  std::string out;
  const size_t n = len_dist(rng);
  for (size_t i = 0; i < n; ++i) {
    switch (kind(rng)) {
      case 0: out.push_back(static_cast<char>(std::uniform_int_distribution<int>(0x20, 0x7E)(rng))); break;
      case 1: out.push_back(static_cast<char>(std::uniform_int_distribution<int>(0x80, 0xBF)(rng))); break;
      case 2: out.push_back(static_cast<char>(std::uniform_int_distribution<int>(0xC0, 0xFF)(rng))); break;
      default: out.push_back(static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng))); break;
    }
  }
  return out;
}

}  // namespace metro::testing
