#include "loadgen/url.h"

#include <charconv>

namespace metro::loadgen {

std::string Url::host_header() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if (port != 80) h += ":" + std::to_string(port);
  return h;
}

std::string Url::to_string() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return "http://" + h + ":" + std::to_string(port) + path;
}

Expected<Url> parse_url(std::string_view text) {
  const std::string shown(text);
  std::string_view rest = text;
  if (rest.starts_with("https://")) {
    return unimplemented("--url '" + shown +
                         "': https is not supported; benchmark the server's plain http port");
  }
  if (!rest.starts_with("http://")) {
    return invalid_argument("--url '" + shown + "': expected http://HOST[:PORT][/PATH]");
  }
  rest.remove_prefix(7);
  auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  Url u;
  if (slash != std::string_view::npos) {
    std::string_view path = rest.substr(slash);
    path = path.substr(0, path.find_first_of("?#"));
    u.path = std::string(path);
    while (!u.path.empty() && u.path.back() == '/') u.path.pop_back();
  }
  if (authority.find('@') != std::string_view::npos) {
    return invalid_argument("--url '" + shown + "': credentials in the URL are not supported; use --api-key");
  }
  std::string_view port_text;
  if (authority.starts_with("[")) {
    auto close = authority.find(']');
    if (close == std::string_view::npos) return invalid_argument("--url '" + shown + "': unclosed '['");
    u.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return invalid_argument("--url '" + shown + "': junk after ']'");
      port_text = after.substr(1);
    }
  } else {
    auto colon = authority.rfind(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (u.host.empty()) return invalid_argument("--url '" + shown + "': no host");
  if (!port_text.empty() || authority.ends_with(":")) {
    unsigned v = 0;
    auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), v);
    if (port_text.empty() || ec != std::errc() || p != port_text.data() + port_text.size() || v == 0 ||
        v > 65535) {
      return invalid_argument("--url '" + shown + "': port must be 1-65535");
    }
    u.port = static_cast<uint16_t>(v);
  }
  return u;
}

}  // namespace metro::loadgen
