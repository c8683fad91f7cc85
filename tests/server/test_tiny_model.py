"""End-to-end with the real MiniMax-M2 CPU executor: `moeserve make-tiny` (tiny checkpoint +
built-in tokenizer and chat template) served with `--device cpu`, driven by the openai SDK.
The random tiny checkpoint (make-tiny) end to end; scripts/run.sh serves the trained demo model (test_demo_model.py)."""
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import REPO, free_port

NAME = "tiny-minimax-m2"
MSG = [{"role": "user", "content": "Hello, who are you?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    binary = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
    tmp = tmp_path_factory.mktemp("tiny")
    model = tmp / "model"
    subprocess.run([binary, "make-tiny", str(model)], check=True, capture_output=True)
    assert (model / "tokenizer.json").exists() and (model / "tokenizer_config.json").exists()
    port = free_port()
    log = open(tmp / "server.log", "w")
    # Underscore spellings are accepted as vLLM's argparse does.
    proc = subprocess.Popen([binary, "serve", str(model), "--served-model-name", NAME, "--device", "cpu",
                             "--host", "127.0.0.1", "--port", str(port), "--max_model_len=2048",
                             "--enable_request_id_headers"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (tmp / "server.log").read_text()
        time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("server did not start: " + (tmp / "server.log").read_text())
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    log.close()


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)


def metrics(base):
    out = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def metric(m, name, extra=""):
    return m[f'{name}{{model_name="{NAME}",engine="0"{extra}}}']


def test_models_and_health(tiny):
    models = client(tiny).models.list()
    assert [m.id for m in models.data] == [NAME]
    assert models.data[0].owned_by == "vllm"  # clients detect vLLM servers by it
    assert models.data[0].model_extra["max_model_len"] == 2048  # from --max_model_len=2048
    assert httpx.get(tiny + "/health").status_code == 200


def test_request_id_header(tiny):
    body = {"model": NAME, "prompt": "id", "max_tokens": 2, "temperature": 0}
    r = httpx.post(tiny + "/v1/completions", json=body, headers={"X-Request-Id": "my-req-42"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "my-req-42"
    assert r.json()["id"] == "cmpl-my-req-42"
    # The same id again, concurrently reused ids included, is fine (engine ids stay unique).
    r2 = httpx.post(tiny + "/v1/completions", json={**body, "stream": True}, headers={"X-Request-Id": "my-req-42"})
    assert r2.status_code == 200 and '"id":"cmpl-my-req-42"' in r2.text
    assert r2.headers["x-request-id"] == "my-req-42"
    # Without the header: a fresh id on the response header too (--enable-request-id-headers).
    r3 = httpx.get(tiny + "/v1/models")
    assert len(r3.headers["x-request-id"]) >= 16


def test_chat_stream_equals_nonstream_greedy(tiny):
    c = client(tiny)
    r = c.chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=24)
    text = r.choices[0].message.content
    assert r.usage.completion_tokens == 24 or r.choices[0].finish_reason == "stop"
    assert text, "the tiny model answers with text"
    s = c.chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=24, stream=True,
                                  stream_options={"include_usage": True})
    streamed, usage, finish = "", None, []
    for ch in s:
        if ch.usage:
            usage = ch.usage
        for x in ch.choices:
            streamed += x.delta.content or ""
            if x.finish_reason:
                finish.append(x.finish_reason)
    assert streamed == text
    assert finish == [r.choices[0].finish_reason]
    assert usage.completion_tokens == r.usage.completion_tokens and usage.prompt_tokens == r.usage.prompt_tokens
    # The prompt went through the MiniMax-M2 chat template: /tokenize with the same messages
    # counts the same prompt tokens.
    tok = httpx.post(tiny + "/tokenize", json={"model": NAME, "messages": MSG}).json()
    assert tok["count"] == r.usage.prompt_tokens


def test_completions_logprobs(tiny):
    r = client(tiny).completions.create(model=NAME, prompt="The quick brown fox", max_tokens=8, temperature=0,
                                        logprobs=3)
    ch = r.choices[0]
    lp = ch.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert v <= 0
        # 3 alternatives plus the sampled token, keyed by text (ids decoding to the same text
        # share a key, as in vLLM).
        assert 1 <= len(top) <= 4
        # Greedy: no alternative is more likely than the chosen token.
        assert max(top.values()) <= v + 1e-4


def test_n2_and_seed_reproducibility(tiny):
    c = client(tiny)
    kw = dict(model=NAME, prompt="Once upon a time", max_tokens=16, temperature=1.0)
    a = c.completions.create(n=2, seed=1234, **kw)
    assert len(a.choices) == 2 and sorted(ch.index for ch in a.choices) == [0, 1]
    b = c.completions.create(n=2, seed=1234, **kw)
    assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]
    d = c.completions.create(n=2, seed=99, **kw)
    assert [ch.text for ch in a.choices] != [ch.text for ch in d.choices]
    # n choices use seeds seed + index (vLLM's parallel sampling): choice 1 of seed 1234
    # equals choice 0 of seed 1235.
    e = c.completions.create(n=1, seed=1235, **kw)
    assert e.choices[0].text == a.choices[1].text


def test_tokenize_detokenize_round_trip(tiny):
    text = "Hello world, tiny model! 123 <think>x</think>"
    tok = httpx.post(tiny + "/tokenize", json={"model": NAME, "prompt": text, "add_special_tokens": False,
                                              "return_token_strs": True}).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and len(tok["token_strs"]) == tok["count"]
    assert 2005 in tok["tokens"] and 2006 in tok["tokens"], "<think> / </think> are added tokens"
    back = httpx.post(tiny + "/detokenize", json={"model": NAME, "tokens": tok["tokens"]}).json()
    assert back["prompt"] == text


def test_metrics_move(tiny):
    before = metrics(tiny)
    r = client(tiny).completions.create(model=NAME, prompt="Counting metrics", max_tokens=5, temperature=0)
    assert r.usage.completion_tokens >= 1
    after = metrics(tiny)

    def delta(name, extra=""):
        return metric(after, name, extra) - metric(before, name, extra)

    assert delta("vllm:prompt_tokens_total") == r.usage.prompt_tokens
    assert delta("vllm:generation_tokens_total") == r.usage.completion_tokens
    assert delta("vllm:request_success_total", f',finished_reason="{r.choices[0].finish_reason}"') == 1
    for h in ["vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
              "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds",
              "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_params_n",
              "vllm:request_params_max_tokens"]:
        assert delta(h + "_count") == 1, h
    # One prefill step plus one decode step per further token.
    assert delta("vllm:iteration_tokens_total_count") == r.usage.completion_tokens
    assert delta("vllm:iteration_tokens_total_sum") == r.usage.prompt_tokens + r.usage.completion_tokens - 1
    assert metric(after, "vllm:num_requests_running") == 0
    assert metric(after, "vllm:num_preemptions_total") >= 0


def test_anthropic_and_responses_plain_paths(tiny):
    """The real model through /v1/messages and /v1/responses (no parsers configured: all text).
    Greedy, so every API and mode yields the chat route's text for the same conversation."""
    import anthropic
    chat = client(tiny).chat.completions.create(model=NAME, messages=MSG, temperature=0, max_tokens=12)
    want = chat.choices[0].message.content
    a = anthropic.Anthropic(base_url=tiny, api_key="none", max_retries=0)
    m = a.messages.create(model=NAME, max_tokens=12, messages=MSG, extra_body={"temperature": 0})
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == want
    assert m.stop_reason == ("max_tokens" if chat.choices[0].finish_reason == "length" else "end_turn")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert m.usage.output_tokens == chat.usage.completion_tokens
    assert a.messages.count_tokens(model=NAME, messages=MSG).input_tokens == chat.usage.prompt_tokens
    with a.messages.stream(model=NAME, max_tokens=12, messages=MSG, extra_body={"temperature": 0}) as st:
        assert "".join(st.text_stream) == want
        assert st.get_final_message().usage.output_tokens == m.usage.output_tokens
    r = client(tiny).responses.create(model=NAME, input=MSG, temperature=0, max_output_tokens=12)
    assert r.output_text == want and r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    with client(tiny).responses.stream(model=NAME, input=MSG, temperature=0, max_output_tokens=12) as st:
        assert "".join(e.delta for e in st if e.type == "response.output_text.delta") == want
        assert st.get_final_response().output_text == want


def test_vllm_logits_processors_on_the_real_executor(tiny):
    """logit_bias / allowed_token_ids / bad_words / penalties on the MiniMax-M2 CPU executor:
    each has its effect, and extreme or non-finite values are refused without hurting it."""
    c = client(tiny)

    def ids(**extra):
        r = c.completions.create(model=NAME, prompt="Hello", max_tokens=6, temperature=0, logprobs=0,
                                 extra_body={"return_tokens_as_token_ids": True, **extra})
        return [int(t.split(":")[1]) for t in r.choices[0].logprobs.tokens]

    base = ids()
    assert ids(logit_bias={"77": 100}) == [77] * 6
    assert set(ids(allowed_token_ids=[40, 41, 42])) <= {40, 41, 42}
    banned = ids(logit_bias={str(base[0]): -100})
    assert banned[0] != base[0]
    r = c.completions.create(model=NAME, prompt="Hello", max_tokens=8, temperature=0.8, seed=3,
                             extra_body={"repetition_penalty": 1.5, "presence_penalty": 1.0,
                                         "frequency_penalty": 1.0, "min_tokens": 4})
    assert r.usage.completion_tokens >= 4
    for bad in ({"repetition_penalty": 1e-38}, {"temperature": -1}, {"logit_bias": {"77": "x"}}):
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model=NAME, prompt="Hello", max_tokens=2, extra_body=bad)
    assert ids() == base  # the engine is unharmed and still deterministic


def test_prompt_logprobs(tiny):
    c = client(tiny)
    ids = c.completions.create(model=NAME, prompt="The quick brown fox jumps", max_tokens=1, temperature=0,
                               extra_body={"prompt_logprobs": 2}).usage.prompt_tokens
    prompt = list(range(5, 5 + ids))  # token-id prompt
    r = c.completions.create(model=NAME, prompt=prompt, max_tokens=2, temperature=0,
                             extra_body={"prompt_logprobs": 2})
    pl = r.choices[0].model_extra["prompt_logprobs"]
    assert len(pl) == len(prompt) and pl[0] is None
    for p in range(1, len(prompt)):
        entry = {int(k): v for k, v in pl[p].items()}
        assert prompt[p] in entry and 2 <= len(entry) <= 3
        # Oracle: the greedy next token after prompt[:p], with its logprob, is the rank-1 entry.
        g = c.completions.create(model=NAME, prompt=prompt[:p], max_tokens=1, temperature=0, logprobs=1)
        top1 = [v for v in entry.values() if v["rank"] == 1][0]
        assert abs(g.choices[0].logprobs.token_logprobs[0] - top1["logprob"]) < 1e-3
        assert all(v["logprob"] <= 0 for v in entry.values())
    # Chat: top-level prompt_logprobs, same shape; streaming with k > 0 is refused (vLLM).
    m = [{"role": "user", "content": "hi there"}]
    cr = c.chat.completions.create(model=NAME, messages=m, max_tokens=2, temperature=0,
                                   extra_body={"prompt_logprobs": 2})
    cpl = cr.model_extra["prompt_logprobs"]
    assert cpl[0] is None and len(cpl) == cr.usage.prompt_tokens and all(isinstance(e, dict) for e in cpl[1:])
    with pytest.raises(openai.BadRequestError, match="stream"):
        c.chat.completions.create(model=NAME, messages=m, max_tokens=2, stream=True, extra_body={"prompt_logprobs": 2})
    with pytest.raises(openai.BadRequestError, match="stream"):
        c.completions.create(model=NAME, prompt="x", max_tokens=2, stream=True, extra_body={"prompt_logprobs": 2})
    # prompt_logprobs 0 with stream is accepted as in vLLM (its stream carries no prompt logprobs).
    chunks = list(c.completions.create(model=NAME, prompt="x y", max_tokens=2, stream=True,
                                       extra_body={"prompt_logprobs": 0}))
    assert chunks
