#include "server/routes.h"

#include <algorithm>
#include <cctype>

#include "server/admin_routes.h"
#include "server/json_util.h"
#include "server/web_ui.h"

namespace metro::server {

HttpResponse HttpResponse::json(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpResponse HttpResponse::error(const ApiError& e) {
  HttpResponse r = json(e.status, e.body());
  if (e.retry_after_seconds > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_seconds));
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

namespace {

ApiError method_not_allowed(const std::string& allow) {
  ApiError e = bad_request("this endpoint accepts " + allow + " only", "", "method_not_allowed");
  e.status = 405;
  return e;
}

HttpResponse not_allowed(const std::string& allow) {
  HttpResponse r = HttpResponse::error(method_not_allowed(allow));
  r.headers.emplace_back("Allow", allow);
  return r;
}

bool is_json_content_type(std::string ct) {
  std::transform(ct.begin(), ct.end(), ct.begin(), [](unsigned char c) { return std::tolower(c); });
  const size_t semi = ct.find(';');
  std::string base = ct.substr(0, semi);
  while (!base.empty() && base.back() == ' ') base.pop_back();
  while (!base.empty() && base.front() == ' ') base.erase(0, 1);
  return base == "application/json";
}

// A served model as /v1/models lists it, under one of its names.
Json model_json(const gateway::ServedModel& m, const std::string& id) {
  Json data = Json::object();
  data["id"] = id;
  data["object"] = "model";
  data["created"] = m.created_unix_s;
  data["owned_by"] = "metro";
  data["max_model_len"] = m.engine->n_ctx();
  return data;
}

// Every served name once (variants of a name are one model to clients; each alias of a
// model is an entry of its own, as clients look names up in this list).
HttpResponse models_list(const gateway::ModelRegistry& registry) {
  Json list = Json::array();
  for (const auto& m : registry.all()) {
    if (!m->variant.empty()) continue;
    for (const std::string& n : m->names()) list.push_back(model_json(*m, n));
  }
  Json j = Json::object();
  j["object"] = "list";
  j["data"] = std::move(list);
  return HttpResponse::json(200, dump_json(j));
}

// GET /v1/models/{id}: one served name, as listed.
HttpResponse model_one(const gateway::ModelRegistry& registry, const std::string& id) {
  auto m = registry.find(id);
  if (!m || !m->variant.empty()) {
    return HttpResponse::error(not_found_error(
        "The model '" + sanitize_utf8(id.substr(0, 128)) + "' does not exist", "model", "model_not_found"));
  }
  return HttpResponse::json(200, dump_json(model_json(*m, id)));
}

// GET or DELETE /v1/responses/{id}: a stored response of the caller's tenant.
HttpResponse stored_response(ResponseStore& store, const std::string& tenant, const std::string& id, bool get) {
  const auto missing = [&] {
    return HttpResponse::error(not_found_error(
        "Response with id '" + sanitize_utf8(id.substr(0, 128)) + "' not found.", "response_id", "response_not_found"));
  };
  if (get) {
    auto e = store.get(tenant, id);
    if (!e) return missing();
    return HttpResponse::json(200, e->response_json);
  }
  if (!store.erase(tenant, id)) return missing();
  Json j = Json::object();
  j["id"] = id;
  j["object"] = "response.deleted";
  j["deleted"] = true;
  return HttpResponse::json(200, dump_json(j));
}

}  // namespace

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

RouteDecision route_request(const RequestHead& head, ServerCore& core) {
  RouteDecision d;
  const std::string path = head.target.substr(0, head.target.find('?'));
  d.endpoint = path;
  const bool get = head.method == "GET" || head.method == "HEAD";
  const bool post = head.method == "POST";

  if (const WebAsset* asset = find_web_asset(path)) {
    d.endpoint = path == "/" || path == "/index.html" ? "/" : "/ui";  // one label for the page's files
    if (!get) {
      d.response = not_allowed("GET");
      return d;
    }
    d.response = web_asset_response(*asset, head.if_none_match);
    return d;
  }
  if (path == "/health") {
    if (!get) {
      d.response = not_allowed("GET");
      return d;
    }
    d.response = HttpResponse::json(200, R"({"status":"ok"})");
    return d;
  }
  if (path == "/ready") {
    if (!get) {
      d.response = not_allowed("GET");
      return d;
    }
    if (core.draining()) {
      d.response = HttpResponse::error(unavailable_error("the server is shutting down", "server_draining"));
    } else if (!core.loaded()) {
      d.response = HttpResponse::error(unavailable_error("the model is loading", "model_loading"));
    } else {
      d.response = HttpResponse::json(200, R"({"status":"ready"})");
    }
    return d;
  }
  if (path == "/metrics") {
    if (!get) {
      d.response = not_allowed("GET");
      return d;
    }
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = core.front_door().metrics().render();
    d.response = std::move(r);
    return d;
  }

  if (is_admin_path(path)) {
    // Behind the admin key, not the API keys.
    d.endpoint = "/admin";
    d.response = admin_response(head, core);
    return d;
  }

  // Every route below is behind the keys: a caller without one learns nothing, not even
  // which routes exist (401 before 404 or 405).
  const ApiKeys& keys = core.config().api_keys;
  if (keys.enabled()) {
    auto tenant = keys.authenticate(head.authorization);
    if (!tenant) {
      ApiError e;
      e.status = 401;
      e.message = head.authorization.empty()
                      ? "You didn't provide an API key. Send it as `Authorization: Bearer <key>`."
                      : "Incorrect API key provided.";
      e.code = "invalid_api_key";
      if (path != "/v1/completions" && path != "/v1/chat/completions" && path != "/v1/embeddings" &&
          path != "/v1/models" && path.rfind("/v1/models/", 0) != 0 && path != "/tokenize" && path != "/detokenize" &&
          path != "/v1/responses" && path.rfind("/v1/responses/", 0) != 0 && path != "/v1/feedback") {
        d.endpoint = "other";  // unknown routes share one label
      }
      d.response = HttpResponse::error(e);
      return d;
    }
    d.call.tenant = *tenant;
    if (const TenantSettings* ts = keys.tenant_settings(*tenant)) d.call.default_class = ts->default_class;
  }
  std::optional<Endpoint> endpoint;
  if (path == "/v1/completions")
    endpoint = Endpoint::kCompletions;
  else if (path == "/v1/chat/completions")
    endpoint = Endpoint::kChatCompletions;
  else if (path == "/v1/embeddings")
    endpoint = Endpoint::kEmbeddings;
  else if (path == "/tokenize")
    endpoint = Endpoint::kTokenize;
  else if (path == "/detokenize")
    endpoint = Endpoint::kDetokenize;
  else if (path == "/v1/responses")
    endpoint = Endpoint::kResponses;
  else if (path == "/v1/feedback")
    endpoint = Endpoint::kFeedback;
  const bool models = path == "/v1/models";
  // The id may hold '/' (names such as "org/model"): everything after the prefix.
  const bool one_model = path.rfind("/v1/models/", 0) == 0 && path.size() > 11;
  const bool one_response = path.rfind("/v1/responses/", 0) == 0 && path.size() > 14;
  if (!endpoint && !models && !one_model && !one_response) {
    d.endpoint = "other";
    d.response = HttpResponse::error(
        not_found_error("no route for " + head.method + " " + sanitize_utf8(path.substr(0, 128)), "", "unknown_route"));
    return d;
  }
  if ((models || one_model) && !get) {
    d.response = not_allowed("GET");
    return d;
  }
  if (endpoint && !post) {
    d.response = not_allowed("POST");
    return d;
  }
  if (one_response) {
    // Answered from the store: no model, loaded or not, is needed.
    d.endpoint = "/v1/responses/{id}";  // one metrics label for every id
    if (!get && head.method != "DELETE") {
      d.response = not_allowed("GET, DELETE");
      return d;
    }
    d.response = stored_response(core.responses(), d.call.tenant, percent_decode(path.substr(14)), get);
    return d;
  }

  if (core.draining()) {
    d.response = HttpResponse::error(unavailable_error("the server is shutting down", "server_draining"));
    return d;
  }
  if (!core.loaded()) {
    d.response = HttpResponse::error(unavailable_error("the model is loading; retry shortly", "model_loading", 2));
    return d;
  }
  if (models) {
    d.response = models_list(core.front_door().models());
    return d;
  }
  if (one_model) {
    d.endpoint = "/v1/models/{id}";  // one metrics label for every id
    d.response = model_one(core.front_door().models(), percent_decode(path.substr(11)));
    return d;
  }
  if (!is_json_content_type(head.content_type)) {
    d.response = HttpResponse::error(bad_request("Content-Type must be application/json", "", "invalid_content_type"));
    return d;
  }
  d.call.class_header = head.metro_class;
  d.call.deadline_header = head.metro_deadline_ms;
  d.model_call = endpoint;
  return d;
}

}  // namespace metro::server
