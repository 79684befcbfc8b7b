#include "tokenizer/vocab.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "base/log.h"
#include "tokenizer/utf8.h"

namespace metro::tokenizer {
namespace {

constexpr const char* kTokensKey = "tokenizer.ggml.tokens";
constexpr size_t kMaxExamples = 3;

// Collects one kind of problem and reports it once, with a few examples.
class Issue {
 public:
  explicit Issue(std::string what) : what_(std::move(what)) {}
  void add(std::string example) {
    if (count_++ < kMaxExamples) examples_.push_back(std::move(example));
  }
  void flush(std::vector<std::string>& out) const {
    if (count_ == 0) return;
    std::string msg = std::to_string(count_) + " " + what_ + " (";
    for (size_t i = 0; i < examples_.size(); ++i) msg += (i ? "; " : "") + examples_[i];
    if (count_ > examples_.size()) msg += "; ...";
    out.push_back(msg + ")");
  }

 private:
  std::string what_;
  size_t count_ = 0;
  std::vector<std::string> examples_;
};

// A token text safe to print in a message.
std::string quoted(std::string_view s) { return quoted_for_message(s, 40); }

uint16_t attrs_from_type(int64_t type) {
  switch (type) {
    case 1: return attr::kNormal;
    case 2: return attr::kUnknown;
    case 3: return attr::kControl;
    case 4: return attr::kUserDefined;
    case 5: return attr::kUnused;
    case 6: return attr::kByte;
    default: return attr::kUndefined;
  }
}

// "<0xNN>" -> NN, else nullopt.
std::optional<uint8_t> parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(text[3]), lo = hex(text[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

// Tokens that models use as turn or document ends but that conversions often leave without
// metadata (the same names llama.cpp recognises), in order of preference.
constexpr std::string_view kEotNames[] = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>",    "_<EOT>",  "[EOT]",         "<｜end▁of▁sentence｜>",
    "<end_of_utterance>"};
constexpr std::string_view kEomNames[] = {"<|eom_id|>"};
constexpr std::string_view kFimPreNames[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                             "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                                             "<|code_prefix|>", "<|prefix|>"};
constexpr std::string_view kFimSufNames[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                             "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                                             "<|code_suffix|>", "<|suffix|>"};
constexpr std::string_view kFimMidNames[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                             "<｜fim▁end｜>", "<MID>", "▁<MID>",
                                             "<|code_middle|>", "<|middle|>"};
constexpr std::string_view kFimPadNames[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                             "[PAD]"};
constexpr std::string_view kFimRepNames[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                             "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepNames[] = {"<|file_sep|>"};
// Tokens that end generation wherever they appear.
constexpr std::string_view kEogNames[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>"};

}  // namespace

class VocabLoader {
 public:
  explicit VocabLoader(const gguf::File& f) : f_(f) {}

  Expected<Vocab> load() {
    METRO_RETURN_IF_ERROR(read_model());
    METRO_RETURN_IF_ERROR(read_tokens());
    read_byte_tokens();
    METRO_RETURN_IF_ERROR(read_special_ids());
    detect_special_by_name();
    apply_strip_rules();
    build_pieces();
    build_special_text_list();
    for (const TokenData& t : v_.tokens_) {
      v_.max_token_bytes_ = std::max({v_.max_token_bytes_, t.piece.size(), t.text.size()});
    }
    if (v_.kind_ == VocabKind::kBpe) METRO_RETURN_IF_ERROR(read_merges());
    for (const auto& w : v_.warnings_) METRO_LOG_WARN("tokenizer: %s", w.c_str());
    return std::move(v_);
  }

 private:
  Status read_model() {
    auto model = f_.get_string("tokenizer.ggml.model");
    if (!model.ok()) {
      if (!f_.has("tokenizer.ggml.model")) {
        return not_found("this file has no tokenizer (tokenizer.ggml.model is missing)");
      }
      return model.status();
    }
    v_.model_name_ = std::string(*model);
    if (*model == "gpt2") {
      v_.kind_ = VocabKind::kBpe;
    } else if (*model == "llama") {
      v_.kind_ = VocabKind::kSpm;
    } else if (*model == "bert") {
      v_.kind_ = VocabKind::kWpm;
    } else {
      return unimplemented("tokenizer model " + quoted(*model) +
                           " is not supported (metro reads 'gpt2', 'llama' and 'bert')");
    }
    auto pre = f_.get_string("tokenizer.ggml.pre");
    if (v_.kind_ != VocabKind::kBpe) {
      v_.pre_name_ = pre.ok() ? std::string(*pre) : "default";
      return {};
    }
    if (!pre.ok()) {
      v_.pre_name_ = "default";
      v_.warnings_.push_back(
          "tokenizer.ggml.pre is missing: using the 'default' pre-tokenizer; text may split "
          "differently from the model's training");
    } else {
      v_.pre_name_ = std::string(*pre);
    }
    v_.pre_spec_ = find_pre_tokenizer(v_.pre_name_);
    if (v_.pre_spec_ == nullptr) {
      v_.pre_recognized_ = false;
      v_.pre_spec_ = &gpt2_pre_tokenizer();
      v_.warnings_.push_back("unknown pre-tokenizer " + quoted(v_.pre_name_) +
                             ": splitting words like GPT-2; tokens may differ from the "
                             "model's training");
    }
    return {};
  }

  Status read_tokens() {
    auto texts = f_.get_string_array(kTokensKey);
    if (!texts.ok()) {
      if (!f_.has(kTokensKey)) return not_found("tokenizer.ggml.tokens is missing");
      return texts.status();
    }
    const size_t n = texts->size();
    if (n == 0) return invalid_argument("tokenizer.ggml.tokens is empty");
    if (n > kMaxVocabSize) {
      return out_of_range("tokenizer.ggml.tokens has " + std::to_string(n) +
                          " entries; at most " + std::to_string(kMaxVocabSize) + " allowed");
    }
    std::vector<float> scores;
    if (f_.has("tokenizer.ggml.scores")) {
      auto s = f_.get_f32_array("tokenizer.ggml.scores");
      if (!s.ok()) return s.status();
      if (s->size() < n) {
        return invalid_argument("tokenizer.ggml.scores has " + std::to_string(s->size()) +
                                " entries for " + std::to_string(n) + " tokens");
      }
      scores = std::move(*s);
    }
    std::vector<int64_t> types;
    if (f_.has("tokenizer.ggml.token_type")) {
      auto t = f_.get_int_array("tokenizer.ggml.token_type");
      if (!t.ok()) return t.status();
      if (t->size() < n) {
        return invalid_argument("tokenizer.ggml.token_type has " + std::to_string(t->size()) +
                                " entries for " + std::to_string(n) + " tokens");
      }
      types = std::move(*t);
    }

    Issue empty("empty token strings, never produced by encoding");
    Issue dup("duplicate token strings; encoding uses the first id");
    Issue bad_type("token types outside 0..6, treated as undefined");
    v_.tokens_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      std::string_view text = (*texts)[i];
      if (text.size() > kMaxTokenBytes) {
        return out_of_range("token " + std::to_string(i) + " is " + std::to_string(text.size()) +
                            " bytes long; at most " + std::to_string(kMaxTokenBytes) +
                            " allowed");
      }
      TokenData& t = v_.tokens_[i];
      t.text = std::string(text);
      t.score = scores.empty() ? 0.0f : scores[i];
      if (!types.empty()) {
        t.attrs = attrs_from_type(types[i]);
        if (types[i] < 0 || types[i] > 6) bad_type.add("id " + std::to_string(i));
      }
      if (text.empty()) empty.add("id " + std::to_string(i));
    }
    // Views into tokens_, which no longer changes size.
    v_.text_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const std::string& text = v_.tokens_[i].text;
      if (text.empty()) continue;
      auto [it, inserted] = v_.text_to_id_.emplace(std::string_view(text), static_cast<int32_t>(i));
      if (!inserted) dup.add("id " + std::to_string(i) + " repeats id " + std::to_string(it->second));
    }
    empty.flush(v_.warnings_);
    dup.flush(v_.warnings_);
    bad_type.flush(v_.warnings_);
    return {};
  }

  void read_byte_tokens() {
    std::fill(std::begin(v_.byte_token_), std::end(v_.byte_token_), -1);
    Issue bad("byte tokens not of the form <0xNN>, treated as plain text");
    const int32_t n = v_.n_tokens();
    for (int32_t id = 0; id < n; ++id) {
      TokenData& t = v_.tokens_[static_cast<size_t>(id)];
      if (!(t.attrs & attr::kByte)) continue;
      auto b = parse_byte_token(t.text);
      if (!b) {
        bad.add("id " + std::to_string(id) + " " + quoted(t.text));
        t.attrs = attr::kNormal;
        continue;
      }
      if (v_.kind_ == VocabKind::kSpm && v_.byte_token_[*b] < 0) v_.byte_token_[*b] = id;
    }
    bad.flush(v_.warnings_);
    if (v_.kind_ == VocabKind::kBpe) {
      ByteLevelMap map;
      for (int b = 0; b < 256; ++b) v_.byte_token_[b] = v_.find(map.encode(static_cast<uint8_t>(b)));
    } else if (v_.kind_ == VocabKind::kSpm) {
      // Vocabularies without <0xNN> tokens may hold bytes as one-character strings.
      for (int b = 0; b < 256; ++b) {
        if (v_.byte_token_[b] < 0) {
          const char c = static_cast<char>(b);
          v_.byte_token_[b] = v_.find(std::string_view(&c, 1));
        }
      }
    }
  }

  // Reads an id key; nullopt when absent, warns and ignores when unusable.
  std::optional<int32_t> read_id(const std::string& key) {
    const gguf::Value* val = f_.find(key);
    if (val == nullptr) return std::nullopt;
    auto i = val->as_int();
    if (!i) {
      v_.warnings_.push_back(key + " is not an integer; ignored");
      return std::nullopt;
    }
    if (*i == -1) return -1;  // some converters write -1 for "none"
    if (*i < 0 || *i >= v_.n_tokens()) {
      v_.warnings_.push_back(key + " = " + std::to_string(*i) + " is outside the vocabulary (" +
                             std::to_string(v_.n_tokens()) + " tokens); ignored");
      return std::nullopt;
    }
    return static_cast<int32_t>(*i);
  }

  Status read_special_ids() {
    const bool spm = v_.kind_ == VocabKind::kSpm;
    const bool wpm = v_.kind_ == VocabKind::kWpm;
    auto dflt = [&](int32_t id) { return v_.valid(id) ? id : -1; };
    v_.bos_ = spm ? dflt(1) : -1;
    v_.eos_ = spm ? dflt(2) : -1;
    v_.unk_ = spm ? dflt(0) : -1;
    const std::string p = "tokenizer.ggml.";
    if (auto id = read_id(p + "bos_token_id")) v_.bos_ = *id;
    if (auto id = read_id(p + "eos_token_id")) v_.eos_ = *id;
    if (auto id = read_id(p + "eot_token_id")) v_.eot_ = *id;
    if (auto id = read_id(p + "eom_token_id")) v_.eom_ = *id;
    if (auto id = read_id(p + "unknown_token_id")) v_.unk_ = *id;
    if (auto id = read_id(p + "padding_token_id")) v_.pad_ = *id;
    if (wpm) read_wordpiece_ids();
    if (v_.kind_ == VocabKind::kBpe && v_.pre_spec_->no_bos && !f_.has(p + "bos_token_id")) {
      v_.bos_ = -1;
    }
    for (const char* k : {"fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"}) {
      fim_[k] = read_id(p + k + "_token_id").value_or(-1);
    }

    v_.add_bos_ = spm || wpm ? true : v_.pre_spec_->add_bos;
    v_.add_eos_ = false;
    v_.add_sep_ = wpm;
    v_.add_space_prefix_ = spm;
    METRO_RETURN_IF_ERROR(read_bool(p + "add_bos_token", v_.add_bos_));
    METRO_RETURN_IF_ERROR(read_bool(p + "add_eos_token", v_.add_eos_));
    if (wpm) METRO_RETURN_IF_ERROR(read_bool(p + "add_sep_token", v_.add_sep_));
    if (spm) METRO_RETURN_IF_ERROR(read_bool(p + "add_space_prefix", v_.add_space_prefix_));
    if (v_.add_bos_ && v_.bos_ < 0) {
      v_.warnings_.push_back("add_bos_token is set but there is no BOS token; no BOS is added");
      v_.add_bos_ = false;
    }
    if (v_.add_eos_ && v_.eos_ < 0) {
      v_.warnings_.push_back("add_eos_token is set but there is no EOS token; no EOS is added");
      v_.add_eos_ = false;
    }
    if (v_.add_sep_ && v_.sep_ < 0) {
      v_.warnings_.push_back("add_sep_token is set but there is no separator token; none is added");
      v_.add_sep_ = false;
    }
    if (wpm && v_.unk_ < 0) {
      v_.warnings_.push_back("this WordPiece vocabulary has no unknown token; words it cannot "
                             "spell are left out");
    }
    return {};
  }

  // WordPiece's ids. llama.cpp's converters write [CLS] as cls_token_id, bos_token_id or
  // both, and [SEP] as seperator_token_id (sic), possibly also as eos_token_id. Files
  // without the keys get the tokens of BERT's usual names.
  void read_wordpiece_ids() {
    const std::string p = "tokenizer.ggml.";
    if (auto id = read_id(p + "seperator_token_id")) v_.sep_ = *id;
    if (auto id = read_id(p + "cls_token_id")) v_.cls_ = *id;
    if (auto id = read_id(p + "mask_token_id")) v_.mask_ = *id;
    auto by_name = [&](int32_t& slot, std::string_view name) {
      if (slot < 0) slot = v_.find(name);
    };
    if (!f_.has(p + "bos_token_id")) v_.bos_ = v_.cls_;
    by_name(v_.cls_, "[CLS]");
    by_name(v_.bos_, "[CLS]");
    by_name(v_.sep_, "[SEP]");
    by_name(v_.unk_, "[UNK]");
    by_name(v_.pad_, "[PAD]");
    by_name(v_.mask_, "[MASK]");
  }

  Status read_bool(const std::string& key, bool& out) {
    if (!f_.has(key)) return {};
    auto b = f_.get_bool(key);
    if (!b.ok()) {
      v_.warnings_.push_back(key + " is not a bool; ignored");
      return {};
    }
    out = *b;
    return {};
  }

  // The first token present among `names`, or -1.
  int32_t first_named(std::span<const std::string_view> names) const {
    for (std::string_view n : names) {
      if (int32_t id = v_.find(n); id >= 0) return id;
    }
    return -1;
  }

  void make_control(int32_t id, Issue& overridden) {
    uint16_t& a = v_.tokens_[static_cast<size_t>(id)].attrs;
    if (!(a & attr::kControl)) {
      overridden.add("id " + std::to_string(id) + " " + quoted(v_.token(id).text));
      a |= attr::kControl;
    }
  }

  void detect_special_by_name() {
    Issue overridden("end-of-turn or fill-in-middle tokens not typed control, made control");
    auto detect = [&](int32_t& slot, std::span<const std::string_view> names) {
      if (slot >= 0) return;
      slot = first_named(names);
      if (slot >= 0) make_control(slot, overridden);
    };
    detect(v_.eot_, kEotNames);
    detect(v_.eom_, kEomNames);
    // WordPiece vocabularies belong to encoders, which fill no middles; and their [PAD]
    // must not be taken for a FIM padding token.
    if (v_.kind_ != VocabKind::kWpm) {
      detect(fim_["fim_pre"], kFimPreNames);
      detect(fim_["fim_suf"], kFimSufNames);
      detect(fim_["fim_mid"], kFimMidNames);
      detect(fim_["fim_pad"], kFimPadNames);
      detect(fim_["fim_rep"], kFimRepNames);
      detect(fim_["fim_sep"], kFimSepNames);
    }

    // Control tokens named "unused" are placeholders.
    for (auto& t : v_.tokens_) {
      if ((t.attrs & attr::kControl) && t.text.find("unused") != std::string::npos) {
        t.attrs |= attr::kUnused;
      }
    }

    std::vector<int32_t> eog;
    for (const char* k : {"fim_pad", "fim_rep", "fim_sep"}) {
      if (fim_[k] >= 0) eog.push_back(fim_[k]);
    }
    for (std::string_view n : kEogNames) {
      if (int32_t id = v_.find(n); id >= 0) {
        eog.push_back(id);
        make_control(id, overridden);
      }
    }
    for (int32_t id : {v_.eos_, v_.eot_, v_.eom_}) {
      if (id >= 0) eog.push_back(id);
    }
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    // Harmony-style vocabularies end a message with <|end|> but a turn with <|return|> or
    // <|call|>; there <|end|> must not stop generation.
    auto has = [&](std::string_view name) {
      const int32_t id = v_.find(name);
      return id >= 0 && std::binary_search(eog.begin(), eog.end(), id);
    };
    const int32_t end_id = v_.find("<|end|>");
    if (end_id >= 0 && has("<|end|>") &&
        ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")))) {
      eog.erase(std::find(eog.begin(), eog.end(), end_id));
      v_.tokens_[static_cast<size_t>(end_id)].attrs = attr::kUserDefined;
    }
    for (int32_t id : eog) v_.tokens_[static_cast<size_t>(id)].attrs |= attr::kEog;
    v_.eog_ = std::move(eog);
    overridden.flush(v_.warnings_);
  }

  // Phi-3's special tokens swallow the whitespace after them (its tokenizer.json says
  // rstrip); GGUF has no field for it, so like llama.cpp this goes by the model's name.
  void apply_strip_rules() {
    auto name = f_.get_string("general.name");
    if (!name.ok()) return;
    std::string lower(*name);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("phi-3") == std::string::npos && lower.find("phi3") == std::string::npos) return;
    for (auto& t : v_.tokens_) {
      if (t.attrs & attr::kSpecialText) t.attrs |= attr::kRStrip;
    }
    if (int32_t id = v_.find("</s>"); id >= 0) v_.tokens_[static_cast<size_t>(id)].attrs |= attr::kRStrip;
    for (std::string_view n : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (int32_t id = v_.find(n); id >= 0) {
        v_.tokens_[static_cast<size_t>(id)].attrs &= static_cast<uint16_t>(~attr::kRStrip);
      }
    }
  }

  void build_pieces() {
    ByteLevelMap map;
    for (auto& t : v_.tokens_) {
      const uint16_t a = t.attrs;
      if (a & attr::kSpecialText) {
        t.piece = t.text;
      } else if (a & attr::kByte) {
        t.piece = std::string(1, static_cast<char>(*parse_byte_token(t.text)));
      } else if (a & attr::kNormal) {
        if (v_.kind_ == VocabKind::kBpe) {
          t.piece = byte_level_decode(map, t.text);
        } else if (v_.kind_ == VocabKind::kWpm) {
          // A word-initial piece starts a new word; a continuation joins the previous one.
          t.piece = t.text.starts_with("\xE2\x96\x81") ? " " + t.text.substr(3) : t.text;
        } else {
          t.piece = t.text;
          for (size_t pos = 0; (pos = t.piece.find("\xE2\x96\x81", pos)) != std::string::npos;) {
            t.piece.replace(pos, 3, " ");
            pos += 1;
          }
        }
      }
      // Undefined and unused-only tokens decode to nothing, as in llama.cpp.
    }
  }

  void build_special_text_list() {
    for (int32_t id = 0; id < v_.n_tokens(); ++id) {
      const TokenData& t = v_.token(id);
      if ((t.attrs & attr::kSpecialText) && !t.text.empty()) v_.special_text_tokens_.push_back(id);
    }
    std::stable_sort(v_.special_text_tokens_.begin(), v_.special_text_tokens_.end(),
                     [&](int32_t a, int32_t b) { return v_.token(a).text.size() > v_.token(b).text.size(); });
  }

  Status read_merges() {
    auto merges = f_.get_string_array("tokenizer.ggml.merges");
    if (!merges.ok()) {
      if (!f_.has("tokenizer.ggml.merges")) {
        return not_found("tokenizer.ggml.merges is missing (a 'gpt2' tokenizer needs merges)");
      }
      return merges.status();
    }
    Issue bad("merges that are malformed or name tokens missing from the vocabulary, ignored");
    v_.merges_.reserve(merges->size());
    std::string joined;
    for (size_t i = 0; i < merges->size(); ++i) {
      std::string_view m = (*merges)[i];
      const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
      if (sp == std::string_view::npos) {
        bad.add("#" + std::to_string(i) + " " + quoted(m));
        continue;
      }
      std::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
      joined.assign(a);
      joined.append(b);
      const int32_t l = v_.find(a), r = v_.find(b), res = v_.find(joined);
      if (l < 0 || r < 0 || res < 0) {
        bad.add("#" + std::to_string(i) + " " + quoted(m));
        continue;
      }
      v_.merges_.push_back({l, r, res});
    }
    bad.flush(v_.warnings_);
    return {};
  }

  const gguf::File& f_;
  Vocab v_;
  std::unordered_map<std::string, int32_t> fim_;
};

int32_t Vocab::find(std::string_view text) const {
  auto it = text_to_id_.find(text);
  return it == text_to_id_.end() ? -1 : it->second;
}

Expected<Vocab> Vocab::from_gguf(const gguf::File& file) { return VocabLoader(file).load(); }

}  // namespace metro::tokenizer
