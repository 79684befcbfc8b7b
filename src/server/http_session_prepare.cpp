// HttpSession's preparation of a model request, on a prep thread (off the connection's
// strand): parse, pick the model and variant, validate, tokenize, then the front door decides.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/feedback.h"
#include "server/guarded_pick.h"
#include "server/http_session.h"
#include "server/teacher_capture.h"

namespace metro::server {

// The error a refusal of the gateway is answered with.
ApiError HttpSession::refusal_error(const gateway::Decision& d) {
  ApiError e;
  if (d.http_status == 400) {  // can never be admitted as it is: the client must change it
    e = bad_request(d.message, "", d.reason);
  } else {
    e.status = d.http_status == 429 ? 429 : 503;
    e.type = d.http_status == 429 ? "rate_limit_error" : "server_error";
    e.code = d.reason.empty() ? (d.http_status == 429 ? "rate_limit_exceeded" : "overloaded") : d.reason;
    e.message = d.message.empty() ? "the server cannot take this request now" : d.message;
    e.retry_after_seconds = std::max(1, static_cast<int>(d.retry_after_s));
  }
  return e;
}

// On a prep thread: parse, pick the model, validate, tokenize, then the front door decides.
HttpSession::Prepared HttpSession::prepare_on_worker(Endpoint endpoint, std::string_view body,
                                                     const CallContext& call,
                                                     std::shared_ptr<gateway::TenantSlot> slot) {
  Prepared p;
  gateway::FrontDoor& door = core_.front_door();
  auto json = parse_body(body);
  if (!json.ok()) {
    p.result = json.error();
    return p;
  }
  if (endpoint == Endpoint::kFeedback) {
    auto answer = feedback_response(*json, call.tenant, door.guard());
    if (!answer.ok()) {
      p.result = answer.error();
    } else {
      p.direct = HttpResponse::json(200, std::move(*answer));
    }
    return p;
  }
  auto name = requested_model(*json);
  if (!name.ok()) {
    p.result = name.error();
    return p;
  }
  // A split sends the same user (the body's `user`, else the API key's tenant) to the same
  // variant every time.
  std::string sticky = call.tenant;
  if (auto u = json->find("user"); u != json->end() && u->is_string() && !u->get<std::string>().empty()) {
    sticky = "user:" + u->get<std::string>();
  }
  p.model = door.resolve(*name, sticky);
  if (p.model) {
    // The variants' breakers and injected faults.
    GuardedPick g = guarded_pick(door, std::move(p.model));
    p.model = std::move(g.model);
    p.injected = g.injected;
    p.delay_s = g.delay_s;
    if (g.error) {
      p.result = std::move(*g.error);
      return p;
    }
  }
  if (!p.model) {
    std::vector<std::string> served;
    for (const auto& m : door.models().all()) {
      if (!m->variant.empty()) continue;
      for (const std::string& n : m->names()) served.push_back(n);
    }
    p.result = detail::unknown_model_error(*name, served);
    return p;
  }
  PromptContext ctx = prompt_context(*p.model, core_.config().limits);
  ctx.responses = &core_.responses();
  std::optional<nlohmann::ordered_json> ordered;
  if (needs_key_order(endpoint, body)) {
    ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (ordered->is_object()) ctx.ordered_body = &*ordered;
  }
  if (endpoint == Endpoint::kTokenize || endpoint == Endpoint::kDetokenize) {
    auto answer = endpoint == Endpoint::kTokenize ? tokenize_response(*json, ctx) : detokenize_response(*json, ctx);
    if (!answer.ok()) {
      p.result = answer.error();
    } else {
      p.direct = HttpResponse::json(200, std::move(*answer));
    }
    return p;
  }
  p.result = prepare_parsed_request(endpoint, *json, ctx, call);
  if (!p.result.ok()) return p;
  PreparedCall& pc = *p.result;
  if (std::optional<ApiError> err = look_up_semantic_cache(endpoint, *json, pc, call, p)) {
    p.result = std::move(*err);
    return p;
  }
  const bool cached_answer = p.cache && p.cache->found.hit && !p.cache->found.verify;
  if (TeacherCapture* cap = core_.config().teacher_capture.get();
      cap && !cached_answer && !pc.requests.empty() && pc.requests.front().kind == engine::RequestKind::kGenerate &&
      cap->sample(call.tenant)) {
    // The engine reports the alternatives the dataset needs; the response keeps to what the
    // client asked for (ResponseFormatter).
    for (engine::Request& rq : pc.requests) {
      rq.sampling.logprobs = true;
      rq.sampling.top_logprobs = std::max(rq.sampling.top_logprobs, cap->top_k());
    }
    p.capture = true;
  }
  gateway::CallRequest r;
  r.model = p.model;
  r.tenant = call.tenant;
  r.prompt_tokens = pc.prompt_tokens;
  r.n_choices = static_cast<int>(pc.requests.size()) * std::max(1, pc.spec.n);
  if (!pc.requests.empty()) {
    r.sla_class = pc.requests.front().sla_class;
    r.deadline_ns = pc.requests.front().deadline_ns;
    r.max_tokens = pc.requests.front().stop.max_tokens;
  }
  r.requests = pc.requests;
  r.slot = std::move(slot);
  r.cached_answer = cached_answer;
  gateway::Decision d = door.admit(r);
  if (!d.admit) {
    p.result = refusal_error(d);
    return p;
  }
  p.admitted = std::move(d.call);
  return p;
}

}  // namespace metro::server
