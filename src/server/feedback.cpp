#include "server/feedback.h"

#include "server/json_util.h"

namespace metro::server {

ApiResult<std::string> feedback_response(const nlohmann::json& body, const std::string& tenant,
                                         gateway::VariantGuard& guard) {
  if (!body.is_object()) return bad_request("the body must be a JSON object");
  auto id = body.find("id");
  if (id == body.end() || !id->is_string() || id->get_ref<const std::string&>().empty() ||
      id->get_ref<const std::string&>().size() > 256) {
    return bad_request("`id` must be the id of an answer (a string of 1 to 256 characters)", "id");
  }
  auto rating = body.find("rating");
  bool good = false;
  if (rating != body.end() && rating->is_number_integer() && (*rating == 1 || *rating == -1)) {
    good = *rating == 1;
  } else if (rating != body.end() && rating->is_string() && (*rating == "good" || *rating == "bad")) {
    good = *rating == "good";
  } else {
    return bad_request("`rating` must be 1 or -1 (or \"good\" or \"bad\")", "rating");
  }
  for (const auto& [key, value] : body.items()) {
    if (key != "id" && key != "rating" && key != "comment") {
      const std::string name = sanitize_utf8(key.substr(0, 64));
      return bad_request("unknown field `" + name + "`", name);
    }
  }
  const std::string& answer = id->get_ref<const std::string&>();
  if (!guard.feedback(answer, tenant, good)) {
    return not_found_error("no answer with id '" + sanitize_utf8(answer) +
                               "' to rate (unknown, another key's, or older than the last 65536 answers)",
                           "id", "answer_not_found");
  }
  Json out = Json::object();
  out["object"] = "feedback";
  out["id"] = answer;
  out["rating"] = good ? "good" : "bad";
  return dump_json(out);
}

}  // namespace metro::server
