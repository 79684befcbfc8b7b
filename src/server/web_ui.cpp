#include "server/web_ui.h"

#include <string>

namespace metro::server {

namespace {

// Scripts and styles from this server only; answers are read over fetch from the same
// origin; no frames, no plugins, no form posts elsewhere.
constexpr std::string_view kPolicy =
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

// An If-None-Match list ("a", W/"b", or *) names `etag`.
bool etag_matches(std::string_view list, std::string_view etag) {
  size_t i = 0;
  while (i < list.size()) {
    while (i < list.size() && (list[i] == ' ' || list[i] == ',' || list[i] == '\t')) ++i;
    if (i >= list.size()) break;
    if (list[i] == '*') return true;
    if (list.compare(i, 2, "W/") == 0) i += 2;
    const size_t end = list.find(',', i);
    std::string_view tag = list.substr(i, end == std::string_view::npos ? std::string_view::npos : end - i);
    while (!tag.empty() && (tag.back() == ' ' || tag.back() == '\t')) tag.remove_suffix(1);
    if (tag == etag) return true;
    if (end == std::string_view::npos) break;
    i = end + 1;
  }
  return false;
}

}  // namespace

const WebAsset* find_web_asset(std::string_view path) {
  if (path == "/") path = "/index.html";
  for (size_t i = 0; i < kWebAssetCount; ++i) {
    if (kWebAssets[i].path == path) return &kWebAssets[i];
  }
  return nullptr;
}

HttpResponse web_asset_response(const WebAsset& asset, std::string_view if_none_match) {
  HttpResponse r;
  r.content_type = std::string(asset.content_type);
  r.headers.emplace_back("ETag", std::string(asset.etag));
  // Revalidated on every use: an upgraded server is never paired with a stale script.
  r.headers.emplace_back("Cache-Control", "no-cache");
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  if (asset.path == "/index.html") {
    r.headers.emplace_back("Content-Security-Policy", std::string(kPolicy));
    r.headers.emplace_back("Referrer-Policy", "no-referrer");
  }
  if (!if_none_match.empty() && etag_matches(if_none_match, asset.etag)) {
    r.status = 304;
    return r;
  }
  r.body = std::string(asset.body);
  return r;
}

}  // namespace metro::server
