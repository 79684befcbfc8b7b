// Weights kept behind the page cache (`metro serve --mem-budget`): an unlinked file in a
// directory on a disk, mapped shared. Matrices are written into it once, at load; then the
// kernel brings their pages in from the file when a step reads them, and, the pages being
// clean, may drop them whenever it needs the memory. The store counts the bytes of the
// entries (one per matrix) that steps touched since they were last released and, past its
// budget, releases the least recently touched ones: their pages leave this process, and the
// page cache keeps them only while the system has memory to spare.
//
// The file is the process's own (unlinked at creation), so nothing done to the model file
// or to the directory while serving can reach these bytes; its blocks are reserved when it
// grows, so a disk that fills later cannot fault a read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace metro {

class ColdStore {
 public:
  struct Options {
    std::string dir = "/var/tmp";  // on a disk: a directory in memory (tmpfs) is refused
    // Also drop a released entry's pages from the page cache (POSIX_FADV_DONTNEED), so that
    // touching it again reads the disk: the worst case, for measurements.
    bool drop_page_cache = false;
    size_t chunk_bytes = size_t{64} << 20;  // the file grows (and is mapped) by this much
  };
  static Expected<std::shared_ptr<ColdStore>> create(const Options& options);
  ~ColdStore();
  ColdStore(const ColdStore&) = delete;
  ColdStore& operator=(const ColdStore&) = delete;

  // Loading (one thread, before seal). Page-aligned writable bytes for one entry, which the
  // caller fills before its next take; null when the file cannot grow (a full disk).
  uint8_t* take(size_t bytes);
  // Registers bytes [p, p + n) of the last take as an entry; returns its id. Ids count up
  // from 0 in the order of the calls.
  int add(const uint8_t* p, size_t n);
  // An entry's unit: entries start on it and span whole units.
  size_t unit() const { return page_; }
  // Writes everything to the file, makes it read-only and releases every entry.
  Status seal();

  // Serving (any thread). The bytes of touched entries allowed mapped in at once.
  void set_budget(uint64_t bytes);
  // Marks the entries a step is about to read as the most recently touched, then releases
  // the least recently touched others while the mapped bytes exceed the budget (the
  // entries of this call are never released by it, whatever the budget).
  void touch(std::span<const int> ids);

  struct Stats {
    uint64_t bytes = 0;     // every entry's bytes
    uint64_t mapped = 0;    // bytes of entries touched since their last release
    uint64_t budget = 0;
    uint64_t releases = 0;  // entries released
    uint64_t faults_in = 0; // entries touched while released (read back in)
    int entries = 0;
  };
  Stats stats() const;
  // The file's name as the process's maps show it (it is unlinked: "... (deleted)").
  const std::string& path() const { return path_; }

 private:
  ColdStore() = default;
  struct Chunk {
    uint8_t* base = nullptr;
    size_t bytes = 0;
    uint64_t offset = 0;  // in the file
  };
  struct Entry {
    const uint8_t* p = nullptr;
    size_t n = 0;          // whole units (page_)
    uint64_t offset = 0;   // in the file
    bool mapped = false;
    uint64_t stamp = 0;    // the touch() call that last touched it
    std::list<int>::iterator lru;
  };
  // Writes the bytes taken so far to the file and drops them from this process.
  void settle();
  void release(Entry& e);  // queued: advise() gives it back
  void advise(int advice);  // madvise over ranges_, adjacent ones joined; clears them

  Options opt_;
  int fd_ = -1;
  std::string path_;
  size_t page_ = 4096;  // an entry's unit: whole pages, 64 KiB at least
  std::vector<Chunk> chunks_;
  size_t used_ = 0;          // of the last chunk
  uint64_t file_bytes_ = 0;
  uint64_t unsettled_ = 0;   // bytes taken since the last settle
  size_t settled_chunk_ = 0, settled_used_ = 0;  // where the last settle stopped
  bool sealed_ = false;

  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::list<int> lru_;  // most recently touched first
  struct Range {
    const uint8_t* p;
    size_t n;
    uint64_t offset;
  };
  std::vector<Range> ranges_;  // entries touch() brings in or gives back, advised together
  uint64_t clock_ = 0, mapped_ = 0, budget_ = 0, releases_ = 0, faults_in_ = 0;
};

}  // namespace metro
