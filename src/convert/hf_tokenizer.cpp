#include "convert/hf_tokenizer.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "convert/hf_internal.h"
#include "convert/sentencepiece_model.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace metro::convert {
namespace {

using nlohmann::json;
using hf::bool_or;
using hf::byte_level_bpe_pre;
using hf::member;
using hf::parse_json;
using hf::read_file;
using hf::token_name;
using hf::type_of;

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581
// A stored token is at most the vocabulary's limit, U+2581 prefix included.
constexpr size_t kMaxTokenTextBytes = tokenizer::kMaxTokenBytes - kWordStart.size();
// Ids may leave holes (filled with unused tokens), but not many more than there are tokens.
constexpr size_t kMaxHoles = 1024;

constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeUnused = 5;

// A string from the file, safe to print.
std::string shown(std::string_view s) { return tokenizer::quoted_for_message(s, 48); }

Status bad(const std::string& what) { return invalid_argument("tokenizer.json: " + what); }

class Converter {
 public:
  explicit Converter(const HfTokenizerFiles& files) : files_(files) {}

  Status run(gguf::Writer& w, TokenizerInfo* info) {
    METRO_RETURN_IF_ERROR(read_side_files());
    if (!files_.tokenizer_json.empty() || !files_.sentencepiece_model) {
      METRO_ASSIGN_OR_RETURN(root_, parse_json(files_.tokenizer_json, "tokenizer.json"));
      if (!root_.is_object()) return bad("not a JSON object");
      model_ = member(root_, "model");
      if (model_ == nullptr || !model_->is_object()) return bad("no 'model' object");
    }
    const std::string type = model_ != nullptr ? type_of(*model_) : std::string();
    // A SentencePiece model converts from tokenizer.model, whose scores and piece types
    // tokenizer.json does not keep; tokenizer.json then adds only its added tokens.
    sp_ = files_.sentencepiece_model.has_value() &&
          (model_ == nullptr || type == "Unigram" || (type == "BPE" && bool_or(*model_, "byte_fallback", false)));
    bpe_ = !sp_ && type == "BPE";
    if (!sp_ && type != "WordPiece" && !bpe_) {
      return unimplemented("this converter reads WordPiece and byte-level BPE tokenizers and SentencePiece BPE models "
                           "(tokenizer.model); this one is " +
                           (type.empty() ? std::string("of no stated type") : shown(type)));
    }
    if (sp_) {
      METRO_RETURN_IF_ERROR(read_sentencepiece());
    } else {
      METRO_RETURN_IF_ERROR(bpe_ ? check_bpe_pipeline() : check_pipeline());
      METRO_RETURN_IF_ERROR(read_vocab());
    }
    METRO_RETURN_IF_ERROR(read_added_tokens());
    METRO_RETURN_IF_ERROR(read_added_tokens_decoder());
    METRO_RETURN_IF_ERROR(pad_to_model_rows());
    if (bpe_) METRO_RETURN_IF_ERROR(read_merges());
    fill_holes();
    METRO_RETURN_IF_ERROR(read_post_processor());
    METRO_RETURN_IF_ERROR(bpe_ || sp_ ? read_bpe_special_ids() : read_special_ids());
    read_token_type_count();
    METRO_RETURN_IF_ERROR(read_chat_template());
    note_dropped_settings();
    if (sp_) {
      write_spm(w);
    } else if (bpe_) {
      write_bpe(w);
    } else {
      write(w);
    }
    if (info != nullptr) *info = std::move(info_);
    return {};
  }

 private:
  struct Token {
    std::string text;  // as in the file
    int32_t type = kTypeNormal;
    bool present = false;
  };

  Status read_side_files() {
    auto parse_side = [](const std::optional<std::string>& text, const char* name,
                         std::optional<json>& out) -> Status {
      if (!text) return {};
      METRO_ASSIGN_OR_RETURN(json j, parse_json(*text, name));
      if (!j.is_object()) return invalid_argument(std::string(name) + ": not a JSON object");
      out = std::move(j);
      return {};
    };
    METRO_RETURN_IF_ERROR(parse_side(files_.tokenizer_config_json, "tokenizer_config.json", config_));
    METRO_RETURN_IF_ERROR(parse_side(files_.special_tokens_map_json, "special_tokens_map.json", special_map_));
    METRO_RETURN_IF_ERROR(parse_side(files_.config_json, "config.json", model_config_));
    return {};
  }

  // Refuses what metro's WordPiece would tokenize differently from the reference.
  Status check_pipeline() {
    if (const json* m = member(*model_, "max_input_chars_per_word");
        m != nullptr && !(m->is_number_integer() && m->get<int64_t>() == 100)) {
      return unimplemented("tokenizer.json: max_input_chars_per_word is " + m->dump().substr(0, 40) +
                           "; metro's WordPiece takes words of up to 100 characters");
    }
    prefix_ = "##";
    if (const json* p = member(*model_, "continuing_subword_prefix"); p != nullptr) {
      if (!p->is_string() || p->get<std::string>().empty()) {
        return bad("continuing_subword_prefix is not a non-empty string");
      }
      prefix_ = p->get<std::string>();
    }

    const std::string want_norm =
        "metro's WordPiece follows BERT uncased: a BertNormalizer that cleans text, splits "
        "CJK ideographs, lowercases and strips accents";
    const json* norm = member(root_, "normalizer");
    if (norm == nullptr) return unimplemented(want_norm + "; this tokenizer.json has no normalizer");
    if (type_of(*norm) != "BertNormalizer") {
      return unimplemented(want_norm + "; this tokenizer.json's normalizer is " +
                           shown(type_of(*norm)));
    }
    // strip_accents null (the usual) follows lowercase.
    const bool lowercase = bool_or(*norm, "lowercase", true);
    const bool strip = bool_or(*norm, "strip_accents", lowercase);
    const bool clean = bool_or(*norm, "clean_text", true);
    const bool cjk = bool_or(*norm, "handle_chinese_chars", true);
    if (!lowercase || !strip || !clean || !cjk) {
      auto flag = [](const char* name, bool v) { return std::string(name) + (v ? "=true" : "=false"); };
      return unimplemented(want_norm + "; this one has " + flag("lowercase", lowercase) + ", " +
                           flag("strip_accents", strip) + ", " + flag("clean_text", clean) + ", " +
                           flag("handle_chinese_chars", cjk));
    }
    const json* pre = member(root_, "pre_tokenizer");
    if (pre == nullptr || type_of(*pre) != "BertPreTokenizer") {
      return unimplemented("metro's WordPiece splits words as BertPreTokenizer does; this "
                           "tokenizer.json's pre_tokenizer is " +
                           (pre == nullptr ? std::string("missing") : shown(type_of(*pre))));
    }
    return {};
  }

  // Byte-level BPE: the pre-tokenizer named by the split found (hf_internal.h).
  Status check_bpe_pipeline() {
    METRO_ASSIGN_OR_RETURN(pre_, byte_level_bpe_pre(root_, *model_, info_.warnings));
    return {};
  }

  // The pieces of tokenizer.model as the vocabulary, with their scores and types, when the
  // model is one metro's SentencePiece BPE reproduces.
  Status read_sentencepiece() {
    METRO_ASSIGN_OR_RETURN(sp_model_, parse_sentencepiece_model(*files_.sentencepiece_model));
    const SpModel& m = sp_model_;
    if (m.model_type != 2) {
      const char* names[] = {"", "unigram", "BPE", "word", "char"};
      const std::string kind = m.model_type >= 1 && m.model_type <= 4 ? names[m.model_type] : "unknown";
      return unimplemented("tokenizer.model: a SentencePiece " + kind +
                           " model; metro converts SentencePiece BPE models (as Llama 2, Mistral and Gemma use)");
    }
    if (m.whitespace_as_suffix) return unimplemented("tokenizer.model: whitespace as a suffix is not supported");
    if (!m.escape_whitespaces) return unimplemented("tokenizer.model: spaces not escaped as U+2581 are not supported");
    if (m.has_charsmap || !(m.normalizer.empty() || m.normalizer == "identity")) {
      return unimplemented("tokenizer.model: the normalizer " + shown(m.normalizer) +
                           " rewrites text before tokenizing, which metro does not (identity is supported)");
    }
    if (m.remove_extra_whitespaces) {
      info_.warnings.push_back("tokenizer.model collapses runs of spaces; metro, like llama.cpp, keeps them");
    }
    tokens_.resize(m.pieces.size());
    scores_.resize(m.pieces.size());
    for (size_t i = 0; i < m.pieces.size(); ++i) {
      const SpPiece& p = m.pieces[i];
      if (p.text.size() > kMaxTokenTextBytes) return bad("tokenizer.model: a piece is too long");
      tokens_[i] = Token{p.text, p.type, true};
      scores_[i] = p.score;
      by_text_.emplace(p.text, static_cast<int32_t>(i));
    }
    n_placed_ = m.pieces.size();
    return {};
  }

  // tokenizer_config.json's added_tokens_decoder: {"id": {"content": ..., "special": ...}}, as
  // transformers saves the tokens it adds to a vocabulary.
  Status read_added_tokens_decoder() {
    if (!config_) return {};
    const json* dec = member(*config_, "added_tokens_decoder");
    if (dec == nullptr) return {};
    if (!dec->is_object()) return invalid_argument("tokenizer_config.json: added_tokens_decoder is not an object");
    for (const auto& [key, t] : dec->items()) {
      const json* content = member(t, "content");
      if (content == nullptr || !content->is_string() || key.empty() || key.size() > 9 ||
          key.find_first_not_of("0123456789") != std::string::npos) {
        return invalid_argument("tokenizer_config.json: added_tokens_decoder entry " + shown(key) +
                                " is not an id with a content");
      }
      const int64_t id = std::stoll(key);
      const std::string text = content->get<std::string>();
      const auto i = static_cast<size_t>(id);
      if (i < tokens_.size() && tokens_[i].present && tokens_[i].text == text) {
        if (bool_or(t, "special", false) && tokens_[i].type == kTypeNormal) tokens_[i].type = kTypeControl;
        continue;  // already known
      }
      if (i < tokens_.size() && tokens_[i].present) {
        info_.warnings.push_back("added token " + shown(text) + " replaces " + shown(tokens_[i].text) + " at id " + key);
      }
      METRO_RETURN_IF_ERROR(place(text, id, "added_tokens_decoder"));
      tokens_[i].type = bool_or(t, "special", false) ? kTypeControl : kTypeUserDefined;
      added_by_text_.emplace(text, static_cast<int32_t>(id));
    }
    return {};
  }

  // Rows of the model beyond the tokenizer's tokens (config.json's vocab_size, as Qwen pads
  // its embedding) get unused placeholders, as llama.cpp's converter writes them.
  Status pad_to_model_rows() {
    if (!model_config_) return {};
    const json* n = member(*model_config_, "vocab_size");
    if (n == nullptr) return {};
    if (!n->is_number_unsigned() || n->get<uint64_t>() > tokenizer::kMaxVocabSize) {
      return invalid_argument("config.json: vocab_size is not a count of tokens");
    }
    const auto rows = static_cast<size_t>(n->get<uint64_t>());
    if (rows < tokens_.size()) {
      return invalid_argument("config.json: vocab_size " + std::to_string(rows) + " is below the tokenizer's " +
                              std::to_string(tokens_.size()) + " tokens");
    }
    if (rows > tokens_.size() + kMaxHoles) {
      return invalid_argument("config.json: vocab_size " + std::to_string(rows) + " leaves more than " +
                              std::to_string(kMaxHoles) + " rows without a token");
    }
    tokens_.resize(rows);
    return {};
  }

  // "a b" or ["a", "b"], each part a token of the vocabulary.
  Status read_merges() {
    const json* merges = member(*model_, "merges");
    if (merges == nullptr || !merges->is_array()) return bad("model.merges is not an array");
    if (merges->size() > 4 * tokenizer::kMaxVocabSize) return bad("model.merges is too long");
    merges_.reserve(merges->size());
    for (const json& m : *merges) {
      std::string a, b;
      if (m.is_string()) {
        const std::string t = m.get<std::string>();
        const size_t sp = t.find(' ');
        if (sp == std::string::npos || t.find(' ', sp + 1) != std::string::npos) {
          return bad("model.merges: " + shown(t) + " is not two tokens apart by one space");
        }
        a = t.substr(0, sp);
        b = t.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
        if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos) {
          return unimplemented("model.merges: " + shown(a + " " + b) +
                               " has a space inside a part, which GGUF's \"a b\" merges cannot hold");
        }
      } else {
        return bad("model.merges: an entry that is neither \"a b\" nor [a, b]");
      }
      if (a.empty() || b.empty()) return bad("model.merges: an empty part");
      if (!by_text_.contains(a) || !by_text_.contains(b)) {
        return bad("model.merges: " + shown(a + " " + b) + " merges a token the vocabulary lacks");
      }
      merges_.push_back(a + " " + b);
    }
    return {};
  }

  // A token named by tokenizer_config.json, special_tokens_map.json (a text) or config.json
  // (an id, or the first of a list), in that order; -1 when none names one.
  int32_t named_id(const char* key, const char* id_key) {
    const json* config = config_ ? &*config_ : nullptr;
    const json* map = special_map_ ? &*special_map_ : nullptr;
    for (const json* source : {config, map}) {
      if (auto name = token_name(source, key)) {
        const int32_t id = find(*name);
        if (id < 0) info_.warnings.push_back(std::string(key) + " " + shown(*name) + " is not in the vocabulary; ignored");
        return id;
      }
    }
    if (model_config_) {
      const json* v = member(*model_config_, id_key);
      if (v != nullptr && v->is_array() && !v->empty()) v = &(*v)[0];
      if (v != nullptr && v->is_number_unsigned() && v->get<uint64_t>() < static_cast<uint64_t>(info_.n_vocab)) {
        return static_cast<int32_t>(v->get<uint64_t>());
      }
    }
    return -1;
  }

  Status read_bpe_special_ids() {
    info_.bos_id = named_id("bos_token", "bos_token_id");
    info_.eos_id = named_id("eos_token", "eos_token_id");
    info_.pad_id = named_id("pad_token", "pad_token_id");
    info_.unk_id = named_id("unk_token", "unk_token_id");
    if (const json* unk = model_ != nullptr ? member(*model_, "unk_token") : nullptr;
        unk != nullptr && unk->is_string() && info_.unk_id < 0) {
      info_.unk_id = find(unk->get<std::string>());
    }
    if (sp_) {
      // tokenizer.model's own ids where no file names the token.
      auto own = [&](int32_t& id, int32_t sp_id) {
        if (id < 0 && sp_id >= 0 && sp_id < info_.n_vocab) id = sp_id;
      };
      own(info_.bos_id, sp_model_.bos_id);
      own(info_.eos_id, sp_model_.eos_id);
      own(info_.unk_id, sp_model_.unk_id);
      own(info_.pad_id, sp_model_.pad_id);
    }
    // What the post-processor puts around a text decides, unless tokenizer_config.json says.
    if (info_.first_id >= 0) info_.bos_id = info_.first_id;
    if (info_.last_id >= 0 && info_.eos_id < 0) info_.eos_id = info_.last_id;
    // A SentencePiece tokenizer adds its BOS unless told not to (transformers' default).
    add_bos_ = info_.first_id >= 0 || (sp_ && root_.is_null() && info_.bos_id >= 0);
    add_eos_ = info_.last_id >= 0;
    if (config_) {
      if (const json* v = member(*config_, "add_bos_token"); v != nullptr && v->is_boolean()) add_bos_ = v->get<bool>();
      if (const json* v = member(*config_, "add_eos_token"); v != nullptr && v->is_boolean()) add_eos_ = v->get<bool>();
    }
    if (add_bos_ && info_.bos_id < 0) return bad("a BOS is to be added but no BOS token is named");
    if (add_eos_ && info_.eos_id < 0) return bad("an EOS is to be added but no EOS token is named");
    return {};
  }

  // tokenizer_config.json's chat_template (a text, or named templates of which "default"),
  // or a chat_template.jinja file.
  Status read_chat_template() {
    if (config_) {
      if (const json* t = member(*config_, "chat_template"); t != nullptr) {
        if (t->is_string()) {
          chat_template_ = t->get<std::string>();
        } else if (t->is_array()) {
          for (const json& e : *t) {
            const json* name = member(e, "name");
            const json* text = member(e, "template");
            if (name != nullptr && name->is_string() && name->get<std::string>() == "default" && text != nullptr &&
                text->is_string()) {
              chat_template_ = text->get<std::string>();
            }
          }
          if (!chat_template_) info_.warnings.push_back("tokenizer_config.json: no chat template named 'default'");
        } else {
          return invalid_argument("tokenizer_config.json: chat_template is neither a text nor a list");
        }
      }
    }
    if (!chat_template_ && files_.chat_template_jinja) chat_template_ = *files_.chat_template_jinja;
    return {};
  }

  // Places `text` at `id`, growing the table; refuses ids out of bounds.
  Status place(const std::string& text, int64_t id, const char* where) {
    if (id < 0 || static_cast<uint64_t>(id) >= tokenizer::kMaxVocabSize) {
      return bad(std::string(where) + ": token " + shown(text) + " has id " + std::to_string(id) +
                 "; ids must be in 0.." + std::to_string(tokenizer::kMaxVocabSize - 1));
    }
    if (static_cast<uint64_t>(id) >= tokens_.size() &&
        static_cast<uint64_t>(id) >= 2 * n_placed_ + kMaxHoles) {
      return bad(std::string(where) + ": id " + std::to_string(id) + " of " + shown(text) +
                 " leaves most ids below it unused (" + std::to_string(n_placed_) + " tokens so far)");
    }
    if (text.size() > kMaxTokenTextBytes) {
      return bad(std::string(where) + ": token " + shown(text) + " is " +
                 std::to_string(text.size()) + " bytes long; at most " +
                 std::to_string(kMaxTokenTextBytes) + " allowed");
    }
    if (text.empty()) return bad(std::string(where) + ": an empty token (id " + std::to_string(id) + ")");
    const auto i = static_cast<size_t>(id);
    if (i >= tokens_.size()) tokens_.resize(i + 1);
    if (!tokens_[i].present) ++n_placed_;
    tokens_[i].text = text;
    tokens_[i].present = true;
    return {};
  }

  Status read_vocab() {
    const json* vocab = member(*model_, "vocab");
    if (vocab == nullptr || !vocab->is_object()) return bad("model.vocab is not an object");
    if (vocab->empty()) return bad("model.vocab is empty");
    if (vocab->size() > tokenizer::kMaxVocabSize) {
      return bad("model.vocab has " + std::to_string(vocab->size()) + " tokens; at most " +
                 std::to_string(tokenizer::kMaxVocabSize) + " allowed");
    }
    // Ids first, to size the table once (the order of a JSON object is not the ids').
    int64_t max_id = -1;
    for (const auto& [text, id] : vocab->items()) {
      if (!id.is_number_integer()) {
        return bad("model.vocab: the id of " + shown(text) + " is not an integer");
      }
      max_id = std::max(max_id, id.get<int64_t>());
    }
    if (max_id >= 0 && static_cast<uint64_t>(max_id) >= 2 * vocab->size() + kMaxHoles) {
      return bad("model.vocab: ids run up to " + std::to_string(max_id) + " for " +
                 std::to_string(vocab->size()) + " tokens");
    }
    if (max_id >= 0) tokens_.resize(static_cast<size_t>(max_id) + 1);
    for (const auto& [text, id] : vocab->items()) {
      const int64_t i = id.get<int64_t>();
      if (i >= 0 && static_cast<size_t>(i) < tokens_.size() && tokens_[static_cast<size_t>(i)].present) {
        return bad("model.vocab: " + shown(text) + " and " + shown(tokens_[static_cast<size_t>(i)].text) +
                   " share id " + std::to_string(i));
      }
      METRO_RETURN_IF_ERROR(place(text, i, "model.vocab"));
      by_text_.emplace(text, static_cast<int32_t>(i));
    }
    return {};
  }

  Status read_added_tokens() {
    const json* added = member(root_, "added_tokens");
    if (added == nullptr) return {};
    if (!added->is_array()) return bad("added_tokens is not an array");
    if (added->size() > tokenizer::kMaxVocabSize) return bad("added_tokens is too long");
    for (const json& t : *added) {
      const json* id = member(t, "id");
      const json* content = member(t, "content");
      if (id == nullptr || !id->is_number_integer() || content == nullptr || !content->is_string()) {
        return bad("added_tokens: an entry without an integer 'id' and a string 'content'");
      }
      const std::string text = content->get<std::string>();
      const int64_t i = id->get<int64_t>();
      if (sp_ && i >= 0 && static_cast<size_t>(i) < tokens_.size() && tokens_[static_cast<size_t>(i)].present &&
          tokens_[static_cast<size_t>(i)].text == text) {
        // A piece of tokenizer.model listed again: its own type stands (<unk> stays unknown,
        // byte pieces stay bytes); a normal piece marked special becomes a control token.
        Token& tk = tokens_[static_cast<size_t>(i)];
        if (bool_or(t, "special", false) && tk.type == kTypeNormal) tk.type = kTypeControl;
        added_by_text_.emplace(text, static_cast<int32_t>(i));
        continue;
      }
      if (i >= 0 && static_cast<size_t>(i) < tokens_.size() && tokens_[static_cast<size_t>(i)].present &&
          tokens_[static_cast<size_t>(i)].text != text) {
        const std::string& old = tokens_[static_cast<size_t>(i)].text;
        info_.warnings.push_back("added token " + shown(text) + " replaces " + shown(old) +
                                 " at id " + std::to_string(i));
        if (auto it = by_text_.find(old); it != by_text_.end() && it->second == i) by_text_.erase(it);
      }
      METRO_RETURN_IF_ERROR(place(text, i, "added_tokens"));
      const bool special = bool_or(t, "special", false);
      tokens_[static_cast<size_t>(i)].type = special ? kTypeControl : kTypeUserDefined;
      added_by_text_.emplace(text, static_cast<int32_t>(i));
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (bool_or(t, flag, false)) {
          info_.warnings.push_back("added token " + shown(text) + " has " + flag +
                                   " set, which the GGUF tokenizer does not carry");
        }
      }
      if (bool_or(t, "normalized", !special)) {
        info_.warnings.push_back("added token " + shown(text) +
                                 " is matched in normalized text by Hugging Face, in raw text "
                                 "by metro");
      }
    }
    return {};
  }

  // Ids no token holds get an unused placeholder, as llama.cpp's converter writes them.
  void fill_holes() {
    for (size_t i = 0; i < tokens_.size(); ++i) {
      if (tokens_[i].present) continue;
      tokens_[i].text = "[PAD" + std::to_string(i) + "]";
      tokens_[i].type = kTypeUnused;
    }
    info_.n_vocab = static_cast<int32_t>(tokens_.size());
  }

  int32_t find(const std::string& text) const {
    if (auto it = added_by_text_.find(text); it != added_by_text_.end()) return it->second;
    if (auto it = by_text_.find(text); it != by_text_.end()) return it->second;
    return -1;
  }

  // The id of a special token named by tokenizer_config.json, special_tokens_map.json or
  // BERT's usual name, in that order; -1 when none exists.
  int32_t special_id(const char* key, const char* usual_name) {
    const json* config = config_ ? &*config_ : nullptr;
    const json* map = special_map_ ? &*special_map_ : nullptr;
    for (const json* source : {config, map}) {
      if (auto name = token_name(source, key)) {
        const int32_t id = find(*name);
        if (id < 0) {
          info_.warnings.push_back(std::string(key) + " " + shown(*name) +
                                   " is not in the vocabulary; ignored");
        }
        return id;
      }
    }
    return find(usual_name);
  }

  Status read_special_ids() {
    const json* unk = member(*model_, "unk_token");
    if (unk == nullptr || !unk->is_string()) return bad("model.unk_token is not a string");
    info_.unk_id = find(unk->get<std::string>());
    if (info_.unk_id < 0) {
      return bad("WordPiece's unknown token " + shown(unk->get<std::string>()) +
                 " is not in the vocabulary");
    }
    info_.cls_id = special_id("cls_token", "[CLS]");
    info_.sep_id = special_id("sep_token", "[SEP]");
    info_.pad_id = special_id("pad_token", "[PAD]");
    info_.mask_id = special_id("mask_token", "[MASK]");
    return {};
  }

  Expected<int32_t> template_special(const json& proc, const json& item) {
    const json* name = member(item, "id");
    if (name == nullptr || !name->is_string()) return bad("post_processor: a SpecialToken without an id");
    const json* specials = member(proc, "special_tokens");
    const json* entry = specials != nullptr ? member(*specials, name->get<std::string>().c_str()) : nullptr;
    const json* ids = entry != nullptr ? member(*entry, "ids") : nullptr;
    if (ids == nullptr || !ids->is_array() || ids->size() != 1 || !(*ids)[0].is_number_integer()) {
      return unimplemented("post_processor: special token " + shown(name->get<std::string>()) +
                           " must stand for exactly one id");
    }
    const int64_t id = (*ids)[0].get<int64_t>();
    if (id < 0 || id >= info_.n_vocab) {
      return bad("post_processor: special token id " + std::to_string(id) + " is outside the vocabulary");
    }
    return static_cast<int32_t>(id);
  }

  // [first] $A [last], as TemplateProcessing spells it.
  Status read_template(const json& proc) {
    const json* single = member(proc, "single");
    if (single == nullptr || !single->is_array()) return bad("post_processor: no 'single' template");
    const std::string unsupported =
        "post_processor: metro adds at most one token before a text and one after it; "
        "this template is " + single->dump().substr(0, 200);
    size_t seq_at = single->size();
    for (size_t i = 0; i < single->size(); ++i) {
      if (member((*single)[i], "Sequence") != nullptr) {
        if (seq_at != single->size()) return unimplemented(unsupported);
        seq_at = i;
      }
    }
    if (seq_at == single->size() || seq_at > 1 || single->size() - seq_at > 2) {
      return unimplemented(unsupported);
    }
    for (size_t i = 0; i < single->size(); ++i) {
      if (i == seq_at) continue;
      const json* special = member((*single)[i], "SpecialToken");
      if (special == nullptr) return unimplemented(unsupported);
      METRO_ASSIGN_OR_RETURN(int32_t id, template_special(proc, *special));
      (i < seq_at ? info_.first_id : info_.last_id) = id;
    }
    return {};
  }

  // BertProcessing and RobertaProcessing: "cls": [text, id], "sep": [text, id].
  Status read_cls_sep(const json& proc) {
    auto read = [&](const char* key, int32_t& out) -> Status {
      const json* v = member(proc, key);
      if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer()) {
        return bad(std::string("post_processor: '") + key + "' is not [token, id]");
      }
      const int64_t id = (*v)[1].get<int64_t>();
      if (id < 0 || id >= info_.n_vocab) {
        return bad(std::string("post_processor: the ") + key + " id " + std::to_string(id) +
                   " is outside the vocabulary");
      }
      out = static_cast<int32_t>(id);
      return {};
    };
    METRO_RETURN_IF_ERROR(read("cls", info_.first_id));
    return read("sep", info_.last_id);
  }

  Status read_one_processor(const json& proc, bool& added) {
    const std::string type = type_of(proc);
    if (type == "ByteLevel") return {};
    if (added) return unimplemented("post_processor: more than one processor adds tokens");
    added = true;
    if (type == "TemplateProcessing") return read_template(proc);
    if (type == "BertProcessing" || type == "RobertaProcessing") return read_cls_sep(proc);
    return unimplemented("post_processor " + shown(type) + " is not supported (metro reads "
                         "TemplateProcessing, BertProcessing and RobertaProcessing)");
  }

  Status read_post_processor() {
    const json* proc = member(root_, "post_processor");
    if (proc == nullptr) return {};
    bool added = false;
    if (type_of(*proc) != "Sequence") return read_one_processor(*proc, added);
    const json* list = member(*proc, "processors");
    if (list == nullptr || !list->is_array()) return bad("post_processor: a Sequence without processors");
    for (const json& p : *list) METRO_RETURN_IF_ERROR(read_one_processor(p, added));
    return {};
  }

  void read_token_type_count() {
    if (!model_config_) return;
    const json* n = member(*model_config_, "type_vocab_size");
    if (n != nullptr && n->is_number_integer() && n->get<int64_t>() >= 1 && n->get<int64_t>() <= 1024) {
      info_.token_type_count = static_cast<uint32_t>(n->get<int64_t>());
    }
  }

  void note_dropped_settings() {
    if (member(root_, "truncation") != nullptr) {
      info_.warnings.push_back("tokenizer.json truncates to a fixed length; metro does not truncate");
    }
    if (member(root_, "padding") != nullptr) {
      info_.warnings.push_back("tokenizer.json pads to a fixed length; metro does not pad");
    }
  }

  // llama.cpp's spelling: continuations lose their prefix, other normal tokens gain U+2581,
  // added and unused tokens stay as they are.
  std::string stored(const Token& t) const {
    if (t.type != kTypeNormal) return t.text;
    if (t.text.size() > prefix_.size() && t.text.compare(0, prefix_.size(), prefix_) == 0) {
      return t.text.substr(prefix_.size());
    }
    return std::string(kWordStart) + t.text;
  }

  void write(gguf::Writer& w) {
    std::vector<std::string> texts;
    std::vector<int32_t> types;
    texts.reserve(tokens_.size());
    types.reserve(tokens_.size());
    std::unordered_map<std::string, size_t> seen;
    size_t clashes = 0;
    for (size_t i = 0; i < tokens_.size(); ++i) {
      texts.push_back(stored(tokens_[i]));
      types.push_back(tokens_[i].type);
      if (!seen.emplace(texts.back(), i).second && clashes++ == 0) {
        info_.warnings.push_back("tokens " + std::to_string(seen[texts.back()]) + " and " +
                                 std::to_string(i) + " are both stored as " + shown(texts.back()) +
                                 "; the first is used");
      }
    }
    const std::string p = "tokenizer.ggml.";
    w.add_string(p + "model", "bert");
    w.add_string(p + "pre", "default");
    w.add_string_array(p + "tokens", texts);
    w.add_i32_array(p + "token_type", types);
    w.add_u32(p + "token_type_count", info_.token_type_count);
    auto id_key = [&](const char* key, int32_t id) {
      if (id >= 0) w.add_u32(p + key, static_cast<uint32_t>(id));
    };
    id_key("unknown_token_id", info_.unk_id);
    id_key("seperator_token_id", info_.sep_id);
    id_key("padding_token_id", info_.pad_id);
    id_key("cls_token_id", info_.cls_id);
    id_key("mask_token_id", info_.mask_id);
    id_key("bos_token_id", info_.first_id);
    id_key("eos_token_id", info_.last_id);
    w.add_bool(p + "add_bos_token", info_.first_id >= 0);
    w.add_bool(p + "add_eos_token", info_.last_id >= 0);
    w.add_bool(p + "add_sep_token", false);
    if (chat_template_) w.add_string("tokenizer.chat_template", *chat_template_);
  }

  // BOS / EOS / UNK / PAD ids, whether BOS and EOS are added, and the chat template, as the
  // BPE and SentencePiece conventions share them.
  void write_specials(gguf::Writer& w) const {
    const std::string p = "tokenizer.ggml.";
    auto id_key = [&](const char* key, int32_t id) {
      if (id >= 0) w.add_u32(p + key, static_cast<uint32_t>(id));
    };
    id_key("bos_token_id", info_.bos_id);
    id_key("eos_token_id", info_.eos_id);
    id_key("unknown_token_id", info_.unk_id);
    id_key("padding_token_id", info_.pad_id);
    w.add_bool(p + "add_bos_token", add_bos_);
    w.add_bool(p + "add_eos_token", add_eos_);
    if (chat_template_) w.add_string("tokenizer.chat_template", *chat_template_);
  }

  // llama.cpp's "gpt2" convention: tokens as the file spells them (bytes mapped to
  // printable characters), merges as "a b".
  void write_bpe(gguf::Writer& w) {
    std::vector<std::string> texts;
    std::vector<int32_t> types;
    texts.reserve(tokens_.size());
    types.reserve(tokens_.size());
    for (const Token& t : tokens_) {
      texts.push_back(t.text);
      types.push_back(t.type);
    }
    const std::string p = "tokenizer.ggml.";
    w.add_string(p + "model", "gpt2");
    w.add_string(p + "pre", pre_);
    w.add_string_array(p + "tokens", texts);
    w.add_i32_array(p + "token_type", types);
    w.add_string_array(p + "merges", merges_);
    write_specials(w);
    info_.pre = pre_;
    info_.n_merges = static_cast<int32_t>(merges_.size());
  }

  // llama.cpp's "llama" convention: the pieces with their scores and types; a space before
  // the text when the model adds one.
  void write_spm(gguf::Writer& w) {
    std::vector<std::string> texts;
    std::vector<int32_t> types;
    std::vector<float> scores;
    // Added tokens score below every piece, so that no merge prefers them.
    float lowest = 0.0f;
    for (float f : scores_) lowest = std::min(lowest, f);
    for (size_t i = 0; i < tokens_.size(); ++i) {
      texts.push_back(tokens_[i].text);
      types.push_back(tokens_[i].type);
      scores.push_back(i < scores_.size() ? scores_[i] : lowest - 1.0f);
    }
    const std::string p = "tokenizer.ggml.";
    w.add_string(p + "model", "llama");
    w.add_string(p + "pre", "default");
    w.add_string_array(p + "tokens", texts);
    w.add_f32_array(p + "scores", scores);
    w.add_i32_array(p + "token_type", types);
    write_specials(w);
    w.add_bool(p + "add_space_prefix", sp_model_.add_dummy_prefix);
    info_.pre = "default";
    info_.sentencepiece = true;
  }

  const HfTokenizerFiles& files_;
  json root_;
  const json* model_ = nullptr;
  std::optional<json> config_, special_map_, model_config_;
  std::string prefix_;
  std::vector<Token> tokens_;
  size_t n_placed_ = 0;  // ids that hold a token of the file
  std::map<std::string, int32_t> by_text_;
  std::map<std::string, int32_t> added_by_text_;
  TokenizerInfo info_;
  bool bpe_ = false;
  bool sp_ = false;
  SpModel sp_model_;
  std::vector<float> scores_;  // of the pieces of tokenizer.model
  std::string pre_;
  std::vector<std::string> merges_;
  bool add_bos_ = false, add_eos_ = false;
  std::optional<std::string> chat_template_;
};

}  // namespace

Status write_hf_tokenizer(const HfTokenizerFiles& files, gguf::Writer& w, TokenizerInfo* info) {
  try {
    return Converter(files).run(w, info);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("tokenizer files: unexpected JSON shape (") + e.what() + ")");
  }
}

Status write_hf_tokenizer(const std::string& hf_dir, gguf::Writer& w, TokenizerInfo* info) {
  METRO_ASSIGN_OR_RETURN(HfTokenizerFiles files, read_hf_tokenizer_files(hf_dir));
  return write_hf_tokenizer(files, w, info);
}

}  // namespace metro::convert
