#include "server/admin_routes.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>

#include "base/log.h"
#include "server/auth.h"
#include "server/json_util.h"

namespace metro::server {

namespace {

constexpr std::string_view kPrefix = "/admin/models";

std::map<std::string, std::string> query_of(const std::string& target) {
  std::map<std::string, std::string> q;
  const size_t mark = target.find('?');
  if (mark == std::string::npos) return q;
  size_t start = mark + 1;
  while (start <= target.size()) {
    const size_t amp = std::min(target.find('&', start), target.size());
    const std::string kv = target.substr(start, amp - start);
    start = amp + 1;
    if (kv.empty()) continue;
    const size_t eq = kv.find('=');
    q[percent_decode(kv.substr(0, eq))] = eq == std::string::npos ? "" : percent_decode(kv.substr(eq + 1));
  }
  return q;
}

std::optional<double> percent_param(const std::map<std::string, std::string>& q, const std::string& key) {
  auto it = q.find(key);
  if (it == q.end()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || end != it->second.c_str() + it->second.size() || !std::isfinite(v) || v < 0 || v > 100) {
    return -1.0;
  }
  return v / 100.0;
}

HttpResponse state_json(ServerCore& core) {
  gateway::FrontDoor& door = core.front_door();
  gateway::VariantGuard& guard = door.guard();
  const auto splits = door.models().splits();
  Json models = Json::array();
  for (const auto& m : door.models().all()) {
    Json j = Json::object();
    j["id"] = m->id();
    j["name"] = m->name;
    j["variant"] = m->variant.empty() ? "primary" : m->variant;
    double share = 0.0;
    if (m->variant.empty()) {
      share = 1.0;
      for (const auto& [key, s] : splits) {
        if (key.first == m->name) share -= s;
      }
    } else if (auto it = splits.find({m->name, m->variant}); it != splits.end()) {
      share = it->second;
    }
    j["share"] = std::max(0.0, share);
    j["breaker"] = gateway::breaker_state_name(guard.breaker_state(m->name, m->variant));
    const engine::EngineStats st = m->engine->stats();
    j["running"] = st.running;
    j["waiting"] = st.waiting;
    models.push_back(std::move(j));
  }
  Json rollouts = Json::array();
  for (const gateway::RolloutStatus& r : guard.rollouts()) {
    Json j = Json::object();
    j["model"] = r.plan.name;
    j["variant"] = r.plan.variant;
    j["state"] = r.state;
    if (!r.cause.empty()) j["cause"] = r.cause;
    Json steps = Json::array();
    for (double s : r.plan.shares) steps.push_back(s * 100.0);
    j["steps"] = std::move(steps);
    j["step"] = r.step + 1;
    j["step_seconds"] = r.plan.step_s;
    j["step_elapsed_seconds"] = r.step_elapsed_s;
    j["step_requests"] = r.step_requests;
    j["step_requests_needed"] = r.step_requests_needed;
    j["cusum"] = Json{{"error_rate", r.cusum_error}, {"ttft_p99", r.cusum_ttft}, {"tpot_p99", r.cusum_tpot},
                      {"shadow_kl", r.cusum_kl}};
    if (r.shadow) {
      j["shadow"] = Json{{"scored", r.shadow_scored}, {"kl_mean", r.shadow_kl_mean}, {"top1_mean", r.shadow_top1_mean}};
    }
    j["threshold"] = r.threshold;
    rollouts.push_back(std::move(j));
  }
  Json loads = Json::array();
  for (const ModelLoad& l : core.model_loads()) {
    Json j = Json::object();
    j["id"] = l.id;
    j["path"] = l.path;
    j["state"] = l.state;
    if (!l.error.empty()) j["error"] = l.error;
    if (l.state != "loading") j["seconds"] = l.seconds;
    loads.push_back(std::move(j));
  }
  Json out = Json::object();
  out["models"] = std::move(models);
  out["rollouts"] = std::move(rollouts);
  out["loads"] = std::move(loads);
  return HttpResponse::json(200, dump_json(out));
}

HttpResponse error_response(int status, const std::string& message, const std::string& code) {
  ApiError e = bad_request(message, "", code);
  e.status = status;
  return HttpResponse::error(e);
}

}  // namespace

bool is_admin_path(const std::string& path) {
  return path == "/admin" || path.rfind("/admin/", 0) == 0;
}

HttpResponse admin_response(const RequestHead& head, ServerCore& core) {
  const std::string& key = core.config().admin_key;
  const std::string path = head.target.substr(0, head.target.find('?'));
  if (key.empty()) {
    return HttpResponse::error(not_found_error("no route for " + head.method + " " + sanitize_utf8(path.substr(0, 128)),
                                               "", "unknown_route"));
  }
  constexpr std::string_view kBearer = "Bearer ";
  const bool authorized = head.authorization.size() > kBearer.size() &&
                          head.authorization.compare(0, kBearer.size(), kBearer) == 0 &&
                          constant_time_equal(std::string_view(head.authorization).substr(kBearer.size()), key);
  if (!authorized) {
    ApiError e;
    e.status = 401;
    e.message = "the admin API needs the admin key as `Authorization: Bearer <key>`";
    e.code = "invalid_admin_key";
    return HttpResponse::error(e);
  }
  if (!core.loaded()) return HttpResponse::error(unavailable_error("the models are loading", "model_loading", 2));
  gateway::FrontDoor& door = core.front_door();
  if (path == kPrefix) {
    if (head.method != "GET" && head.method != "HEAD") return error_response(405, "GET only", "method_not_allowed");
    return state_json(core);
  }
  if (path.rfind(std::string(kPrefix) + "/", 0) != 0) {
    return error_response(404, "no admin route " + sanitize_utf8(path.substr(0, 128)), "unknown_route");
  }
  // /admin/models/{name}/{action}; the name may hold '/', the action is the last segment.
  const std::string rest = path.substr(kPrefix.size() + 1);
  const size_t slash = rest.rfind('/');
  if (slash == std::string::npos || slash == 0) {
    return error_response(404, "write /admin/models/{name}/{split|promote|rollback|drain|rollout|swap|load|unload}",
                          "unknown_route");
  }
  const std::string name = percent_decode(rest.substr(0, slash));
  const std::string action = rest.substr(slash + 1);
  if (action != "split" && action != "promote" && action != "rollback" && action != "rollout" && action != "load" &&
      action != "unload" && action != "drain" && action != "swap") {
    return error_response(404, "unknown admin action '" + sanitize_utf8(action.substr(0, 64)) + "'", "unknown_route");
  }
  if (head.method != "POST") return error_response(405, "POST only", "method_not_allowed");
  const auto q = query_of(head.target);
  const auto variant = q.find("variant");
  const std::string v = variant == q.end() ? "" : variant->second;
  gateway::VariantGuard& guard = door.guard();
  Status st;
  if (action == "load" || action == "unload") {
    // v may be empty: the primary (unload) or a new name (load).
    if (action == "unload") {
      st = door.remove_model(name, v);
      if (st.ok()) METRO_LOG_INFO("admin: %s%s%s unloaded; its requests in flight finish on it", name.c_str(),
                                  v.empty() ? "" : "@", v.c_str());
    } else {
      const auto file = q.find("path");
      if (file == q.end() || file->second.empty()) {
        return error_response(400, "give the file: &path=FILE", "missing_path");
      }
      bool named = false, taken = false;
      for (const auto& m : door.models().all()) {
        named = named || m->answers_to(name);
        taken = taken || (m->name == name && m->variant == v);
      }
      if (taken) {
        st = invalid_argument("'" + name + (v.empty() ? "" : "@" + v) + "' is served already");
      } else if (!v.empty() && !named) {
        st = invalid_argument("a variant of '" + name + "' needs '" + name + "' itself served");
      } else {
        st = core.start_model_load(name, v, file->second);
        if (st.ok()) {
          HttpResponse r = state_json(core);
          r.status = 202;  // loading: GET /admin/models says when it is done
          return r;
        }
      }
    }
  } else if (v.empty()) {
    return error_response(400, "name the variant: ?variant=NAME", "missing_variant");
  } else if (action == "split" || action == "promote") {
    std::optional<double> share = percent_param(q, "share");
    if (action == "split" && !share) return error_response(400, "give the share: &share=PERCENT", "missing_share");
    if (share && *share < 0) return error_response(400, "share is a percent from 0 to 100", "invalid_share");
    st = action == "split" ? door.set_split(name, v, *share) : guard.promote(name, v, share.value_or(1.0));
  } else if (action == "rollback") {
    st = guard.roll_back(name, v, "manual");
  } else if (action == "drain") {
    st = guard.drain(name, v);
  } else if (action == "swap") {
    st = guard.swap(name, v);
  } else {
    const auto steps = q.find("steps");
    const auto step = q.find("step");
    if (steps == q.end() || step == q.end()) {
      return error_response(400, "give the steps and their time: &steps=5,25,100&step=10m", "missing_steps");
    }
    const auto parsed = gateway::parse_rollout(name + ":" + v + "=" + steps->second + "@" + step->second);
    if (!parsed.ok()) return error_response(400, parsed.status().message(), "invalid_rollout");
    st = guard.start_rollout(*parsed);
  }
  if (!st.ok()) return error_response(400, st.message(), "invalid_admin_request");
  return state_json(core);
}

}  // namespace metro::server
