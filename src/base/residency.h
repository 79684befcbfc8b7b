// Which pages of some host memory are in RAM, and keeping them there: the measures behind
// `metro serve --mlock` and the weight residency metrics.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace metro {

using ByteRanges = std::vector<std::span<const uint8_t>>;

// The ranges sorted by address with overlapping and touching ones joined.
ByteRanges merge_ranges(ByteRanges ranges);

// The ranges' bytes, summed.
uint64_t total_bytes(const ByteRanges& ranges);

// Bytes of the ranges resident in RAM now (mincore, page by page): a resident page counts
// for the part of it a range covers. Ranges that overlap count twice: merge them first.
uint64_t resident_bytes(const ByteRanges& ranges);

// Locks the pages of the ranges in RAM (mlock), faulting them in. Returns the bytes
// locked; an error names RLIMIT_MEMLOCK when the limit is what refused (the ranges locked
// before the failure stay locked).
Expected<uint64_t> lock_ranges(const ByteRanges& ranges);

// Major page faults of the process so far (getrusage): reads that waited for the disk.
uint64_t major_page_faults();

}  // namespace metro
