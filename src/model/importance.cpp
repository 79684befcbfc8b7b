#include "model/importance.h"

#include <algorithm>

#include "model/reference_forward.h"

namespace metro::model {

const std::vector<float>* Importance::find(const std::string& tensor) const {
  auto it = by_tensor.find(tensor);
  return it == by_tensor.end() ? nullptr : &it->second;
}

Expected<Importance> compute_importance(const gguf::File& file, std::span<const int32_t> tokens, int window,
                                        const std::function<void(int, int)>& on_window) {
  if (window < 1) return invalid_argument("importance: the window must hold at least one token");
  if (tokens.empty()) return invalid_argument("importance: the calibration text has no tokens");
  std::map<std::string, std::vector<double>> sums;
  const MatvecObserver observe = [&](const std::string& name, const std::vector<double>& x) {
    std::vector<double>& s = sums[name];
    if (s.empty()) s.assign(x.size(), 0.0);
    for (size_t i = 0; i < x.size() && i < s.size(); ++i) s[i] += x[i] * x[i];
  };
  const int n = static_cast<int>(tokens.size());
  const int windows = (n + window - 1) / window;
  for (int w = 0; w < windows; ++w) {
    const int begin = w * window, end = std::min(n, begin + window);
    METRO_RETURN_IF_ERROR(
        reference_forward(file, tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)), observe)
            .status());
    if (on_window) on_window(w + 1, windows);
  }
  Importance imp;
  imp.tokens = n;
  for (auto& [name, s] : sums) {
    double mean = 0.0;
    for (double v : s) mean += v;
    mean /= static_cast<double>(std::max<size_t>(1, s.size()));
    const double floor = std::max(1e-12, 1e-4 * mean / n);
    std::vector<float>& out = imp.by_tensor[name];
    out.resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<float>(std::max(s[i] / n, floor));
  }
  return imp;
}

}  // namespace metro::model
