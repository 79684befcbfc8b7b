#include "kv/file_spill.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "base/clock.h"
#include "base/hash.h"
#include "base/log.h"

namespace metro::kv {

namespace {

std::atomic<uint64_t> g_files{0};  // tiers opened by this process: each file its own name

bool write_all(int fd, const uint8_t* p, size_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return true;
}

bool read_all(int fd, uint8_t* p, size_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;  // an error, or the file ends early (truncated)
    p += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return true;
}

}  // namespace

Expected<std::unique_ptr<FileSpillTier>> FileSpillTier::open(const FileSpillConfig& cfg, KvArena& arena) {
  if (cfg.dir.empty()) return invalid_argument("--kv-spill-dir needs a directory");
  const int64_t bb = static_cast<int64_t>(arena.block_bytes());
  if (cfg.max_bytes < bb) {
    return invalid_argument("--kv-spill-bytes must hold at least one KV block (" + std::to_string(bb) + " bytes)");
  }
  std::error_code ec;
  std::filesystem::create_directories(cfg.dir, ec);
  if (ec) return invalid_argument("--kv-spill-dir: cannot make " + cfg.dir + ": " + ec.message());
  // Files a process left when it died (killed, crashed) are of no use to anyone: remove them.
  for (const auto& entry : std::filesystem::directory_iterator(cfg.dir, ec)) {
    const std::string name = entry.path().filename().string();
    long pid = 0;
    if (std::sscanf(name.c_str(), "kv-spill-%ld-", &pid) == 1 && pid > 0 && pid != ::getpid() &&
        ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  std::unique_ptr<FileSpillTier> t(new FileSpillTier(cfg, arena));
  t->path_ = (std::filesystem::path(cfg.dir) / ("kv-spill-" + std::to_string(::getpid()) + "-" +
                                                std::to_string(g_files.fetch_add(1)) + ".bin"))
                 .string();
  t->fd_ = ::open(t->path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (t->fd_ < 0) {
    return invalid_argument("--kv-spill-dir: cannot create " + t->path_ + ": " + std::strerror(errno));
  }
  if (t->cfg_.max_pending_bytes <= 0) {
    t->cfg_.max_pending_bytes =
        std::clamp(static_cast<int64_t>(arena.bytes()), int64_t{64} << 20, int64_t{1} << 30);
  }
  if (t->cfg_.max_prefetch_bytes <= 0) t->cfg_.max_prefetch_bytes = t->cfg_.max_pending_bytes / 2;
  t->capacity_ = cfg.max_bytes / bb;
  t->stats_.capacity_blocks = t->capacity_;
  t->writer_ = std::thread([p = t.get()] { p->run(); });
  return t;
}

FileSpillTier::FileSpillTier(const FileSpillConfig& cfg, KvArena& arena)
    : cfg_(cfg), arena_(arena), block_bytes_(arena.block_bytes()), read_buf_(arena.block_bytes()) {}

FileSpillTier::~FileSpillTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void FileSpillTier::on_evict(BlockId b, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) {
  std::unique_lock lock(mu_);
  if (stats_.failed || stop_) {
    ++stats_.dropped;
    return;
  }
  if (auto it = index_.find(hash); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);  // the same key holds the same KV
    return;
  }
  if (pending_.count(hash) != 0) return;
  if (pending_bytes_ + static_cast<int64_t>(block_bytes_) > cfg_.max_pending_bytes) {
    ++stats_.dropped;
    return;
  }
  auto p = std::make_shared<Pending>();
  p->hash = hash;
  p->parent = parent;
  p->tokens.assign(tokens.begin(), tokens.end());
  p->bytes.resize(block_bytes_);
  // The pool hands the block out only after this returns: its bytes are intact here. Copied
  // before the entry is published, so the writer never sees it half filled.
  arena_.read_block(b, p->bytes);
  pending_bytes_ += static_cast<int64_t>(block_bytes_);
  pending_.emplace(hash, p);
  queue_.push_back(p);
  tell_hint_locked(hash);
  lock.unlock();
  wake_.notify_one();
}

bool FileSpillTier::worth_restoring(uint64_t hash, int position) {
  std::lock_guard lock(mu_);
  if (pending_.count(hash) != 0 || staged_.count(hash) != 0) return true;  // a copy in memory
  if (index_.count(hash) == 0) return false;
  if (read_s_per_block_ <= 0.0 || per_token_s_ <= 0.0) return true;
  const double n = static_cast<double>(index_.at(hash).tokens.size());
  const double pairs = n * static_cast<double>(position) + n * (n + 1.0) / 2.0;
  return read_s_per_block_ < per_token_s_ * n + per_pair_s_ * pairs;
}

void FileSpillTier::erase_locked(uint64_t hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  free_slots_.push_back(it->second.slot);
  lru_.erase(it->second.lru);
  index_.erase(it);
  stats_.blocks = static_cast<int64_t>(index_.size());
  stats_.bytes = stats_.blocks * static_cast<int64_t>(block_bytes_);
  tell_hint_locked(hash);
}

void FileSpillTier::tell_hint_locked(uint64_t hash) {
  if (hint_) hint_->set_spilled(hash, pending_.count(hash) != 0 || index_.count(hash) != 0);
}

void FileSpillTier::set_hint(std::shared_ptr<const PrefixHint> hint) {
  std::lock_guard lock(mu_);
  hint_ = std::move(hint);
  if (!hint_) return;
  for (const auto& [hash, e] : index_) hint_->set_spilled(hash, true);
  for (const auto& [hash, p] : pending_) hint_->set_spilled(hash, true);
}

bool FileSpillTier::restore(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, BlockId dst) {
  const int64_t t0 = now_ns();
  std::lock_guard lock(mu_);
  auto same_key = [&](uint64_t p, const std::vector<int32_t>& t) {
    return p == parent && t.size() == tokens.size() && std::equal(t.begin(), t.end(), tokens.begin());
  };
  if (auto pit = pending_.find(hash); pit != pending_.end()) {
    const Pending& p = *pit->second;
    if (!same_key(p.parent, p.tokens)) return false;
    arena_.write_block(dst, p.bytes);
    ++stats_.restores;
    return true;
  }
  if (auto sit = staged_.find(hash); sit != staged_.end()) {
    // Read ahead and verified: used once, from memory.
    const bool same = same_key(sit->second.parent, sit->second.tokens);
    if (same) arena_.write_block(dst, sit->second.bytes);
    staged_bytes_ -= static_cast<int64_t>(block_bytes_);
    staged_.erase(sit);
    if (!same) return false;
    if (auto it = index_.find(hash); it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
    ++stats_.restores;
    ++stats_.prefetch_hits;
    return true;
  }
  auto it = index_.find(hash);
  if (it == index_.end() || !same_key(it->second.parent, it->second.tokens)) return false;
  // Restored before its read-ahead came up: the read-ahead would only copy it again.
  if (!reads_.empty()) std::erase(reads_, hash);
  const Entry& e = it->second;
  if (!read_all(fd_, read_buf_.data(), block_bytes_, e.slot * static_cast<int64_t>(block_bytes_)) ||
      hash_bytes(read_buf_.data(), block_bytes_, hash) != e.checksum) {
    ++stats_.corrupt;
    METRO_LOG_WARN("KV spill: a block in %s failed its checksum; its tokens are computed instead", path_.c_str());
    erase_locked(hash);
    return false;
  }
  arena_.write_block(dst, read_buf_);
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  const double s = static_cast<double>(now_ns() - t0) * 1e-9;
  read_s_per_block_ = read_s_per_block_ <= 0.0 ? s : 0.9 * read_s_per_block_ + 0.1 * s;
  ++stats_.restores;
  stats_.restore_bytes += block_bytes_;
  stats_.restore_seconds += s;
  return true;
}

void FileSpillTier::set_recompute_cost(double per_token_s, double per_pair_s) {
  std::lock_guard lock(mu_);
  per_token_s_ = per_token_s;
  per_pair_s_ = per_pair_s;
}

void FileSpillTier::flush() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && reads_.empty() && !writing_; });
}

void FileSpillTier::prefetch(std::span<const uint64_t> hashes) {
  {
    std::lock_guard lock(mu_);
    if (stats_.failed || stop_) return;
    // No more queued than the copies can hold: the rest would only push out the first.
    const size_t cap = static_cast<size_t>(cfg_.max_prefetch_bytes / static_cast<int64_t>(block_bytes_));
    for (uint64_t h : hashes) {
      if (reads_.size() >= cap) break;
      if (index_.count(h) != 0 && staged_.count(h) == 0 && pending_.count(h) == 0) reads_.push_back(h);
    }
    if (reads_.empty()) return;
  }
  wake_.notify_one();
}

void FileSpillTier::read_ahead(std::unique_lock<std::mutex>& lock, uint64_t hash) {
  auto it = index_.find(hash);
  if (it == index_.end() || staged_.count(hash) != 0 || pending_.count(hash) != 0) return;
  // Only this thread writes the file, so the slot's bytes cannot change while it reads them
  // unlocked; the entry may go meanwhile (a restore found it damaged), so it is looked up again.
  const int64_t slot = it->second.slot;
  const uint64_t checksum = it->second.checksum;
  std::vector<uint8_t> bytes(block_bytes_);
  lock.unlock();
  const bool ok = read_all(fd_, bytes.data(), block_bytes_, slot * static_cast<int64_t>(block_bytes_)) &&
                  hash_bytes(bytes.data(), block_bytes_, hash) == checksum;
  lock.lock();
  it = index_.find(hash);
  if (it == index_.end() || it->second.slot != slot || staged_.count(hash) != 0) return;
  if (!ok) {
    ++stats_.corrupt;
    METRO_LOG_WARN("KV spill: a block in %s failed its checksum; its tokens are computed instead", path_.c_str());
    erase_locked(hash);
    return;
  }
  while (staged_bytes_ + static_cast<int64_t>(block_bytes_) > cfg_.max_prefetch_bytes && !staged_order_.empty()) {
    const uint64_t old = staged_order_.front();
    staged_order_.pop_front();
    if (staged_.erase(old) != 0) staged_bytes_ -= static_cast<int64_t>(block_bytes_);
  }
  if (staged_bytes_ + static_cast<int64_t>(block_bytes_) > cfg_.max_prefetch_bytes) return;
  staged_.emplace(hash, Staged{it->second.parent, it->second.tokens, std::move(bytes)});
  staged_order_.push_back(hash);
  // The order may name blocks restored since: trimmed when it outgrows what is staged.
  if (staged_order_.size() > 2 * staged_.size() + 64) {
    std::erase_if(staged_order_, [&](uint64_t h) { return staged_.count(h) == 0; });
  }
  staged_bytes_ += static_cast<int64_t>(block_bytes_);
  ++stats_.prefetched;
}

FileSpillStats FileSpillTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void FileSpillTier::run() {
  for (;;) {
    std::shared_ptr<Pending> p;
    int64_t slot = -1;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty() || !reads_.empty(); });
      // Reads first: a request waits on them; a write only keeps a copy in memory longer.
      if (!reads_.empty() && !stop_) {
        const uint64_t h = reads_.front();
        reads_.pop_front();
        writing_ = true;
        read_ahead(lock, h);
        writing_ = false;
        if (queue_.empty() && reads_.empty()) idle_.notify_all();
        continue;
      }
      if (queue_.empty()) {
        reads_.clear();
        idle_.notify_all();
        return;
      }
      p = queue_.front();
      queue_.pop_front();
      writing_ = true;
      if (!stats_.failed) {
        if (!free_slots_.empty()) {
          slot = free_slots_.back();
          free_slots_.pop_back();
        } else if (next_slot_ < capacity_) {
          slot = next_slot_++;
        } else if (!lru_.empty()) {
          const uint64_t victim = lru_.back();
          erase_locked(victim);  // frees its slot
          slot = free_slots_.back();
          free_slots_.pop_back();
        }
      }
    }
    const bool ok = slot >= 0 && write_all(fd_, p->bytes.data(), block_bytes_, slot * static_cast<int64_t>(block_bytes_));
    std::lock_guard lock(mu_);
    if (ok) {
      Entry e;
      e.parent = p->parent;
      e.tokens = p->tokens;
      e.checksum = hash_bytes(p->bytes.data(), block_bytes_, p->hash);
      e.slot = slot;
      lru_.push_front(p->hash);
      e.lru = lru_.begin();
      index_[p->hash] = std::move(e);
      ++stats_.writes;
      stats_.blocks = static_cast<int64_t>(index_.size());
      stats_.bytes = stats_.blocks * static_cast<int64_t>(block_bytes_);
    } else {
      ++stats_.dropped;
      if (slot >= 0) free_slots_.push_back(slot);
      if (slot >= 0 && !stats_.failed) {
        stats_.failed = true;
        METRO_LOG_WARN("KV spill: writing %s failed (%s); evicted KV blocks are no longer kept", path_.c_str(),
                       std::strerror(errno));
      }
    }
    pending_.erase(p->hash);
    tell_hint_locked(p->hash);
    pending_bytes_ -= static_cast<int64_t>(block_bytes_);
    writing_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace metro::kv
