// libFuzzer target: the GGUF reader and the metadata interpretation above it must never
// crash, hang or read out of bounds on any bytes.
#include <cstddef>
#include <cstdint>
#include <span>

#include "gguf/gguf.h"
#include "model/hparams.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = metro::gguf::File::parse(std::span<const uint8_t>(data, size));
  if (!f.ok()) return 0;
  for (const auto& kv : f->metadata()) {
    (void)kv.value.to_display_string();
    if (kv.value.is_array()) {
      for (size_t i = 0; i < kv.value.array_size() && i < 64; ++i) (void)kv.value.array_at(i);
    }
  }
  volatile uint8_t sink = 0;
  for (const auto& t : f->tensors()) {
    if (t.n_bytes) sink = static_cast<uint8_t>(sink ^ t.data[0] ^ t.data[t.n_bytes - 1]);
  }
  (void)metro::model::HParams::from_gguf(*f);
  return 0;
}
