// http:// URLs as given to --url.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace metro::loadgen {

struct Url {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  uint16_t port = 80;
  std::string path;  // "" or "/..." without query

  // The Host header value: host[:port], IPv6 bracketed.
  std::string host_header() const;
  std::string to_string() const;
};

// Accepts http://HOST[:PORT][/PATH]. https needs TLS, which this tool does not speak: put
// it behind a local plain-HTTP port, or measure the server directly.
Expected<Url> parse_url(std::string_view text);

}  // namespace metro::loadgen
