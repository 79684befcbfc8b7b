// The bytes of a whole file, read-only: either a memory map of the file (open) or a copy
// in anonymous memory the process owns (read).
//
// A map is cheap but stays backed by the file: when the file is later truncated (`cp` over
// it truncates first), touching a mapped page past the new end raises SIGBUS, even for a
// MAP_PRIVATE map, since pages never written are still the file's pages. What must keep
// working whatever happens to the file (a served model's weights, which a backend may keep
// reading) is therefore read into a copy; tools that look at a file once may map it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/file_watch.h"
#include "base/status.h"

namespace metro {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Errors name the file by its base name only (never a full path: docs/reliability.md 24).
  static Expected<MappedFile> open(const std::string& path);

  struct ReadOptions {
    size_t chunk_bytes = size_t{8} << 20;  // bytes per read() call
    // Called after each chunk with the bytes read so far and the total (progress; tests
    // use it to change the file while it is being read).
    std::function<void(size_t done, size_t total)> on_chunk;
    // Byte ranges (offset, length) of the file whose whole pages are mapped from the file
    // (private, read-only) rather than read: bytes the caller reads once, soon, to copy
    // elsewhere, and then gives back (give_back), which ends the mapping. Until then those
    // pages are exposed to changes to the file as a map is.
    std::vector<std::pair<size_t, size_t>> map_ranges;
  };
  // Reads the whole file into anonymous memory owned by the returned object (read-only once
  // filled). Nothing done to the file afterwards can change or fault these bytes. A file
  // that shrinks, grows or is replaced while it is read is refused with a clean error.
  static Expected<MappedFile> read(const std::string& path, const ReadOptions& options);
  static Expected<MappedFile> read(const std::string& path) { return read(path, ReadOptions{}); }
  // A copy of bytes made in memory (a derived model), in anonymous memory owned like read()'s.
  static Expected<MappedFile> copy_of(std::span<const uint8_t> bytes);

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

  // Asks the kernel to keep these pages resident (best effort).
  void advise_willneed() const;

  // Gives the memory of the whole pages inside bytes [offset, offset + length) of a copy
  // back to the system and makes them unreadable: a later read faults (SIGSEGV) rather
  // than returning zeros. Pages mapped from the file (ReadOptions::map_ranges) stop being
  // the file's. For bytes nothing will read again (tensors a backend has copied
  // into layouts of its own). Returns the bytes given back; 0 for a map of the file, whose
  // clean pages the kernel reclaims by itself.
  size_t give_back(size_t offset, size_t length) const;

  // True for a copy made by read(), false for a map of the file.
  bool owned() const { return owned_; }
  // The file as it was when opened or read.
  const FileStamp& stamp() const { return stamp_; }

 private:
  void release();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owned_ = false;
  FileStamp stamp_;
};

}  // namespace metro
