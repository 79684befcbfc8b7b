// GET /: a small chat page served from the binary (no build step, no CDN). It lists the
// model from /v1/models and streams replies from /v1/chat/completions; an API key, when the
// server needs one, is kept in the browser's localStorage.
#pragma once

#include <string_view>

namespace metro::server {

std::string_view web_ui_html();

}  // namespace metro::server
