#include "base/file_watch.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace metro {
namespace {

FileStamp stamp_of(const struct stat& st) {
  FileStamp s;
  s.dev = static_cast<uint64_t>(st.st_dev);
  s.ino = static_cast<uint64_t>(st.st_ino);
  s.size = static_cast<int64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return s;
}

std::string human_bytes(int64_t n) {
  char buf[32];
  if (n < 1024) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(n));
  } else if (n < (int64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", static_cast<double>(n) / 1024.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(n) / (1024.0 * 1024.0));
  }
  return buf;
}

}  // namespace

Expected<FileStamp> FileStamp::of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return io_error(std::string("cannot stat: ") + std::strerror(errno));
  return stamp_of(st);
}

Expected<FileStamp> FileStamp::of_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error(std::string("cannot stat: ") + std::strerror(errno));
  return stamp_of(st);
}

std::string FileStamp::change_from(const FileStamp& before) const {
  if (dev != before.dev || ino != before.ino) return "replaced by another file";
  if (size != before.size) return "size " + human_bytes(before.size) + " -> " + human_bytes(size);
  if (mtime_ns != before.mtime_ns) return "rewritten in place";
  return "unchanged";
}

FileWatch::FileWatch(std::string path, FileStamp loaded, std::chrono::milliseconds period,
                     std::function<void(const std::string&)> on_change)
    : path_(std::move(path)), loaded_(loaded), period_(period), on_change_(std::move(on_change)) {
  thread_ = std::thread([this] { run(); });
}

FileWatch::~FileWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool FileWatch::changed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return changed_;
}

void FileWatch::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (cv_.wait_for(lock, period_, [this] { return stopping_; })) return;
    lock.unlock();
    Expected<FileStamp> now = FileStamp::of(path_);
    std::string what;
    if (!now.ok()) {
      what = "no longer there";
    } else if (!(*now == loaded_)) {
      what = now->change_from(loaded_);
    }
    lock.lock();
    if (!what.empty()) {
      changed_ = true;
      lock.unlock();
      on_change_(what);
      return;
    }
  }
}

}  // namespace metro
