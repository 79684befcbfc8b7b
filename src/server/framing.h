// What Beast's parser lets through but a server must refuse (RFC 9112): a request whose
// framing it cannot be sure of would let the bytes after its header be read as another
// request (smuggling past a proxy that framed it differently), so the connection closes.
//   Transfer-Encoding: metro decodes chunked alone. A list whose last coding is not
//   chunked leaves the body's length unknown: 400. Another coding before chunked (gzip,
//   identity, a repeated chunked): 501. Not allowed at all in HTTP/1.0: 400.
//   Host: exactly one in HTTP/1.1: 400 otherwise.
#pragma once

#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <optional>

#include "server/api_error.h"

namespace metro::server {

// The refusal for a request header, or nullopt when its framing is sound.
std::optional<ApiError> check_framing(const boost::beast::http::request_header<>& h);

}  // namespace metro::server
