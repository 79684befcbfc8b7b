"""Tool calling end to end with the openai SDK: on the default model's template (which knows
no tools: the generic format) and on servers started with the templates of the three native
formats (Hermes as Qwen2.5 writes it, Llama 3.1, Mistral); tool_choice required, named and
auto, parallel calls, streamed and not (the SDK's own accumulation of delta.tool_calls), the
SDK's strict `pydantic_function_tool` parsing, a tool result sent back through the template,
and malformed tool fields refused with a 400 naming them. Every call's arguments validate
against its function's schema (`jsonschema`)."""

import json
import os

import jsonschema
import openai
import pydantic

from e2e_util import MetroServer, check_error, env_int, request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TEMPLATES = {
    "hermes": os.path.join(ROOT, "tests/fixtures/chat_templates/templates/qwen25_tools.jinja"),
    "llama3": os.path.join(ROOT, "tests/fixtures/chat_templates/templates/llama31_tools.jinja"),
    "mistral": os.path.join(HERE, "templates/mistral_tools.jinja"),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it in Tokyo?"}]


def _check_calls(calls, names=None):
    assert calls, "no tool calls"
    ids = set()
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.id not in ids, c
        ids.add(c.id)
        assert c.function.name in SCHEMAS, c
        if names is not None:
            assert c.function.name in names, (c.function.name, names)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def _streamed(client, model, **kw):
    """The SDK's chunks accumulated as its docs show: content, and tool calls by index (each
    with the number of chunks its arguments came in)."""
    content, calls, finish = "", {}, None
    content_chunks = [0]
    for chunk in client.chat.completions.create(model=model, stream=True, **kw):
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            content_chunks[0] += 1 if d.content else 0
            for tc in d.tool_calls or []:
                acc = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": "", "chunks": 0})
                if tc.id:
                    assert acc["id"] is None, "a call's id comes once"
                    acc["id"] = tc.id
                if tc.function and tc.function.name:
                    acc["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    acc["arguments"] += tc.function.arguments
                    acc["chunks"] += 1
            finish = ch.finish_reason or finish
    _streamed.content_chunks = content_chunks[0]
    return content, [calls[i] for i in sorted(calls)], finish


def _exercise(client, model, fmt, notes):
    """required (one call, then parallel), named, streamed, auto; notes what it saw."""
    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=200, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (fmt, c)
    _check_calls(c.message.tool_calls)
    assert len(c.message.tool_calls) == 1, c.message.tool_calls
    one = c.message.tool_calls[0]

    # Parallel calls: a small model may go on calling until max_tokens; the calls that
    # were complete are returned either way.
    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                       max_tokens=200, temperature=0)
    c = r.choices[0]
    assert c.finish_reason in ("tool_calls", "length"), (fmt, c)
    _check_calls(c.message.tool_calls)
    parallel_n = len(c.message.tool_calls)
    if fmt == "llama3":
        assert parallel_n == 1, "the Llama 3 format holds one call per message"

    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=200, temperature=0.9,
                                       seed=7, tool_choice={"type": "function", "function": {"name": "get_time"}})
    c = r.choices[0]
    assert c.finish_reason in ("tool_calls", "length"), (fmt, c)
    _check_calls(c.message.tool_calls, {"get_time"})

    content, calls, finish = _streamed(client, model, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=200, temperature=0)
    assert finish == "tool_calls" and len(calls) == 1, (fmt, content, calls, finish)
    acc = calls[0]
    assert acc["id"] and acc["id"].startswith("call_"), acc
    # Streamed and not, the same greedy call, to the byte; its arguments stream as written.
    assert acc["name"] == one.function.name and acc["arguments"] == one.function.arguments, (acc, one)
    assert acc["chunks"] > 1, acc
    content, calls, finish = _streamed(client, model, messages=ASK, tools=TOOLS, tool_choice="required",
                                       max_tokens=200, temperature=0)
    assert finish in ("tool_calls", "length") and calls, (fmt, content, calls, finish)
    # Cut by max_tokens, the last call has gone out in part (as OpenAI streams it).
    for acc in calls[:-1] if finish == "length" else calls:
        assert acc["name"] in SCHEMAS, acc
        jsonschema.validate(json.loads(acc["arguments"]), SCHEMAS[acc["name"]])

    # auto: the model may call or answer; either way the answer is well formed.
    auto_calls = 0
    for seed in range(3):
        r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=120,
                                           temperature=0.8, seed=seed)
        c = r.choices[0]
        if c.message.tool_calls:
            auto_calls += 1
            assert c.finish_reason == "tool_calls", c
            _check_calls(c.message.tool_calls)
        else:
            assert c.finish_reason in ("stop", "length") and isinstance(c.message.content, str), c
        # Streamed, the same answer: text as it is written (the generic format's response
        # too, decoded from its JSON string as it streams), calls to the byte.
        content, calls, finish = _streamed(client, model, messages=ASK, tools=TOOLS, max_tokens=120,
                                           temperature=0.8, seed=seed)
        if finish == c.finish_reason and finish != "length":
            assert content == (c.message.content or ""), (fmt, content, c.message.content)
            want = [(x.function.name, x.function.arguments) for x in c.message.tool_calls or []]
            assert [(x["name"], x["arguments"]) for x in calls] == want, (fmt, calls, want)
            if len(content) > 20:
                assert _streamed.content_chunks > 1, (fmt, content)
    notes.append(f"{fmt}: one call {one.function.name}, parallel {parallel_n} call(s), auto called in "
                 f"{auto_calls} of 3")


def t_tools_generic_format(t):
    notes = []
    _exercise(t.client, t.model_name, "generic", notes)
    t.note("tool calling, " + "; ".join(notes))


def t_tools_sdk_strict_pydantic_and_tool_results(t):
    class GetWeather(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=20)
        unit: str = pydantic.Field(json_schema_extra={"enum": ["celsius", "fahrenheit"]})

    parse = getattr(t.client.chat.completions, "parse", None) or t.client.beta.chat.completions.parse
    r = parse(model=t.model_name, messages=[{"role": "user", "content": "Weather in Oslo?"}],
              tools=[openai.pydantic_function_tool(GetWeather)], tool_choice="required", max_tokens=120,
              temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    call = c.message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, GetWeather), call
    # The call and its result go back; the model answers in words.
    messages = [{"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": call.id, "type": "function",
                                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                {"role": "tool", "tool_call_id": call.id, "content": "light rain, 8 degrees"}]
    r = t.client.chat.completions.create(model=t.model_name, messages=messages, tools=TOOLS, tool_choice="none",
                                         max_tokens=40, temperature=0)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length") and c.message.content and not c.message.tool_calls, c


def t_tools_refusals(t):
    base = {"model": t.model_name, "messages": ASK}
    cases = [
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer", "multipleOf": 2}}}}}], "tool_choice": "required"},
         "tools"),
    ]
    for extra, param in cases:
        st, _, data = request(t.port, "POST", "/v1/chat/completions", dict(base, **extra), t.auth)
        err = check_error(st, data, 400)
        assert err["param"] == param, (extra, err)
    # tool_choice none with response_format is fine: the tools are not called.
    st, _, data = request(t.port, "POST", "/v1/chat/completions",
                          dict(base, tools=TOOLS, tool_choice="none", max_tokens=40,
                               response_format={"type": "json_object"}), t.auth)
    assert st == 200, data[:300]


def t_tools_native_formats(t):
    notes = []
    for fmt, path in TEMPLATES.items():
        srv = MetroServer(t.metro, t.model_path, [
            "--model-name", t.model_name, "--ctx", "2048", "--ctx-total", "8192", "--max-seqs", "8",
            "--chat-template", path, "-t", str(env_int("METRO_E2E_THREADS", 2)),
            # Native templates render the tool definitions into a prompt of ~400 tokens; a
            # sanitized build prefills too slowly for the standard class's TTFT bound, and
            # admission is e2e_sla.py's subject, not this one's.
            "--admission", "off"])
        srv.start()
        try:
            srv.wait_ready()
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none", timeout=600,
                                   max_retries=0)
            _exercise(client, t.model_name, fmt, notes)
            # The raw text follows the format: a completion with the same prompt is not
            # needed; the parsed calls above came from it. A tool result renders.
            r = client.chat.completions.create(model=t.model_name, max_tokens=8, temperature=0, tools=TOOLS,
                                               messages=ASK + [
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_a", "type": "function",
                 "function": {"name": "get_time", "arguments": "{\"zone\": \"Asia/Tokyo\"}"}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "21:04"}])
            assert r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r
        finally:
            srv.kill()
    t.note("tool calling, " + "; ".join(notes))


# The tools in the Responses API's shape (no `function` level).
RESP_TOOLS = [dict(type="function", **t["function"]) for t in TOOLS]


def t_responses_tools(t):
    """/v1/responses with function tools through the SDK: a required call is a function_call
    item whose arguments validate; its result goes back as a function_call_output after
    previous_response_id (and, stateless, with the call as a function_call input item) and is
    answered in words, the same words as the chat request it amounts to; a stream's
    function_call items, their argument deltas adding up to the arguments done; a named
    tool_choice; the refusals, named in the Responses shape."""
    c = t.client
    ask = "What is the weather in Paris?"
    r = c.responses.create(model=t.model_name, input=ask, tools=RESP_TOOLS, tool_choice="required",
                           parallel_tool_calls=False, max_output_tokens=120, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and r.parallel_tool_calls is False, r
    for fc in calls:
        assert fc.call_id.startswith("call_") and fc.id.startswith("fc_") and fc.status == "completed", fc
        jsonschema.validate(json.loads(fc.arguments), SCHEMAS[fc.name])
    assert [x.name for x in r.tools] == ["get_weather", "get_time"] and r.tool_choice == "required", r

    results = [{"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21 degrees"} for fc in calls]
    r2 = c.responses.create(model=t.model_name, previous_response_id=r.id, input=results, tools=RESP_TOOLS,
                            tool_choice="none", max_output_tokens=40, temperature=0)
    assert r2.output_text and not [o for o in r2.output if o.type == "function_call"], r2
    stateless = c.responses.create(
        model=t.model_name, tools=RESP_TOOLS, tool_choice="none", max_output_tokens=40, temperature=0,
        input=[{"role": "user", "content": ask}] +
              [{"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments}
               for fc in calls] + results)
    chat = c.chat.completions.create(
        model=t.model_name, tools=TOOLS, tool_choice="none", max_tokens=40, temperature=0,
        messages=[{"role": "user", "content": ask},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": fc.call_id, "type": "function",
                                   "function": {"name": fc.name, "arguments": fc.arguments}} for fc in calls]}] +
                 [{"role": "tool", "tool_call_id": fc.call_id, "content": "sunny, 21 degrees"} for fc in calls])
    want = chat.choices[0].message.content
    assert r2.output_text == stateless.output_text == want, (r2.output_text, stateless.output_text, want)

    events = list(c.responses.create(model=t.model_name, input="What time is it in Tokyo?", tools=RESP_TOOLS,
                                     tool_choice={"type": "function", "name": "get_time"}, max_output_tokens=120,
                                     parallel_tool_calls=False, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"], events[:2]
    assert events[-1].type == "response.completed", events[-1].type
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert added and all(a.name == "get_time" for a in added), added
    final_calls = [o for o in events[-1].response.output if o.type == "function_call"]
    assert [a.id for a in added] == [f.id for f in final_calls], (added, final_calls)
    for a, f in zip(added, final_calls):
        deltas = "".join(e.delta for e in events
                         if e.type == "response.function_call_arguments.delta" and e.item_id == a.id)
        done = [e for e in events if e.type == "response.function_call_arguments.done" and e.item_id == a.id]
        assert len(done) == 1 and deltas == done[0].arguments == f.arguments, (deltas, done, f)
        jsonschema.validate(json.loads(f.arguments), SCHEMAS["get_time"])

    for kw, param in ((dict(tools=[{"type": "web_search"}]), "tools"),
                      (dict(tools=RESP_TOOLS, tool_choice={"type": "function", "name": "nope"}), "tool_choice.name"),
                      (dict(tools=[RESP_TOOLS[0], RESP_TOOLS[0]]), "tools[1].name"),
                      (dict(tools=RESP_TOOLS, tool_choice={"type": "file_search"}), "tool_choice")):
        try:
            c.responses.create(model=t.model_name, input=ask, **kw)
            raise AssertionError(f"{kw} was accepted")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, (kw, e.body)
    t.note(f"responses tools: {len(calls)} call(s) {[fc.name for fc in calls]}, answered {want!r:.60}")


TESTS = [t_tools_refusals, t_tools_generic_format, t_tools_sdk_strict_pydantic_and_tool_results, t_responses_tools]
SEPARATE_SERVER_TESTS = [t_tools_native_formats]
