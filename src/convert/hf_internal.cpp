#include "convert/hf_internal.h"

#include <sys/stat.h>

#include <fstream>

#include "base/check.h"
#include "convert/hf_tokenizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace metro::convert::hf {

constexpr size_t kMaxTokenizerJsonBytes = size_t{256} << 20;
constexpr size_t kMaxSideFileBytes = size_t{16} << 20;

namespace {

constexpr int kMaxJsonDepth = 64;

// The pre-tokenizer split patterns of Llama 3, Qwen2, GPT-4o (o200k: Phi-4-mini, Llama 4)
// and Tekken (Mistral Nemo) as tokenizer.json spells them.
constexpr std::string_view kHfLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kHfQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kHfGpt4oSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kHfTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A string from the file, safe to print.
std::string shown(std::string_view s) { return tokenizer::quoted_for_message(s, 48); }

Status bad(const std::string& what) { return invalid_argument("tokenizer.json: " + what); }

}  // namespace

// Nothing nested deeper than `max_depth`, so no reader recurses far on hostile input.
bool depth_ok(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

Expected<json> parse_json(std::string_view text, const std::string& name) {
  if (!depth_ok(text, kMaxJsonDepth)) {
    return invalid_argument(name + ": nested deeper than " + std::to_string(kMaxJsonDepth) +
                            " levels");
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return invalid_argument(name + ": not valid JSON (" + e.what() + ")");
  }
}

Expected<std::optional<std::string>> read_file(const std::string& path, const std::string& name,
                                               size_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::optional<std::string>();
  if (!S_ISREG(st.st_mode)) return invalid_argument(path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return out_of_range(name + " is " + std::to_string(st.st_size) + " bytes; at most " +
                        std::to_string(max_bytes) + " allowed");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open " + path);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.gcount() != static_cast<std::streamsize>(text.size())) {
    return io_error("cannot read " + path);
  }
  return std::optional<std::string>(std::move(text));
}

const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// A token named in a config file: "[CLS]" or {"content": "[CLS]", ...}.
std::optional<std::string> token_name(const json* obj, const char* key) {
  if (obj == nullptr) return std::nullopt;
  const json* v = member(*obj, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (const json* c = member(*v, "content"); c != nullptr && c->is_string()) {
    return c->get<std::string>();
  }
  return std::nullopt;
}

std::string type_of(const json& obj) {
  const json* t = member(obj, "type");
  return t != nullptr && t->is_string() ? t->get<std::string>() : std::string();
}

bool bool_or(const json& obj, const char* key, bool dflt) {
  const json* v = member(obj, key);
  return v != nullptr && v->is_boolean() ? v->get<bool>() : dflt;
}

Expected<std::string> byte_level_bpe_pre(const json& root, const json& model, std::vector<std::string>& warnings) {
  std::string pre;
  if (bool_or(model, "byte_fallback", false)) {
    return unimplemented("tokenizer.json: a BPE with byte fallback (SentencePiece style, as Llama 2, Mistral "
                         "and Gemma save theirs) converts from its tokenizer.model, which this directory lacks");
  }
  if (member(model, "dropout") != nullptr) return unimplemented("tokenizer.json: BPE dropout is set");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = member(model, key);
    if (v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
      return unimplemented(std::string("tokenizer.json: BPE ") + key + " is set; byte-level BPE has none");
    }
  }
  const bool ignore_merges = bool_or(model, "ignore_merges", false);
  if (const json* norm = member(root, "normalizer"); norm != nullptr) {
    const std::string t = type_of(*norm);
    if (t == "NFC") {
      warnings.push_back("the NFC normalizer is not applied: text is tokenized as given, as llama.cpp does");
    } else if (!(t == "Sequence" && member(*norm, "normalizers") != nullptr &&
                 (*norm)["normalizers"].is_array() && (*norm)["normalizers"].empty())) {
      return unimplemented("tokenizer.json: a byte-level BPE with the normalizer " + shown(t) +
                           " (none or NFC is supported)");
    }
  }
  // The pre-tokenizers in order, a Sequence flattened.
  std::vector<const json*> pres;
  if (const json* top = member(root, "pre_tokenizer"); top != nullptr) {
    if (type_of(*top) == "Sequence") {
      const json* list = member(*top, "pretokenizers");
      if (list == nullptr || !list->is_array()) return bad("pre_tokenizer: a Sequence without pretokenizers");
      for (const json& p : *list) pres.push_back(&p);
    } else {
      pres.push_back(top);
    }
  }
  std::string found;
  for (const json* p : pres) found += (found.empty() ? "" : ", ") + shown(type_of(*p));
  const std::string unsupported =
      "tokenizer.json: the pre-tokenizer [" + found +
      "] is not one metro reproduces (ByteLevel with its regex; Digits then ByteLevel; Split with Llama 3's, "
      "Qwen2's, GPT-4o's or Tekken's pattern then ByteLevel)";
  if (pres.empty() || type_of(*pres.back()) != "ByteLevel") return unimplemented(unsupported);
  const json& byte_level = *pres.back();
  if (bool_or(byte_level, "add_prefix_space", false)) {
    return unimplemented("tokenizer.json: ByteLevel with add_prefix_space (a space before every text) is not "
                         "supported");
  }
  const bool byte_regex = bool_or(byte_level, "use_regex", true);
  std::string family;  // the split's name in metro's table, to check ignore_merges against
  if (pres.size() == 1 && byte_regex) {
    pre = "gpt-2";
    family = "gpt2";
  } else if (pres.size() == 2 && byte_regex && type_of(*pres[0]) == "Digits" &&
             bool_or(*pres[0], "individual_digits", false)) {
    pre = "starcoder";
    family = "starcoder";
  } else if (pres.size() == 2 && !byte_regex && type_of(*pres[0]) == "Split") {
    const json& split = *pres[0];
    const json* pattern = member(split, "pattern");
    const json* regex = pattern != nullptr ? member(*pattern, "Regex") : nullptr;
    const json* behavior = member(split, "behavior");
    if (regex == nullptr || !regex->is_string() || behavior == nullptr || !behavior->is_string() ||
        behavior->get<std::string>() != "Isolated" || bool_or(split, "invert", false)) {
      return unimplemented(unsupported + "; its Split is not an isolating regex");
    }
    const std::string r = regex->get<std::string>();
    if (r == kHfLlama3Split) {
      // Llama 3's split with whole words looked up first, or without (as dbrx and smaug).
      pre = ignore_merges ? "llama-bpe" : "smaug-bpe";
      family = ignore_merges ? "llama3" : "llama3-regex";
    } else if (r == kHfQwen2Split) {
      pre = "qwen2";
      family = "qwen2";
    } else if (r == kHfGpt4oSplit) {
      pre = "gpt-4o";
      family = "gpt4o";
    } else if (r == kHfTekkenSplit) {
      pre = "tekken";
      family = "tekken";
    } else {
      return unimplemented("tokenizer.json: the pre-tokenizer's split pattern " + shown(r) +
                           " is not one metro reproduces (Llama 3's, Qwen2's, GPT-4o's and Tekken's are)");
    }
  } else {
    return unimplemented(unsupported);
  }
  const tokenizer::PreTokenizerSpec* spec = tokenizer::find_pre_tokenizer(pre);
  METRO_CHECK_MSG(spec != nullptr, "a pre-tokenizer name the converter writes is missing from metro's table");
  const bool family_ignores = spec->ignore_merges;
  if (family_ignores != ignore_merges) {
    return unimplemented("tokenizer.json: ignore_merges is " + std::string(ignore_merges ? "true" : "false") +
                         " with the " + family + " split, which metro tokenizes with it " +
                         (family_ignores ? "on" : "off"));
  }
  if (const json* dec = member(root, "decoder"); dec != nullptr && type_of(*dec) != "ByteLevel") {
    warnings.push_back("the decoder " + shown(type_of(*dec)) + " is read as ByteLevel");
  }
  return pre;
}

}  // namespace metro::convert::hf

namespace metro::convert {

// hf_tokenizer.h's file reading, beside the other readers of Hugging Face's files.
Expected<HfTokenizerFiles> read_hf_tokenizer_files(const std::string& hf_dir) {
  HfTokenizerFiles files;
  METRO_ASSIGN_OR_RETURN(auto tok, hf::read_file(hf_dir + "/tokenizer.json", "tokenizer.json",
                                             hf::kMaxTokenizerJsonBytes));
  METRO_ASSIGN_OR_RETURN(files.sentencepiece_model,
                         hf::read_file(hf_dir + "/tokenizer.model", "tokenizer.model", hf::kMaxTokenizerJsonBytes));
  if (!tok && files.sentencepiece_model) tok = std::string();
  if (!tok) {
    struct stat st {};
    if (::stat((hf_dir + "/vocab.txt").c_str(), &st) == 0) {
      return not_found(hf_dir + " has vocab.txt but no tokenizer.json; metro reads the "
                       "tokenizer.json that Hugging Face's fast tokenizers save");
    }
    return not_found(hf_dir + "/tokenizer.json is missing");
  }
  files.tokenizer_json = std::move(*tok);
  METRO_ASSIGN_OR_RETURN(files.tokenizer_config_json,
                         hf::read_file(hf_dir + "/tokenizer_config.json", "tokenizer_config.json",
                                   hf::kMaxSideFileBytes));
  METRO_ASSIGN_OR_RETURN(files.special_tokens_map_json,
                         hf::read_file(hf_dir + "/special_tokens_map.json", "special_tokens_map.json",
                                   hf::kMaxSideFileBytes));
  METRO_ASSIGN_OR_RETURN(files.config_json,
                         hf::read_file(hf_dir + "/config.json", "config.json", hf::kMaxSideFileBytes));
  METRO_ASSIGN_OR_RETURN(files.chat_template_jinja,
                         hf::read_file(hf_dir + "/chat_template.jinja", "chat_template.jinja", hf::kMaxSideFileBytes));
  return files;
}

}  // namespace metro::convert
