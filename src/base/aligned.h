// Aligned heap buffers for SIMD data (64-byte: a cache line, an AVX-512 register).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace metro {

inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kHugePage = size_t{2} << 20;

// n rounded up to a multiple of `unit`.
constexpr size_t round_up(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// `bytes` (rounded up to a cache line) of uninitialised memory. At least kHugePage of it
// starts on a 2 MiB boundary, rounded up to whole 2 MiB pages, and asks for transparent
// huge pages before anything touches it (Linux, THP in "madvise" or "always" mode): a KV
// arena's pages, scattered over gigabytes, and streamed weights otherwise cost a TLB miss
// every 4 KiB. The advice is only that: where THP is off, the memory is ordinary.
// `*rounded` gets the size allocated.
inline void* aligned_alloc_bytes(size_t bytes, size_t* rounded) {
  bytes = bytes == 0 ? kCacheLine : round_up(bytes, kCacheLine);
  const bool huge = bytes >= kHugePage;
  if (huge) bytes = round_up(bytes, kHugePage);
  void* p = std::aligned_alloc(huge ? kHugePage : kCacheLine, bytes);
  if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  *rounded = bytes;
  return p;
}

// A fixed-size, 64-byte-aligned array of trivially copyable T, zero-initialised.
template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { resize(n); }

  void resize(size_t n) {
    size_t bytes = 0;
    void* p = aligned_alloc_bytes(n * sizeof(T), &bytes);
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

// Many long-lived allocations (a model's repacked weight matrices, most under 2 MiB each)
// carved from a few large chunks, so they share huge pages. Each allocation is 64-byte
// aligned and uninitialised; nothing is freed before the arena. Not thread-safe.
class BumpArena {
 public:
  explicit BumpArena(size_t chunk_bytes = size_t{16} << 20) : chunk_bytes_(chunk_bytes) {}

  uint8_t* take(size_t bytes) {
    bytes = round_up(bytes, kCacheLine);
    if (bytes >= chunk_bytes_) return grab(bytes, nullptr);  // its own chunk; the open one stays open
    if (left_ < bytes) {
      next_ = grab(chunk_bytes_, &left_);
    }
    uint8_t* at = next_;
    next_ += bytes;
    left_ -= bytes;
    return at;
  }

 private:
  uint8_t* grab(size_t bytes, size_t* got) {
    size_t rounded = 0;
    std::unique_ptr<uint8_t, AlignedFree> chunk(static_cast<uint8_t*>(aligned_alloc_bytes(bytes, &rounded)));
    uint8_t* p = chunk.get();
    chunks_.push_back(std::move(chunk));
    if (got) *got = rounded;
    return p;
  }

  size_t chunk_bytes_;
  uint8_t* next_ = nullptr;
  size_t left_ = 0;
  std::vector<std::unique_ptr<uint8_t, AlignedFree>> chunks_;
};

}  // namespace metro
