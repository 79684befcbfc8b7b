// What of a model's weights lives in host memory, and giving back the file copy's bytes the
// backend no longer reads (model/model.h).
#include <algorithm>

#include "base/residency.h"
#include "model/model.h"

namespace metro::model {

std::vector<std::span<const uint8_t>> Model::weight_memory() const {
  ByteRanges all;
  auto add = [&](const backends::DeviceMatrix* m) {
    if (m == nullptr || m->cold()) return;
    for (const auto& r : m->host_memory()) all.push_back(r);
  };
  for (const auto* m : w_.product_matrices()) add(m);
  add(w_.token_embd.get());
  add(w_.pos_embd.get());
  return merge_ranges(std::move(all));
}

Expected<uint64_t> Model::lock_weights() const {
  METRO_ASSIGN_OR_RETURN(uint64_t n, lock_ranges(weight_memory()));
  locked_.store(n, std::memory_order_relaxed);
  return n;
}

Status Model::apply_budget(const MemBudget& budget) {
  mem_budget_ = budget.bytes;
  const uint64_t hot = total_bytes(weight_memory());
  auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  if (hot > budget.bytes) {
    return invalid_argument("the memory budget (" + mib(budget.bytes) + ") is below the " + mib(hot) +
                            " of weights every step reads (only the experts of a mixture-of-experts model and the "
                            "token embedding table's rows can be kept cold)");
  }
  if (!cold_) return {};
  METRO_RETURN_IF_ERROR(cold_->seal());
  cold_->set_budget(budget.bytes - hot);
  return {};
}

uint64_t Model::give_back_unread_file_bytes() const {
  if (!file_.owns_bytes() || !backend_->host_memory_complete() || file_given_back() > 0) return 0;
  // Tensor bytes minus every range a weight reads in place.
  const ByteRanges keep = weight_memory();
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file_.tensors()) {
    const uint8_t* at = t.data;
    const uint8_t* const end = t.data + t.n_bytes;
    // The kept ranges that start before the tensor's end, in address order.
    auto k = std::lower_bound(keep.begin(), keep.end(), at,
                              [](const auto& r, const uint8_t* p) { return r.data() + r.size() <= p; });
    while (at < end) {
      const uint8_t* stop = end;
      if (k != keep.end() && k->data() < end) stop = std::max(at, k->data());
      if (stop > at) total += file_.give_back({at, static_cast<size_t>(stop - at)});
      if (k == keep.end() || k->data() >= end) break;
      at = std::max(at, k->data() + k->size());
      ++k;
    }
  }
  given_back_.fetch_add(total, std::memory_order_relaxed);
  return total;
}

}  // namespace metro::model
