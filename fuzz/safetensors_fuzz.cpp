// libFuzzer target: the safetensors header parser (`metro convert` reads checkpoints from
// anywhere) must never crash, hang or hand out a tensor outside the bytes it was given.
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/check.h"
#include "convert/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  auto ts = metro::convert::parse_safetensors(bytes, "fuzz");
  if (!ts.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const auto& t : *ts) {
    METRO_CHECK(t.data.data() >= data && t.data.data() + t.data.size() <= data + size);
    if (!t.data.empty()) sink = static_cast<uint8_t>(sink ^ t.data.front() ^ t.data.back());
  }
  return 0;
}
