// Grammars for JSON output: any JSON object (OpenAI's `json_object` mode), a JSON schema
// (`json_schema` mode), or one of a list of strings. Whatever a schema asks that the grammar
// cannot guarantee is refused, naming the keyword and where it is, never ignored: an output
// the grammar allows always validates against the schema.
//
// Supported: type (one or a list), properties (generated in the order given; required ones
// always, optional ones may be left out), required, additionalProperties (with properties,
// none are generated, which every value of additionalProperties allows; without them, a map
// whose values follow it), items, minItems, maxItems, enum, const, anyOf, oneOf (as anyOf:
// the alternatives should not overlap), allOf of one schema, $ref to #, #/$defs/NAME or
// #/definitions/NAME (recursion allowed), string minLength / maxLength, format date, time,
// date-time, uuid, and pattern (a regular expression, grammar/regex.h; unanchored unless it
// says ^ and $, as JSON Schema means it); integer minimum 0 or 1. Annotations (title, description, default,
// examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored.
// Whitespace between tokens: none, one space, or a newline and up to 16 spaces or tabs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"

namespace metro::grammar {

// Any JSON object (nested values of any type).
Grammar json_object_grammar();
// Any JSON value.
Grammar json_value_grammar();
// JSON satisfying `schema`; an error names the first unsupported keyword and its path.
// Properties are generated in the order the schema lists them, which an ordered_json keeps
// (a plain json sorts them by name).
Expected<Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);
Expected<Grammar> json_schema_grammar(const nlohmann::json& schema);
// Exactly one of `choices` (at least one, none empty).
Expected<Grammar> choice_grammar(const std::vector<std::string>& choices);

}  // namespace metro::grammar
