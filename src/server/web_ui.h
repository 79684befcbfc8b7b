// The web UI: a chat app (conversations kept in the browser, Stop / regenerate / edit,
// Markdown and code highlighting) and a live view of /metrics, served from the binary.
// Its files (web/, and marked + highlight.js from Debian's libjs-* packages) are embedded at
// build time by scripts/embed_web.py; nothing is fetched from elsewhere.
//
//   GET /, /index.html      the page      GET /ui/...   its scripts and styles
//
// Every answer carries an ETag (a hash of the bytes) and is revalidated by the browser;
// the page's Content-Security-Policy allows scripts from the server only, so markup in a
// model's answer cannot run.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "server/routes.h"

namespace metro::server {

struct WebAsset {
  std::string_view path;  // "/index.html", "/ui/app.js", ...
  std::string_view content_type;
  std::string_view etag;  // quoted, as sent
  std::string_view body;
};

extern const WebAsset kWebAssets[];
extern const size_t kWebAssetCount;

// The asset at a request path ("/" is the page), or null.
const WebAsset* find_web_asset(std::string_view path);

// The response to a GET of a web asset: 304 when `if_none_match` names its ETag.
HttpResponse web_asset_response(const WebAsset& asset, std::string_view if_none_match);

}  // namespace metro::server
