// Noticing that a file changed on disk after it was read: a FileStamp is what stat() says
// about a file (which inode, how long, when last written), and a FileWatch polls a path on
// a thread of its own and reports the first time its stamp differs from the one taken when
// the file was read.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"

namespace metro {

struct FileStamp {
  uint64_t dev = 0;
  uint64_t ino = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;

  // The stamp of the file at `path` (follows symlinks, as open() does).
  static Expected<FileStamp> of(const std::string& path);
  // The stamp of an open file.
  static Expected<FileStamp> of_fd(int fd);

  bool operator==(const FileStamp&) const = default;
  // What differs from `before`, e.g. "size 98.1 MiB -> 0 B" or "replaced by another file".
  std::string change_from(const FileStamp& before) const;
};

class FileWatch {
 public:
  // Polls `path` every `period`. The first time its stamp differs from `loaded` (or the path
  // no longer names a file), calls `on_change` once with what changed, on the watch's
  // thread, and stops polling.
  FileWatch(std::string path, FileStamp loaded, std::chrono::milliseconds period,
            std::function<void(const std::string& what)> on_change);
  ~FileWatch();
  FileWatch(const FileWatch&) = delete;
  FileWatch& operator=(const FileWatch&) = delete;

  // Whether a change has been seen (and reported).
  bool changed() const;

 private:
  void run();

  const std::string path_;
  const FileStamp loaded_;
  const std::chrono::milliseconds period_;
  const std::function<void(const std::string&)> on_change_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool changed_ = false;
  std::thread thread_;
};

}  // namespace metro
