// Stop strings over streamed text: emits only text that cannot be the start of a stop
// string, so a stop string never reaches the client even when it spans tokens.
// Linear in the text (bounded number and length of stop strings; no regex).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace metro::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends text (whole UTF-8 characters). Returns what is safe to emit; `*matched` is set
  // when a stop string appeared, the returned text then ending right before it.
  std::string push(std::string_view text, bool* matched);
  // At the end of generation: whatever was held back.
  std::string flush();
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace metro::engine
