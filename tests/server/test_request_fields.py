"""Issue 17 item 9 and issue 25 item 1 through the real server and the official openai SDK
(vLLM fields via extra_body): every vLLM sampling field works as in vLLM or is refused with a
400 naming it; numeric fields have finite ranges; extreme values never hurt the engine.

The replay backend forces each scripted token with logit 30 and every other id 0, so the
effect of a field on greedy decoding is exact: the token ids come back through logprobs with
return_tokens_as_token_ids."""
import json

import httpx
import openai
import pytest

from conftest import EOS, PLAIN, Server, encode

VOCAB = 151669  # the replay script's vocab_size


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("fields"), ["--reasoning-parser", "minimax_m2"])
    yield s
    assert s.stop() == 0


def completion_ids(client, prompt="Say hi", **extra):
    """Greedy completion; returns (token ids, response)."""
    extra = {"return_tokens_as_token_ids": True, **extra}
    r = client.completions.create(model="replay", prompt=prompt, max_tokens=extra.pop("max_tokens", 6),
                                  temperature=0, logprobs=0, extra_body=extra)
    toks = r.choices[0].logprobs.tokens
    assert all(t.startswith("token_id:") for t in toks), toks
    return [int(t.split(":")[1]) for t in toks], r


def expect_400(fn, field):
    with pytest.raises(openai.BadRequestError) as e:
        fn()
    assert e.value.status_code == 400
    body = e.value.body if isinstance(e.value.body, dict) else {}
    assert field in str(e.value) or body.get("param") == field, str(e.value)
    return str(e.value)


def test_script_baseline(srv):
    ids, _ = completion_ids(srv.client())
    assert ids == encode(PLAIN)[:6]


def test_logit_bias_under_greedy(srv):
    c = srv.client()
    target = encode(" banana")[0]
    ids, _ = completion_ids(c, logit_bias={str(target): 100})
    assert ids == [target] * 6
    # The OpenAI SDK's own parameter, on chat too.
    r = c.chat.completions.create(model="replay", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                  temperature=0, logit_bias={str(target): 100}, logprobs=True,
                                  extra_body={"return_tokens_as_token_ids": True})
    assert [t.token for t in r.choices[0].logprobs.content] == [f"token_id:{target}"] * 4
    # Values are clamped to [-100, 100]: 1e6 acts as 100, -1e6 pushes the forced token below 0.
    assert completion_ids(c, logit_bias={str(target): 1e6})[0] == [target] * 6
    first = encode(PLAIN)[0]
    ids, _ = completion_ids(c, logit_bias={str(first): -1e6}, max_tokens=1)
    assert ids == [0]  # every other id ties at 0: the lowest wins
    # Python int() spellings of the key, and the errors of vLLM.
    assert completion_ids(c, logit_bias={f" +{target} ": 100}, max_tokens=2)[0] == [target] * 2
    expect_400(lambda: completion_ids(c, logit_bias={"abc": 1}), "logit_bias")
    msg = expect_400(lambda: completion_ids(c, logit_bias={str(VOCAB): 1}), "logit_bias")
    assert "out-of-vocab" in msg
    expect_400(lambda: completion_ids(c, logit_bias={"-1": 1}), "logit_bias")
    expect_400(lambda: completion_ids(c, logit_bias={"5": "x"}), "logit_bias")


def test_allowed_token_ids(srv):
    c = srv.client()
    allowed = [11, 12, encode(PLAIN)[3]]
    ids, _ = completion_ids(c, allowed_token_ids=allowed)
    assert set(ids) <= set(allowed)
    assert ids[0] == 11  # the forced token is not allowed: the lowest allowed id wins the tie
    assert ids[3] == allowed[2]  # the fourth scripted token is allowed and forced
    expect_400(lambda: completion_ids(c, allowed_token_ids=[]), "allowed_token_ids")
    expect_400(lambda: completion_ids(c, allowed_token_ids=[VOCAB]), "allowed_token_ids")


def test_bad_words(srv):
    c = srv.client()
    script = encode(PLAIN)
    # "Hello" begins the script: both its plain and its leading-space form are banned.
    ids, _ = completion_ids(c, bad_words=["Hello"], max_tokens=3)
    assert ids[0] != script[0] and script[0] not in ids
    # A two-token word: its last token is banned only right after its first.
    words = encode(" there!")
    assert len(words) == 2 and script[1:3] == words
    ids, _ = completion_ids(c, bad_words=[" there!"], max_tokens=4)
    assert ids[:2] == script[:2] and ids[2] != script[2]
    # A chat request takes them too.
    r = c.chat.completions.create(model="replay", messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                  temperature=0, extra_body={"bad_words": ["Hello"]})
    m = r.choices[0].message
    assert not ((getattr(m, "reasoning_content", None) or "") + (m.content or "")).startswith("Hello")
    expect_400(lambda: completion_ids(c, bad_words="Hello"), "bad_words")


def test_min_tokens_masks_eos_and_delays_stop_strings(srv):
    c = srv.client()
    n = len(encode(PLAIN))
    r = c.completions.create(model="replay", prompt="x", max_tokens=n + 10, temperature=0)
    assert r.usage.completion_tokens == n + 1 and r.choices[0].finish_reason == "stop"  # the script, then EOS
    # EOS is masked until min_tokens are generated (the replay then forces EOS, so id 0 wins).
    r = c.completions.create(model="replay", prompt="x", max_tokens=n + 10, temperature=0,
                             extra_body={"min_tokens": n + 4})
    assert r.usage.completion_tokens == n + 5 and r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == PLAIN + "!" * 4
    # Stop strings are looked for only once more than min_tokens tokens exist (vLLM): "Hello"
    # ends at token 1, so with min_tokens 3 it never stops the text.
    r = c.completions.create(model="replay", prompt="x", max_tokens=100, temperature=0, stop=["there"])
    assert r.choices[0].text == "Hello "
    r = c.completions.create(model="replay", prompt="x", max_tokens=100, temperature=0, stop=["Hello"],
                             extra_body={"min_tokens": 3})
    assert r.choices[0].text == PLAIN


def test_skip_special_tokens_and_include_stop_str(srv):
    c = srv.client()
    body = {"include_stop_str_in_output": True}
    r = c.completions.create(model="replay", prompt="x", max_tokens=100, temperature=0,
                             extra_body={**body, "skip_special_tokens": False})
    assert r.choices[0].text == PLAIN + "<|im_end|>"
    r = c.completions.create(model="replay", prompt="x", max_tokens=100, temperature=0, extra_body=body)
    assert r.choices[0].text == PLAIN  # the EOS is decoded but skipped as special
    r = c.completions.create(model="replay", prompt="x", max_tokens=100, temperature=0, stop=["help"],
                             extra_body=body)
    assert r.choices[0].text.endswith("help") and r.choices[0].finish_reason == "stop"
    # spaces_between_special_tokens: accepted; a tokenizer.json tokenizer decodes the same
    # either way (vLLM's fast detokenizer does not read it).
    a = c.completions.create(model="replay", prompt="x", max_tokens=100, temperature=0,
                             extra_body={"skip_special_tokens": False, "spaces_between_special_tokens": False,
                                         **body})
    assert a.choices[0].text == PLAIN + "<|im_end|>"
    expect_400(lambda: c.completions.create(model="replay", prompt="x",
                                            extra_body={"spaces_between_special_tokens": "no"}),
               "spaces_between_special_tokens")


def test_truncate_prompt_tokens(srv):
    c = srv.client()
    prompt = list(range(100, 150))
    r = c.completions.create(model="replay", prompt=prompt, max_tokens=1, echo=True,
                             extra_body={"truncate_prompt_tokens": 10})
    assert r.usage.prompt_tokens == 10
    text = "one two three four five six seven eight nine ten eleven twelve"
    full = c.completions.create(model="replay", prompt=text, max_tokens=1).usage.prompt_tokens
    assert full > 5
    # The last tokens are kept (vLLM truncates on the left): the TOOLTEST marker at the start
    # is cut off, so the replay picks the plain script instead of the tool script.
    tool = c.completions.create(model="replay", prompt="TOOLTEST " + text, max_tokens=3, temperature=0)
    assert tool.choices[0].text.startswith("I should")
    r = c.completions.create(model="replay", prompt="TOOLTEST " + text, max_tokens=3, temperature=0,
                             extra_body={"truncate_prompt_tokens": 5})
    assert r.usage.prompt_tokens == 5 and r.choices[0].text.startswith("Hello")
    r = c.chat.completions.create(model="replay", messages=[{"role": "user", "content": text}], max_tokens=1,
                                  extra_body={"truncate_prompt_tokens": 7})
    assert r.usage.prompt_tokens == 7
    r = c.completions.create(model="replay", prompt=text, max_tokens=1, extra_body={"truncate_prompt_tokens": -1})
    assert r.usage.prompt_tokens == full
    msg = expect_400(lambda: c.completions.create(model="replay", prompt=text,
                                                  extra_body={"truncate_prompt_tokens": 5000}),
                     "truncate_prompt_tokens")
    assert "greater than max_model_len" in msg
    expect_400(lambda: c.completions.create(model="replay", prompt=text, extra_body={"truncate_prompt_tokens": 0}),
               "truncate_prompt_tokens")


def test_include_reasoning(srv):
    c = srv.client()
    msgs = [{"role": "user", "content": "TOOLTEST"}]
    r = c.chat.completions.create(model="replay", messages=msgs, max_tokens=200)
    assert r.choices[0].message.reasoning_content
    r = c.chat.completions.create(model="replay", messages=msgs, max_tokens=200,
                                  extra_body={"include_reasoning": False})
    assert not getattr(r.choices[0].message, "reasoning_content", None)
    assert "look up the weather" not in (r.choices[0].message.content or "")


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("field,value", [
    ("prompt_logprobs", 1), ("use_beam_search", True), ("best_of", 2), ("priority", 1), ("cache_salt", ""),
    ("cache_salt", 5), ("logits_processors", ["my.Processor"]),
])
def test_unimplemented_fields_refused(srv, route, field, value):
    c = srv.client()
    if route == "chat":
        fn = lambda: c.chat.completions.create(model="replay", messages=[{"role": "user", "content": "x"}],
                                               max_tokens=2, extra_body={field: value})
    else:
        fn = lambda: c.completions.create(model="replay", prompt="x", max_tokens=2, extra_body={field: value})
    expect_400(fn, field)


def test_chat_echo(srv):
    c = srv.client()
    m = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure: "}]
    # The last message has the reply's role only without a generation prompt (as vLLM).
    r = c.chat.completions.create(model="replay", messages=m, max_tokens=3, temperature=0,
                                  extra_body={"echo": True, "add_generation_prompt": False,
                                              "continue_final_message": True})
    full = r.choices[0].message.content
    plain = c.chat.completions.create(model="replay", messages=m, max_tokens=3, temperature=0,
                                      extra_body={"add_generation_prompt": False, "continue_final_message": True})
    assert full == "Sure: " + (plain.choices[0].message.content or "")
    r = c.chat.completions.create(model="replay", messages=m[:1], max_tokens=3, temperature=0,
                                  extra_body={"echo": True})  # user last, assistant reply: nothing echoed
    assert not (r.choices[0].message.content or "").startswith("x")
    stream = c.chat.completions.create(model="replay", messages=m, max_tokens=3, temperature=0, stream=True,
                                       extra_body={"echo": True, "add_generation_prompt": False,
                                                   "continue_final_message": True})
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == full


def test_route_specific_refusals(srv):
    c = srv.client()
    m = [{"role": "user", "content": "x"}]
    expect_400(lambda: c.chat.completions.create(model="replay", messages=m, extra_body={"chat_template": "{{ 1 }}"}),
               "chat_template")
    expect_400(lambda: c.completions.create(model="replay", prompt="x", extra_body={"prompt_embeds": "AAAA"}),
               "prompt_embeds")
    expect_400(lambda: c.completions.create(model="replay", prompt="x", suffix="y"), "suffix")


def test_fields_vllm_ignores_are_accepted(srv):
    c = srv.client()
    extra = {"mm_processor_kwargs": {}, "kv_transfer_params": {"a": 1}, "vllm_xargs": {"k": 1}, "length_penalty": 2.0,
             "some_unknown_field": [1, 2], "priority": 0, "best_of": 1, "use_beam_search": False,
             "prompt_logprobs": None, "logits_processors": None, "documents": [{"title": "t", "text": "d"}]}
    r = c.chat.completions.create(model="replay", messages=[{"role": "user", "content": "x"}], max_tokens=3, user="u",
                                  parallel_tool_calls=False, metadata={"k": "v"}, store=False, extra_body=extra)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    extra.pop("documents")
    r = c.completions.create(model="replay", prompt="x", max_tokens=3, user="u", extra_body=extra)
    assert r.usage.completion_tokens == 3


def raw(srv, path, body_text):
    return httpx.post(srv.base + path, content=body_text, headers={"content-type": "application/json"}, timeout=30)


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", "1e-38"), ("repetition_penalty", "0"), ("repetition_penalty", "1e9"),
    ("temperature", "1e400"), ("temperature", "-1"), ("temperature", "1e39"), ("top_p", "0"), ("top_p", "1.5"),
    ("top_k", "-2"), ("min_p", "1.01"), ("presence_penalty", "2.5"), ("frequency_penalty", "-1e300"),
    ("seed", str(2**64)), ("logit_bias", '{"5": 1e400}'), ("n", "0"), ("max_tokens", "0"), ("min_tokens", "-1"),
])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_numeric_ranges(srv, field, value, route):
    base = '"messages":[{"role":"user","content":"x"}]' if "chat" in route else '"prompt":"x"'
    r = raw(srv, route, '{"model":"replay",' + base + ',"max_tokens":2,"' + field + '":' + value + '}')
    assert r.status_code == 400, (field, value, r.text)
    assert r.json()["error"]["type"] == "BadRequestError"
    # A number beyond a double fails in the JSON parser, before any field is known.
    assert field in r.text or "1e400" in value
    assert httpx.get(srv.base + "/health").status_code == 200


@pytest.mark.parametrize("extra", [
    {"repetition_penalty": 0.001}, {"repetition_penalty": 1000}, {"temperature": 1e30}, {"temperature": 1e-30},
    {"top_k": 2**31 - 1}, {"top_k": 2**40}, {"min_p": 1.0}, {"top_p": 1e-30}, {"frequency_penalty": -2},
    {"presence_penalty": 2}, {"seed": -2**63}, {"seed": 2**63 - 1}, {"logit_bias": {"0": -100, "1": 100}},
    {"repetition_penalty": 0.001, "frequency_penalty": 2, "presence_penalty": 2, "min_p": 1.0, "temperature": 5},
])
def test_extreme_valid_values_serve(srv, extra):
    c = srv.client()
    for n in (1, 2):
        r = c.completions.create(model="replay", prompt="x", max_tokens=4, n=n, extra_body=extra)
        assert all(ch.finish_reason in ("length", "stop") for ch in r.choices), r
    assert httpx.get(srv.base + "/health").status_code == 200


def test_everything_masked_fails_only_that_request(srv):
    c = srv.client()
    amp = encode("&")
    assert len(amp) == 1
    for stream in (False, True):
        body = {"allowed_token_ids": amp, "bad_words": ["&"]}
        if stream:
            with pytest.raises(openai.APIError) as e:
                for _ in c.completions.create(model="replay", prompt="x", max_tokens=3, stream=True, extra_body=body):
                    pass
        else:
            with pytest.raises(openai.InternalServerError) as e:
                c.completions.create(model="replay", prompt="x", max_tokens=3, extra_body=body)
        assert "no token can be sampled" in str(e.value), str(e.value)
    assert httpx.get(srv.base + "/health").status_code == 200
    assert completion_ids(c)[0] == encode(PLAIN)[:6]


def test_cache_salt_separates_prefix_cache(srv):
    c = srv.client()
    prompt = list(range(1000, 1100))  # 100 tokens: 6 full blocks of 16

    def counter():
        return sum(v for k, v in srv.metrics().items() if k.startswith("vllm:prefix_cache_hits_total"))

    def hits(**extra):
        before = counter()
        c.completions.create(model="replay", prompt=prompt, max_tokens=1, extra_body=extra)
        return counter() - before

    hits()  # caches the unsalted prefix
    assert hits() == 96
    assert hits(cache_salt="alice") == 0  # salted: the unsalted blocks are not visible
    assert hits(cache_salt="alice") == 96
    assert hits(cache_salt="bob") == 0
    assert hits() == 96
