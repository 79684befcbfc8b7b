#include "server/api_error.h"

#include "server/json_util.h"

namespace metro::server {

std::string ApiError::body() const {
  Json err = Json::object();
  err["message"] = message;
  err["type"] = type;
  err["param"] = param.empty() ? Json(nullptr) : Json(param);
  err["code"] = code.empty() ? Json(nullptr) : Json(code);
  Json root = Json::object();
  root["error"] = std::move(err);
  return dump_json(root);
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError not_found_error(std::string message, std::string param, std::string code) {
  ApiError e = bad_request(std::move(message), std::move(param), std::move(code));
  e.status = 404;
  return e;
}

ApiError forbidden_error(std::string message, std::string param, std::string code) {
  ApiError e = bad_request(std::move(message), std::move(param), std::move(code));
  e.status = 403;
  e.type = "permission_error";
  return e;
}

ApiError unavailable_error(std::string message, std::string code, int retry_after_seconds) {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.message = std::move(message);
  e.code = std::move(code);
  e.retry_after_seconds = retry_after_seconds;
  return e;
}

ApiError error_from_status(const Status& s, const std::string& param) {
  switch (s.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kUnimplemented:
      return bad_request(s.message(), param);
    case ErrorCode::kOutOfRange:
      return bad_request(s.message(), param.empty() ? "messages" : param, "context_length_exceeded");
    case ErrorCode::kUnavailable:
      return unavailable_error(s.message(), "unavailable");
    case ErrorCode::kResourceExhausted:
      return unavailable_error(s.message(), "overloaded");
    default: {
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = "internal error: " + s.message();
      e.code = "internal_error";
      return e;
    }
  }
}

const char* http_reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

}  // namespace metro::server
