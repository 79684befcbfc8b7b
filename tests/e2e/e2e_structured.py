"""Structured outputs end to end: `response_format` json_schema over a corpus of schemas
(every finished output parses and validates with the `jsonschema` package, sampled and
greedy, streamed and not), json_object, `metro.choice`, the openai SDK's own `parse` with a
pydantic model, and schemas the server cannot guarantee refused with a 400 naming the
keyword."""

import json
import re

import jsonschema
import pydantic

from e2e_util import check_error, env_int, request

# Shapes of real tool and extraction schemas, and of the JSON-Schema test suite's keywords.
SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]},
    {"type": "object", "properties": {"score": {"type": "number"}, "label": {"const": "review"}},
     "required": ["label", "score"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "date-time"},
    {"type": "object", "properties": {"query": {"type": "string", "maxLength": 30},
                                      "limit": {"type": "integer", "minimum": 1},
                                      "filters": {"type": "object", "properties": {
                                          "lang": {"enum": ["en", "fr", "de"]},
                                          "after": {"type": "string", "format": "date"}}}},
     "required": ["query"]},
    {"type": "object", "properties": {"steps": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"n": {"type": "integer"}, "text": {"type": "string", "maxLength": 16}},
        "required": ["n", "text"]}}}, "required": ["steps"]},
    {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"error": {"type": "string", "maxLength": 20}},
                                     "required": ["error"]}]},
    {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
    {"type": ["string", "null"], "maxLength": 10},
    {"$defs": {"leaf": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0}}, "required": ["id"]}},
     "type": "object", "properties": {"first": {"$ref": "#/$defs/leaf"}, "second": {"$ref": "#/$defs/leaf"}},
     "required": ["first", "second"]},
    {"definitions": {"tree": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/definitions/tree"}}},
        "required": ["v", "kids"]}}, "$ref": "#/definitions/tree"},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 40},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
                                      "priority": {"enum": [1, 2, 3]}, "done": {"type": "boolean"}},
     "required": ["title", "priority", "done"]},
    {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat", "lon"],
     "title": "Point", "description": "A place on Earth"},
    {"type": "integer", "minimum": 1},
    {"type": "object", "properties": {"function": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"location": {"type": "string", "maxLength": 30}}, "required": ["location"]}},
     "required": ["function", "arguments"]},
    {"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{3}$"},
                                      "phone": {"type": "string", "pattern": "^\\+?\\d{2,3} \\d{4}$"}},
     "required": ["code", "phone"]},
    {"type": "string", "pattern": "^(red|green|blue)( and (red|green|blue))?$"},
    {"type": "array", "maxItems": 3, "items": {"type": "string", "pattern": "^[a-z]{2,8}(-[a-z]{2,8})?$"}},
    # Shapes of published tool definitions (search, calendars, shops, code tools, ...).
    {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40},
                                      "num_results": {"type": "integer", "minimum": 1}},
     "required": ["query"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
                                      "start": {"type": "string", "format": "date-time"},
                                      "attendees": {"type": "array", "maxItems": 3,
                                                    "items": {"type": "string", "maxLength": 20}}},
     "required": ["title", "start"]},
    {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^ORD-\\d{6}$"},
                                      "reason": {"enum": ["damaged", "late", "wrong_item", "other"]}},
     "required": ["order_id", "reason"], "additionalProperties": False},
    {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40},
                                      "content": {"type": "string", "maxLength": 60},
                                      "overwrite": {"type": "boolean"}},
     "required": ["path", "content"]},
    {"type": "object", "properties": {"sql": {"type": "string", "maxLength": 80},
                                      "params": {"type": "array", "maxItems": 4,
                                                 "items": {"type": ["string", "number", "null"], "maxLength": 12}}},
     "required": ["sql"]},
    {"type": "object", "properties": {"to": {"type": "array", "minItems": 1, "maxItems": 2,
                                             "items": {"type": "string", "maxLength": 30}},
                                      "subject": {"type": "string", "maxLength": 40},
                                      "body": {"type": "string", "maxLength": 80}},
     "required": ["to", "subject", "body"]},
    {"type": "object", "properties": {"amount": {"type": "number"}, "from": {"enum": ["USD", "EUR", "JPY"]},
                                      "to": {"enum": ["USD", "EUR", "JPY"]}},
     "required": ["amount", "from", "to"]},
    {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"},
                                      "radius_km": {"type": "integer", "minimum": 1},
                                      "category": {"anyOf": [{"enum": ["food", "fuel", "hotel"]}, {"type": "null"}]}},
     "required": ["lat", "lon"]},
    {"type": "object", "properties": {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"},
                                      "range": {"enum": ["1d", "5d", "1m", "1y"]}},
     "required": ["ticker"]},
    {"type": "object", "properties": {"command": {"type": "string", "maxLength": 40},
                                      "timeout_s": {"type": "integer", "minimum": 1},
                                      "env": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 10}}},
     "required": ["command"]},
    # Extraction records.
    {"type": "object", "properties": {"invoice": {"type": "string", "maxLength": 16},
                                      "date": {"type": "string", "format": "date"},
                                      "lines": {"type": "array", "maxItems": 3, "items": {
                                          "type": "object", "properties": {"item": {"type": "string", "maxLength": 16},
                                                                           "qty": {"type": "integer", "minimum": 1},
                                                                           "price": {"type": "number"}},
                                          "required": ["item", "qty", "price"]}},
                                      "total": {"type": "number"}},
     "required": ["invoice", "lines", "total"]},
    {"type": "object", "properties": {"sentiment": {"enum": ["positive", "neutral", "negative"]},
                                      "confidence": {"type": "number"},
                                      "aspects": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 16}}},
     "required": ["sentiment", "confidence"]},
    {"type": "object", "properties": {"people": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                         "role": {"type": ["string", "null"], "maxLength": 16}},
        "required": ["name"]}}}, "required": ["people"]},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                      "created": {"type": "string", "format": "date-time"},
                                      "status": {"const": "open"}},
     "required": ["id", "status"]},
    {"type": "object", "properties": {"question": {"type": "string", "maxLength": 50},
                                      "options": {"type": "array", "minItems": 2, "maxItems": 4,
                                                  "items": {"type": "string", "maxLength": 12}},
                                      "answer_index": {"type": "integer", "minimum": 0}},
     "required": ["question", "options", "answer_index"]},
    # JSON-Schema test suite shapes.
    {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}, "maxItems": 2},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "boolean"}}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "number"}, {"type": "boolean"}]},
    {"enum": [1, "one", None, True, {"x": 1}, [1, 2]]},
    {"const": {"fixed": [1, "two", None]}},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "array", "minItems": 2, "maxItems": 2, "items": {"enum": ["left", "right"]}},
]

PROMPT = "Reply with JSON for a weather lookup, a person or a list, as the format asks."


def _chat(t, body, stream=False):
    b = {"model": t.model_name, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 160}
    b.update(body)
    if stream:
        b["stream"] = True
    st, _, data = request(t.port, "POST", "/v1/chat/completions", b, t.auth, timeout=300)
    return st, data


def _text_and_finish(data, stream):
    """The first choice's text and finish reason, from a stream or a body."""
    if stream:
        return _stream_text(data)
    c = json.loads(data)["choices"][0]
    return c["message"]["content"], c["finish_reason"]


def _stream_text(data):
    text, finish = "", None
    for line in data.decode().split("\n\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        j = json.loads(line[6:])
        for ch in j.get("choices", []):
            text += ch["delta"].get("content") or ""
            finish = ch.get("finish_reason") or finish
    return text, finish


def t_structured_json_schema_corpus(t):
    stops = lengths = 0
    runs = env_int("METRO_E2E_STRUCTURED_RUNS", 2)
    for i, schema in enumerate(SCHEMAS):
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        for run in range(runs):
            sampled = {"temperature": 0.8, "seed": 1000 * i + run} if run else {"temperature": 0}
            st, data = _chat(t, dict(sampled, response_format=fmt), stream=run % 2 == 1)
            assert st == 200, (i, data[:300])
            text, finish = _text_and_finish(data, stream=run % 2 == 1)
            if finish == "length":  # cut by max_tokens: a prefix of a valid text
                lengths += 1
                continue
            assert finish == "stop", (i, finish, text)
            stops += 1
            try:
                value = json.loads(text)
                jsonschema.validate(value, schema)
            except Exception as e:  # noqa: BLE001 - report the schema and the text
                raise AssertionError(f"schema {i} {json.dumps(schema)}: output {text!r}: {e}") from e
    total = stops + lengths
    assert stops >= 0.75 * total, (stops, lengths)
    t.note(f"structured outputs: {stops} of {total} outputs over {len(SCHEMAS)} schemas finished and validated "
           f"(jsonschema), {lengths} cut by max_tokens")


def t_structured_json_object_and_choice(t):
    st, data = _chat(t, {"response_format": {"type": "json_object"}, "temperature": 0, "max_tokens": 200})
    assert st == 200, data[:300]
    c = json.loads(data)["choices"][0]
    if c["finish_reason"] == "stop":
        assert isinstance(json.loads(c["message"]["content"]), dict), c
    choices = ["red", "green", "blue"]
    for seed in range(4):
        st, data = _chat(t, {"metro": {"choice": choices}, "temperature": 1.0, "seed": seed})
        assert st == 200, data[:300]
        c = json.loads(data)["choices"][0]
        assert c["message"]["content"] in choices and c["finish_reason"] == "stop", c
    # On completions too.
    st, _, data = request(t.port, "POST", "/v1/completions", {
        "model": t.model_name, "prompt": "The best colour is", "max_tokens": 8, "metro": {"choice": choices}}, t.auth)
    assert st == 200 and json.loads(data)["choices"][0]["text"] in choices, data[:300]
    # text is free text, as before.
    st, data = _chat(t, {"response_format": {"type": "text"}, "max_tokens": 4})
    assert st == 200, data[:300]


def t_structured_regex(t):
    """metro.regex: every finished output matches the expression whole (Python's `re`)."""
    patterns = [r"\d{3}-\d{4}", r"(yes|no), because [a-z ]{1,40}\.", r"[A-Z][a-z]{1,12} is \d{1,3} years old",
                r"[^\n]{0,20}!"]
    finished = 0
    for i, pattern in enumerate(patterns):
        for run in range(2):
            sampled = {"temperature": 0.8, "seed": 10 * i + run} if run else {"temperature": 0}
            st, data = _chat(t, dict(sampled, metro={"regex": pattern}, max_tokens=64), stream=run == 1)
            assert st == 200, (pattern, data[:300])
            text, finish = _text_and_finish(data, stream=run == 1)
            if finish == "length":
                continue
            assert finish == "stop", (pattern, finish, text)
            assert re.fullmatch(pattern, text), (pattern, text)
            finished += 1
    assert finished >= len(patterns), finished
    st, data = _chat(t, {"metro": {"regex": "(a)\\1"}})
    err = check_error(st, data, 400, "unsupported_regex")
    assert err["param"] == "metro.regex" and "backreferences" in err["message"], err


def _finished_sentences(t, grammar, same, runs, first_seed):
    """Greedy, then sampled runs (the second streamed) under `grammar`: every finished output
    matches the regular expression `same`; returns how many finished."""
    finished = 0
    for run in range(runs):
        sampled = {"temperature": 1.0, "seed": first_seed + run} if run else {"temperature": 0}
        st, data = _chat(t, dict(sampled, metro={"grammar": grammar}, max_tokens=48), stream=run == 1)
        assert st == 200, data[:300]
        text, finish = _text_and_finish(data, stream=run == 1)
        if finish == "length":
            continue
        assert finish == "stop" and re.fullmatch(same, text), (finish, text)
        finished += 1
    return finished


def t_structured_gbnf(t):
    """metro.grammar (GBNF, then Lark): every finished output is a sentence of the grammar,
    checked with Python's `re` against the same language written as a regular expression."""
    grammar = ('root ::= colour (", " colour){0,3} "."\n'
               'colour ::= "red" | "green" | "blue" | "dark " colour  # recursion\n')
    same = r"((dark )*(red|green|blue))(, (dark )*(red|green|blue)){0,3}\."
    finished = _finished_sentences(t, grammar, same, runs=4, first_seed=0)
    assert finished >= 2, finished
    st, data = _chat(t, {"metro": {"grammar": "root ::= missing\n"}})
    err = check_error(st, data, 400, "unsupported_grammar")
    assert err["param"] == "metro.grammar" and "missing" in err["message"], err

    # The same language as a Lark grammar (left recursion, a bounded repetition, an alias).
    lark = ('start: colour (", " colour) ~ 0..3 "."\n'
            '?colour: "red" | "green" | "blue" -> plain\n'
            '       | "dark " colour  // recursion\n')
    finished = _finished_sentences(t, lark, same, runs=3, first_seed=10)
    assert finished >= 1, finished
    st, data = _chat(t, {"metro": {"grammar": "start: colour\ncolour: colour2\n"}})
    err = check_error(st, data, 400, "unsupported_grammar")
    assert "'colour2' is used but not defined" in err["message"], err


def t_structured_properties_in_schema_order(t):
    """Over HTTP, an object's properties come out in the order the schema lists them (not
    sorted), on chat and on /v1/responses."""
    schema = {"type": "object", "properties": {"zeta": {"type": "string", "maxLength": 8},
                                               "alpha": {"type": "integer"}, "mid": {"type": "boolean"}},
              "required": ["zeta", "alpha", "mid"], "additionalProperties": False}
    st, data = _chat(t, {"temperature": 0, "max_tokens": 60, "response_format": {
        "type": "json_schema", "json_schema": {"name": "o", "schema": schema, "strict": True}}})
    assert st == 200, data[:300]
    text, finish = _text_and_finish(data, stream=False)
    assert finish == "stop", (finish, text)
    assert [k for k, _ in json.loads(text, object_pairs_hook=list)] == ["zeta", "alpha", "mid"], text
    st, _, data = request(t.port, "POST", "/v1/responses", {
        "model": t.model_name, "input": PROMPT, "max_output_tokens": 60, "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "o", "schema": schema, "strict": True}}}, t.auth)
    assert st == 200, data[:300]
    r = json.loads(data)
    assert r["status"] == "completed", r
    out = r["output"][0]["content"][0]["text"]
    assert [k for k, _ in json.loads(out, object_pairs_hook=list)] == ["zeta", "alpha", "mid"], out


def t_structured_sdk_parse_with_pydantic(t):
    class Weather(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=20)
        celsius: int
        sunny: bool

    parse = getattr(t.client.chat.completions, "parse", None) or t.client.beta.chat.completions.parse
    r = parse(model=t.model_name, messages=[{"role": "user", "content": "Weather in Oslo as JSON."}],
              response_format=Weather, max_tokens=120, temperature=0)
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(c.message.parsed, Weather), c.message
        assert len(c.message.parsed.city) <= 20


def t_structured_refusals(t):
    cases = [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "multipleOf": 2}}}, "multipleOf"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "maximum": 9}}}, "maximum"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "email"}}}, "email"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "http://x/y.json"}}}, "$ref"),
    ]
    for fmt, word in cases:
        st, data = _chat(t, {"response_format": fmt})
        err = check_error(st, data, 400, "unsupported_schema")
        assert word in err["message"] and err["param"] == "response_format.json_schema.schema", err
    for fmt, param in (({"type": "xml"}, "response_format.type"), ({"type": "json_schema"}, "response_format.json_schema"),
                       ({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}},
                        "response_format.json_schema.schema"), ("json", "response_format")):
        st, data = _chat(t, {"response_format": fmt})
        err = check_error(st, data, 400)
        assert err["param"] == param, (fmt, err)
    st, data = _chat(t, {"metro": {"choice": []}})
    check_error(st, data, 400)
    st, data = _chat(t, {"metro": {"choice": ["a"]}, "response_format": {"type": "json_object"}})
    check_error(st, data, 400)


TESTS = [t_structured_refusals, t_structured_json_object_and_choice, t_structured_json_schema_corpus,
         t_structured_regex, t_structured_gbnf, t_structured_properties_in_schema_order,
         t_structured_sdk_parse_with_pydantic]
