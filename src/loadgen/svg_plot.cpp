#include "loadgen/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <vector>

#include "loadgen/report_text.h"

namespace metro::loadgen {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr const char* kAllColor = "#222222";
constexpr size_t kMaxCurvePoints = 1000;
// Above this max/min ratio a linear axis squeezes the bulk of a CDF into its first pixels.
constexpr double kLogAxisRatio = 100.0;

void appendf(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& out, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n > 0) out.append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
}

struct Curve {
  std::string name;
  const char* color;
  std::vector<std::pair<double, double>> points;  // data coordinates
  bool markers = false;
};

// A step of 1, 2 or 5 times a power of ten giving about `n` intervals up to `max`.
double nice_step(double max, int n) {
  if (!(max > 0.0)) return 1.0;
  const double raw = max / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10.0 * mag;
}

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

struct Panel {
  double x0, y0, w, h;  // plot area in pixels
  std::string title, x_label, y_label;
  double x_max = 1.0, y_max = 1.0;
  double x_min = 0.0;    // log axis only: a power of ten below every value
  bool log_x = false;    // decades, for latencies whose tail is 100x their bulk
  std::vector<std::string> x_categories;  // when set, x is the index 0..n-1
  std::vector<Curve> curves;

  double px(double x) const {
    if (!x_categories.empty()) {
      const double n = static_cast<double>(x_categories.size());
      return x0 + w * (x + 0.5) / n;
    }
    if (log_x) {
      const double lx = std::log10(std::max(x, x_min));
      return x0 + w * (lx - std::log10(x_min)) / (std::log10(x_max) - std::log10(x_min));
    }
    return x0 + w * x / x_max;
  }
  double py(double y) const { return y0 + h - h * y / y_max; }

  void draw(std::string& out) const {
    appendf(out, "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
            x0, y0 - 10, svg_escape(title).c_str());
    appendf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n",
            x0, y0, w, h);
    // y grid and labels
    const double ys = nice_step(y_max, 5);
    for (double v = 0; v <= y_max * (1 + 1e-9); v += ys) {
      appendf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", x0,
              py(v), x0 + w, py(v));
      appendf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
              x0 - 4, py(v) + 4, tick_label(v).c_str());
    }
    // x grid and labels
    if (!x_categories.empty()) {
      for (size_t i = 0; i < x_categories.size(); ++i) {
        const double x = px(static_cast<double>(i));
        appendf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", x,
                y0, x, y0 + h);
        appendf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                x, y0 + h + 15, svg_escape(x_categories[i]).c_str());
      }
    } else if (log_x) {
      for (double decade = x_min; decade <= x_max * (1 + 1e-9); decade *= 10) {
        for (double m : {1.0, 2.0, 5.0}) {
          const double v = decade * m;
          if (v > x_max * (1 + 1e-9)) break;
          appendf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n",
                  px(v), y0, px(v), y0 + h, m == 1.0 ? "#d0d0d0" : "#f0f0f0");
          if (m == 1.0) {
            appendf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                    px(v), y0 + h + 15, tick_label(v).c_str());
          }
        }
      }
    } else {
      const double xs = nice_step(x_max, 6);
      for (double v = 0; v <= x_max * (1 + 1e-9); v += xs) {
        appendf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n",
                px(v), y0, px(v), y0 + h);
        appendf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                px(v), y0 + h + 15, tick_label(v).c_str());
      }
    }
    appendf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n",
            x0 + w / 2, y0 + h + 34, svg_escape(x_label).c_str());
    appendf(out,
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">%s</text>\n",
            x0 - 42, y0 + h / 2, x0 - 42, y0 + h / 2, svg_escape(y_label).c_str());
    for (const auto& c : curves) {
      if (c.points.empty()) continue;
      appendf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" points=\"", c.color);
      for (const auto& [x, y] : c.points) appendf(out, "%.1f,%.1f ", px(x), py(y));
      out += "\"/>\n";
      if (c.markers) {
        for (const auto& [x, y] : c.points) {
          appendf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(x), py(y), c.color);
        }
      }
    }
    out += "</g>\n";
  }
};

// Empirical CDF as a staircase, thinned to at most kMaxCurvePoints steps.
std::vector<std::pair<double, double>> cdf_points(std::vector<double> v, double scale) {
  std::erase_if(v, [](double x) { return std::isnan(x); });
  std::vector<std::pair<double, double>> pts;
  if (v.empty()) return pts;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const size_t stride = std::max<size_t>(1, n / kMaxCurvePoints);
  pts.push_back({v[0] * scale, 0.0});
  for (size_t i = 0; i < n; i += stride) {
    const size_t last = std::min(n - 1, i + stride - 1);
    pts.push_back({v[i] * scale, static_cast<double>(i) / static_cast<double>(n)});
    pts.push_back({v[last] * scale, static_cast<double>(last + 1) / static_cast<double>(n)});
  }
  return pts;
}

void header(std::string& out, int width, int height, const std::string& title) {
  appendf(out,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
          "<text x=\"%d\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">%s</text>\n",
          width, height, width, height, width / 2, svg_escape(title).c_str());
}

void legend(std::string& out, const std::vector<std::pair<std::string, const char*>>& entries, int y) {
  double x = 70;
  for (const auto& [name, color] : entries) {
    appendf(out, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>\n",
            x, y, x + 22, y, color);
    appendf(out, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\">%s</text>\n", x + 28, y + 4,
            svg_escape(name).c_str());
    x += 40 + 7.0 * static_cast<double>(name.size());
  }
}

std::vector<std::pair<std::string, const char*>> groups_of(const RunSummary& s) {
  std::vector<std::pair<std::string, const char*>> g{{"all requests", kAllColor}};
  for (size_t i = 0; i < s.classes.size(); ++i) {
    g.push_back({s.classes[i].name, kColors[i % std::size(kColors)]});
  }
  return g;
}

}  // namespace

std::string svg_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out.push_back(c);
    }
  }
  return out;
}

std::string latency_cdf_svg(const RunResult& run, const RunSummary& summary, const std::string& title) {
  const int width = 1000, height = 800;
  std::string out;
  header(out, width, height, title);
  const auto groups = groups_of(summary);
  legend(out, groups, 48);

  struct Metric {
    const char* name;
    const char* what;
    double (*get)(const RequestRecord&);
  };
  const Metric metrics[] = {
      {"TTFT", "requests", [](const RequestRecord& r) { return r.ttft_s; }},
      {"TPOT", "requests", [](const RequestRecord& r) { return r.tpot_s; }},
      {"ITL", "token gaps", nullptr},
      {"E2E", "requests", [](const RequestRecord& r) { return r.e2e_s; }},
  };
  for (int m = 0; m < 4; ++m) {
    // Values per group, in seconds.
    std::vector<std::vector<double>> values(groups.size());
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const std::string cls = gi == 0 ? std::string() : summary.classes[gi - 1].name;
      if (metrics[m].get == nullptr) {
        values[gi] = pooled_itl(run.requests, cls);
        continue;
      }
      for (const auto& r : run.requests) {
        if (r.ok() && (cls.empty() || r.class_name == cls)) values[gi].push_back(metrics[m].get(r));
      }
    }
    double vmax = 0.0;
    for (const auto& v : values) {
      for (double x : v) {
        if (!std::isnan(x)) vmax = std::max(vmax, x);
      }
    }
    double vmin_pos = vmax;
    for (const auto& v : values) {
      for (double x : v) {
        if (x > 0.0) vmin_pos = std::min(vmin_pos, x);
      }
    }
    const bool in_ms = vmax < 1.0;
    const double scale = in_ms ? 1e3 : 1.0;
    Panel p;
    p.x0 = 90 + (m % 2) * 480;
    p.y0 = 100 + (m / 2) * 350;
    p.w = 390;
    p.h = 250;
    p.title = std::string(metrics[m].name) + " CDF";
    p.x_label = std::string(metrics[m].name) + (in_ms ? " (ms)" : " (s)");
    p.y_label = std::string("fraction of ") + metrics[m].what;
    const double vs = vmax * scale;
    const double step = nice_step(vs, 6);
    p.x_max = vs > 0 ? std::ceil(vs / step * (1 - 1e-12)) * step : 1.0;
    if (vmin_pos > 0.0 && vmax / vmin_pos > kLogAxisRatio) {
      p.log_x = true;
      p.x_min = std::pow(10.0, std::floor(std::log10(vmin_pos * scale)));
      p.x_max = std::pow(10.0, std::ceil(std::log10(vs)));
      p.x_label += ", log scale";
    }
    p.y_max = 1.0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      p.curves.push_back({groups[gi].first, groups[gi].second, cdf_points(values[gi], scale)});
    }
    p.draw(out);
  }
  out += "</svg>\n";
  return out;
}

std::string sweep_svg(std::span<const RunSummary> runs, const std::string& title) {
  const int width = 1000, height = 470;
  std::string out;
  header(out, width, height, title);
  if (runs.empty()) {
    out += "</svg>\n";
    return out;
  }
  const auto groups = groups_of(runs.front());
  legend(out, groups, 48);
  std::vector<std::string> categories;
  for (const auto& r : runs) categories.push_back(rate_label(r.rate_per_s));

  // The group of a class in one run (classes may be missing from a short run).
  auto find = [](const RunSummary& s, const std::string& cls) -> const GroupSummary* {
    if (cls.empty()) return &s.overall;
    for (const auto& c : s.classes) {
      if (c.name == cls) return &c;
    }
    return nullptr;
  };
  for (int panel = 0; panel < 2; ++panel) {
    Panel p;
    p.x0 = 90 + panel * 480;
    p.y0 = 100;
    p.w = 390;
    p.h = 290;
    p.x_categories = categories;
    p.x_label = "request rate (requests/s)";
    double ymax = 0.0;
    std::vector<Curve> curves;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const std::string cls = gi == 0 ? std::string() : runs.front().classes[gi - 1].name;
      Curve c{groups[gi].first, groups[gi].second, {}, true};
      for (size_t i = 0; i < runs.size(); ++i) {
        const GroupSummary* g = find(runs[i], cls);
        if (g == nullptr) continue;
        const double y = panel == 0 ? g->output_token_throughput : g->ttft.p99;
        if (std::isnan(y)) continue;
        c.points.push_back({static_cast<double>(i), y});
        ymax = std::max(ymax, y);
      }
      curves.push_back(std::move(c));
    }
    const double step = nice_step(ymax, 5);
    p.y_max = ymax > 0 ? std::ceil(ymax / step * (1 - 1e-12)) * step : 1.0;
    p.title = panel == 0 ? "output token throughput" : "p99 time to first token";
    p.y_label = panel == 0 ? "tokens/s" : "p99 TTFT (s)";
    p.curves = std::move(curves);
    p.draw(out);
  }
  out += "</svg>\n";
  return out;
}

}  // namespace metro::loadgen
