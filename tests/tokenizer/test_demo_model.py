"""The demo model's tokenizer (assets/demo-model, trained by scripts/train_demo.py) in moeserve:
`moeserve tokenize` / `detokenize` must agree with HF `tokenizers`, the config's vocabulary must
be the tokenizer's size, and moeserve's chat-template renderer must produce exactly the text the
model was trained on (scripts/demo_corpus.py renders the dialogs with jinja2 as HF does)."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo-model"
sys.path.insert(0, str(ROOT / "scripts"))


def moeserve():
    b = os.environ.get("MOESERVE_BIN", str(ROOT / "build" / "moeserve"))
    if not Path(b).exists():
        pytest.fail("moeserve not built")
    return b


def run(args, stdin=b""):
    return subprocess.run([moeserve(), *args], input=stdin, capture_output=True, timeout=120)


def dialogs(n=12):
    import demo_dialogs
    return demo_dialogs.make_dialogs(random.Random(5), n, [("a decorator", "A function returning a function.")],
                                     [("the for statement", "It iterates over a sequence.")])


def test_vocab_and_added_tokens():
    hf = Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    cfg = json.loads((DEMO / "config.json").read_text())
    assert hf.get_vocab_size() == cfg["vocab_size"] == 8192
    assert hf.token_to_id("]~!b[") == cfg["bos_token_id"] and hf.token_to_id("[e~[") == cfg["eos_token_id"]
    ids = hf.encode("<think>x</think><minimax:tool_call>", add_special_tokens=False).ids
    # the think / tool-call tags are single (non-special) tokens; they survive skip_special_tokens
    assert len(ids) == 4 and hf.decode(ids, skip_special_tokens=True) == "<think>x</think><minimax:tool_call>"


@pytest.mark.parametrize("k", range(4))
def test_tokenize_matches_hf(tmp_path, k):
    import demo_corpus
    hf = Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    tpl = json.loads((DEMO / "tokenizer_config.json").read_text())["chat_template"]
    texts = ["Python is an easy to learn, powerful programming language.\n\n  It has efficient data structures!",
             "Ünïcödé 😀 tabs\tand\r\nnewlines 12345 ]~b]user",
             *demo_corpus.render_dialogs(dialogs(3), tpl)]
    text = texts[k]
    r = run(["tokenize", "--tokenizer", str(DEMO), "--json"], text.encode())
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)["ids"]
    assert ids == hf.encode(text, add_special_tokens=False).ids
    r = run(["detokenize", "--tokenizer", str(DEMO), "--ids", ",".join(map(str, ids)), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == text


def test_chat_template_renders_training_text(tmp_path):
    import demo_corpus
    tpl = json.loads((DEMO / "tokenizer_config.json").read_text())["chat_template"]
    for i, d in enumerate(dialogs()):
        want = demo_corpus.render_dialogs([d], tpl)[0]
        f = tmp_path / f"d{i}.json"
        f.write_text(json.dumps({"messages": d["messages"], "tools": d["tools"]} if d["tools"] else d["messages"]))
        r = run(["chat-template", "--tokenizer", str(DEMO), "--messages", str(f)])
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode() == want, (r.stdout.decode()[-400:], want[-400:])
