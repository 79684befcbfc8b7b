// Writes valid GGUF v3 files: metadata then tensors, data aligned to `general.alignment`.
// Used by tests to build small models, by `metro quantize` and by `metro convert` (whose
// tensors are filled lazily, so a file is streamed rather than held in memory).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/ggml_type.h"
#include "gguf/gguf.h"

namespace metro::gguf {

// Little-endian byte encoder; also used by tests to craft malformed files by hand.
class Encoder {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void put_bytes(std::span<const uint8_t> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  void pad_to(size_t align) {
    while (bytes_.size() % align) bytes_.push_back(0);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
};

class Writer {
 public:
  void set_alignment(uint32_t alignment);

  void add_u8(std::string_view key, uint8_t v) { add_scalar(key, ValueType::kU8, v); }
  void add_i8(std::string_view key, int8_t v) { add_scalar(key, ValueType::kI8, v); }
  void add_u16(std::string_view key, uint16_t v) { add_scalar(key, ValueType::kU16, v); }
  void add_i16(std::string_view key, int16_t v) { add_scalar(key, ValueType::kI16, v); }
  void add_u32(std::string_view key, uint32_t v) { add_scalar(key, ValueType::kU32, v); }
  void add_i32(std::string_view key, int32_t v) { add_scalar(key, ValueType::kI32, v); }
  void add_u64(std::string_view key, uint64_t v) { add_scalar(key, ValueType::kU64, v); }
  void add_i64(std::string_view key, int64_t v) { add_scalar(key, ValueType::kI64, v); }
  void add_f32(std::string_view key, float v) { add_scalar(key, ValueType::kF32, v); }
  void add_f64(std::string_view key, double v) { add_scalar(key, ValueType::kF64, v); }
  void add_bool(std::string_view key, bool v) { add_scalar(key, ValueType::kBool, uint8_t{v}); }
  void add_string(std::string_view key, std::string_view v);
  void add_string_array(std::string_view key, const std::vector<std::string>& v);
  void add_f32_array(std::string_view key, const std::vector<float>& v);
  void add_i32_array(std::string_view key, const std::vector<int32_t>& v);
  // A pre-encoded value (type + payload as the format lays it out), for unusual values.
  void add_raw(std::string_view key, ValueType type, std::span<const uint8_t> payload);
  // A value read from another file, re-encoded as it was (any type, nested arrays included).
  void add_value(std::string_view key, const Value& v);
  // Every key of `f` but `skip` (when not empty), its alignment kept: the start of a file
  // rewritten from another (requantized, LoRA-merged).
  void copy_metadata(const File& f, std::string_view skip = {});

  // dims[0] is the innermost dimension. The byte size must match the type's geometry.
  Status add_tensor(std::string_view name, GgmlType type, const std::vector<uint64_t>& dims,
                    std::span<const uint8_t> data);

  // A tensor whose bytes `fill` writes into `dst` (exactly the shape's size) only when the
  // file is built or written, one tensor at a time: a converter streams a checkpoint larger
  // than memory this way. Called once per build() / write().
  using TensorFill = std::function<Status(std::span<uint8_t> dst)>;
  Status add_tensor_lazy(std::string_view name, GgmlType type, const std::vector<uint64_t>& dims, TensorFill fill);

  // Without lazy tensors.
  std::vector<uint8_t> serialize() const;
  // Any tensors; an error from a fill stops it.
  Expected<std::vector<uint8_t>> build() const;
  // Streams to `path`: the header, then each tensor as it is filled.
  Status write(const std::string& path) const;
  // The same into a file beside `path`, synced and renamed into place: a failed or
  // interrupted write leaves no partial file at `path`.
  Status write_atomically(const std::string& path) const;
  // The size the file will have.
  uint64_t file_size() const;

 private:
  template <class T>
  void add_scalar(std::string_view key, ValueType type, T v) {
    meta_.put_string(key);
    meta_.put<uint32_t>(static_cast<uint32_t>(type));
    meta_.put<T>(v);
    ++n_kv_;
  }

  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> data;
    uint64_t n_bytes = 0;
    TensorFill fill;  // set for lazy tensors, whose `data` stays empty
  };
  Expected<uint64_t> checked_bytes(std::string_view name, GgmlType type, const std::vector<uint64_t>& dims) const;
  std::vector<uint8_t> header() const;
  Encoder meta_;
  uint64_t n_kv_ = 0;
  uint32_t alignment_ = static_cast<uint32_t>(kDefaultAlignment);
  bool alignment_written_ = false;
  std::vector<Tensor> tensors_;
};

}  // namespace metro::gguf
