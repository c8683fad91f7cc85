"""CLI tests of the parallelism flags (`generate` and `serve` on the CPU: ranks on threads over
the in-process communicator) and their error messages."""
import json
import os
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest

BIN = os.environ.get("MOESERVE_BIN", "build/moeserve")
SRC = os.environ.get("MOESERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(SRC, "tests", "fixtures", "golden")


def run(*args, check=True):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}): {p.stderr}")
    return p


def gen(model, *flags, tmp_path=None, n=6):
    args = ["generate", "--model", model, "--prompt-ids", "5,17,300,42", "--max-tokens", str(n), "--json",
            "--device", "cpu", *flags]
    npy = None
    if tmp_path is not None:
        npy = tmp_path / ("logits" + "_".join(f.strip("-") for f in flags) + ".npy")
        args += ["--dump-logits", str(npy)]
    out = json.loads(run(*args).stdout)["generated_ids"]
    return out, (np.load(npy) if npy is not None else None)


@pytest.mark.parametrize("flags", [["-tp", "2"], ["--tensor-parallel-size", "4"], ["-tp", "2", "--enable-expert-parallel"],
                                   ["-tp", "4", "--enable-expert-parallel", "-dp", "1"]])
def test_generate_parallel_equals_single(tmp_path, flags):
    d = os.path.join(GOLDEN, "tiny_bf16")
    ids1, l1 = gen(d, tmp_path=tmp_path)
    idsp, lp = gen(d, *flags, tmp_path=tmp_path)
    assert idsp == ids1
    assert np.abs(lp - l1).max() / np.abs(l1).max() <= 1e-5


def test_fp8_block_split_refused_and_ep_accepted(tmp_path):
    # make-tiny --fp8: 128x128 blocks, intermediate 128: expert TP=2 would cut blocks in half.
    d = str(tmp_path / "tiny8")
    run("make-tiny", "--fp8", "--num-kv-heads", "4", d)
    p = run("generate", "--model", d, "--prompt-ids", "1,2,3", "--max-tokens", "2", "-tp", "2", check=False)
    assert p.returncode != 0
    assert "--enable-expert-parallel" in p.stderr and "128" in p.stderr, p.stderr
    ids1, _ = gen(d)
    ids_ep, _ = gen(d, "-tp", "2", "--enable-expert-parallel")
    assert ids_ep == ids1


@pytest.mark.parametrize("flags,needle", [
    (["-dp", "2"], "--data-parallel-size"),
    (["-tp", "3"], "num_attention_heads"),
    (["-tp", "0"], "--tensor-parallel-size"),
    (["-tp", "2", "--nnodes", "2"], "--nnodes"),
])
def test_invalid_layouts_have_clear_errors(flags, needle):
    d = os.path.join(GOLDEN, "tiny_bf16")
    p = run("generate", "--model", d, "--prompt-ids", "1,2", "--max-tokens", "1", *flags, check=False)
    assert p.returncode != 0 and needle in p.stderr, p.stderr


def test_ep_experts_must_divide(tmp_path):
    d = os.path.join(GOLDEN, "tiny_fp8_nonsquare")  # 6 experts, 8 heads
    p = run("generate", "--model", d, "--prompt-ids", "1,2", "--max-tokens", "1", "-tp", "4",
            "--enable-expert-parallel", check=False)
    assert p.returncode != 0 and "experts % ranks" in p.stderr, p.stderr


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_serve_tp2_ep_answers_like_tp1(tmp_path):
    d = str(tmp_path / "tiny")
    run("make-tiny", d)
    texts = []
    for flags in ([], ["-tp", "2", "--enable-expert-parallel"]):
        port = free_port()
        proc = subprocess.Popen([BIN, "serve", d, "--served-model-name", "tiny", "--port", str(port), "--device", "cpu",
                                 *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    urllib.request.urlopen(base + "/health", timeout=1)
                    break
                except Exception:
                    time.sleep(0.1)
            req = urllib.request.Request(base + "/v1/completions", json.dumps(
                {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}).encode(),
                {"Content-Type": "application/json"})
            r = json.loads(urllib.request.urlopen(req, timeout=60).read())
            texts.append(r["choices"][0]["text"])
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert texts[0] == texts[1]
