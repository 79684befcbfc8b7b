#include "base/cold_store.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/check.h"
#include "base/log.h"

namespace metro {
namespace {

// Bytes written while loading that may stay dirty in this process before they are written
// out and dropped: loading a model larger than memory must not hold it all at once.
constexpr uint64_t kSettleBytes = uint64_t{32} << 20;
// Entries start and end on this boundary in memory: a page fault maps the pages around the
// faulting one that the page cache holds (fault-around, 64 KiB by default), and entries so
// aligned never bring a neighbour's pages in with their own.
constexpr size_t kGranule = size_t{64} << 10;

// `n` bytes of the file from `offset`, mapped shared at an address aligned to kGranule.
uint8_t* map_aligned(int fd, size_t n, uint64_t offset) {
  void* span = mmap(nullptr, n + kGranule, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (span == MAP_FAILED) return nullptr;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(span);
  const uintptr_t at = (lo + kGranule - 1) / kGranule * kGranule;
  void* p = mmap(reinterpret_cast<void*>(at), n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    munmap(span, n + kGranule);
    return nullptr;
  }
  if (at > lo) munmap(span, at - lo);
  const uintptr_t hi = lo + n + kGranule;
  if (hi > at + n) munmap(reinterpret_cast<void*>(at + n), hi - (at + n));
  return static_cast<uint8_t*>(p);
}

}  // namespace

Expected<std::shared_ptr<ColdStore>> ColdStore::create(const Options& options) {
  std::shared_ptr<ColdStore> s(new ColdStore());
  s->opt_ = options;
  s->page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  s->page_ = std::max(s->page_, kGranule);  // the unit of every entry
  s->opt_.chunk_bytes = std::max(s->page_, (options.chunk_bytes + s->page_ - 1) / s->page_ * s->page_);
  const std::string dir = options.dir.empty() ? std::string(".") : options.dir;
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) != 0) {
    return io_error("cannot use '" + dir + "' for cold weights: " + std::strerror(errno));
  }
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) {
    return invalid_argument("'" + dir + "' is in memory (tmpfs): cold weights kept there would stay in RAM; " +
                            "name a directory on a disk (--cold-dir)");
  }
  std::string templ = dir + "/metro-cold-XXXXXX";
  std::vector<char> name(templ.begin(), templ.end());
  name.push_back('\0');
  const int fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return io_error("cannot create a file for cold weights in '" + dir + "': " + std::strerror(errno));
  unlink(name.data());  // the process's own: gone when it exits, out of reach meanwhile
  s->fd_ = fd;
  s->path_ = name.data();
  return s;
}

ColdStore::~ColdStore() {
  for (const Chunk& c : chunks_) munmap(c.base, c.bytes);
  if (fd_ >= 0) close(fd_);
}

uint8_t* ColdStore::take(size_t bytes) {
  METRO_CHECK(!sealed_);
  bytes = (bytes + page_ - 1) / page_ * page_;
  if (unsettled_ >= kSettleBytes) settle();
  if (chunks_.empty() || chunks_.back().bytes - used_ < bytes) {
    const size_t n = std::max(opt_.chunk_bytes, bytes);
    // Reserve the blocks, so that a later write-back cannot meet a full disk.
    if (ftruncate(fd_, static_cast<off_t>(file_bytes_ + n)) != 0 ||
        posix_fallocate(fd_, static_cast<off_t>(file_bytes_), static_cast<off_t>(n)) != 0) {
      if (ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0) METRO_LOG_WARN("cold weights: cannot shrink the file back");
      return nullptr;
    }
    uint8_t* p = map_aligned(fd_, n, file_bytes_);
    if (p == nullptr) return nullptr;
    chunks_.push_back({p, n, file_bytes_});
    file_bytes_ += n;
    used_ = 0;
  }
  uint8_t* at = chunks_.back().base + used_;
  used_ += bytes;
  unsettled_ += bytes;
  return at;
}

int ColdStore::add(const uint8_t* p, size_t n) {
  METRO_CHECK(!sealed_);
  for (const Chunk& c : chunks_) {
    if (p >= c.base && p + n <= c.base + c.bytes) {
      std::lock_guard lock(mu_);
      Entry e;
      e.p = p;
      e.n = (n + page_ - 1) / page_ * page_;
      e.offset = c.offset + static_cast<uint64_t>(p - c.base);
      e.lru = lru_.end();
      entries_.push_back(e);
      return static_cast<int>(entries_.size()) - 1;
    }
  }
  METRO_CHECK_MSG(false, "ColdStore::add: bytes not taken from this store");
  return -1;
}

void ColdStore::settle() {
  for (size_t i = settled_chunk_; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    const size_t from = i == settled_chunk_ ? settled_used_ : 0;
    const size_t to = i + 1 == chunks_.size() ? used_ : c.bytes;
    if (to > from) {
      msync(c.base + from, to - from, MS_SYNC);
      madvise(c.base + from, to - from, MADV_DONTNEED);
    }
  }
  if (!chunks_.empty()) {
    settled_chunk_ = chunks_.size() - 1;
    settled_used_ = used_;
  }
  unsettled_ = 0;
}

Status ColdStore::seal() {
  METRO_CHECK(!sealed_);
  for (const Chunk& c : chunks_) {
    if (msync(c.base, c.bytes, MS_SYNC) != 0) {
      return io_error(std::string("cannot write the cold weights' file: ") + std::strerror(errno));
    }
    mprotect(c.base, c.bytes, PROT_READ);
    madvise(c.base, c.bytes, MADV_DONTNEED);
    if (opt_.drop_page_cache) {
      posix_fadvise(fd_, static_cast<off_t>(c.offset), static_cast<off_t>(c.bytes), POSIX_FADV_DONTNEED);
    }
  }
  sealed_ = true;
  return {};
}

void ColdStore::set_budget(uint64_t bytes) {
  std::lock_guard lock(mu_);
  budget_ = bytes;
}

void ColdStore::release(Entry& e) {
  ranges_.push_back({e.p, e.n, e.offset});
  e.mapped = false;
  mapped_ -= e.n;
  ++releases_;
}

// One call per run of adjacent ranges: an expert's three matrices sit side by side and are
// read and given back together, and each call interrupts the other threads (a TLB flush).
void ColdStore::advise(int advice) {
  std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.p < b.p; });
  for (size_t i = 0; i < ranges_.size();) {
    Range run = ranges_[i];
    size_t j = i + 1;
    while (j < ranges_.size() && ranges_[j].p == run.p + run.n) run.n += ranges_[j++].n;
    madvise(const_cast<uint8_t*>(run.p), run.n, advice);
    if (advice == MADV_DONTNEED && opt_.drop_page_cache) {
      posix_fadvise(fd_, static_cast<off_t>(run.offset), static_cast<off_t>(run.n), POSIX_FADV_DONTNEED);
    }
    i = j;
  }
  ranges_.clear();
}

void ColdStore::touch(std::span<const int> ids) {
  std::lock_guard lock(mu_);
  const uint64_t now = ++clock_;
  for (const int id : ids) {
    Entry& e = entries_.at(static_cast<size_t>(id));
    e.stamp = now;
    if (e.mapped) {
      lru_.splice(lru_.begin(), lru_, e.lru);
      continue;
    }
    e.mapped = true;
    mapped_ += e.n;
    ++faults_in_;
    lru_.push_front(id);
    e.lru = lru_.begin();
    ranges_.push_back({e.p, e.n, e.offset});
  }
  // Start reading what returns while the step gets to it (a no-op for pages in the page
  // cache). The pages are mapped by the faults of the threads that read them, spread over
  // all of them, not here, where one thread would map them while the others wait.
  advise(MADV_WILLNEED);
  while (mapped_ > budget_ && !lru_.empty()) {
    Entry& old = entries_[static_cast<size_t>(lru_.back())];
    if (old.stamp == now) break;  // everything left was touched by this call
    lru_.pop_back();
    old.lru = lru_.end();
    release(old);
  }
  advise(MADV_DONTNEED);
}

ColdStore::Stats ColdStore::stats() const {
  std::lock_guard lock(mu_);
  Stats s;
  for (const Entry& e : entries_) s.bytes += e.n;
  s.mapped = mapped_;
  s.budget = budget_;
  s.releases = releases_;
  s.faults_in = faults_in_;
  s.entries = static_cast<int>(entries_.size());
  return s;
}

}  // namespace metro
