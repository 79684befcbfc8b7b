#include "server/framing.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace metro::server {

namespace http = boost::beast::http;

std::optional<ApiError> check_framing(const http::request_header<>& h) {
  size_t n_te = 0, n_host = 0;
  std::string codings;
  for (const auto& f : h) {
    if (f.name() == http::field::transfer_encoding) {
      ++n_te;
      if (!codings.empty()) codings += ',';
      codings += std::string(f.value());
    } else if (f.name() == http::field::host) {
      ++n_host;
    }
  }
  if (n_te > 0) {
    std::vector<std::string> list;
    size_t i = 0;
    while (i <= codings.size()) {
      const size_t comma = std::min(codings.find(',', i), codings.size());
      std::string c = codings.substr(i, comma - i);
      while (!c.empty() && (c.back() == ' ' || c.back() == '\t')) c.pop_back();
      size_t b = 0;
      while (b < c.size() && (c[b] == ' ' || c[b] == '\t')) ++b;
      c.erase(0, b);
      std::transform(c.begin(), c.end(), c.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      if (!c.empty()) list.push_back(std::move(c));
      i = comma + 1;
    }
    if (h.version() < 11) {
      return bad_request("Transfer-Encoding is not allowed in an HTTP/1.0 request", "", "bad_http");
    }
    if (list.empty() || list.back() != "chunked") {
      return bad_request("the last Transfer-Encoding must be chunked: the body's length is unknown otherwise", "",
                         "bad_http");
    }
    if (list.size() > 1) {
      ApiError e = bad_request("only the chunked transfer coding is supported", "", "unsupported_transfer_coding");
      e.status = 501;
      e.type = "server_error";
      return e;
    }
  }
  if (h.version() >= 11 && n_host != 1) {
    return bad_request(n_host == 0 ? "an HTTP/1.1 request must have a Host header" : "more than one Host header", "",
                       "bad_http");
  }
  return std::nullopt;
}

}  // namespace metro::server
