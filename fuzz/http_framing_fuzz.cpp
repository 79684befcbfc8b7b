// libFuzzer target: the request-header checks that guard against smuggling (framing.h).
// Any bytes Beast accepts as a request header go through check_framing, which must never
// crash, and must refuse every header whose Transfer-Encoding does not end in a single
// chunked, or an HTTP/1.1 header without exactly one Host. An If-None-Match value goes
// through the web UI's revalidation: a 304 only when it names the page's ETag (or is *), and
// a 200 carries the page whole.
#include <boost/beast/core/buffers_prefix.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/framing.h"
#include "server/web_ui.h"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  http::request_parser<http::empty_body> p;
  p.header_limit(16 * 1024);
  p.eager(false);
  boost::beast::error_code ec;
  p.put(boost::asio::buffer(data, size), ec);
  if (!p.is_header_done()) return 0;
  const auto& h = p.get();
  if (auto it = h.find(http::field::if_none_match); it != h.end()) {
    const metro::server::WebAsset* page = metro::server::find_web_asset("/");
    if (page == nullptr) std::abort();
    const std::string_view value = it->value();
    const metro::server::HttpResponse r = metro::server::web_asset_response(*page, value);
    if (r.status == 304 && value.find(page->etag) == std::string_view::npos && value.find('*') == std::string_view::npos) {
      std::abort();
    }
    if (r.status != 304 && (r.status != 200 || r.body != page->body)) std::abort();
  }
  const auto verdict = metro::server::check_framing(h);
  size_t hosts = 0;
  for (const auto& f : h) hosts += f.name() == http::field::host;
  if (h.version() >= 11 && hosts != 1 && !verdict) std::abort();
  // The oracle, written apart from the checker: the comma-separated codings of every
  // Transfer-Encoding field, empty elements skipped (RFC 9110 lists), must be exactly one
  // "chunked" (any case), and only in HTTP/1.1.
  size_t n_te = 0, n_codings = 0;
  bool all_chunked = true;
  for (const auto& f : h) {
    if (f.name() != http::field::transfer_encoding) continue;
    ++n_te;
    std::string_view v = f.value();
    while (!v.empty()) {
      const size_t comma = v.find(',');
      std::string_view item = v.substr(0, comma);
      v = comma == std::string_view::npos ? std::string_view{} : v.substr(comma + 1);
      while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
      while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
      if (item.empty()) continue;
      ++n_codings;
      bool is_chunked = item.size() == 7;
      for (size_t i = 0; is_chunked && i < 7; ++i) is_chunked = (item[i] | 0x20) == "chunked"[i];
      all_chunked = all_chunked && is_chunked;
    }
  }
  if (n_te > 0) {
    const bool acceptable = h.version() >= 11 && n_codings == 1 && all_chunked;
    if (acceptable == verdict.has_value() && (hosts == 1 || h.version() < 11)) std::abort();
  }
  return 0;
}
