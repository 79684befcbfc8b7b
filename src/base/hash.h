// 64-bit non-cryptographic hashing (prefix-cache block keys, tables).
// Not for secrets. Stable across runs and machines (fixed seed, little-endian reads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace metro {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

inline uint64_t hash_combine(uint64_t seed, uint64_t v) {
  return mix64(seed ^ (v + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2)));
}

inline uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0x6d6574726f) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = mix64(seed ^ (n * 0x9e3779b97f4a7c15ull));
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = hash_combine(h, w);
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  if (n > 0) std::memcpy(&tail, p, n);  // an empty input may come with a null pointer
  return hash_combine(h, tail ^ (static_cast<uint64_t>(n) << 56));
}

inline uint64_t hash_string(std::string_view s, uint64_t seed = 0x6d6574726f) {
  return hash_bytes(s.data(), s.size(), seed);
}

}  // namespace metro
