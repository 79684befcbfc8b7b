// Helpers shared by the fuzz targets.
#pragma once

#include <string_view>

namespace metro::fuzz {

// The server refuses bodies nested deeper than this before parsing them; inputs past it
// would only exercise nlohmann::json's recursion.
inline bool shallow(std::string_view s) {
  int depth = 0;
  for (char c : s) {
    if (c == '[' || c == '{') {
      if (++depth > 32) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace metro::fuzz
