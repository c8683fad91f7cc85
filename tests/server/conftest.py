"""Starts `moeserve serve` with the replay backend on a temporary model directory
(Qwen3 tokenizer + chat template from shared/data) and yields a client handle."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QWEN = None
for cand in [REPO / "tests/fixtures/shared-data/tokenizers/qwen3"]:
    if (cand / "tokenizer.json").exists():
        QWEN = cand
        break

EOS = 151645  # <|im_end|>

PLAIN = "Hello there! How can I help you today? I am a scripted replay model."
TOOL = ("I should look up the weather.</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
        "<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n"
        "</minimax:tool_call>")


def encode(text):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(QWEN / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """`moeserve serve` on the replay backend (default), or with `model` on that real
    checkpoint on the CPU (the demo model: tests/server/test_web_ui.py's screenshot)."""

    def __init__(self, tmp, extra_args=(), script_extra=None, model=None):
        if model is not None:
            self._start(tmp, [str(model), "--device", "cpu", "--served-model-name", "moeserve-demo", *extra_args])
            return
        if QWEN is None:
            pytest.fail("tests/fixtures/shared-data/tokenizers/qwen3 not found")
        model = tmp / "model"
        model.mkdir()
        shutil.copy(QWEN / "tokenizer.json", model)
        shutil.copy(QWEN / "tokenizer_config.json", model)
        (model / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}))
        script = {"vocab_size": 151669, "max_model_len": 2048, "num_kv_blocks": 4096, "end_token": EOS,
                  "scripts": [{"marker": encode("TOOLTEST"), "tokens": encode(TOOL)},
                              {"marker": [], "tokens": encode(PLAIN)}]}
        script.update(script_extra or {})
        (tmp / "replay.json").write_text(json.dumps(script))
        self._start(tmp, [str(model), "--served-model-name", "replay", "--test-replay-backend",
                          str(tmp / "replay.json"), *extra_args])

    def _start(self, tmp, args):
        self.bin = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "server.log", "w")
        self.proc = subprocess.Popen([self.bin, "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        import httpx
        for _ in range(1200):
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return
            except Exception:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("server did not start: " + (tmp / "server.log").read_text())

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def metrics(self):
        import httpx
        out = {}
        for line in httpx.get(self.base + "/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("srv"),
               ["--enable-auto-tool-choice", "--tool-call-parser", "minimax_m2", "--reasoning-parser", "minimax_m2",
                "--max-request-body-bytes", "1000000"])
    yield s
    assert s.stop() == 0
