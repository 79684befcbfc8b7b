// API keys: `--api-key-file` holds one key per line, optionally followed by a tenant name
// and the tenant's traffic settings:
//
//   sk-abc123456 team-a class=realtime tpm=60000 burst=90000 concurrency=8
//
//   class=realtime|standard|batch  the SLA class of its requests that name none
//   tpm=N          tokens per minute (prompt + generated; 0 or absent: unlimited)
//   burst=N        token bucket size (default: one minute's worth, tpm)
//   concurrency=N  requests in flight at once (0 or absent: unlimited)
//   capture=R      share (0 to 1) of its requests written to the teacher-capture dataset
//                  (`--capture-teacher`; absent: none of them)
//   cache=on|off   whether its requests may opt in to the semantic cache (`--semantic-cache`;
//                  absent: off)
//
// Blank lines and lines starting with '#' are skipped. Several keys may share a tenant; its
// settings may be written on any of its lines but must not disagree. When any key is set,
// every /v1/* request needs `Authorization: Bearer <key>`.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/sla.h"

namespace metro::server {

// Compares in time that depends only on the lengths, never on where the bytes differ.
bool constant_time_equal(std::string_view a, std::string_view b);

struct TenantSettings {
  std::optional<SlaClass> default_class;
  double tokens_per_minute = 0.0;  // 0: unlimited
  double burst_tokens = 0.0;       // 0: tokens_per_minute
  int max_concurrent = 0;          // 0: unlimited
  std::optional<double> capture_share;  // teacher capture: opted in at this share
  bool semantic_cache = false;          // cache=on: its requests may use the semantic cache
  bool operator==(const TenantSettings&) const = default;
};

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
  // The settings of a tenant named in the file; nullptr for an unknown name.
  const TenantSettings* tenant_settings(const std::string& tenant) const;
  // Every tenant with its settings, in the order of first appearance.
  const std::vector<std::pair<std::string, TenantSettings>>& tenants() const { return tenants_; }

 private:
  struct Entry {
    std::string key;
    std::string tenant;
  };
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, TenantSettings>> tenants_;
};

}  // namespace metro::server
