"""/v1/messages (Anthropic) and /v1/responses (OpenAI Responses) end to end: the real binary
with the replay backend (scripted MiniMax-M2 tool calls and thinking), the MiniMax-M2.5 chat
template and the minimax_m2 parsers, driven by the official anthropic and openai SDKs."""
import json
import threading
import time

import anthropic
import httpx
import openai
import pytest

from conftest import PLAIN, REPO, TOOL, Server, encode

TEMPLATE = REPO / "tests/fixtures/shared-data/chat-templates/minimax-m2.5.jinja"
ANSWER = "Got the result.</think>\n\nIt is sunny in Paris."
THINK = "Let me think.</think>\n\nHello from the model. The end."
SCRIPTS = [{"marker": encode(" ANSWERTURN"), "tokens": encode(ANSWER)},
           {"marker": encode(" TOOLTEST"), "tokens": encode(TOOL)},
           {"marker": encode(" THINKTEST"), "tokens": encode(THINK)},
           # ~340 tokens (7 s on the 20 ms/step server): long enough to be caught in flight
           # however loaded the machine is.
           {"marker": encode(" LONGTEST"), "tokens": encode(PLAIN * 20)},
           {"marker": [], "tokens": encode(PLAIN)}]
ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "minimax_m2", "--reasoning-parser", "minimax_m2",
        "--chat-template", str(TEMPLATE)]
A_TOOLS = [{"name": "get_weather", "description": "Weather of a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}]
R_TOOLS = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
           for t in A_TOOLS]
ASK = [{"role": "user", "content": "What is the weather? TOOLTEST"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("agent"), ARGS, script_extra={"scripts": SCRIPTS})
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """API key on, 20 ms per engine step: for auth, disconnects and cancels."""
    s = Server(tmp_path_factory.mktemp("slow"), ARGS + ["--api-key", "sekret"],
               script_extra={"scripts": SCRIPTS, "step_sleep_us": 20000})
    yield s
    assert s.stop() == 0


def ant(s, **kw):
    return anthropic.Anthropic(base_url=s.base, api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


def oai(s, **kw):
    return openai.OpenAI(base_url=s.base + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


def sse_events(resp):
    """(event, data) pairs of an SSE response."""
    out, event = [], None
    for line in resp.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            out.append((event, json.loads(line[6:])))
    return out


def metric(s, name):
    return s.metrics().get(name + '{model_name="replay",engine="0"}', 0.0)


# ---------------------------------------------------------------------------- /v1/messages

def test_messages_tool_round_trip(srv):
    c = ant(srv)
    m = c.messages.create(model="replay", max_tokens=200, tools=A_TOOLS, messages=ASK)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "replay"
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[0].thinking == "I should look up the weather." and m.content[0].signature
    tu = m.content[1]
    assert tu.name == "get_weather" and tu.input == {"city": "Paris", "days": 3} and tu.id.startswith("call_")
    assert m.stop_reason == "tool_use" and m.stop_sequence is None
    count = c.messages.count_tokens(model="replay", tools=A_TOOLS, messages=ASK).input_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == count
    assert m.usage.output_tokens == len(encode(TOOL)) + 1  # + EOS

    # Streaming gives the same message.
    with c.messages.stream(model="replay", max_tokens=200, tools=A_TOOLS, messages=ASK) as st:
        kinds = [e.type for e in st]
        f = st.get_final_message()
    assert [b.type for b in f.content] == ["thinking", "tool_use"]
    assert f.content[0].thinking == m.content[0].thinking and f.content[1].input == tu.input
    assert f.stop_reason == "tool_use" and f.usage.output_tokens == m.usage.output_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"

    # The full assistant turn goes back with the tool result; the model answers.
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id,
                                                   "content": [{"type": "text", "text": "22C ANSWERTURN"}]}]}]
    m2 = c.messages.create(model="replay", max_tokens=200, tools=A_TOOLS, messages=history)
    assert [b.type for b in m2.content] == ["thinking", "text"]
    assert m2.content[1].text == "\n\nIt is sunny in Paris." and m2.stop_reason == "end_turn"
    count2 = c.messages.count_tokens(model="replay", tools=A_TOOLS, messages=history).input_tokens
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens == count2 > count
    # The thinking of the echoed turn is in the prompt: dropping it changes the count.
    no_think = [history[0], {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content[1:]]},
                history[2]]
    assert c.messages.count_tokens(model="replay", tools=A_TOOLS, messages=no_think).input_tokens < count2


def test_messages_stream_event_sequence(srv):
    with httpx.stream("POST", srv.base + "/v1/messages", headers={"anthropic-version": "2023-06-01"},
                      json={"model": "replay", "max_tokens": 200, "tools": A_TOOLS, "messages": ASK,
                            "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        ev = sse_events(r)
    assert all(e == d["type"] for e, d in ev)
    seq = [e for e, _ in ev]
    assert seq[:3] == ["message_start", "ping", "content_block_start"]
    assert seq[-2:] == ["message_delta", "message_stop"]
    start = ev[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    blocks = [d for e, d in ev if e == "content_block_start"]
    assert [b["content_block"]["type"] for b in blocks] == ["thinking", "tool_use"]
    assert [b["index"] for b in blocks] == [0, 1]
    deltas = [d["delta"] for e, d in ev if e == "content_block_delta"]
    kinds = [d["type"] for d in deltas]
    assert kinds.index("signature_delta") < kinds.index("input_json_delta")
    assert "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta") == "I should look up the weather."
    parts = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert len(parts) >= 2  # streamed per parameter
    assert json.loads("".join(parts)) == {"city": "Paris", "days": 3}
    assert [d["index"] for e, d in ev if e == "content_block_stop"] == [0, 1]
    md = ev[-2][1]
    assert md["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert md["usage"]["output_tokens"] == len(encode(TOOL)) + 1


def test_messages_text_stop_sequence_and_max_tokens(srv):
    c = ant(srv)
    msgs = [{"role": "user", "content": "Hi THINKTEST"}]
    m = c.messages.create(model="replay", max_tokens=200, messages=msgs, system="Be brief.")
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "Let me think." and m.content[1].text == "\n\nHello from the model. The end."
    assert m.stop_reason == "end_turn"
    s = c.messages.create(model="replay", max_tokens=200, messages=msgs, stop_sequences=["model", "zzz"])
    assert s.stop_reason == "stop_sequence" and s.stop_sequence == "model"
    assert s.content[-1].text == "\n\nHello from the "
    with c.messages.stream(model="replay", max_tokens=200, messages=msgs, stop_sequences=["model"]) as st:
        text = "".join(st.text_stream)
        f = st.get_final_message()
    assert text == "\n\nHello from the " and f.stop_reason == "stop_sequence" and f.stop_sequence == "model"
    t = c.messages.create(model="replay", max_tokens=3, messages=msgs)
    assert t.stop_reason == "max_tokens" and t.usage.output_tokens == 3
    assert [b.type for b in t.content] == ["thinking"]
    # Plain (no </think>): everything is thinking, as the chat route reports it as reasoning.
    p = c.messages.create(model="replay", max_tokens=200, messages=[{"role": "user", "content": "hello"}],
                          metadata={"user_id": "u1"},
                          extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5})
    assert [b.type for b in p.content] == ["thinking"] and p.content[0].thinking == PLAIN


def test_messages_thinking_maps_to_template(server):
    """Qwen3's template (conftest's server) honours enable_thinking: `thinking` reaches it."""
    c = ant(server)
    msgs = [{"role": "user", "content": "hello"}]
    on = c.messages.count_tokens(model="replay", messages=msgs,
                                 thinking={"type": "enabled", "budget_tokens": 1024}).input_tokens
    off = c.messages.count_tokens(model="replay", messages=msgs, thinking={"type": "disabled"}).input_tokens
    default = c.messages.count_tokens(model="replay", messages=msgs).input_tokens
    assert on == default and off > on  # disabled adds the empty <think></think> block
    tok = httpx.post(server.base + "/tokenize", json={"messages": msgs, "chat_template_kwargs":
                                                      {"enable_thinking": False}}).json()["count"]
    assert tok == off


def decode(ids):
    from tokenizers import Tokenizer
    from conftest import QWEN
    return Tokenizer.from_file(str(QWEN / "tokenizer.json")).decode(ids, skip_special_tokens=False)


def test_thinking_budget_is_enforced(srv):
    """thinking_token_budget (vLLM) / Anthropic thinking / Responses effort "none": the engine
    forces </think> once the budget is spent inside the section the MiniMax template opened;
    the replay script's next tokens then follow as the answer."""
    ids = encode(PLAIN)
    msgs = [{"role": "user", "content": "hello"}]
    # No budget: the whole plain script is reasoning (no </think> in it).
    free = oai(srv).chat.completions.create(model="replay", messages=msgs, max_tokens=200)
    assert free.choices[0].message.reasoning_content == PLAIN and not free.choices[0].message.content
    r = oai(srv).chat.completions.create(model="replay", messages=msgs, max_tokens=200,
                                         extra_body={"thinking_token_budget": 3})
    m = r.choices[0].message
    assert m.reasoning_content.strip() == decode(ids[:3]).strip()
    assert m.content.strip() == decode(ids[4:]).strip()  # token 3 was replaced by the forced </think>
    # Streaming: the same split.
    parts = {"reasoning": "", "content": ""}
    for ch in oai(srv).chat.completions.create(model="replay", messages=msgs, max_tokens=200, stream=True,
                                               extra_body={"thinking_token_budget": 3}):
        d = ch.choices[0].delta if ch.choices else None
        if d is not None:
            parts["reasoning"] += getattr(d, "reasoning_content", None) or ""
            parts["content"] += d.content or ""
    assert parts["reasoning"].strip() == m.reasoning_content.strip() and parts["content"] == m.content

    # Anthropic: disabled closes the section at once; enabled with a budget above the script's
    # length changes nothing.
    c = ant(srv)
    off = c.messages.create(model="replay", max_tokens=200, messages=msgs, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    assert off.content[0].text.strip() == decode(ids[1:]).strip()
    on = c.messages.create(model="replay", max_tokens=1500, messages=msgs,
                           thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in on.content] == ["thinking"] and on.content[0].thinking == PLAIN
    with c.messages.stream(model="replay", max_tokens=200, messages=msgs, thinking={"type": "disabled"}) as st:
        assert "".join(st.text_stream).strip() == off.content[0].text.strip()

    # Responses: reasoning effort "none".
    rn = oai(srv).responses.create(model="replay", input="hello", reasoning={"effort": "none"}, store=False)
    assert rn.output_text.strip() == decode(ids[1:]).strip()

    # Bad values: 400 naming the field.
    bad = httpx.post(srv.base + "/v1/chat/completions",
                     json={"model": "replay", "messages": msgs, "thinking_token_budget": -1})
    assert bad.status_code == 400 and "thinking_token_budget" in bad.text


def test_thinking_budget_needs_a_reasoning_parser(tmp_path):
    s = Server(tmp_path, [], script_extra={"scripts": SCRIPTS})
    try:
        msgs = [{"role": "user", "content": "hello"}]
        r = httpx.post(s.base + "/v1/chat/completions",
                       json={"model": "replay", "messages": msgs, "thinking_token_budget": 5})
        assert r.status_code == 400 and "--reasoning-parser" in r.json()["error"]["message"], r.text
        anth_error(s, {"model": "replay", "max_tokens": 10, "messages": msgs, "thinking": {"type": "disabled"}},
                   400, "invalid_request_error")
        # Without a budget the same request is served.
        assert httpx.post(s.base + "/v1/messages", json={"model": "replay", "max_tokens": 10,
                                                         "messages": msgs}).status_code == 200
    finally:
        assert s.stop() == 0


def anth_error(s, body, status, etype, message=None, path="/v1/messages", headers=None):
    r = httpx.post(s.base + path, json=body, headers=headers or {})
    assert r.status_code == status, r.text
    j = r.json()
    assert j["type"] == "error" and j["error"]["type"] == etype and set(j) == {"type", "error"}
    if message is not None:
        assert j["error"]["message"] == message
    return j["error"]["message"]


def test_messages_errors(srv):
    base = {"model": "replay", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    anth_error(srv, {k: v for k, v in base.items() if k != "max_tokens"}, 400, "invalid_request_error",
               "max_tokens: Field required")
    anth_error(srv, {**base, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f",
                                                                        "input": {}}]}]},
               400, "invalid_request_error", "messages.0.content.0: content block type 'tool_use' is not allowed "
                                             "in a user message")
    anth_error(srv, {**base, "messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}, 400, "invalid_request_error",
        "messages.0.content.0: content block type 'image' is not supported: this model accepts text only")
    anth_error(srv, {**base, "tools": A_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, 400,
               "invalid_request_error", "tool_choice.name: tool 'nope' is not in `tools`")
    msg = anth_error(srv, {**base, "messages": [{"role": "user", "content": "hi " * 3000}]}, 400,
                     "invalid_request_error")
    assert msg.startswith("prompt is too long: ") and "maximum context length is 2048 tokens" in msg
    anth_error(srv, {**base, "model": "claude-nope"}, 404, "not_found_error", "The model `claude-nope` does not exist.")
    anth_error(srv, {"model": "replay", "messages": "x"}, 400, "invalid_request_error",
               "messages: Input should be a valid list", path="/v1/messages/count_tokens")
    r = httpx.post(srv.base + "/v1/messages", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # The SDK raises its typed errors from these bodies.
    with pytest.raises(anthropic.BadRequestError) as e:
        ant(srv).messages.create(model="replay", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert httpx.get(srv.base + "/health").status_code == 200


def test_messages_body_too_large(server):
    """conftest's server caps bodies at 1 MB: 413 request_too_large in Anthropic's shape."""
    big = {"model": "replay", "max_tokens": 5, "messages": [{"role": "user", "content": "a" * 2_000_000}]}
    anth_error(server, big, 413, "request_too_large")
    r = httpx.post(server.base + "/v1/responses", json={"model": "replay", "input": "a" * 2_000_000})
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


def test_request_ids_and_metrics_on_all_routes(srv):
    name = 'vllm:request_success_total{model_name="replay",engine="0",finished_reason="stop"}'
    n0 = srv.metrics().get(name, 0.0)
    r = httpx.post(srv.base + "/v1/messages", headers={"x-request-id": "abc123"},
                   json={"model": "replay", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]})
    assert r.json()["id"] == "msg_abc123"
    r = httpx.post(srv.base + "/v1/responses", headers={"x-request-id": "abc124"},
                   json={"model": "replay", "input": "hi", "store": False})
    assert r.json()["id"] == "resp_abc124"
    assert srv.metrics()[name] == n0 + 2


def test_auth_and_disconnect(slow):
    body = {"model": "replay", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    anth_error(slow, body, 401, "authentication_error")
    anth_error(slow, body, 401, "authentication_error", headers={"x-api-key": "wrong"})
    m = ant(slow, api_key="sekret").messages.create(**body)  # the SDK sends x-api-key
    assert m.content[0].thinking == PLAIN
    assert oai(slow, api_key="sekret").responses.create(model="replay", input="hi", store=False).status == "completed"
    with pytest.raises(openai.AuthenticationError):
        oai(slow, api_key="wrong").responses.create(model="replay", input="hi")
    # A client that goes away mid-stream frees its engine request.
    aborts = 'vllm:request_success_total{model_name="replay",engine="0",finished_reason="abort"}'
    a0 = slow.metrics().get(aborts, 0.0)
    with httpx.stream("POST", slow.base + "/v1/messages", headers={"x-api-key": "sekret"},
                      json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if "content_block_delta" in line:
                break
    for _ in range(200):
        if slow.metrics().get(aborts, 0.0) > a0:
            break
        time.sleep(0.02)
    assert slow.metrics().get(aborts, 0.0) == a0 + 1
    assert metric(slow, "vllm:num_requests_running") == 0


# ---------------------------------------------------------------------------- /v1/responses

def test_responses_tool_round_trip(srv):
    c = oai(srv)
    r = c.responses.create(model="replay", input="What is the weather? TOOLTEST", tools=R_TOOLS,
                           instructions="Be brief.")
    assert r.id.startswith("resp_") and r.status == "completed" and r.object == "response"
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == "I should look up the weather." and r.output[0].summary == []
    fc = r.output[1]
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris", "days": 3}
    assert fc.call_id.startswith("call_") and fc.id.startswith("fc_")
    assert r.usage.output_tokens == len(encode(TOOL)) + 1 and r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens

    with c.responses.stream(model="replay", input="What is the weather? TOOLTEST", tools=R_TOOLS,
                            instructions="Be brief.") as st:
        events = [e.type for e in st]
        f = st.get_final_response()
    assert [o.type for o in f.output] == ["reasoning", "function_call"]
    assert f.output[1].arguments == fc.arguments and f.usage.output_tokens == r.usage.output_tokens
    assert events[:2] == ["response.created", "response.in_progress"] and events[-1] == "response.completed"
    for kind in ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                 "response.reasoning_text.done", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"]:
        assert kind in events, kind

    # Continue through the store, and again by sending the whole conversation: same prompt.
    out = [{"type": "function_call_output", "call_id": fc.call_id, "output": "22C ANSWERTURN"}]
    r2 = c.responses.create(model="replay", previous_response_id=r.id, input=out, tools=R_TOOLS,
                            instructions="Be brief.")
    assert r2.output_text == "\n\nIt is sunny in Paris." and r2.previous_response_id == r.id
    full = [{"role": "user", "content": "What is the weather? TOOLTEST"}] + \
        [o.model_dump(exclude_none=True) for o in r.output] + out
    r3 = c.responses.create(model="replay", input=full, tools=R_TOOLS, instructions="Be brief.", store=False)
    assert r3.output_text == r2.output_text and r3.usage.input_tokens == r2.usage.input_tokens
    # Equal to the Anthropic rendering of the same conversation.
    a = ant(srv).messages.count_tokens(
        model="replay", system="Be brief.", tools=A_TOOLS,
        messages=[{"role": "user", "content": "What is the weather? TOOLTEST"},
                  {"role": "assistant", "content": [
                      {"type": "thinking", "thinking": r.output[0].content[0].text, "signature": "s"},
                      {"type": "tool_use", "id": fc.call_id, "name": fc.name, "input": json.loads(fc.arguments)}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": fc.call_id,
                                                "content": "22C ANSWERTURN"}]}])
    assert a.input_tokens == r2.usage.input_tokens


def test_responses_stream_raw_sequence(srv):
    with httpx.stream("POST", srv.base + "/v1/responses",
                      json={"model": "replay", "input": "Hi THINKTEST", "stream": True, "store": False}) as r:
        ev = sse_events(r)
    assert all(e == d["type"] for e, d in ev)
    assert [d["sequence_number"] for _, d in ev] == list(range(len(ev)))
    seq = [e for e, _ in ev]
    assert seq[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                       "response.content_part.added", "response.reasoning_text.delta"]
    msg_start = seq.index("response.output_text.delta")
    assert seq[msg_start - 3:msg_start] == ["response.output_item.done", "response.output_item.added",
                                            "response.content_part.added"]
    assert seq[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                        "response.completed"]
    done = ev[-1][1]["response"]
    assert done["status"] == "completed" and done["output"][1]["content"][0]["text"] == "\n\nHello from the model. The end."
    text = "".join(d["delta"] for e, d in ev if e == "response.output_text.delta")
    assert text == done["output"][1]["content"][0]["text"]


def test_responses_store_get_delete_and_limits(srv):
    c = oai(srv)
    r = c.responses.create(model="replay", input="Hi THINKTEST", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    g = c.responses.retrieve(r.id)
    assert g.id == r.id and g.status == "incomplete" and g.output[0].content[0].text == r.output[0].content[0].text
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    n = c.responses.create(model="replay", input="Hi THINKTEST", store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(n.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="replay", input="x", previous_response_id="resp_nope")
    e = c.responses.create(model="replay", input="Hi THINKTEST", include=["reasoning.encrypted_content"],
                           reasoning={"effort": "low"})
    assert e.output[0].encrypted_content
    # The reasoning comes back through encrypted_content alone (store=false clients).
    item = {"type": "reasoning", "id": e.output[0].id, "summary": [], "encrypted_content": e.output[0].encrypted_content}
    with_item = c.responses.create(model="replay", store=False, input=[
        {"role": "user", "content": "Hi THINKTEST"}, item,
        {"role": "assistant", "content": e.output_text}, {"role": "user", "content": "again THINKTEST"}])
    assert with_item.status == "completed"


@pytest.mark.parametrize("body,fragment", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "only function tools are"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "json_schema needs a `schema`"),
    ({"input": "x", "background": True}, "background mode is not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "text only"),
    ({"input": "x", "tools": R_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "'nope' is not in"),
    ({"input": "hi " * 3000}, "maximum context length"),
    ({}, "input: Field required"),
])
def test_responses_errors(srv, body, fragment):
    r = httpx.post(srv.base + "/v1/responses", json={"model": "replay", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["code"] == 400


def test_responses_cancel_in_flight(slow):
    h = {"authorization": "Bearer sekret"}
    events = []

    def reader():
        with httpx.stream("POST", slow.base + "/v1/responses", headers=h,
                          json={"model": "replay", "input": "hi LONGTEST", "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
    t = threading.Thread(target=reader)
    t.start()
    for _ in range(500):
        if any(e["type"] == "response.reasoning_text.delta" for e in events):
            break
        time.sleep(0.01)
    rid = events[0]["response"]["id"]
    assert httpx.get(slow.base + f"/v1/responses/{rid}", headers=h).json()["status"] == "in_progress"
    c = httpx.post(slow.base + f"/v1/responses/{rid}/cancel", headers=h)
    assert c.status_code == 200 and c.json()["status"] == "cancelled"
    t.join(10)
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["status"] == "cancelled"
    stored = httpx.get(slow.base + f"/v1/responses/{rid}", headers=h).json()
    assert stored["status"] == "cancelled"
    again = httpx.post(slow.base + f"/v1/responses/{rid}/cancel", headers=h)
    assert again.status_code == 400 and "only an in-progress response" in again.json()["error"]["message"]
