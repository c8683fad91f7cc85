"""Real chat templates of many model families (tests/fixtures/chat-templates-extra, see its
README for provenance) rendered by the C++ engine and by Python jinja2 configured as
transformers configures it, over every conversation in tests/fixtures/chat and
tests/fixtures/chat-extra, with the generation prompt on and off and with template kwargs.
Output must be byte-identical; when jinja2 raises, the C++ engine must fail with "line N: ...".
strftime_now is pinned through MOESERVE_TEST_NOW (honoured by the oracle and the engine)."""
import glob
import os
import time

import pytest

os.environ["MOESERVE_TEST_NOW"] = "1736942400"  # 2025-01-15 12:00:00 UTC
os.environ["TZ"] = "UTC"
time.tzset()

import oracle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_DIR = os.path.join(oracle.REPO, "tests", "fixtures", "chat-templates-extra")
TEMPLATES = sorted(glob.glob(os.path.join(TEMPLATE_DIR, "*.jinja")))
CONVERSATIONS = sorted(glob.glob(os.path.join(oracle.FIXTURES, "*.json")) +
                       glob.glob(os.path.join(oracle.REPO, "tests", "fixtures", "chat-extra", "*.json")))
BOS, EOS = "<|bos|>", "<|eos|>"

# kwargs every template is rendered with, plus the ones a template reads.
COMMON_KWARGS = [{}, {"enable_thinking": False}]
TEMPLATE_KWARGS = {
    "llama-3.2": [{"tools_in_user_message": False}, {"date_string": "01 Feb 2025", "custom_tools": [
        {"name": "calc", "description": "Calculator", "parameters": {"type": "object", "properties": {}}}]}],
    "llama-3.3": [{"tools_in_user_message": False}, {"builtin_tools": ["brave_search"]}],
    "gpt-oss": [{"reasoning_effort": "high", "builtin_tools": ["browser", "python"]}, {"model_identity": "You are X."}],
    "seed-oss": [{"thinking_budget": 0}, {"thinking_budget": 600}, {"thinking_budget": 99999},
                 {"use_json_tooldef": True}],
    "granite-3.3": [{"thinking": True}, {"controls": {"citations": True, "hallucinations": True}},
                    {"available_tools": [{"name": "x"}], "controls": {"length": "short"}}],
    "command-r7b": [{"enable_citations": True}],
    "firefunction-v2": [{"functions": "[{\"name\": \"f\"}]", "datetime": "2025-01-15"}],
    "deepseek-v3.1": [{"thinking": True}],
    "rwkv-world": [{"enable_thinking": True}],
    "glm-4.6": [{"enable_thinking": True}],
    "nemotron-nano-v2": [{"continue_final_message": False}],
    "functionary-v3.2": [{"tools": [{"type": "code_interpreter"}]}],
}


def _name(path):
    return os.path.basename(path).rsplit(".", 1)[0]


def _cases():
    out = []
    for t in TEMPLATES:
        for kw in COMMON_KWARGS + TEMPLATE_KWARGS.get(_name(t), []):
            for c in CONVERSATIONS:
                for gen in (False, True):
                    kid = ",".join(f"{k}" for k in kw) or "nokw"
                    out.append(pytest.param(t, c, kw, gen, id=f"{_name(t)}-{_name(c)}-{kid}-{'gen' if gen else 'nogen'}"))
    return out


CASES = _cases()
_SOURCES = {}
_CONVS = {}


def _load(t, c):
    if t not in _SOURCES:
        with open(t, encoding="utf-8") as f:
            _SOURCES[t] = f.read()
    if c not in _CONVS:
        import json
        with open(c, encoding="utf-8") as f:
            _CONVS[c] = json.load(f)
    return _SOURCES[t], _CONVS[c]


def _kwargs(conv, kw):
    merged = dict(conv.get("kwargs", {}))
    merged.update(kw)
    return merged


@pytest.fixture(scope="module")
def cpp_results():
    reqs = []
    for p in CASES:
        t, c, kw, gen = p.values
        src, conv = _load(t, c)
        reqs.append({"template": src, "messages": conv["messages"], "tools": conv.get("tools"),
                     "add_generation_prompt": gen, "kwargs": _kwargs(conv, kw), "bos": BOS, "eos": EOS})
    return oracle.render_cpp_batch(reqs)


@pytest.mark.parametrize("idx", range(len(CASES)), ids=[p.id for p in CASES])
def test_matches_jinja2(idx, cpp_results):
    t, c, kw, gen = CASES[idx].values
    src, conv = _load(t, c)
    want_ok, want = oracle.render_py(src, conv["messages"], conv.get("tools"), gen, _kwargs(conv, kw), BOS, EOS)
    got_ok, got = cpp_results[idx]
    if not want_ok:
        assert not got_ok, f"jinja2 failed ({want}) but C++ rendered: {got!r}"
        assert got.startswith("line "), got
        if want.startswith("TemplateError: "):  # raise_exception(): same message
            assert want[len("TemplateError: "):] in got, (want, got)
        return
    assert got_ok, f"C++ failed: {got}"
    assert got == want


def test_suite_size():
    assert len(TEMPLATES) >= 20
    assert len(CONVERSATIONS) >= 30
