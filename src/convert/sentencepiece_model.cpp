#include "convert/sentencepiece_model.h"

#include <cstring>

#include "tokenizer/vocab.h"

namespace metro::convert {
namespace {

// Protocol buffer wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5;

Status bad(const std::string& what) { return invalid_argument("tokenizer.model: " + what); }

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool done() const { return pos_ >= b_.size(); }

  Expected<uint64_t> varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= b_.size()) return bad("a number runs past the end");
      const auto c = static_cast<uint8_t>(b_[pos_++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if ((c & 0x80) == 0) return v;
    }
    return bad("a number longer than ten bytes");
  }

  // A field's number and wire type.
  Expected<std::pair<uint32_t, uint32_t>> tag() {
    METRO_ASSIGN_OR_RETURN(uint64_t t, varint());
    if ((t >> 3) == 0 || (t >> 3) > (uint64_t{1} << 29)) return bad("a field number out of range");
    return std::pair<uint32_t, uint32_t>{static_cast<uint32_t>(t >> 3), static_cast<uint32_t>(t & 7)};
  }

  Expected<std::string_view> bytes() {
    METRO_ASSIGN_OR_RETURN(uint64_t n, varint());
    if (n > b_.size() - pos_) return bad("a field of " + std::to_string(n) + " bytes runs past the end");
    const std::string_view s = b_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

  Expected<float> fixed32() {
    if (b_.size() - pos_ < 4) return bad("a float runs past the end");
    uint32_t u = 0;
    for (int i = 0; i < 4; ++i) u |= static_cast<uint32_t>(static_cast<uint8_t>(b_[pos_ + i])) << (8 * i);
    pos_ += 4;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }

  Status skip(uint32_t wire) {
    switch (wire) {
      case kVarint:
        return varint().status();
      case kFixed64:
        if (b_.size() - pos_ < 8) return bad("a field runs past the end");
        pos_ += 8;
        return {};
      case kLen:
        return bytes().status();
      case kFixed32:
        return fixed32().status();
      default:
        return bad("wire type " + std::to_string(wire) + " (groups or a damaged file)");
    }
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

// A varint field as the int32 protobuf stores (negative numbers in ten bytes).
Expected<int32_t> int32_field(Reader& r) {
  METRO_ASSIGN_OR_RETURN(uint64_t v, r.varint());
  return static_cast<int32_t>(static_cast<uint32_t>(v));
}

Status expect(uint32_t wire, uint32_t want, const char* field) {
  if (wire != want) return bad(std::string(field) + " has the wrong wire type");
  return {};
}

Expected<SpPiece> parse_piece(std::string_view b) {
  SpPiece p;
  bool has_text = false;
  Reader r(b);
  while (!r.done()) {
    METRO_ASSIGN_OR_RETURN(auto t, r.tag());
    if (t.first == 1) {
      METRO_RETURN_IF_ERROR(expect(t.second, kLen, "piece"));
      METRO_ASSIGN_OR_RETURN(std::string_view s, r.bytes());
      if (s.size() > tokenizer::kMaxTokenBytes) return bad("a piece of " + std::to_string(s.size()) + " bytes");
      p.text.assign(s);
      has_text = true;
    } else if (t.first == 2) {
      METRO_RETURN_IF_ERROR(expect(t.second, kFixed32, "score"));
      METRO_ASSIGN_OR_RETURN(p.score, r.fixed32());
    } else if (t.first == 3) {
      METRO_RETURN_IF_ERROR(expect(t.second, kVarint, "type"));
      METRO_ASSIGN_OR_RETURN(p.type, int32_field(r));
      if (p.type < 1 || p.type > 6) return bad("a piece of unknown type " + std::to_string(p.type));
    } else {
      METRO_RETURN_IF_ERROR(r.skip(t.second));
    }
  }
  if (!has_text || p.text.empty()) return bad("a piece without text");
  return p;
}

Status parse_trainer(std::string_view b, SpModel& m) {
  Reader r(b);
  while (!r.done()) {
    METRO_ASSIGN_OR_RETURN(auto t, r.tag());
    int32_t* target = nullptr;
    bool* flag = nullptr;
    switch (t.first) {
      case 3: target = &m.model_type; break;
      case 24: flag = &m.whitespace_as_suffix; break;
      case 35: flag = &m.byte_fallback; break;
      case 40: target = &m.unk_id; break;
      case 41: target = &m.bos_id; break;
      case 42: target = &m.eos_id; break;
      case 43: target = &m.pad_id; break;
      default: break;
    }
    if (target != nullptr || flag != nullptr) {
      METRO_RETURN_IF_ERROR(expect(t.second, kVarint, "a trainer setting"));
      METRO_ASSIGN_OR_RETURN(int32_t v, int32_field(r));
      if (target != nullptr) *target = v;
      if (flag != nullptr) *flag = v != 0;
    } else {
      METRO_RETURN_IF_ERROR(r.skip(t.second));
    }
  }
  return {};
}

Status parse_normalizer(std::string_view b, SpModel& m) {
  Reader r(b);
  while (!r.done()) {
    METRO_ASSIGN_OR_RETURN(auto t, r.tag());
    if (t.first == 1 || t.first == 2) {
      METRO_RETURN_IF_ERROR(expect(t.second, kLen, "a normalizer field"));
      METRO_ASSIGN_OR_RETURN(std::string_view s, r.bytes());
      if (t.first == 1) m.normalizer.assign(s.substr(0, 64));
      if (t.first == 2) m.has_charsmap = !s.empty();
    } else if (t.first >= 3 && t.first <= 5) {
      METRO_RETURN_IF_ERROR(expect(t.second, kVarint, "a normalizer flag"));
      METRO_ASSIGN_OR_RETURN(uint64_t v, r.varint());
      (t.first == 3 ? m.add_dummy_prefix : t.first == 4 ? m.remove_extra_whitespaces : m.escape_whitespaces) = v != 0;
    } else {
      METRO_RETURN_IF_ERROR(r.skip(t.second));
    }
  }
  return {};
}

}  // namespace

Expected<SpModel> parse_sentencepiece_model(std::string_view bytes) {
  SpModel m;
  Reader r(bytes);
  while (!r.done()) {
    METRO_ASSIGN_OR_RETURN(auto t, r.tag());
    if (t.first >= 1 && t.first <= 3) {
      METRO_RETURN_IF_ERROR(expect(t.second, kLen, "a model field"));
      METRO_ASSIGN_OR_RETURN(std::string_view b, r.bytes());
      if (t.first == 1) {
        if (m.pieces.size() >= tokenizer::kMaxVocabSize) return bad("more pieces than a vocabulary may hold");
        METRO_ASSIGN_OR_RETURN(SpPiece p, parse_piece(b));
        m.pieces.push_back(std::move(p));
      } else if (t.first == 2) {
        METRO_RETURN_IF_ERROR(parse_trainer(b, m));
      } else {
        METRO_RETURN_IF_ERROR(parse_normalizer(b, m));
      }
    } else {
      METRO_RETURN_IF_ERROR(r.skip(t.second));
    }
  }
  if (m.pieces.empty()) return bad("no pieces");
  return m;
}

}  // namespace metro::convert
