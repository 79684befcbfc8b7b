// libFuzzer target: bench-serve's reading of a streamed response (server bytes are
// untrusted). The SSE parser must never crash and must give the same events however the
// bytes are cut; the response meter must survive any events.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen/response_meter.h"
#include "loadgen/sse_parser.h"

namespace {

std::vector<std::string> events_of(std::string_view bytes, size_t cut_every) {
  metro::loadgen::SseParser p(1 << 16);
  std::vector<std::string> out;
  auto sink = [&](const metro::loadgen::SseEvent& e) { out.push_back(e.type + '\0' + e.data + '\0' + e.id); };
  for (size_t pos = 0; pos < bytes.size(); pos += cut_every) {
    if (!p.feed(bytes.substr(pos, cut_every), sink).ok()) {
      out.push_back("<error>");
      break;
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t cut = 1 + data[0] % 16;
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto whole = events_of(bytes, bytes.size() + 1);
  const auto pieces = events_of(bytes, cut);
  // An over-long line is an error at the same place whatever the cuts, so the event lists
  // before it agree too.
  if (whole != pieces) std::abort();

  metro::loadgen::RequestRecord r;
  metro::loadgen::ResponseMeter meter(r, /*stream=*/true, /*keep_text=*/true);
  meter.on_head(0.0, 200);
  double t = 0.0;
  for (size_t pos = 0; pos < bytes.size(); pos += cut) {
    t += 0.001;
    if (!meter.on_body(t, bytes.substr(pos, cut))) break;
  }
  meter.on_done(t + 0.001, metro::loadgen::HttpOutcome{metro::loadgen::TransportError::kNone, "", 200});
  return 0;
}
