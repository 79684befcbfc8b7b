#include "base/msgpack_reader.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace metro {

std::optional<int64_t> MsgpackValue::as_int() const {
  if (type == Type::kInt) return i;
  if (type == Type::kUint && u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(u);
  }
  return std::nullopt;
}

std::optional<uint64_t> MsgpackValue::as_uint() const {
  if (type == Type::kUint) return u;
  return std::nullopt;
}

const MsgpackValue* MsgpackValue::get(std::string_view key) const {
  if (type != Type::kMap) return nullptr;
  for (size_t k = 0; k + 1 < items.size(); k += 2) {
    if (items[k].type == Type::kStr && items[k].s == key) return &items[k + 1];
  }
  return nullptr;
}

namespace {

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  Status value(MsgpackValue* out, int depth) {
    if (depth < 0) return invalid_argument("msgpack: nested too deep");
    uint8_t tag;
    METRO_RETURN_IF_ERROR(byte(&tag));
    using T = MsgpackValue::Type;
    if (tag <= 0x7f) return set_uint(out, tag);
    if (tag >= 0xe0) return set_int(out, static_cast<int8_t>(tag));
    if ((tag & 0xf0) == 0x80) return container(out, T::kMap, tag & 0x0f, depth);
    if ((tag & 0xf0) == 0x90) return container(out, T::kArray, tag & 0x0f, depth);
    if ((tag & 0xe0) == 0xa0) return bytes(out, T::kStr, tag & 0x1f);
    uint64_t n = 0;
    switch (tag) {
      case 0xc0: out->type = T::kNil; return {};
      case 0xc2: case 0xc3: out->type = T::kBool; out->b = tag == 0xc3; return {};
      case 0xc4: case 0xc5: case 0xc6:
        METRO_RETURN_IF_ERROR(be(size_t{1} << (tag - 0xc4), &n));
        return bytes(out, T::kBin, n);
      case 0xc7: case 0xc8: case 0xc9: {
        METRO_RETURN_IF_ERROR(be(size_t{1} << (tag - 0xc7), &n));
        return ext(out, n);
      }
      case 0xca: {
        METRO_RETURN_IF_ERROR(be(4, &n));
        out->type = T::kFloat;
        out->f = std::bit_cast<float>(static_cast<uint32_t>(n));
        return {};
      }
      case 0xcb:
        METRO_RETURN_IF_ERROR(be(8, &n));
        out->type = T::kFloat;
        out->f = std::bit_cast<double>(n);
        return {};
      case 0xcc: case 0xcd: case 0xce: case 0xcf:
        METRO_RETURN_IF_ERROR(be(size_t{1} << (tag - 0xcc), &n));
        return set_uint(out, n);
      case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        const size_t w = size_t{1} << (tag - 0xd0);
        METRO_RETURN_IF_ERROR(be(w, &n));
        // Sign-extend the w-byte value.
        const int shift = static_cast<int>(64 - 8 * w);
        const auto v = static_cast<int64_t>(n << shift) >> shift;
        return v >= 0 ? set_uint(out, static_cast<uint64_t>(v)) : set_int(out, v);
      }
      case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        return ext(out, uint64_t{1} << (tag - 0xd4));
      case 0xd9: case 0xda: case 0xdb:
        METRO_RETURN_IF_ERROR(be(size_t{1} << (tag - 0xd9), &n));
        return bytes(out, T::kStr, n);
      case 0xdc: case 0xdd:
        METRO_RETURN_IF_ERROR(be(size_t{2} << (tag - 0xdc), &n));
        return container(out, T::kArray, n, depth);
      case 0xde: case 0xdf:
        METRO_RETURN_IF_ERROR(be(size_t{2} << (tag - 0xde), &n));
        return container(out, T::kMap, n, depth);
      default: return invalid_argument("msgpack: byte 0xc1 is never used");
    }
  }

  size_t left() const { return in_.size() - pos_; }

 private:
  Status byte(uint8_t* b) {
    if (pos_ >= in_.size()) return invalid_argument("msgpack: truncated");
    *b = static_cast<uint8_t>(in_[pos_++]);
    return {};
  }
  Status be(size_t width, uint64_t* out) {
    if (left() < width) return invalid_argument("msgpack: truncated");
    uint64_t v = 0;
    for (size_t k = 0; k < width; ++k) v = (v << 8) | static_cast<uint8_t>(in_[pos_ + k]);
    pos_ += width;
    *out = v;
    return {};
  }
  static Status set_uint(MsgpackValue* out, uint64_t v) {
    out->type = MsgpackValue::Type::kUint;
    out->u = v;
    return {};
  }
  static Status set_int(MsgpackValue* out, int64_t v) {
    out->type = MsgpackValue::Type::kInt;
    out->i = v;
    return {};
  }
  Status bytes(MsgpackValue* out, MsgpackValue::Type t, uint64_t n) {
    if (n > left()) return invalid_argument("msgpack: truncated");
    out->type = t;
    out->s.assign(in_.data() + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return {};
  }
  Status ext(MsgpackValue* out, uint64_t n) {
    uint8_t t;
    METRO_RETURN_IF_ERROR(byte(&t));
    METRO_RETURN_IF_ERROR(bytes(out, MsgpackValue::Type::kExt, n));
    out->i = static_cast<int8_t>(t);
    return {};
  }
  Status container(MsgpackValue* out, MsgpackValue::Type t, uint64_t n, int depth) {
    const uint64_t items = t == MsgpackValue::Type::kMap ? 2 * n : n;
    // Every item takes at least one byte: a count past the bytes left is a lie.
    if (items > left()) return invalid_argument("msgpack: truncated");
    out->type = t;
    // Grown as items arrive, so a nest of arrays each claiming the bytes left allocates
    // no more than the items it really holds.
    out->items.reserve(static_cast<size_t>(std::min<uint64_t>(items, 64)));
    for (uint64_t k = 0; k < items; ++k) METRO_RETURN_IF_ERROR(value(&out->items.emplace_back(), depth - 1));
    return {};
  }

  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

Expected<MsgpackValue> parse_msgpack(std::string_view bytes, int max_depth) {
  Reader r(bytes);
  MsgpackValue v;
  METRO_RETURN_IF_ERROR(r.value(&v, max_depth));
  if (r.left() != 0) return invalid_argument("msgpack: bytes after the value");
  return v;
}

}  // namespace metro
