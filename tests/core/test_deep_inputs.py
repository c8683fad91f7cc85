"""Documents nested 100,000 levels deep (issue 25 item 2) end in a clear error naming the
nesting limit, never a signal: `moeserve inspect` (safetensors header, index), `tokenize`
(tokenizer.json), `chat-template` (messages file), and the server (request body, all routes,
no API key needed for /tokenize)."""
import json
import os
import signal
import struct
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
DEEP = "[" * 100000 + "]" * 100000
DEEP_OBJ = '{"a":' * 100000 + "1" + "}" * 100000


def run(*args, **kw):
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, **kw)
    assert r.returncode == 1, (r.returncode, r.stderr[-500:])  # an error exit, not a signal
    return r.stderr


def test_inspect_deep_config_safetensors_header_and_index(tmp_path):
    tiny = tmp_path / "tiny"
    subprocess.run([BIN, "make-tiny", str(tiny)], check=True, capture_output=True)
    config = (tiny / "config.json").read_text()
    d = tmp_path / "header"
    d.mkdir()
    (d / "config.json").write_text(config)
    header = ('{"x": ' + DEEP + "}").encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    assert "nested deeper than 512 levels (the nesting limit)" in run("inspect", str(d))
    d = tmp_path / "idx"
    d.mkdir()
    (d / "config.json").write_text(config)
    (d / "model.safetensors.index.json").write_text('{"weight_map": ' + DEEP_OBJ + "}")
    assert "nested deeper than 512 levels" in run("inspect", str(d))
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "config.json").write_text('{"x": ' + DEEP + "}")
    assert "config.json: JSON nested deeper than 512 levels" in run("inspect", str(d))


def test_tokenize_deep_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": ' + DEEP + "}")
    err = run("tokenize", "--tokenizer", str(tmp_path), input="hi")
    assert "tokenizer.json: JSON nested deeper than 512 levels (the nesting limit)" in err


def test_chat_template_deep_messages(tmp_path):
    (tmp_path / "m.json").write_text('[{"role": "user", "content": ' + DEEP + "}]")
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    err = run("chat-template", "--messages", str(tmp_path / "m.json"), "--chat-template", str(tmp_path / "t.jinja"))
    assert "nested deeper than 512 levels" in err


def test_max_json_depth_option(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps([{"role": "user", "content": [[[["x"]]]]}]))
    (tmp_path / "t.jinja").write_text("{{ messages | length }}")
    err = run("--max-json-depth", "4", "chat-template", "--messages", str(tmp_path / "m.json"),
              "--chat-template", str(tmp_path / "t.jinja"))
    assert "nested deeper than 4 levels" in err
    r = subprocess.run([BIN, "--max-json-depth", "0", "version"], capture_output=True, text=True)
    assert r.returncode == 2


def test_server_deep_bodies_are_400(tmp_path):
    model = tmp_path / "model"
    subprocess.run([BIN, "make-tiny", str(model)], check=True, capture_output=True)
    s = __import__("socket").socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([BIN, "serve", str(model), "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
                             "--api-key", "k"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        for route in ["/tokenize", "/detokenize", "/v1/chat/completions", "/v1/completions"]:
            for body in (DEEP, DEEP_OBJ, '{"prompt": "x", "messages": ' + DEEP + "}"):
                r = httpx.post(base + route, content=body, headers={"Authorization": "Bearer k"}, timeout=30)
                assert r.status_code == 400, (route, r.status_code, r.text[:200])
                assert "nested deeper than 512 levels (the nesting limit)" in r.json()["error"]["message"]
        r = httpx.post(base + "/tokenize", content='{"prompt": "x", "add_special_tokens": []}')
        assert r.status_code == 400 and "add_special_tokens" in r.json()["error"]["message"]
        r = httpx.post(base + "/tokenize", content='{"prompt": 1e400}')
        assert r.status_code == 400 and "number overflow" in r.json()["error"]["message"]
        r = httpx.post(base + "/detokenize", content='{"tokens": [1, "a"]}')
        assert r.status_code == 400 and "body.tokens" in r.json()["error"]["message"]
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
