"""Structured outputs and forced tool calls end to end: the real MiniMax-M2 CPU executor with
random weights (`moeserve make-tiny`), through the official `openai` SDK and raw HTTP.
Every constrained output is checked independently of our engine: with the `jsonschema`
package, Python's `re`, or xgrammar's matcher (for "a valid prefix" when max_tokens cut it)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal, Union

import httpx
import jsonschema
import openai
import pydantic
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "structured"))
import xgr_oracle  # noqa: E402

from conftest import REPO, free_port  # noqa: E402

NAME = "tiny"


def tiny_server(tmp_path_factory, parser_args):
    binary = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
    tmp = tmp_path_factory.mktemp("tiny_structured")
    model = tmp / "model"
    subprocess.run([binary, "make-tiny", str(model)], check=True, capture_output=True)
    port = free_port()
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([binary, "serve", str(model), "--served-model-name", NAME, "--device", "cpu",
                             "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
                             "--enable-auto-tool-choice", *parser_args],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (tmp / "server.log").read_text()
        time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("server did not start: " + (tmp / "server.log").read_text())
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, (tmp / "server.log").read_text()
    log.close()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    yield from tiny_server(tmp_path_factory, ["--tool-call-parser", "minimax_m2"])


@pytest.fixture(scope="module")
def hermes_base(tmp_path_factory):
    """Qwen3's parsers: hermes tool calls, qwen3 reasoning."""
    yield from tiny_server(tmp_path_factory, ["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"])


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


MSG = [{"role": "user", "content": "Describe a person as JSON."}]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    color: Literal["red", "green", "blue"]
    member: bool


def test_sdk_parse_with_pydantic(base):
    c = client(base)
    for seed in range(4):
        r = c.chat.completions.parse(model=NAME, messages=MSG, response_format=Person, seed=seed, max_tokens=300,
                                     temperature=1.0)
        ch = r.choices[0]
        assert ch.finish_reason == "stop"
        assert isinstance(ch.message.parsed, Person), ch.message.content
        jsonschema.validate(json.loads(ch.message.content), Person.model_json_schema())


class Cat(pydantic.BaseModel):
    pet_type: Literal["cat"]
    lives: int = pydantic.Field(ge=1, le=9)


class Dog(pydantic.BaseModel):
    pet_type: Literal["dog"]
    bark: float = pydantic.Field(ge=0, lt=1)


class Owner(pydantic.BaseModel):
    """What pydantic v2 writes for these: {"const": "cat", "type": "string"}, a oneOf with a
    "discriminator", {"enum": [...], "type": "string"} and number bounds (minimum /
    exclusiveMaximum / exclusiveMinimum on floats)."""
    pet: Union[Cat, Dog] = pydantic.Field(discriminator="pet_type")
    mood: Literal["happy", "sad"]
    confidence: float = pydantic.Field(ge=0, le=1)
    offset: float = pydantic.Field(gt=-2.5, le=3.75)


def test_sdk_parse_with_literals_discriminated_union_and_float_bounds(base):
    c = client(base)
    pets = set()
    for seed in range(6):
        r = c.chat.completions.parse(model=NAME, messages=MSG, response_format=Owner, seed=seed, max_tokens=400,
                                     temperature=1.0)
        ch = r.choices[0]
        assert ch.finish_reason == "stop", ch.message.content
        assert isinstance(ch.message.parsed, Owner), ch.message.content
        doc = json.loads(ch.message.content)
        jsonschema.validate(doc, Owner.model_json_schema())
        assert 0 <= doc["confidence"] <= 1 and -2.5 < doc["offset"] <= 3.75
        assert "e" not in ch.message.content.lower().split('"offset"')[1]  # no exponent in a bounded number
        pets.add(doc["pet"]["pet_type"])
    assert pets == {"cat", "dog"}, pets


SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        "ok": {"type": ["boolean", "null"]},
        "code": {"type": "string", "pattern": "[A-Z]{2}[0-9]{2}"},
        "when": {"type": "string", "format": "date"},
    },
    "required": ["id", "tags", "ok", "code", "when"],
}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_streaming_and_not(base, stream):
    c = client(base)
    rf = {"type": "json_schema", "json_schema": {"name": "rec", "schema": SCHEMA, "strict": True}}
    for seed in range(3):
        kw = dict(model=NAME, messages=MSG, response_format=rf, seed=seed, max_tokens=200, temperature=1.0)
        if stream:
            text, finish = "", None
            for chunk in c.chat.completions.create(stream=True, **kw):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
        else:
            r = c.chat.completions.create(**kw)
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA, format_checker=jsonschema.FormatChecker())


def valid_prefix(text, spec):
    """Independent check with xgrammar's matcher: `text` is a prefix of the language."""
    xgr = xgr_oracle.import_xgrammar()
    toks = [bytes([b]) for b in range(256)]
    info = xgr.TokenizerInfo(toks, xgr.VocabType.RAW, vocab_size=256, stop_token_ids=[])
    m = xgr.GrammarMatcher(xgr_oracle.xgr_compile(xgr, xgr.GrammarCompiler(info), spec), terminate_without_stop_token=True)
    return all(m.accept_token(b) for b in text.encode())


def test_json_object_valid_or_valid_prefix(base):
    c = client(base)
    for seed in range(3):
        r = c.chat.completions.create(model=NAME, messages=MSG, response_format={"type": "json_object"}, seed=seed,
                                      max_tokens=60, temperature=1.0)
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.message.content), dict)
        else:
            assert ch.finish_reason == "length"
            assert valid_prefix(ch.message.content, {"kind": "json_object"}), ch.message.content


def test_structured_outputs_regex_choice_grammar_completions(base):
    c = client(base)
    regex = r"[a-z]{3}-\d{2,4}"
    r = c.completions.create(model=NAME, prompt="code:", max_tokens=40, seed=1,
                             extra_body={"structured_outputs": {"regex": regex}})
    assert r.choices[0].finish_reason == "stop" and re.fullmatch(regex, r.choices[0].text), r.choices[0].text
    r = c.completions.create(model=NAME, prompt="mood:", max_tokens=20, n=3, seed=2,
                             extra_body={"structured_outputs": {"choice": ["happy", "sad", "very happy"]}})
    assert [ch.finish_reason for ch in r.choices] == ["stop"] * 3
    assert all(ch.text in ("happy", "sad", "very happy") for ch in r.choices)
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'
    r = c.chat.completions.create(model=NAME, messages=MSG, max_tokens=60, seed=3,
                                  extra_body={"structured_outputs": {"grammar": grammar}})
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", text), text
    else:
        assert valid_prefix(text, {"kind": "grammar", "text": grammar}), text


def test_guided_fields_and_seeded_n(base):
    c = client(base)
    schema = {"type": "object", "properties": {"x": {"enum": [1, 2, 3]}}, "required": ["x"]}
    outs = []
    for _ in range(2):
        r = c.chat.completions.create(model=NAME, messages=MSG, max_tokens=40, n=2, seed=7, temperature=1.0,
                                      extra_body={"guided_json": schema})
        outs.append([ch.message.content for ch in r.choices])
        for ch in r.choices:  # any whitespace is allowed (not strict): it may run to max_tokens
            if ch.finish_reason == "stop":
                jsonschema.validate(json.loads(ch.message.content), schema)
            else:
                assert valid_prefix(ch.message.content, {"kind": "json_schema", "text": json.dumps(schema)})
    assert outs[0] == outs[1]  # seeded: reproducible
    r = c.completions.create(model=NAME, prompt="x", max_tokens=10, extra_body={"guided_choice": ["left", "right"]})
    assert r.choices[0].text in ("left", "right")
    r = c.completions.create(model=NAME, prompt="x", max_tokens=10, extra_body={"guided_regex": "[01]{4}"})
    assert re.fullmatch("[01]{4}", r.choices[0].text)


def test_logprobs_are_after_masking(base):
    c = client(base)
    r = c.completions.create(model=NAME, prompt="x", max_tokens=10, logprobs=3, temperature=1.0, seed=4,
                             extra_body={"guided_choice": ["left", "right"]})
    lp = r.choices[0].logprobs
    # The first token is a prefix of one of the choices; every alternative with a finite
    # logprob must be one too (masked tokens are -inf, reported as -9999.0).
    for alt, v in lp.top_logprobs[0].items():
        assert v <= -9999.0 or "left".startswith(alt) or "right".startswith(alt), (alt, v)


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}, "note": {"type": "string"},
            "code": {"type": "string", "pattern": "[A-Z]{3}"}}, "required": ["a", "b", "code"]}}},
]


def check_calls(calls, names):
    assert calls, "no tool calls"
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_calls_hermes(hermes_base, choice):
    """The hermes grammar, read back by the hermes parser. enable_thinking false: the qwen3
    reasoning parser takes the prompt as having ended the reasoning, so the constraint starts
    at the first token and the output is content (the calls), not reasoning."""
    c = client(hermes_base)
    tc = "required" if choice == "required" else {"type": "function", "function": {"name": "add"}}
    names = {"get_weather", "add"} if choice == "required" else {"add"}
    no_think = {"chat_template_kwargs": {"enable_thinking": False}}
    done = 0
    for seed in range(3):
        r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                      tools=TOOLS, tool_choice=tc, parallel_tool_calls=False, seed=seed,
                                      max_tokens=400, temperature=1.0, extra_body=no_think)
        ch = r.choices[0]
        if r.usage.completion_tokens >= 400:  # a long string ran to max_tokens; the call is cut
            continue
        done += 1
        assert ch.finish_reason == "tool_calls", ch
        assert len(ch.message.tool_calls) == 1, ch
        assert (ch.message.content or "").strip() == ""
        check_calls(ch.message.tool_calls, names)
    assert done > 0
    calls, finish = {}, None
    for chunk in c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Add 1 and 2"}],
                                           tools=TOOLS, tool_choice=tc, seed=5, max_tokens=600, stream=True,
                                           extra_body=no_think):
        if chunk.choices:
            finish = chunk.choices[0].finish_reason or finish
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            e = calls.setdefault(d.index, {"name": "", "arguments": ""})
            e["name"] += (d.function.name or "") if d.function else ""
            e["arguments"] += (d.function.arguments or "") if d.function else ""
    assert calls and finish in ("tool_calls", "length"), (calls, finish)
    if finish == "tool_calls":
        for e in calls.values():
            assert e["name"] in names
            jsonschema.validate(json.loads(e["arguments"]),
                                {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[e["name"]])


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_calls(base, choice):
    c = client(base)
    tc = "required" if choice == "required" else {"type": "function", "function": {"name": "add"}}
    names = {"get_weather", "add"} if choice == "required" else {"add"}
    for seed in range(3):
        r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                      tools=TOOLS, tool_choice=tc, parallel_tool_calls=False, seed=seed,
                                      max_tokens=400, temperature=1.0)
        ch = r.choices[0]
        if r.usage.completion_tokens >= 400:  # a raw string ("note") ran to max_tokens; the call is cut
            continue
        assert ch.finish_reason in ("tool_calls", "stop"), ch
        assert len(ch.message.tool_calls) == 1
        check_calls(ch.message.tool_calls, names)
    # Streaming: the same call assembled from deltas.
    calls, finish = {}, None
    for chunk in c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Add 1 and 2"}],
                                           tools=TOOLS, tool_choice=tc, seed=5, max_tokens=600, stream=True):
        if chunk.choices:
            finish = chunk.choices[0].finish_reason or finish
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            e = calls.setdefault(d.index, {"name": "", "arguments": ""})
            e["name"] += (d.function.name or "") if d.function else ""
            e["arguments"] += (d.function.arguments or "") if d.function else ""
    assert calls and finish in ("tool_calls", "stop"), (calls, finish)
    for e in calls.values():
        assert e["name"] in names
        jsonschema.validate(json.loads(e["arguments"]),
                            {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[e["name"]])


def post(base, path, body):
    return httpx.post(base + path, json=body, timeout=60)


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
      "patternProperties": {"a": {}}}}}}, "patternProperties"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}}, "'not'"),
    ({"structured_outputs": {"regex": "ab[cd"}}, "position 5"),
    ({"structured_outputs": {"regex": "(a)\\1"}}, "back-references"),
    ({"structured_outputs": {"grammar": "root ::= \"x"}}, "position"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "undefined_rule"),
    ({"structured_outputs": {"grammar": "root ::= root \"a\" | \"b\""}}, "left-recursive"),
    ({"structured_outputs": {"choice": []}}, "choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "Only one"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structural_tag"),
    ({"guided_json": "{not json"}, "not valid JSON"),
    ({"response_format": {"type": "yaml"}}, "yaml"),
    ({"guided_json": {"type": "array", "items": {"$ref": "#/$defs/nope"}}}, "does not resolve"),
    ({"structured_outputs": {"json": {"type": "string", "minLength": 10, "maxLength": 2}}}, "max"),
    ({"structured_outputs": {"json": {"type": "number", "minimum": 1, "exclusiveMaximum": 1}}}, "no value"),
    ({"structured_outputs": {"json": {"const": "cat", "type": "integer"}}}, "'const' value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array",
      "uniqueItems": True}}}}, "uniqueItems"),
]


@pytest.mark.parametrize("extra,needle", BAD, ids=[b[1] for b in BAD])
def test_invalid_constraints_are_400(base, extra, needle):
    r = post(base, "/v1/chat/completions", {"model": NAME, "messages": MSG, "max_tokens": 5, **extra})
    assert r.status_code == 400, r.text
    assert needle.lower() in r.json()["error"]["message"].lower(), r.text


def test_pathological_inputs_bounded(base):
    deep = {}
    cur = deep
    for _ in range(500):
        cur["type"] = "array"
        cur["items"] = {}
        cur = cur["items"]
    t0 = time.time()
    r = post(base, "/v1/chat/completions", {"model": NAME, "messages": MSG, "max_tokens": 5, "guided_json": deep})
    assert r.status_code == 400 and "deeper" in r.text
    huge_enum = {"enum": [f"value_{i}" for i in range(20000)]}
    r = post(base, "/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 5, "guided_json": huge_enum})
    assert r.status_code == 200, r.text
    r = post(base, "/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 8,
                                       "structured_outputs": {"regex": "(a|aa|aaa|a*)*b"}})
    assert r.status_code in (200, 400), r.text
    r = post(base, "/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 8,
                                       "structured_outputs": {"regex": "(x{1000}){1000}"}})
    assert r.status_code == 200, r.text  # a million-character language, compiled small (copies share a rule)
    r = post(base, "/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 8,
                                       "structured_outputs": {"regex": "x{20000}"}})
    assert r.status_code == 400 and "limit" in r.text, r.text
    r = post(base, "/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 8,
                                       "structured_outputs": {"grammar": "(" * 5000}})
    assert r.status_code == 400, r.text
    assert time.time() - t0 < 60
    assert httpx.get(base + "/health").status_code == 200


def test_forced_tool_call_errors(base):
    r = post(base, "/v1/chat/completions", {"model": NAME, "messages": MSG, "max_tokens": 5, "tools": TOOLS,
                                            "tool_choice": "required", "response_format": {"type": "json_object"}})
    assert r.status_code == 400
    bad_tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "number", "multipleOf": 0.5}}}}}]
    r = post(base, "/v1/chat/completions", {"model": NAME, "messages": MSG, "max_tokens": 5, "tools": bad_tools,
                                            "tool_choice": "required"})
    assert r.status_code == 400 and "multipleOf" in r.text


def test_agent_apis_structured_formats(base):
    """The Responses API's text.format and the Messages API's output_config.format go through
    the same grammar engine as response_format: the output validates against the schema."""
    for _ in range(2):
        r = post(base, "/v1/responses", {"model": NAME, "input": "Give a record.", "max_output_tokens": 200,
                                         "temperature": 1.0,
                                         "text": {"format": {"type": "json_schema", "name": "rec",
                                                             "schema": SCHEMA, "strict": True}}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["text"]["format"]["type"] == "json_schema"
        text = "".join(p["text"] for o in body["output"] if o["type"] == "message"
                       for p in o["content"] if p["type"] == "output_text")
        if body["status"] == "completed":
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert valid_prefix(text, {"kind": "json_schema", "text": json.dumps(SCHEMA), "any_whitespace": False}), text
        m = post(base, "/v1/messages", {"model": NAME, "max_tokens": 200, "temperature": 1.0,
                                        "messages": [{"role": "user", "content": "Give a record."}],
                                        "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
        assert m.status_code == 200, m.text
        mb = m.json()
        mtext = "".join(b["text"] for b in mb["content"] if b["type"] == "text")
        if mb["stop_reason"] == "end_turn":
            jsonschema.validate(json.loads(mtext), SCHEMA)
    bad = post(base, "/v1/responses", {"model": NAME, "input": "x",
                                       "text": {"format": {"type": "json_schema", "name": "x",
                                                           "schema": {"not": {}}}}})
    assert bad.status_code == 400 and "not" in bad.text, bad.text
