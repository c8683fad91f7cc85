"""Qwen3 serving end to end: the real binary with the replay backend (scripted Qwen3 outputs),
the Qwen3 tokenizer and its own chat template, `--tool-call-parser hermes --reasoning-parser
qwen3`, driven by the openai SDK. Expected messages are what vLLM returns for these outputs:
reasoning split at </think>, tool calls with json.dumps(arguments, ensure_ascii=False),
content before the first <tool_call>; streaming assembles to the same message."""
import json

import httpx
import pytest

from conftest import Server, encode

THINK_CALLS = ("<think>\nNeed the weather of two cities.\n</think>\n\n<tool_call>\n"
               "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n"
               "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"S\\u00e3o Paulo\"}}\n</tool_call>")
THINK_ANSWER = "<think>\nTwo plus two.\n</think>\n\nIt is 4."
NO_THINK = "It is 4, without thinking."
BROKEN = "<think>\nhmm\n</think>\n\n<tool_call>\n{\"name\": get_weather}\n</tool_call>"
SCRIPTS = [{"marker": encode(" QCALLS"), "tokens": encode(THINK_CALLS)},
           {"marker": encode(" QANSWER"), "tokens": encode(THINK_ANSWER)},
           {"marker": encode(" QNOTHINK"), "tokens": encode(NO_THINK)},
           {"marker": encode(" QBROKEN"), "tokens": encode(BROKEN)}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("qwen3"),
               ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"],
               script_extra={"scripts": SCRIPTS})
    yield s
    assert s.stop() == 0


def ask(word):
    return [{"role": "user", "content": f"Question{word}"}]


def both(srv, messages, **kw):
    """(non-streaming message dict, finish_reason), and the same assembled from the stream."""
    body = {"model": "replay", "messages": messages, "tools": TOOLS, **kw}
    r = httpx.post(srv.base + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    msg = ch["message"]
    calls, reasoning, content, finish = {}, None, None, None
    with httpx.stream("POST", srv.base + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as s:
        for line in s.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:])["choices"]:
                d = c["delta"]
                # (the first delta carries role and content "", as vLLM's does)
                if d.get("reasoning"):
                    reasoning = (reasoning or "") + d["reasoning"]
                if d.get("content"):
                    content = (content or "") + d["content"]
                for tc in d.get("tool_calls") or []:
                    e = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                    if "id" in tc:
                        assert e["id"] is None and tc["type"] == "function"  # id and name come once, first
                        e["id"] = tc["id"]
                    e["name"] += tc["function"].get("name") or ""
                    e["arguments"] += tc["function"].get("arguments") or ""
                finish = c.get("finish_reason") or finish
    streamed = {"reasoning": reasoning, "content": content,
                "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}
    return msg, ch["finish_reason"], streamed


def test_reasoning_then_parallel_tool_calls(srv):
    msg, finish, st = both(srv, ask(" QCALLS"))
    assert finish == "tool_calls"
    assert msg["reasoning"] == msg["reasoning_content"] == "\nNeed the weather of two cities.\n"
    assert msg["content"] == "\n\n"  # vLLM: the text between </think> and the first <tool_call>
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
    assert got == [("get_weather", '{"city": "Paris", "days": 3}'), ("get_weather", '{"city": "São Paulo"}')]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in msg["tool_calls"])
    assert st["finish_reason"] == "tool_calls"
    assert st["reasoning"] == msg["reasoning"] and st["content"] == msg["content"]
    assert [(c["name"], c["arguments"]) for c in st["tool_calls"]] == got


def test_reasoning_and_answer(srv):
    msg, finish, st = both(srv, ask(" QANSWER"))
    assert finish == "stop" and not msg["tool_calls"]
    assert msg["reasoning"] == "\nTwo plus two.\n" and msg["content"] == "\n\nIt is 4."
    assert (st["reasoning"], st["content"], st["tool_calls"]) == (msg["reasoning"], msg["content"], [])


def test_enable_thinking_false_is_all_content(srv):
    # The template closes the think block in the prompt: the output is content, not reasoning.
    kw = {"chat_template_kwargs": {"enable_thinking": False}}
    msg, finish, st = both(srv, ask(" QNOTHINK"), **kw)
    assert finish == "stop"
    assert msg["content"] == NO_THINK and msg["reasoning"] is None
    assert st["content"] == NO_THINK and st["reasoning"] is None
    # Thinking on (the default) and no </think>: the output is reasoning (cut off while thinking).
    msg, _, st = both(srv, ask(" QNOTHINK"))
    assert msg["reasoning"] == NO_THINK and msg["content"] is None
    assert st["reasoning"] == NO_THINK and st["content"] is None


def test_malformed_tool_call_is_content(srv):
    msg, finish, st = both(srv, ask(" QBROKEN"))
    assert finish == "stop" and not msg["tool_calls"]
    assert msg["content"] == "\n\n<tool_call>\n{\"name\": get_weather}\n</tool_call>"
    assert st["content"] == msg["content"] and st["tool_calls"] == []


def test_tool_choice_none_keeps_text(srv):
    msg, finish, _ = both(srv, ask(" QCALLS"), tool_choice="none")
    assert finish == "stop" and not msg["tool_calls"] and msg["content"].startswith("\n\n<tool_call>\n")


def test_forced_tool_call_grammar_compiles(srv):
    # The request path only (generation under the grammar is tested on the tiny model in
    # test_structured_outputs.py): the hermes grammar is compiled, a bad schema is a 400 naming the tool.
    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "not": {"const": 2}}}}}}]
    r = httpx.post(srv.base + "/v1/chat/completions", timeout=60, json={
        "model": "replay", "messages": ask(" QCALLS"), "tools": bad, "tool_choice": "required"})
    assert r.status_code == 400 and "parameters of tool 'f'" in r.text, r.text
