"""`moeserve tokenize` / `moeserve detokenize` against HF `tokenizers`."""
import json
import os
import subprocess
from pathlib import Path

import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "assets" / "tiny-tokenizer"


def moeserve():
    b = os.environ.get("MOESERVE_BIN", str(ROOT / "build" / "moeserve"))
    if not Path(b).exists():
        pytest.skip("moeserve not built")
    return b


def run(args, stdin=b""):
    return subprocess.run([moeserve(), *args], input=stdin, capture_output=True, timeout=60)


def test_tokenize_stdin_json_and_file(tmp_path):
    hf = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    text = "Hello world!\r\n<think>ok</think> ]~b]user 123"
    r = run(["tokenize", "--tokenizer", str(TINY), "--json"], text.encode())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ids"] == hf.encode(text, add_special_tokens=False).ids
    f = tmp_path / "t.txt"
    f.write_bytes(text.encode())
    r = run(["tokenize", "--tokenizer", str(TINY / "tokenizer.json"), "--text-file", str(f), "--add-special-tokens"])
    assert r.returncode == 0, r.stderr
    assert [int(x) for x in r.stdout.split()] == hf.encode(text, add_special_tokens=True).ids


def test_detokenize_roundtrip():
    hf = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    ids = hf.encode("]~!b[Streaming é 😀 text[e~[").ids
    for skip in (False, True):
        args = ["detokenize", "--tokenizer", str(TINY), "--ids", ",".join(map(str, ids)), "--json"]
        r = run(args + (["--skip-special-tokens"] if skip else []))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["text"] == hf.decode(ids, skip_special_tokens=skip)


def test_errors_are_clear():
    r = run(["tokenize", "--tokenizer", str(TINY)], b"ok \xff bad")
    assert r.returncode == 1 and b"not valid UTF-8" in r.stderr
    r = run(["detokenize", "--tokenizer", str(TINY), "--ids", "1,x"])
    assert r.returncode == 1 and b"not a token id" in r.stderr
    r = run(["tokenize", "--tokenizer", "/nonexistent"], b"x")
    assert r.returncode == 1 and b"cannot open" in r.stderr
