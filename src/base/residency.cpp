#include "base/residency.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace metro {

namespace {

uintptr_t page_size() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

ByteRanges merge_ranges(ByteRanges ranges) {
  std::erase_if(ranges, [](const auto& r) { return r.empty(); });
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.data() < b.data(); });
  ByteRanges out;
  for (const auto& r : ranges) {
    if (!out.empty() && r.data() <= out.back().data() + out.back().size()) {
      const uint8_t* end = std::max(out.back().data() + out.back().size(), r.data() + r.size());
      out.back() = {out.back().data(), static_cast<size_t>(end - out.back().data())};
    } else {
      out.push_back(r);
    }
  }
  return out;
}

uint64_t total_bytes(const ByteRanges& ranges) {
  uint64_t n = 0;
  for (const auto& r : ranges) n += r.size();
  return n;
}

uint64_t resident_bytes(const ByteRanges& ranges) {
  const uintptr_t page = page_size();
  uint64_t total = 0;
  std::vector<unsigned char> vec;
  for (const auto& r : ranges) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(r.data()), hi = lo + r.size();
    const uintptr_t begin = lo / page * page, end = (hi + page - 1) / page * page;
    if (end <= begin) continue;
    vec.assign((end - begin) / page, 0);
    if (mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) != 0) continue;
    // A page the range covers in part (at its ends) counts for the covered part.
    for (size_t i = 0; i < vec.size(); ++i) {
      if (!(vec[i] & 1)) continue;
      const uintptr_t p0 = begin + i * page;
      total += std::min(p0 + page, hi) - std::max(p0, lo);
    }
  }
  return total;
}

Expected<uint64_t> lock_ranges(const ByteRanges& ranges) {
  const uintptr_t page = page_size();
  uint64_t locked = 0;
  for (const auto& r : ranges) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(r.data()) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(r.data()) + r.size() + page - 1) / page * page;
    if (end <= begin) continue;
    if (mlock(reinterpret_cast<void*>(begin), end - begin) != 0) {
      const int e = errno;
      struct rlimit lim {};
      getrlimit(RLIMIT_MEMLOCK, &lim);
      std::string limit = lim.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(lim.rlim_cur >> 10) + " KiB";
      return resource_exhausted("cannot lock " + std::to_string((end - begin) >> 10) + " KiB of weights after " +
                                std::to_string(locked >> 20) + " MiB: " + std::strerror(e) +
                                " (RLIMIT_MEMLOCK is " + limit +
                                "; raise it with `ulimit -l`, LimitMEMLOCK= in a systemd unit, or run without --mlock)");
    }
    locked += end - begin;
  }
  return locked;
}

uint64_t major_page_faults() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_majflt);
}

}  // namespace metro
