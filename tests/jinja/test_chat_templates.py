"""Byte-identical rendering of real chat templates: C++ engine vs Python jinja2 (oracle),
over every conversation in tests/fixtures/chat/, with and without the generation prompt
and with template kwargs. When jinja2 raises, the C++ side must fail too."""
import glob
import json
import os

import pytest

import oracle

TEMPLATES = {
    "minimax-m2": {"file": os.path.join(oracle.SHARED, "chat-templates", "minimax-m2.jinja"),
                   "kwargs": [{}, {"model_identity": "You are X."}]},
    "minimax-m2.5": {"file": os.path.join(oracle.SHARED, "chat-templates", "minimax-m2.5.jinja"), "kwargs": [{}]},
    "qwen3": {"tokenizer": os.path.join(oracle.SHARED, "tokenizers", "qwen3"),
              "kwargs": [{}, {"enable_thinking": False}, {"enable_thinking": True}]},
    "deepseek-v3": {"tokenizer": os.path.join(oracle.SHARED, "tokenizers", "deepseek-v3"), "kwargs": [{}]},
}
FIXTURES = sorted(glob.glob(os.path.join(oracle.FIXTURES, "*.json")))


def _template_text(spec):
    if "file" in spec:
        with open(spec["file"], encoding="utf-8") as f:
            return f.read(), None, None
    with open(os.path.join(spec["tokenizer"], "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)

    def tok(v):
        return v["content"] if isinstance(v, dict) else v

    return cfg["chat_template"], tok(cfg.get("bos_token")), tok(cfg.get("eos_token"))


def _cases():
    for name, spec in TEMPLATES.items():
        for fx in FIXTURES:
            for kw in spec["kwargs"]:
                for gen in (False, True):
                    kid = ",".join(f"{k}={v}" for k, v in kw.items()) or "nokw"
                    yield pytest.param(name, fx, kw, gen,
                                       id=f"{name}-{os.path.basename(fx)[:-5]}-{kid}-{'gen' if gen else 'nogen'}")


@pytest.mark.parametrize("tname,fixture,kwargs,gen", list(_cases()))
def test_matches_jinja2(tname, fixture, kwargs, gen):
    spec = TEMPLATES[tname]
    if not os.path.exists(spec.get("file") or spec.get("tokenizer")):
        pytest.fail("shared chat template data not present: " + oracle.SHARED)
    with open(fixture, encoding="utf-8") as f:
        conv = json.load(f)
    source, bos, eos = _template_text(spec)
    want_ok, want = oracle.render_py(source, conv["messages"], conv.get("tools"), gen, kwargs, bos, eos)
    got_ok, got = oracle.render_cpp(spec.get("file"), spec.get("tokenizer"), conv["messages"], conv.get("tools"),
                                    gen, kwargs)
    if not want_ok:
        assert not got_ok, f"jinja2 failed ({want}) but C++ rendered: {got!r}"
        assert got.startswith("error: line "), got
        return
    assert got_ok, f"C++ failed: {got}"
    assert got == want


def test_fixture_suite_is_not_trivial():
    # Guard against the suite silently shrinking: most cases must render successfully.
    assert len(FIXTURES) >= 15
