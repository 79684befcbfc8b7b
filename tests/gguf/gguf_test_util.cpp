#include "gguf/gguf_test_util.h"

namespace metro::testing {

std::vector<uint8_t> small_valid_gguf() {
  gguf::Writer w;
  w.add_string("general.architecture", "test");
  w.add_u32("test.count", 7);
  w.add_i32("test.neg", -3);
  w.add_f32("test.pi", 3.25f);
  w.add_bool("test.flag", true);
  w.add_string_array("test.words", {"a", "bc", ""});
  w.add_f32_array("test.floats", {1.0f, -2.5f});
  std::vector<float> a(8, 1.5f), b(4, -1.0f);
  (void)w.add_tensor("a", gguf::GgmlType::kF32, {4, 2},
                     {reinterpret_cast<const uint8_t*>(a.data()), a.size() * 4});
  (void)w.add_tensor("b", gguf::GgmlType::kF32, {4},
                     {reinterpret_cast<const uint8_t*>(b.data()), b.size() * 4});
  return w.serialize();
}

gguf::Encoder raw_header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  gguf::Encoder e;
  e.put<uint32_t>(gguf::kMagic);
  e.put<uint32_t>(version);
  e.put<uint64_t>(n_tensors);
  e.put<uint64_t>(n_kv);
  return e;
}

}  // namespace metro::testing
