// The web UI's embedded files (server/web_ui.h): every file the page names is served, with
// its type, an ETag that revalidates, and the page's script policy.
#include "server/web_ui.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

namespace metro::server {
namespace {

std::string header(const HttpResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return {};
}

TEST(WebUi, ThePageAndEveryFileItNamesAreServed) {
  const WebAsset* page = find_web_asset("/");
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(page, find_web_asset("/index.html"));
  EXPECT_EQ(page->content_type, "text/html; charset=utf-8");
  const std::string html(page->body);
  const std::regex ref(R"re((?:src|href)="([^"]+)")re");
  int named = 0;
  for (std::sregex_iterator it(html.begin(), html.end(), ref), end; it != end; ++it) {
    const std::string url = (*it)[1].str();
    ASSERT_EQ(url.rfind("ui/", 0), 0u) << url << ": the page loads nothing from elsewhere";
    const WebAsset* a = find_web_asset("/" + url);
    ASSERT_NE(a, nullptr) << url;
    // Empty when Debian's libjs-marked / libjs-highlight.js were missing at build time.
    EXPECT_GT(a->body.size(), 500u) << url << " (scripts/deps.sh installs the packages it comes from)";
    const bool script = url.size() > 3 && url.substr(url.size() - 3) == ".js";
    EXPECT_EQ(a->content_type, script ? "text/javascript; charset=utf-8" : "text/css; charset=utf-8") << url;
    ++named;
  }
  EXPECT_EQ(named, 6);  // 4 scripts, 2 style sheets
  EXPECT_EQ(find_web_asset("/ui/nope.js"), nullptr);
  EXPECT_EQ(find_web_asset("/ui/"), nullptr);
  EXPECT_EQ(find_web_asset("/ui/../index.html"), nullptr);
}

TEST(WebUi, EtagsRevalidateAndThePageCarriesItsPolicy) {
  const WebAsset* page = find_web_asset("/");
  ASSERT_NE(page, nullptr);
  HttpResponse r = web_asset_response(*page, "");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, page->body);
  EXPECT_EQ(header(r, "ETag"), page->etag);
  EXPECT_EQ(header(r, "Cache-Control"), "no-cache");
  const std::string csp = header(r, "Content-Security-Policy");
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("script-src 'self' 'unsafe"), std::string::npos) << "inline scripts must stay off: " << csp;

  const std::string etag(page->etag);
  ASSERT_GE(etag.size(), 3u);
  EXPECT_EQ(etag.front(), '"');
  for (const std::string& match : {etag, "W/" + etag, "\"zzz\", " + etag, "\"zzz\"," + etag + " ", std::string("*")}) {
    HttpResponse m = web_asset_response(*page, match);
    EXPECT_EQ(m.status, 304) << match;
    EXPECT_TRUE(m.body.empty()) << match;
    EXPECT_EQ(header(m, "ETag"), etag);
  }
  for (const std::string& miss : {std::string("\"zzz\""), etag.substr(0, etag.size() - 1), std::string(", ,"),
                                 etag.substr(1)}) {
    EXPECT_EQ(web_asset_response(*page, miss).status, 200) << miss;
  }
  // A script has no page policy of its own; it is not the document.
  const WebAsset* app = find_web_asset("/ui/app.js");
  ASSERT_NE(app, nullptr);
  EXPECT_TRUE(header(web_asset_response(*app, ""), "Content-Security-Policy").empty());
  EXPECT_NE(app->etag, page->etag);
}

}  // namespace
}  // namespace metro::server
