#include "tokenizer/tokenizer.h"

#include "tokenizer/bert_normalizer.h"
#include "tokenizer/special_split.h"
#include "tokenizer/spm.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/wordpiece.h"

namespace metro::tokenizer {
namespace {

void encode_bpe(const PreTokenizer& pre, const BpeModel& bpe, const WordCache& cache,
                std::string_view text, const std::vector<Fragment>& fragments,
                std::vector<int32_t>& out) {
  std::vector<TextSpan> words;
  BpeScratch scratch;
  out.reserve(out.size() + text.size() / 4 + 8);
  for (const Fragment& f : fragments) {
    if (f.is_token()) {
      out.push_back(f.token);
      continue;
    }
    const std::string_view chunk = text.substr(f.offset, f.length);
    pre.split(chunk, words);
    for (const TextSpan w : words) {
      const std::string_view word = chunk.substr(w.offset, w.length);
      if (cache.lookup(word, out)) continue;
      const size_t before = out.size();
      bpe.encode_word(word, out, scratch);
      cache.insert(word, std::span<const int32_t>(out).subspan(before));
    }
  }
}

void encode_spm(const Vocab& v, std::string_view text, const std::vector<Fragment>& fragments,
                std::vector<int32_t>& out) {
  SpmScratch scratch;
  bool prev_special = true;  // a space goes before the first text, as SentencePiece does
  std::string piece;
  for (const Fragment& f : fragments) {
    if (f.is_token()) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    piece.clear();
    if (v.add_space_prefix() && prev_special) piece.push_back(' ');
    piece.append(text.substr(f.offset, f.length));
    spm_encode(v, spm_escape_spaces(piece), out, scratch);
    prev_special = false;
  }
}

// The cache is keyed by the normalized word, so "The" and "the" share an entry.
void encode_wpm(const Vocab& v, const WordCache& cache, std::string_view text,
                const std::vector<Fragment>& fragments, std::vector<int32_t>& out) {
  BertWords words;
  WordPieceScratch scratch;
  for (const Fragment& f : fragments) {
    if (f.is_token()) {
      out.push_back(f.token);
      continue;
    }
    bert_split_words(text.substr(f.offset, f.length), words);
    out.reserve(out.size() + words.words.size() + 8);
    for (const BertWord& w : words.words) {
      const std::string_view word = std::string_view(words.text).substr(w.offset, w.length);
      if (cache.lookup(word, out)) continue;
      const size_t before = out.size();
      wordpiece_encode_word(v, word, w.n_chars, out, scratch);
      cache.insert(word, std::span<const int32_t>(out).subspan(before));
    }
  }
}

}  // namespace

Expected<Tokenizer> Tokenizer::from_gguf(const gguf::File& file, const TokenizerOptions& options) {
  METRO_ASSIGN_OR_RETURN(Vocab vocab, Vocab::from_gguf(file));
  auto impl = std::make_shared<Impl>(std::move(vocab), options.word_cache_entries);
  if (impl->vocab.kind() == VocabKind::kBpe) {
    const PreTokenizerSpec& spec = *impl->vocab.pre_spec();
    METRO_ASSIGN_OR_RETURN(PreTokenizer pre, PreTokenizer::create(spec));
    impl->pre.emplace(std::move(pre));
    impl->bpe.emplace(impl->vocab, spec.ignore_merges);
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const Vocab& v = impl_->vocab;
  std::vector<int32_t> out;
  std::vector<Fragment> fragments;
  split_special(v, text, parse_special, fragments);
  if (add_special && v.add_bos()) out.push_back(v.bos_id());

  switch (v.kind()) {
    case VocabKind::kBpe:
      encode_bpe(*impl_->pre, *impl_->bpe, impl_->cache, text, fragments, out);
      break;
    case VocabKind::kSpm:
      encode_spm(v, text, fragments, out);
      break;
    case VocabKind::kWpm:
      encode_wpm(v, impl_->cache, text, fragments, out);
      break;
  }

  if (add_special && v.add_eos()) out.push_back(v.eos_id());
  if (add_special && v.add_sep() && !(v.add_eos() && v.eos_id() == v.sep_id())) {
    out.push_back(v.sep_id());
  }
  return out;
}

void append_decoded(const Vocab& vocab, int32_t id, const DecodeOptions& options,
                    bool& strip_next, std::string& out) {
  if (!vocab.valid(id)) return;
  const TokenData& t = vocab.token(id);
  if (t.attrs & attr::kSpecialText) {
    const bool shown = !(t.attrs & attr::kHidden) || options.render_special;
    if (vocab.kind() == VocabKind::kWpm) {
      // A special token shown is a word of its own; a hidden one leaves no trace.
      if (shown) {
        if (!strip_next) out.push_back(' ');
        out.append(t.piece);
        strip_next = false;
      }
      return;
    }
    if (shown) out.append(t.piece);
    strip_next = options.strip_leading_space && vocab.add_space_prefix();
    return;
  }
  if (t.piece.empty()) return;
  if (strip_next) {
    strip_next = false;
    if (t.piece[0] == ' ') {
      out.append(t.piece, 1);
      return;
    }
  }
  out.append(t.piece);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  const Vocab& v = impl_->vocab;
  std::string out;
  bool strip_next = strips_first_space(v, options);
  for (const int32_t id : ids) append_decoded(v, id, options, strip_next, out);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  const Vocab& v = impl_->vocab;
  return v.valid(id) ? v.token(id).piece : std::string();
}

int32_t Tokenizer::n_vocab() const { return impl_->vocab.n_tokens(); }
int32_t Tokenizer::bos_id() const { return impl_->vocab.bos_id(); }
int32_t Tokenizer::eos_id() const { return impl_->vocab.eos_id(); }
int32_t Tokenizer::eot_id() const { return impl_->vocab.eot_id(); }
int32_t Tokenizer::pad_id() const { return impl_->vocab.pad_id(); }
int32_t Tokenizer::unk_id() const { return impl_->vocab.unk_id(); }
bool Tokenizer::is_eog(int32_t id) const { return impl_->vocab.is_eog(id); }
bool Tokenizer::add_bos() const { return impl_->vocab.add_bos(); }
bool Tokenizer::add_eos() const { return impl_->vocab.add_eos(); }
bool Tokenizer::is_control(int32_t id) const {
  return impl_->vocab.valid(id) && (impl_->vocab.attrs(id) & attr::kHidden);
}
VocabKind Tokenizer::kind() const { return impl_->vocab.kind(); }
std::string_view Tokenizer::pre_tokenizer_name() const { return impl_->vocab.pre_name(); }
bool Tokenizer::pre_tokenizer_recognized() const { return impl_->vocab.pre_recognized(); }
const std::vector<std::string>& Tokenizer::warnings() const { return impl_->vocab.warnings(); }
const Vocab& Tokenizer::vocab() const { return impl_->vocab; }

}  // namespace metro::tokenizer
