#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <string>

#include "tokenizer/utf8.h"

namespace metro::tokenizer {
namespace {

// GPT-2's split. llama.cpp hand-codes it, equal to this pattern.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's split; the case-insensitive contractions written out so that no Unicode case
// folding (long s, Kelvin sign) joins them.
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's: Llama 3's with single digits.
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Tekken and GPT-4o tell upper from lower case only within ASCII in llama.cpp (every other
// letter counts as both). "A letter that is not a-z" is written as the class [^\P{L}a-z]
// rather than llama.cpp's lookahead group, which means the same but makes PCRE2 keep a
// backtracking frame per character and run out of JIT stack on long words.
constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?[^\P{L}a-z]*[^\P{L}A-Z]+|[^\r\n\p{L}\p{N}]?[^\P{L}a-z]+[^\P{L}A-Z]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[^\P{L}a-z]*[^\P{L}A-Z]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[^\P{L}a-z]+[^\P{L}A-Z]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kPoro = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
constexpr std::string_view kDigit = R"(\p{N})";

constexpr std::array<std::string_view, 1> kGpt2List = {kGpt2};
constexpr std::array<std::string_view, 1> kLlama3List = {kLlama3};
constexpr std::array<std::string_view, 1> kQwen2List = {kQwen2};
constexpr std::array<std::string_view, 1> kQwen35List = {kQwen35};
constexpr std::array<std::string_view, 1> kTekkenList = {kTekken};
constexpr std::array<std::string_view, 1> kGpt4oList = {kGpt4o};
constexpr std::array<std::string_view, 1> kPoroList = {kPoro};
constexpr std::array<std::string_view, 2> kVikingList = {kPoro, kDigit};
constexpr std::array<std::string_view, 2> kStarcoderList = {kDigit, kGpt2};
constexpr std::array<std::string_view, 4> kDefaultList = {
    R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"};
constexpr std::array<std::string_view, 3> kFalconList = {
    R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"};
constexpr std::array<std::string_view, 6> kDeepseekLlmList = {
    R"([\r\n])",
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)",
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
    R"(\s+$)",
    R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)",
    R"(\p{N}+)"};
constexpr std::array<std::string_view, 5> kDeepseekCoderList = {
    R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)",
    R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)", R"(\p{N})"};
constexpr std::array<std::string_view, 3> kDeepseekV3List = {
    R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};

const PreTokenizerSpec kGpt2Spec{"gpt2", kGpt2List};
const PreTokenizerSpec kSpecs[] = {
    {"default", kDefaultList},
    {"gpt2", kGpt2List},
    {"llama3", kLlama3List, /*ignore_merges=*/true, /*add_bos=*/true},
    {"llama3-regex", kLlama3List},                    // dbrx, smaug: Llama 3's regex only
    {"chatglm4", kLlama3List, false, false, /*no_bos=*/true},
    {"glm4", kLlama3List, true, false, true},
    {"qwen2", kQwen2List},
    {"qwen35", kQwen35List},
    {"starcoder", kStarcoderList},
    {"falcon", kFalconList},
    {"deepseek-llm", kDeepseekLlmList},
    {"deepseek-coder", kDeepseekCoderList},
    {"deepseek-v3", kDeepseekV3List},
    {"poro", kPoroList},
    {"viking", kVikingList},
    {"tekken", kTekkenList, true, true},
    {"gpt4o", kGpt4oList},
};

const PreTokenizerSpec& spec_named(std::string_view family) {
  for (const auto& s : kSpecs) {
    if (s.family == family) return s;
  }
  METRO_CHECK_MSG(false, "pre-tokenizer family missing from the table");
  return kGpt2Spec;
}

struct Alias {
  std::string_view name;
  std::string_view family;
};
constexpr Alias kAliases[] = {
    {"default", "default"},
    {"llama3", "llama3"},        {"llama-v3", "llama3"},     {"llama-bpe", "llama3"},
    {"falcon3", "llama3"},       {"falcon-h1", "llama3"},    {"pixtral", "llama3"},
    {"midm-2.0", "llama3"},      {"lfm2", "llama3"},
    {"dbrx", "llama3-regex"},    {"smaug-bpe", "llama3-regex"},
    {"chatglm-bpe", "chatglm4"}, {"glm4", "glm4"},
    {"qwen2", "qwen2"},          {"deepseek-r1-qwen", "qwen2"}, {"stablelm2", "qwen2"},
    {"megrez", "qwen2"},         {"hunyuan", "qwen2"},       {"qwen35", "qwen35"},
    {"starcoder", "starcoder"},  {"refact", "starcoder"},    {"command-r", "starcoder"},
    {"smollm", "starcoder"},     {"codeshell", "starcoder"}, {"exaone", "starcoder"},
    {"minerva-7b", "starcoder"}, {"mellum2", "starcoder"},
    {"gpt-2", "gpt2"},           {"phi-2", "gpt2"},          {"mpt", "gpt2"},
    {"olmo", "gpt2"},            {"jais", "gpt2"},           {"jina-es", "gpt2"},
    {"jina-de", "gpt2"},         {"jina-v1-en", "gpt2"},     {"jina-v2-es", "gpt2"},
    {"jina-v2-de", "gpt2"},      {"jina-v2-code", "gpt2"},   {"roberta-bpe", "gpt2"},
    {"gigachat", "gpt2"},        {"exaone4", "gpt2"},        {"trillion", "gpt2"},
    {"granite-docling", "gpt2"}, {"a.x-4.0", "gpt2"},        {"mellum", "gpt2"},
    {"falcon", "falcon"},
    {"deepseek-llm", "deepseek-llm"}, {"deepseek-coder", "deepseek-coder"},
    {"deepseek-v3", "deepseek-v3"},
    {"poro-chat", "poro"},       {"bloom", "poro"},          {"gpt3-finnish", "poro"},
    {"viking", "viking"},
    {"tekken", "tekken"},
    {"gpt-4o", "gpt4o"},         {"llama4", "gpt4o"},
};

constexpr uint32_t kCompileOptions =
    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
constexpr uint32_t kMaxCaptures = 16;

}  // namespace

const PreTokenizerSpec* find_pre_tokenizer(std::string_view pre_name) {
  for (const auto& a : kAliases) {
    if (a.name == pre_name) return &spec_named(a.family);
  }
  return nullptr;
}

bool is_known_pre_tokenizer(std::string_view pre_name) {
  return find_pre_tokenizer(pre_name) != nullptr;
}

const PreTokenizerSpec& gpt2_pre_tokenizer() { return kGpt2Spec; }

std::vector<std::string_view> known_pre_tokenizer_names() {
  std::vector<std::string_view> names;
  for (const auto& a : kAliases) names.push_back(a.name);
  return names;
}

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

Expected<PreTokenizer> PreTokenizer::create(const PreTokenizerSpec& spec) {
  PreTokenizer p;
  p.spec_ = &spec;
  for (std::string_view re : spec.regexes) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    auto pat = std::make_unique<Pattern>();
    pat->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(), kCompileOptions,
                              &err, &err_offset, nullptr);
    if (pat->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return internal_error("pre-tokenizer '" + std::string(spec.family) + "': regex error at " +
                            std::to_string(err_offset) + ": " + reinterpret_cast<char*>(msg));
    }
    uint32_t captures = 0;
    pcre2_pattern_info(pat->code, PCRE2_INFO_CAPTURECOUNT, &captures);
    METRO_CHECK(captures + 1 <= kMaxCaptures);
    // Without JIT (an unsupported CPU), the interpreter gives the same matches, slower.
    (void)pcre2_jit_compile(pat->code, PCRE2_JIT_COMPLETE);
    p.patterns_.push_back(std::move(pat));
  }
  return p;
}

namespace {

// Match state of one split() call. The JIT's default 32 KiB stack suffices for the
// patterns above on ordinary text; a pathological word gets a larger stack, then the
// interpreter, and if even that gives up the rest of the piece stays unsplit.
class Matcher {
 public:
  Matcher() : md_(pcre2_match_data_create(kMaxCaptures, nullptr)) { METRO_CHECK(md_ != nullptr); }
  ~Matcher() {
    pcre2_match_data_free(md_);
    pcre2_match_context_free(ctx_);
    pcre2_jit_stack_free(stack_);
  }
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // The next match in subject[start, end); false when there is none.
  bool next(const pcre2_code* code, std::string_view subject, size_t start, size_t& m_begin,
            size_t& m_end) {
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    int rc = pcre2_match(code, s, subject.size(), start, 0, md_, ctx_);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && stack_ == nullptr) {
      stack_ = pcre2_jit_stack_create(32 * 1024, kBigJitStackBytes, nullptr);
      ctx_ = pcre2_match_context_create(nullptr);
      if (stack_ != nullptr && ctx_ != nullptr) {
        pcre2_jit_stack_assign(ctx_, nullptr, stack_);
        rc = pcre2_match(code, s, subject.size(), start, 0, md_, ctx_);
      }
    }
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      rc = pcre2_match(code, s, subject.size(), start, PCRE2_NO_JIT, md_, ctx_);
    }
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_);
    m_begin = ov[0];
    m_end = ov[1];
    return m_begin >= start && m_end >= m_begin && m_end <= subject.size();
  }

 private:
  static constexpr size_t kBigJitStackBytes = 8 << 20;
  pcre2_match_data* md_;
  pcre2_match_context* ctx_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<TextSpan>& words) const {
  words.clear();
  if (text.empty()) return;
  METRO_CHECK(text.size() <= UINT32_MAX);
  words.push_back({0, static_cast<uint32_t>(text.size())});
  std::vector<TextSpan> next;
  Matcher matcher;
  for (const auto& pat : patterns_) {
    next.clear();
    next.reserve(words.size() * 2);
    for (const TextSpan w : words) {
      const std::string_view piece = text.substr(w.offset, w.length);
      size_t gap = 0;     // start of text not yet emitted
      size_t search = 0;  // where the next match may start
      while (search < piece.size()) {
        size_t b = 0, e = 0;
        if (!matcher.next(pat->code, piece, search, b, e)) break;
        if (e == b) {
          // An empty match cuts nothing; step over one character and search on.
          if (b >= piece.size()) break;
          search = b + std::min(utf8_lead_len(static_cast<uint8_t>(piece[b])), piece.size() - b);
          continue;
        }
        if (b > gap) next.push_back({w.offset + static_cast<uint32_t>(gap), static_cast<uint32_t>(b - gap)});
        next.push_back({w.offset + static_cast<uint32_t>(b), static_cast<uint32_t>(e - b)});
        gap = search = e;
      }
      if (gap < piece.size()) {
        next.push_back({w.offset + static_cast<uint32_t>(gap), static_cast<uint32_t>(piece.size() - gap)});
      }
    }
    words.swap(next);
  }
}

}  // namespace metro::tokenizer
