// A MessagePack reader for untrusted bytes (the KV events `metro router` subscribes to):
// one message decoded whole into a tree. Truncated input, trailing bytes, nesting deeper
// than max_depth and counts larger than the bytes left could hold are refused, so memory
// stays within a small multiple of the input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace metro {

struct MsgpackValue {
  enum class Type : uint8_t { kNil, kBool, kInt, kUint, kFloat, kStr, kBin, kArray, kMap, kExt };
  Type type = Type::kNil;
  bool b = false;
  int64_t i = 0;   // kInt: a negative integer
  uint64_t u = 0;  // kUint: a non-negative one
  double f = 0.0;  // kFloat (float32 widened)
  std::string s;   // kStr, kBin, kExt (its data; the ext type in i)
  std::vector<MsgpackValue> items;  // kArray; kMap: key, value, key, value, ...

  bool is_nil() const { return type == Type::kNil; }
  bool is_array() const { return type == Type::kArray; }
  bool is_map() const { return type == Type::kMap; }
  bool is_str() const { return type == Type::kStr; }
  // The integer's value when it fits the type asked for.
  std::optional<int64_t> as_int() const;
  std::optional<uint64_t> as_uint() const;
  // A map's value under a string key (the first); null when absent or not a map.
  const MsgpackValue* get(std::string_view key) const;
};

Expected<MsgpackValue> parse_msgpack(std::string_view bytes, int max_depth = 32);

}  // namespace metro
