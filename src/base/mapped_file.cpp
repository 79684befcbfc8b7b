#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace metro {
namespace {
std::string base_name(const std::string& path) {
  auto pos = path.find_last_of('/');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

// Closes a file descriptor when it leaves scope.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// The whole pages inside each range (offset, length) of a file of `total` bytes, sorted
// and joined: [begin, end) offsets, page-aligned.
std::vector<std::pair<size_t, size_t>> page_interiors(const std::vector<std::pair<size_t, size_t>>& ranges,
                                                      size_t total) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<size_t, size_t>> out;
  for (const auto& [off, len] : ranges) {
    if (off >= total) continue;
    const size_t b = (off + page - 1) / page * page;
    const size_t e = std::min(off + std::min(len, total - off), total) / page * page;
    if (e > b) out.emplace_back(b, e);
  }
  std::sort(out.begin(), out.end());
  std::vector<std::pair<size_t, size_t>> joined;
  for (const auto& r : out) {
    if (!joined.empty() && r.first <= joined.back().second) {
      joined.back().second = std::max(joined.back().second, r.second);
    } else {
      joined.push_back(r);
    }
  }
  return joined;
}

}  // namespace

// A map of the file and a copy in anonymous memory are both released by munmap.
void MappedFile::release() {
  if (data_ && size_) munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owned_(other.owned_),
      stamp_(other.stamp_) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owned_ = other.owned_;
    stamp_ = other.stamp_;
  }
  return *this;
}

Expected<MappedFile> MappedFile::open(const std::string& path) {
  const std::string name = base_name(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open '" + name + "': " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return io_error("cannot stat '" + name + "': " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument("'" + name + "' is not a regular file");
  }
  MappedFile f;
  f.size_ = static_cast<size_t>(st.st_size);
  if (auto stamp = FileStamp::of_fd(fd); stamp.ok()) f.stamp_ = *stamp;
  if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      f.size_ = 0;
      return io_error("cannot map '" + name + "': " + std::strerror(e));
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

Expected<MappedFile> MappedFile::read(const std::string& path, const ReadOptions& options) {
  const std::string name = base_name(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open '" + name + "': " + std::strerror(errno));
  FdCloser closer(fd);
  Expected<FileStamp> before = FileStamp::of_fd(fd);
  if (!before.ok()) return io_error("cannot stat '" + name + "': " + before.status().message());
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return invalid_argument("'" + name + "' is not a regular file");
  }
  MappedFile f;
  f.owned_ = true;
  f.stamp_ = *before;
  const size_t total = static_cast<size_t>(before->size);
  if (total == 0) return f;
  // Anonymous memory, so that no page of the copy is ever backed by the file. Huge pages
  // (best effort) make the copy cheaper to fault in and the weights cheaper to read.
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return resource_exhausted("cannot allocate " + std::to_string(total) + " bytes to hold '" + name +
                              "': " + std::strerror(errno));
  }
  f.data_ = static_cast<const uint8_t*>(p);
  f.size_ = total;
#ifdef MADV_HUGEPAGE
  madvise(p, total, MADV_HUGEPAGE);
#endif
  uint8_t* dst = static_cast<uint8_t*>(p);
  const size_t chunk = std::max<size_t>(options.chunk_bytes, 4096);
  const std::vector<std::pair<size_t, size_t>> holes = page_interiors(options.map_ranges, total);
  size_t done = 0;
  size_t next_hole = 0;
  while (done < total) {
    if (next_hole < holes.size() && done >= holes[next_hole].first) {
      done = holes[next_hole++].second;  // mapped below, not read
      if (options.on_chunk) options.on_chunk(done, total);
      continue;
    }
    const size_t limit = next_hole < holes.size() ? holes[next_hole].first : total;
    const size_t want = std::min(chunk, limit - done);
    const ssize_t got = ::pread(fd, dst + done, want, static_cast<off_t>(done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot read '" + name + "' at byte " + std::to_string(done) + ": " + std::strerror(errno));
    }
    if (got == 0) {
      return data_loss("'" + name + "' was cut short while it was read (" + std::to_string(done) + " of " +
                       std::to_string(total) + " bytes); load it again once it is complete");
    }
    done += static_cast<size_t>(got);
    if (options.on_chunk) options.on_chunk(done, total);
  }
  for (const auto& [b, e] : holes) {
    if (mmap(dst + b, e - b, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, static_cast<off_t>(b)) == MAP_FAILED) {
      return io_error("cannot map '" + name + "' at byte " + std::to_string(b) + ": " + std::strerror(errno));
    }
  }
  // The bytes must all come from one version of the file: one rewritten in place while it
  // was read (same size, a new write time) could mix two versions.
  Expected<FileStamp> after = FileStamp::of_fd(fd);
  if (!after.ok() || !(*after == *before)) {
    return data_loss("'" + name + "' changed while it was read (" +
                     (after.ok() ? after->change_from(*before) : std::string("cannot stat it")) +
                     "); load it again once it is complete");
  }
  mprotect(p, total, PROT_READ);
  return f;
}

Expected<MappedFile> MappedFile::copy_of(std::span<const uint8_t> bytes) {
  MappedFile f;
  f.owned_ = true;
  if (bytes.empty()) return f;
  void* p = mmap(nullptr, bytes.size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return resource_exhausted("cannot allocate " + std::to_string(bytes.size()) + " bytes");
  std::memcpy(p, bytes.data(), bytes.size());
  mprotect(p, bytes.size(), PROT_READ);
  f.data_ = static_cast<const uint8_t*>(p);
  f.size_ = bytes.size();
  return f;
}

size_t MappedFile::give_back(size_t offset, size_t length) const {
  if (!owned_ || data_ == nullptr || offset >= size_) return 0;
  length = std::min(length, size_ - offset);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data_) + offset + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data_) + offset + length) / page * page;
  if (end <= begin) return 0;
  // Fresh inaccessible anonymous pages in their place: frees them, and ends a file mapping.
  void* p = reinterpret_cast<void*>(begin);
  if (mmap(p, end - begin, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
    return 0;
  }
  return end - begin;
}

void MappedFile::advise_willneed() const {
  if (data_ && size_) madvise(const_cast<uint8_t*>(data_), size_, MADV_WILLNEED);
}

}  // namespace metro
