#include "cli/model_specs.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

namespace metro::cli {

namespace {

bool name_ok(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.' || c == '/' || c == ':';
    if (!ok) return false;
  }
  return true;
}

bool variant_ok(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string default_model_name(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name;
}

Expected<std::vector<ServeModelSpec>> parse_model_specs(const std::vector<std::string>& args,
                                                        const std::string& model_name,
                                                        const std::vector<std::string>& names) {
  std::vector<ServeModelSpec> out;
  bool unnamed = false;
  for (const std::string& a : args) {
    ServeModelSpec s;
    const size_t eq = a.find('=');
    if (eq == std::string::npos || is_file(a)) {
      if (unnamed) {
        return invalid_argument("-m '" + a + "': only one model may go without a name; give the others as NAME=FILE");
      }
      unnamed = true;
      s.path = a;
      s.name = !names.empty() ? names.front() : model_name.empty() ? default_model_name(a) : model_name;
      if (!names.empty()) s.aliases.assign(names.begin() + 1, names.end());
    } else {
      const std::string lhs = a.substr(0, eq);
      s.path = a.substr(eq + 1);
      const size_t at = lhs.find('@');
      s.name = lhs.substr(0, at);
      if (at != std::string::npos) s.variant = lhs.substr(at + 1);
      if (!name_ok(s.name)) {
        return invalid_argument("-m '" + a + "': a model name is 1 to 128 letters, digits or -_./:");
      }
      if (at != std::string::npos && !variant_ok(s.variant)) {
        return invalid_argument("-m '" + a + "': a variant name is 1 to 64 letters, digits or -_.");
      }
      if (s.path.empty()) return invalid_argument("-m '" + a + "': no file after '='");
    }
    for (const ServeModelSpec& o : out) {
      if (o.name == s.name && o.variant == s.variant) {
        return invalid_argument("-m '" + a + "': the model '" + s.name + (s.variant.empty() ? "" : "@" + s.variant) +
                                "' is given twice");
      }
    }
    out.push_back(std::move(s));
  }
  if (!unnamed && (!model_name.empty() || !names.empty())) {
    return invalid_argument("--model-name and --served-model-name name the model given as -m FILE; every -m here "
                            "names its own");
  }
  for (const ServeModelSpec& s : out) {
    if (s.variant.empty()) continue;
    bool primary = false;
    for (const ServeModelSpec& o : out) primary = primary || (o.name == s.name && o.variant.empty());
    if (!primary) {
      return invalid_argument("-m " + s.name + "@" + s.variant + ": the variant needs '" + s.name +
                              "' itself served too (-m " + s.name + "=FILE)");
    }
  }
  return out;
}

Expected<std::vector<SplitSpec>> parse_splits(const std::vector<std::string>& args,
                                              const std::vector<ServeModelSpec>& models) {
  std::vector<SplitSpec> out;
  std::map<std::string, double> total;
  for (const std::string& a : args) {
    const size_t colon = a.find(':'), eq = a.rfind('=');
    if (colon == std::string::npos || eq == std::string::npos || eq < colon) {
      return invalid_argument("--split '" + a + "': write NAME:VARIANT=PERCENT");
    }
    SplitSpec s;
    s.name = a.substr(0, colon);
    s.variant = a.substr(colon + 1, eq - colon - 1);
    const std::string pct = a.substr(eq + 1);
    char* end = nullptr;
    const double v = std::strtod(pct.c_str(), &end);
    if (pct.empty() || end != pct.c_str() + pct.size() || !std::isfinite(v) || v < 0 || v > 100) {
      return invalid_argument("--split '" + a + "': the percent must be a number from 0 to 100");
    }
    bool served = false;
    for (const ServeModelSpec& m : models) served = served || (m.name == s.name && m.variant == s.variant);
    if (s.variant.empty() || !served) {
      return invalid_argument("--split '" + a + "': no variant '" + s.variant + "' of '" + s.name +
                              "' is served (-m " + s.name + "@VARIANT=FILE)");
    }
    for (const SplitSpec& o : out) {
      if (o.name == s.name && o.variant == s.variant) return invalid_argument("--split '" + a + "' is given twice");
    }
    s.share = v / 100.0;
    total[s.name] += s.share;
    if (total[s.name] > 1.0 + 1e-9) {
      return invalid_argument("--split: the variants of '" + s.name + "' take more than 100% of its traffic");
    }
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

bool serves(const std::vector<ServeModelSpec>& models, const std::string& name, const std::string& variant) {
  for (const ServeModelSpec& m : models) {
    if (m.name == name && m.variant == variant) return true;
  }
  return false;
}

std::optional<double> parse_share(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < 0 || v > 1) return std::nullopt;
  return v;
}

}  // namespace

Expected<std::vector<gateway::RolloutPlan>> parse_rollouts(const std::vector<std::string>& args,
                                                           const std::vector<ServeModelSpec>& models) {
  std::vector<gateway::RolloutPlan> out;
  for (const std::string& a : args) {
    METRO_ASSIGN_OR_RETURN(gateway::RolloutPlan p, gateway::parse_rollout(a));
    if (!serves(models, p.name, p.variant)) {
      return invalid_argument("--rollout '" + a + "': no variant '" + p.variant + "' of '" + p.name +
                              "' is served (-m " + p.name + "@VARIANT=FILE)");
    }
    for (const auto& o : out) {
      if (o.name == p.name && o.variant == p.variant) return invalid_argument("--rollout '" + a + "' is given twice");
    }
    out.push_back(std::move(p));
  }
  return out;
}

Expected<std::vector<FaultTarget>> parse_faults(const std::vector<std::string>& args,
                                                const std::vector<ServeModelSpec>& models) {
  std::vector<FaultTarget> out;
  for (const std::string& a : args) {
    const auto bad = [&](const std::string& why) { return invalid_argument("--fault '" + a + "': " + why); };
    const size_t colon = a.find(':');
    if (colon == std::string::npos || colon == 0) return bad("write TARGET:error=SHARE,latency=DURATION,...");
    FaultTarget f;
    const std::string target = a.substr(0, colon);
    if (const size_t at = target.find('@'); at != std::string::npos) {
      f.name = target.substr(0, at);
      f.variant = target.substr(at + 1);
    } else if (serves(models, target, "")) {
      f.name = target;
    } else {
      // A bare variant: the one name that has it.
      int found = 0;
      for (const ServeModelSpec& m : models) {
        if (m.variant == target) {
          f.name = m.name;
          f.variant = target;
          ++found;
        }
      }
      if (found > 1) return bad("several names have a variant '" + target + "'; write NAME@" + target);
    }
    if (f.name.empty() || !serves(models, f.name, f.variant)) return bad("no model '" + target + "' is served");
    size_t start = colon + 1;
    bool any = false;
    while (start <= a.size()) {
      const size_t comma = std::min(a.find(',', start), a.size());
      const std::string kv = a.substr(start, comma - start);
      start = comma + 1;
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) return bad("'" + kv + "' is not KEY=VALUE");
      const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
      if (key == "error" || key == "latency_share") {
        const auto v = parse_share(value);
        if (!v) return bad(key + " is a share from 0 to 1");
        (key == "error" ? f.spec.error : f.spec.latency_share) = *v;
      } else if (key == "status") {
        char* end = nullptr;
        const long v = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || end != value.c_str() + value.size() || v < 400 || v > 599) {
          return bad("status is an HTTP error status from 400 to 599");
        }
        f.spec.status = static_cast<int>(v);
      } else if (key == "latency") {
        const auto d = gateway::parse_duration_s(value);
        if (!d || *d > 3600.0) return bad("latency is a time such as 300ms or 2s (at most 1h)");
        f.spec.latency_s = *d;
      } else {
        return bad("unknown key '" + key + "' (error, status, latency, latency_share)");
      }
      any = true;
    }
    if (!any) return bad("no fault given");
    out.push_back(std::move(f));
  }
  return out;
}

Status add_lora_specs(const std::vector<std::string>& lora, const std::vector<std::pair<std::string, double>>& scaled,
                      std::vector<ServeModelSpec>& specs, bool run_time) {
  std::vector<std::pair<std::string, double>> all;
  for (const std::string& a : lora) all.emplace_back(a, 1.0);
  all.insert(all.end(), scaled.begin(), scaled.end());
  if (all.empty()) return {};
  const ServeModelSpec base = specs.front();
  for (const auto& [a, scale] : all) {
    const size_t eq = a.find('=');
    const std::string name = eq == std::string::npos ? "" : a.substr(0, eq);
    if (eq == std::string::npos || !variant_ok(name) || eq + 1 == a.size()) {
      return invalid_argument("--lora '" + a + "': write NAME=FILE (NAME: 1 to 64 letters, digits or -_.)");
    }
    if (!std::isfinite(scale)) return invalid_argument("--lora-scaled '" + a + "': the scale is not a number");
    ServeModelSpec s;
    s.name = base.name + ":" + name;
    s.path = base.path;
    s.lora = {{a.substr(eq + 1), static_cast<float>(scale)}};
    if (!name_ok(s.name)) return invalid_argument("--lora '" + a + "': '" + s.name + "' is too long a model name");
    for (const ServeModelSpec& o : specs) {
      bool taken = o.name == s.name;
      for (const auto& ad : o.adapters) taken = taken || ad.first == s.name;
      if (taken) return invalid_argument("--lora '" + a + "': the model '" + s.name + "' is given twice");
    }
    if (run_time) {
      specs.front().adapters.emplace_back(s.name, s.lora.front());
    } else {
      specs.push_back(std::move(s));
    }
  }
  return {};
}

}  // namespace metro::cli
