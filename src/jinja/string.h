// Python `str` semantics over UTF-8 bytes, as Jinja templates see them.
//
// Python indexes strings by code point, so len(), subscripts and slices here count code
// points. Bytes that are not valid UTF-8 count as one code point each (no input is
// rejected here). Case mapping (upper/lower/title/capitalize) covers ASCII letters only;
// other characters pass through unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace metro::jinja {

bool is_ascii(std::string_view s);
bool is_valid_utf8(std::string_view s);
// Decodes the code point at s[i] (i < s.size()); *len receives its byte length. An invalid
// byte decodes as itself with length 1.
uint32_t decode_utf8(std::string_view s, size_t i, size_t* len);
void append_utf8(std::string& out, uint32_t cp);
size_t code_point_count(std::string_view s);
// Byte offsets of each code point's start, plus s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s);

// Python's str.isspace() for one code point (also what `\s` matches in Jinja's lexer).
bool is_py_space(uint32_t cp);

enum class StripSide : uint8_t { kLeft, kRight, kBoth };
// str.strip/lstrip/rstrip: `chars` unset strips whitespace, else any code point in chars.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, StripSide side);
// str.split(sep, maxsplit) / str.rsplit: sep unset splits on runs of whitespace.
// An empty sep is a ValueError (thrown as jinja::Error).
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right);
std::vector<std::string> py_splitlines(std::string_view s);
// str.replace(old, new, count); count < 0 replaces all. `max_bytes` bounds the result.
std::string py_replace(std::string_view s, std::string_view from, std::string_view to,
                       int64_t count, size_t max_bytes);
// Code-point index of the first `sub` in s, or -1.
int64_t py_find(std::string_view s, std::string_view sub);
int64_t py_count(std::string_view s, std::string_view sub);

std::string ascii_upper(std::string_view s);
std::string ascii_lower(std::string_view s);
std::string py_capitalize(std::string_view s);   // str.capitalize and Jinja's capitalize
std::string py_title(std::string_view s);        // str.title()
std::string jinja_title(std::string_view s);     // Jinja's `title` filter (splits on -,space,([{<)

// repr() of a float: shortest round-trip digits, exponent form outside [1e-4, 1e16),
// "inf", "-inf", "nan".
std::string py_float_repr(double v);
// repr() of a str: quoted with ' unless the text holds ' and no ", escapes as Python does.
void append_py_repr_string(std::string& out, std::string_view s);

// Python's int(str, base): optional sign, whitespace around, underscores between digits,
// base prefixes when base is 0 or matches. nullopt when the text is not an integer or
// does not fit in 64 bits.
std::optional<int64_t> parse_py_int(std::string_view s, int base);
// Python's float(str): decimal/exponent forms, inf, nan, surrounding whitespace.
std::optional<double> parse_py_float(std::string_view s);

}  // namespace metro::jinja
