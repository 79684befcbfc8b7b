// The teacher-capture dataset: what is written reads back as documented (the JSON line
// locates its arrays in the .bin), the size bounds drop rather than block, tenants opt in.
#include "server/teacher_capture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/json_util.h"

namespace metro::server {
namespace {

std::string temp_dir(const char* tag) {
  auto d = std::filesystem::temp_directory_path() /
           (std::string("metro-capture-") + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CaptureSample make_sample(int n_prompt, int n_output, int n_top, int seed) {
  CaptureSample s;
  s.id = "cmpl-" + std::to_string(seed);
  s.request_id = "req_" + std::to_string(seed);
  s.model = "chat";
  s.variant = seed % 2 ? "canary" : "";
  s.tenant = "team-a";
  s.endpoint = "/v1/completions";
  s.finish_reason = "length";
  s.choice = seed % 3;
  for (int i = 0; i < n_prompt; ++i) s.prompt.push_back(1000 * seed + i);
  for (int i = 0; i < n_output; ++i) {
    engine::TokenInfo t;
    t.id = 7 * seed + i;
    t.logprob = -0.5f * static_cast<float>(i + 1);
    for (int j = 0; j < n_top; ++j) t.top.push_back({t.id + j, t.logprob - static_cast<float>(j)});
    s.output.push_back(std::move(t));
  }
  return s;
}

int32_t i32_at(const std::string& b, size_t off) {
  int32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}
float f32_at(const std::string& b, size_t off) {
  float v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

TEST(TeacherCapture, SamplesReadBackAsTheLayoutSays) {
  CaptureConfig cfg;
  cfg.dir = temp_dir("layout");
  cfg.top_k = 4;
  auto cap = TeacherCapture::open(cfg);
  ASSERT_TRUE(cap.ok()) << cap.status().message();
  // The second sample has fewer alternatives than top_k (padded), the third none at all.
  std::vector<CaptureSample> want = {make_sample(5, 3, 4, 1), make_sample(2, 4, 2, 2), make_sample(1, 1, 0, 3)};
  ASSERT_TRUE((*cap)->submit({want[0], want[1]}));
  ASSERT_TRUE((*cap)->submit({want[2]}));
  (*cap)->flush();
  const std::string bin = slurp((*cap)->bin_path());
  std::istringstream lines(slurp((*cap)->jsonl_path()));
  std::string line;
  size_t i = 0;
  size_t end = 0;
  while (std::getline(lines, line)) {
    ASSERT_LT(i, want.size());
    const CaptureSample& w = want[i];
    const Json j = Json::parse(line);
    EXPECT_EQ(j["id"], w.id);
    EXPECT_EQ(j["request_id"], w.request_id);
    EXPECT_EQ(j["variant"], w.variant);
    EXPECT_EQ(j["tenant"], w.tenant);
    EXPECT_EQ(j["choice"], w.choice);
    EXPECT_EQ(j["finish_reason"], w.finish_reason);
    EXPECT_EQ(j["top_k"], 4);
    const size_t np = j["n_prompt"], no = j["n_output"], off = j["offset"], bytes = j["bytes"];
    EXPECT_EQ(np, w.prompt.size());
    EXPECT_EQ(no, w.output.size());
    EXPECT_EQ(off, end) << "samples are packed in order";
    EXPECT_EQ(bytes, 4 * (np + 2 * no + 2 * no * 4));
    ASSERT_LE(off + bytes, bin.size());
    size_t at = off;
    for (size_t p = 0; p < np; ++p, at += 4) EXPECT_EQ(i32_at(bin, at), w.prompt[p]);
    for (size_t o = 0; o < no; ++o, at += 4) EXPECT_EQ(i32_at(bin, at), w.output[o].id);
    for (size_t o = 0; o < no; ++o, at += 4) EXPECT_EQ(f32_at(bin, at), w.output[o].logprob);
    for (size_t o = 0; o < no; ++o) {
      for (size_t k = 0; k < 4; ++k, at += 4) {
        EXPECT_EQ(i32_at(bin, at), k < w.output[o].top.size() ? w.output[o].top[k].id : -1);
      }
    }
    for (size_t o = 0; o < no; ++o) {
      for (size_t k = 0; k < 4; ++k, at += 4) {
        const float v = f32_at(bin, at);
        if (k < w.output[o].top.size()) {
          EXPECT_EQ(v, w.output[o].top[k].logprob);
        } else {
          EXPECT_TRUE(std::isinf(v) && v < 0);
        }
      }
    }
    EXPECT_EQ(at, off + bytes);
    end = off + bytes;
    ++i;
  }
  EXPECT_EQ(i, want.size());
  EXPECT_EQ(end, bin.size());
  metrics::Exposition e;
  (*cap)->export_metrics(e);
  EXPECT_NE(e.text().find("metro_teacher_capture_samples_total 3"), std::string::npos) << e.text();
  std::filesystem::remove_all(cfg.dir);
}

TEST(TeacherCapture, ADatasetAtItsLimitDropsSamplesAndCountsThem) {
  CaptureConfig cfg;
  cfg.dir = temp_dir("limit");
  cfg.top_k = 8;
  // One sample of 100 outputs is 100 * (8 + 64) + 400 + the line's estimate: room for two.
  cfg.max_bytes = 16000;
  auto cap = TeacherCapture::open(cfg);
  ASSERT_TRUE(cap.ok());
  int accepted = 0;
  for (int i = 0; i < 5; ++i) accepted += (*cap)->submit({make_sample(100, 100, 8, i)});
  EXPECT_EQ(accepted, 2);
  (*cap)->flush();
  metrics::Exposition e;
  (*cap)->export_metrics(e);
  EXPECT_NE(e.text().find("metro_teacher_capture_dropped_total 3"), std::string::npos) << e.text();
  EXPECT_LE(static_cast<int64_t>(std::filesystem::file_size((*cap)->bin_path())), cfg.max_bytes);
  std::filesystem::remove_all(cfg.dir);
}

TEST(TeacherCapture, TenantsOptInAtTheirShare) {
  CaptureConfig cfg;
  cfg.dir = temp_dir("tenants");
  cfg.tenant_rates = {{"all", 1.0}, {"some", 0.25}, {"none", 0.0}};
  auto cap = TeacherCapture::open(cfg);
  ASSERT_TRUE(cap.ok());
  int all = 0, some = 0, none = 0, other = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    all += (*cap)->sample("all");
    some += (*cap)->sample("some");
    none += (*cap)->sample("none");
    other += (*cap)->sample("not-in-the-file");
  }
  EXPECT_EQ(all, n);
  EXPECT_EQ(none, 0);
  EXPECT_EQ(other, 0) << "capture is opt-in once any tenant has a share";
  // Binomial(4000, 0.25): sd 27; 6 sd either side.
  EXPECT_NEAR(some, n / 4, 165);

  CaptureConfig open_cfg;
  open_cfg.dir = cfg.dir;
  open_cfg.rate = 0.5;
  auto c2 = TeacherCapture::open(open_cfg);
  ASSERT_TRUE(c2.ok());
  int half = 0;
  for (int i = 0; i < n; ++i) half += (*c2)->sample("");
  EXPECT_NEAR(half, n / 2, 190);
  std::filesystem::remove_all(cfg.dir);
}

TEST(TeacherCapture, BadSettingsAreRefused) {
  const std::string dir = temp_dir("bad");
  for (auto edit : std::vector<void (*)(CaptureConfig&)>{
           [](CaptureConfig& c) { c.top_k = 0; }, [](CaptureConfig& c) { c.top_k = 21; },
           [](CaptureConfig& c) { c.rate = 1.5; }, [](CaptureConfig& c) { c.rate = std::nan(""); },
           [](CaptureConfig& c) { c.tenant_rates["t"] = -0.1; }, [](CaptureConfig& c) { c.max_bytes = 0; },
           [](CaptureConfig& c) { c.dir = ""; }, [](CaptureConfig& c) { c.dir = "/proc/metro-cannot-make-this"; }}) {
    CaptureConfig c;
    c.dir = dir;
    edit(c);
    EXPECT_FALSE(TeacherCapture::open(c).ok());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace metro::server
