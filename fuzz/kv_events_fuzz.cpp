// libFuzzer target: the KV events `metro router --kv-events` reads from replicas (bytes
// from the network are untrusted). The MessagePack reader and the index must never crash,
// and the index must stay consistent: a prompt never matches more blocks than it has.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "base/msgpack_reader.h"
#include "router/kv_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)metro::parse_msgpack(bytes);
  metro::router::KvIndex idx(2, 1024);
  // The input as one batch, and split in two batches at its first byte's position.
  (void)idx.apply(0, bytes);
  if (size > 1) {
    const size_t cut = 1 + data[0] % (size - 1);
    (void)idx.apply(1, bytes.substr(1, cut - 1));
    (void)idx.apply(1, bytes.substr(cut));
  }
  const int bs = idx.block_size();
  std::vector<int32_t> prompt;
  for (size_t k = 0; k < size && k < 64; ++k) prompt.push_back(data[k]);
  for (int r = 0; r < 2; ++r) {
    const size_t m = idx.matched(r, prompt);
    if (bs > 0 && m * static_cast<size_t>(bs) > prompt.size()) std::abort();
    if (bs <= 0 && m != 0) std::abort();
    if (idx.blocks(r) > 1024) std::abort();
  }
  return 0;
}
