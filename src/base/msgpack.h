// A MessagePack writer for the few shapes metro sends (maps, arrays, strings, integers,
// doubles, nil): the smallest encoding of each value, as the format's reference encoders
// choose it. Big-endian throughout.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace metro {

class MsgpackWriter {
 public:
  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

  void nil() { out_.push_back(static_cast<char>(0xc0)); }
  void boolean(bool v) { out_.push_back(static_cast<char>(v ? 0xc3 : 0xc2)); }
  void uint(uint64_t v) {
    if (v < 0x80) {
      byte(static_cast<uint8_t>(v));
    } else if (v <= 0xff) {
      byte(0xcc);
      be(v, 1);
    } else if (v <= 0xffff) {
      byte(0xcd);
      be(v, 2);
    } else if (v <= 0xffffffffu) {
      byte(0xce);
      be(v, 4);
    } else {
      byte(0xcf);
      be(v, 8);
    }
  }
  void integer(int64_t v) {
    if (v >= 0) {
      uint(static_cast<uint64_t>(v));
    } else if (v >= -32) {
      byte(static_cast<uint8_t>(static_cast<int8_t>(v)));
    } else if (v >= INT8_MIN) {
      byte(0xd0);
      be(static_cast<uint64_t>(v), 1);
    } else if (v >= INT16_MIN) {
      byte(0xd1);
      be(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN) {
      byte(0xd2);
      be(static_cast<uint64_t>(v), 4);
    } else {
      byte(0xd3);
      be(static_cast<uint64_t>(v), 8);
    }
  }
  void float64(double v) {
    byte(0xcb);
    be(std::bit_cast<uint64_t>(v), 8);
  }
  void str(std::string_view s) {
    const size_t n = s.size();
    if (n < 32) {
      byte(static_cast<uint8_t>(0xa0 | n));
    } else if (n <= 0xff) {
      byte(0xd9);
      be(n, 1);
    } else if (n <= 0xffff) {
      byte(0xda);
      be(n, 2);
    } else {
      byte(0xdb);
      be(n, 4);
    }
    out_.append(s);
  }
  void array(size_t n) { header(n, 0x90, 0xdc, 0xdd); }
  void map(size_t n) { header(n, 0x80, 0xde, 0xdf); }

 private:
  void byte(uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void be(uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void header(size_t n, uint8_t fix, uint8_t b16, uint8_t b32) {
    if (n < 16) {
      byte(static_cast<uint8_t>(fix | n));
    } else if (n <= 0xffff) {
      byte(b16);
      be(n, 2);
    } else {
      byte(b32);
      be(n, 4);
    }
  }

  std::string out_;
};

}  // namespace metro
