"""Mutation test (issue 25 item 4): thousands of mutated valid requests against every route of
the real CPU server (OpenAI chat / completions with structured-output constraints, /tokenize,
/detokenize, Anthropic /v1/messages and count_tokens, /v1/responses; the tiny MiniMax-M2 model,
tool and reasoning parsers on). Bad input must
get a 4xx in the API's error shape, never a 5xx, and the server must stay up.

Mutations of a valid request: a field (top level or nested: messages, content parts, tools,
stream_options, tool calls) replaced by a value of another type or an extreme value, removed,
or an unknown field added; plus raw-body damage (truncation, invalid UTF-8, numbers beyond a
double, deep nesting). Seeded: a failure prints the request, and the same seed repeats it."""
import copy
import json
import os
import random
import signal
import subprocess
import time

import httpx
import pytest

from conftest import REPO, free_port

N_REQUESTS = 4000
SEED = 25

EXTREMES = [None, True, False, 0, -1, 1, 2, 7, 0.5, -0.5, 1e-38, 1e-300, 1e308, -1e308, 2 ** 63, -2 ** 63,
            2 ** 64, 2 ** 31, -2 ** 31 - 1, 1.5, "", "x", "auto", "none", "required", "\u0000", "\ud7ff\ue000",
            "a" * 5000, [], [1], ["x"], [[]], [None], [{"role": "user"}], {}, {"a": 1}, {"type": "function"},
            [1, "a", None], {"name": 5}, 123456789012345678901234567890]

CHAT = {"model": "tiny-minimax-m2", "messages": [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "assistant", "content": "", "reasoning_content": "r",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "42"},
    {"role": "user", "content": "and?"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                 "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}],
    "tool_choice": "auto", "max_tokens": 3, "temperature": 0.8, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "seed": 1,
    "stop": ["zz"], "logprobs": True, "top_logprobs": 2, "presence_penalty": 0.1, "frequency_penalty": 0.1,
    "repetition_penalty": 1.05, "n": 1, "stream": False, "chat_template_kwargs": {"enable_thinking": True},
    "skip_special_tokens": True, "include_stop_str_in_output": False, "add_generation_prompt": True}
COMPLETION = {"model": "tiny-minimax-m2", "prompt": "Hello", "max_tokens": 3, "echo": True, "logprobs": 1, "n": 2,
              "temperature": 0, "stop_token_ids": [5, 6], "min_tokens": 1, "ignore_eos": False, "stream": True,
              "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "add_special_tokens": True}
COMPLETION_IDS = {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 2, "temperature": 0.5, "seed": 3}
TOKENIZE = {"model": "tiny-minimax-m2", "prompt": "hello world", "add_special_tokens": True, "return_token_strs": True}
TOKENIZE_CHAT = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True,
                 "return_token_strs": False, "tools": CHAT["tools"]}
DETOKENIZE = {"model": "tiny-minimax-m2", "tokens": [10, 20, 30]}

# Structured outputs: every constraint kind goes through the schema / regex / EBNF compilers.
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name"], "additionalProperties": False}
CHAT_SCHEMA = {"model": "tiny-minimax-m2", "messages": [{"role": "user", "content": "json"}], "max_tokens": 3,
               "response_format": {"type": "json_schema", "json_schema": {"name": "rec", "schema": SCHEMA, "strict": True}}}
CHAT_GUIDED = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
               "structured_outputs": {"regex": "[a-c]{1,4}", "choice": None}}
CHAT_FORCED_TOOL = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "tools": CHAT["tools"],
                    "tool_choice": {"type": "function", "function": {"name": "f"}}}
COMPLETION_GRAMMAR = {"prompt": "x", "max_tokens": 3, "structured_outputs": {"grammar": 'root ::= "a" [0-9]*'}}
# The agent APIs (issue 19): Anthropic Messages, its token count, OpenAI Responses.
ANTH_TOOLS = [{"name": "f", "description": "d", "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}]
MESSAGES = {"model": "tiny-minimax-m2", "max_tokens": 3, "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}],
            "tools": ANTH_TOOLS, "tool_choice": {"type": "auto"}, "temperature": 0.8, "top_p": 0.9, "top_k": 5,
            "stop_sequences": ["zz"], "stream": False, "metadata": {"user_id": "u"}}
COUNT_TOKENS = {"model": "tiny-minimax-m2", "messages": [{"role": "user", "content": "hi"}], "tools": ANTH_TOOLS,
                "system": "s"}
RESPONSES = {"model": "tiny-minimax-m2", "instructions": "be brief", "max_output_tokens": 3, "store": False,
             "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                       {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "42"}],
             "tools": [{"type": "function", "name": "f", "parameters": CHAT["tools"][0]["function"]["parameters"]}],
             "tool_choice": "auto", "temperature": 0.8, "top_p": 0.9,
             "text": {"format": {"type": "json_schema", "name": "rec", "schema": SCHEMA}}}

ROUTES = [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION), ("/v1/completions", COMPLETION_IDS),
          ("/tokenize", TOKENIZE), ("/tokenize", TOKENIZE_CHAT), ("/detokenize", DETOKENIZE),
          ("/v1/chat/completions", CHAT_SCHEMA), ("/v1/chat/completions", CHAT_GUIDED), ("/v1/chat/completions", CHAT_FORCED_TOOL),
          ("/v1/completions", COMPLETION_GRAMMAR), ("/v1/messages", MESSAGES),
          ("/v1/messages/count_tokens", COUNT_TOKENS), ("/v1/responses", RESPONSES)]


def paths(obj, prefix=()):
    """Every (path) to a value inside obj (dict keys and list indices)."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, prefix + (i,))
    return out


def deep(n):
    # A placeholder, replaced by n nested arrays in the serialized body (Python's own json and
    # copy would recurse too deep).
    return "__DEEP_%d__" % n


def mutate(rng, base):
    body = json.loads(json.dumps(base))
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        ps = paths(body)
        if not ps:
            break
        p = rng.choice(ps)
        parent = body
        for k in p[:-1]:
            parent = parent[k]
        kind = rng.random()
        if kind < 0.7:
            parent[p[-1]] = copy.deepcopy(rng.choice(EXTREMES + [deep(rng.choice([3, 100, 600]))]))
        elif kind < 0.85:
            del parent[p[-1]]
        elif isinstance(parent, dict):
            parent["unknown_" + str(rng.randrange(100))] = copy.deepcopy(rng.choice(EXTREMES))
    # Generation stays short unless max_tokens itself was mutated (keeps the run fast).
    if isinstance(body, dict) and "max_tokens" in base and body.get("max_tokens") == base["max_tokens"]:
        body["max_tokens"] = 2
    text = json.dumps(body, allow_nan=True)
    for n in (3, 100, 600):
        text = text.replace('"__DEEP_%d__"' % n, "[" * n + "1" + "]" * n)
    return text.encode()


def raw_damage(rng, base):
    text = json.dumps(base)
    k = rng.randrange(7)
    if k == 0:
        return text[:rng.randrange(len(text))].encode()
    if k == 1:
        return text.replace('"', "", 1).encode()
    if k == 2:
        b = bytearray(text.encode())
        b[rng.randrange(len(b))] = rng.choice([0xFF, 0xC0, 0x80, 0xED])
        return bytes(b)
    if k == 3:  # a number beyond a double, in some numeric field
        return text.replace(": 3", ": 1e400", 1).replace(": 2,", ": -1e400,", 1).encode()
    if k == 4:
        return ('{"a": ' + "[" * 100000 + "]" * 100000 + ", " + text[1:]).encode()
    if k == 5:
        return text.replace("true", "NaN", 1).replace("0.8", "Infinity", 1).encode()
    return rng.choice([b"", b"null", b"[]", b"1", b'"x"', b"{}", b"{" * 5000])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    binary = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
    tmp = tmp_path_factory.mktemp("mut")
    model = tmp / "model"
    subprocess.run([binary, "make-tiny", str(model)], check=True, capture_output=True)
    port = free_port()
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([binary, "serve", str(model), "--served-model-name", "tiny-minimax-m2", "--device", "cpu",
                             "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
                             "--enable-auto-tool-choice", "--tool-call-parser", "minimax_m2",
                             "--reasoning-parser", "minimax_m2"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (tmp / "server.log").read_text()
        time.sleep(0.05)
    yield base, proc, tmp / "server.log"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    log.close()


def test_mutated_requests_never_get_a_5xx(tiny):
    base, proc, log = tiny
    rng = random.Random(SEED)
    statuses = {}
    bad = []
    with httpx.Client(base_url=base, timeout=60) as c:
        for i in range(N_REQUESTS):
            route, valid = rng.choice(ROUTES)
            body = raw_damage(rng, valid) if rng.random() < 0.15 else mutate(rng, valid)
            r = c.post(route, content=body, headers={"Content-Type": "application/json"})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 408:  # a complete request sent at once never times out
                bad.append((i, route, body[:600], r.status_code, r.text[:400]))
            text = r.text
            if r.status_code >= 500 or '"code":500' in text or '"code": 500' in text:
                bad.append((i, route, body[:600], r.status_code, text[:400]))
            elif r.status_code >= 400:
                err = r.json()
                assert "error" in err and "message" in err["error"], (route, body[:300], text[:300])
            if len(bad) >= 10:
                break
            assert proc.poll() is None, f"server died at request {i}: {route} {body[:300]!r}\n" + log.read_text()[-3000:]
        assert c.get("/health").status_code == 200
    print("statuses:", dict(sorted(statuses.items())))
    assert not bad, "\n".join(f"#{i} {route} {body!r} -> {st} {t}" for i, route, body, st, t in bad)
    assert sum(statuses.values()) == N_REQUESTS
    assert statuses.get(200, 0) > N_REQUESTS // 10 and sum(v for k, v in statuses.items() if 400 <= k < 500) > N_REQUESTS // 4
