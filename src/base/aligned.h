// Aligned heap buffers for SIMD data (64-byte: a cache line, an AVX-512 register).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>

namespace metro {

inline constexpr size_t kCacheLine = 64;

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// A fixed-size, 64-byte-aligned array of trivially copyable T, zero-initialised.
template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { resize(n); }

  void resize(size_t n) {
    size_t bytes = (n * sizeof(T) + kCacheLine - 1) / kCacheLine * kCacheLine;
    if (bytes == 0) bytes = kCacheLine;
    void* p = std::aligned_alloc(kCacheLine, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    ptr_.reset(static_cast<T*>(p));
    size_ = n;
  }

  T* data() { return ptr_.get(); }
  const T* data() const { return ptr_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return ptr_.get()[i]; }
  const T& operator[](size_t i) const { return ptr_.get()[i]; }
  std::span<T> span() { return {data(), size_}; }
  std::span<const T> span() const { return {data(), size_}; }

 private:
  std::unique_ptr<T, AlignedFree> ptr_;
  size_t size_ = 0;
};

}  // namespace metro
