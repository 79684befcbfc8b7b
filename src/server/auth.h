// API keys: `--api-key-file` holds one key per line, optionally followed by a tenant name
// (`sk-abc team-a`); blank lines and lines starting with '#' are skipped. When any key is
// set, every /v1/* request needs `Authorization: Bearer <key>`.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace metro::server {

// Compares in time that depends only on the lengths, never on where the bytes differ.
bool constant_time_equal(std::string_view a, std::string_view b);

class ApiKeys {
 public:
  // Errors name the line number, never the key or the file's path.
  static Expected<ApiKeys> parse(std::string_view text);
  static Expected<ApiKeys> load(const std::string& path);

  bool enabled() const { return !entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // The tenant of the key in an Authorization header value ("Bearer <key>"); nullopt when
  // the header is missing, malformed or names no key. Every key is compared (no early exit).
  std::optional<std::string> authenticate(std::string_view authorization_header) const;

 private:
  struct Entry {
    std::string key;
    std::string tenant;
  };
  std::vector<Entry> entries_;
};

}  // namespace metro::server
