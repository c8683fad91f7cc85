"""`serve --speculative-config` end to end on the replay backend (a periodic script, so n-gram
drafts are accepted): completions (plain and streamed, with a stop string landing inside an
accepted run) are the same with speculation on and off, /metrics carries vLLM's spec-decode
counters, the stats log has the "SpecDecoding metrics" line, and refusals come before loading."""
import json
import re
import subprocess
import time

import httpx
import pytest

from test_serve_cli import BIN, QWEN, EOS, Serve, run  # noqa: F401
import shutil

SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}'


@pytest.fixture
def model(tmp_path):
    m = tmp_path / "model"
    m.mkdir()
    shutil.copy(QWEN / "tokenizer.json", m)
    shutil.copy(QWEN / "tokenizer_config.json", m)
    (m / "config.json").write_text(json.dumps({"model_type": "minimax_m2"}))
    (m / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}))
    # " one two three four" repeated: after one period every draft is right.
    period = [825, 1378, 2326, 3040]
    (tmp_path / "replay.json").write_text(json.dumps(
        {"vocab_size": 151669, "max_model_len": 2048, "num_kv_blocks": 512, "end_token": EOS,
         "step_sleep_us": 2000, "scripts": [{"marker": [], "tokens": period * 10}]}))
    return m


def completions(base, **body):
    body = {"model": "m", "prompt": "count:", "temperature": 0, "max_tokens": 30, **body}
    choices = httpx.post(base + "/v1/completions", json=body, timeout=30).json()["choices"]
    plain = [(c["text"], c["finish_reason"]) for c in sorted(choices, key=lambda c: c["index"])]
    streamed = {}
    with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    streamed[c["index"]] = streamed.get(c["index"], "") + c["text"]
    return plain, [streamed[i] for i in sorted(streamed)]


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def chosen_k(text, k):
    m = re.search(r'^moeserve:spec_decode_chosen_k_total\{[^}]*k="%d"\} ([0-9.e+]+)$' % k, text, re.M)
    return float(m.group(1)) if m else None


def test_speculation_on_equals_off_and_reports_vllm_metrics(tmp_path, model):
    cases = [{}, {"max_tokens": 7}, {"stop": [" three four one"]}, {"n": 2, "seed": 3, "temperature": 0.5}]
    results = {}
    # "on": k pinned to num_speculative_tokens (vLLM's behaviour), so the counters below are
    # certain; "adaptive" (the default): k chosen per step from measured step times, which on
    # this backend can be anything, so only its output and metric names are checked.
    for mode in ("off", "on", "adaptive"):
        args = ["--served-model-name", "m"]
        if mode != "off":
            args += ["--speculative-config", SPEC] + (["--no-speculative-adaptive"] if mode == "on" else [])
        s = Serve(tmp_path, model, *args)
        try:
            results[mode] = [completions(s.base, **c) for c in cases]
            m = httpx.get(s.base + "/metrics").text
            if mode == "adaptive":
                chosen = [chosen_k(m, k) for k in range(4)]
                assert all(c is not None for c in chosen), m
                assert sum(chosen) > 5, m
                assert metric(m, "moeserve:spec_decode_k_explorations_total") is not None, m
                assert metric(m, "moeserve:spec_decode_k") in (0, 1, 2, 3), m
            elif mode == "on":
                assert chosen_k(m, 3) > 5, m
                assert metric(m, "moeserve:spec_decode_k_explorations_total") == 0, m
                drafts = metric(m, "vllm:spec_decode_num_drafts_total")
                assert drafts and drafts > 5, m
                acc = metric(m, "vllm:spec_decode_num_accepted_tokens_total")
                assert acc and acc > drafts, m  # most steps accept more than one draft
                for pos in range(3):
                    assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",engine="0",position="{pos}"}}' in m
                time.sleep(11)  # one stats interval
                assert "SpecDecoding metrics: Mean acceptance length: " in s.text(), s.text()
            else:
                assert "spec_decode" not in m
        finally:
            assert s.stop() == 0
    assert results["on"] == results["off"]
    assert results["adaptive"] == results["off"]
    for plain, streamed in results["on"]:
        assert [t for t, _ in plain] == streamed
    assert results["on"][1][0][0][1] == "length"
    assert results["on"][2][0][0][1] == "stop"
    assert results["on"][2][0][0][0].endswith(" two")  # cut before the stop string
    assert len(results["on"][3][0]) == 2


@pytest.mark.parametrize("cfg,named", [
    ('{"method": "eagle", "model": "x/y", "num_speculative_tokens": 3}', 'method "eagle"'),
    ('{"method": "ngram", "num_speculative_tokens": 3, "enforce_eager": true}', '"enforce_eager": true'),
])
def test_refused_before_loading(tmp_path, model, cfg, named):
    t0 = time.time()
    r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
            "--speculative-config", cfg)
    assert r.returncode != 0
    assert time.time() - t0 < 10
    assert "not supported yet: --speculative-config " + named in r.stderr, r.stderr


def test_draft_heads_refused_without_a_draft(tmp_path, model):
    # eagle3 with a directory that is not a draft fails before loading; the replay backend
    # (no model) cannot run a draft head either, and says so at argument time.
    for cfg, want in [('{"method": "eagle3", "model": "%s", "num_speculative_tokens": 3}' % (tmp_path / "nodraft"),
                       "no config.json in draft directory"),
                      ('{"method": "mtp", "num_speculative_tokens": 1}', "the test replay backend runs no draft heads")]:
        t0 = time.time()
        r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
                "--speculative-config", cfg)
        assert r.returncode != 0 and time.time() - t0 < 10
        assert want in r.stderr, r.stderr


def test_unknown_key_and_bad_values_fail(tmp_path, model):
    for cfg, want in [('{"method": "ngram", "num_speculative_tokens": 3, "bogus": 1}', 'unknown key "bogus"'),
                      ('{"method": "ngram"}', '"num_speculative_tokens" is required'),
                      ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, '
                       '"prompt_lookup_max": 2}', "must be <="),
                      ("{oops", "not valid JSON")]:
        r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
                "--speculative-config", cfg)
        assert r.returncode != 0 and want in r.stderr, r.stderr
