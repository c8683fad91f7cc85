"""`moeserve plan` end to end: local directories (index or single-file header), the --json
schema, and the hub fetch of config.json + index against a local HTTP server (endpoint,
token, revision quoting, token dropped on a cross-host redirect, 404/401 handling)."""
import json
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(os.environ.get("MOESERVE_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BIN = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
M25 = REPO / "tests/fixtures/shared-data/models/minimax-m2.5/config.json"
M25_BYTES = 230121630720  # config arithmetic, worked out in tests/tools/test_plan.cpp


def m25_index(mtp=False):
    wm = {"model.embed_tokens.weight": "model-00001-of-00126.safetensors", "lm_head.weight": "x"}
    for layer in range(62):
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            wm[f"model.layers.{layer}.self_attn.{p}.weight"] = "x"
            wm[f"model.layers.{layer}.self_attn.{p}.weight_scale_inv"] = "x"
    if mtp:
        wm["model.layers.63.enorm.weight"] = "x"
    return {"metadata": {"total_size": M25_BYTES}, "weight_map": wm}


def run(*args, env=None, check=True):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([BIN, "plan", *args], capture_output=True, text=True, env=e, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


@pytest.fixture
def m25_dir(tmp_path):
    d = tmp_path / "m25"
    d.mkdir()
    shutil.copy(M25, d / "config.json")
    (d / "model.safetensors.index.json").write_text(json.dumps(m25_index()))
    return d


LAYOUT_KEYS = {"name": str, "tp": int, "dp": int, "ep": int, "expert_parallel": bool, "valid": bool,
               "reasons": list, "notes": list, "flags": str, "weights_bytes_per_gpu": int,
               "weights_bytes_by_category": dict, "reserve_bytes": dict, "kv_heads_per_gpu": int,
               "kv_bytes_per_token_per_gpu": int, "kv_cache_bytes_per_gpu": int, "kv_blocks_per_gpu": int,
               "kv_tokens_per_replica": int, "kv_tokens_total": int, "seqs_per_replica": int,
               "max_concurrent_seqs": int, "max_concurrency": float}


def test_json_schema_8x141(m25_dir):
    r = json.loads(run("--model", str(m25_dir), "--gpus", "8", "--gpu-memory", "141GB", "--json").stdout)
    assert set(r) >= {"model", "checkpoint", "options", "memory_model", "layouts", "recommended",
                      "recommendation_reason", "warnings", "sources"}
    assert r["sources"]["index"].endswith("model.safetensors.index.json")
    assert r["checkpoint"]["computed_bytes"] == M25_BYTES == r["checkpoint"]["index_total_size"]
    assert r["checkpoint"]["mtp"] == {"declared_modules": 3, "present_modules": 0, "loaded": False}
    assert [l["name"] for l in r["layouts"]] == ["TP8", "TP8+EP8", "DP2xTP4+EP8", "DP4xTP2+EP8", "DP8xTP1+EP8"]
    for l in r["layouts"]:
        for k, t in LAYOUT_KEYS.items():
            assert isinstance(l[k], t) or (t is float and isinstance(l[k], int)), (k, l[k])
        assert set(l["reserve_bytes"]) == {"overhead", "activations", "logits", "total", "activation_bytes_per_token"}
        assert sum(l["weights_bytes_by_category"].values()) == l["weights_bytes_per_gpu"]
        assert l["valid"] == (not l["reasons"])
    assert r["recommended"] == "TP8+EP8"
    ep8 = r["layouts"][1]
    assert ep8["weights_bytes_per_gpu"] == 28936587136 and ep8["max_concurrent_seqs"] == 15
    assert r["options"]["usable_bytes_per_gpu"] == 126900000000


def test_text_output_and_reasons(m25_dir):
    out = run("--model", str(m25_dir), "--gpus", "8", "--gpu-memory", "141GB", "--max-model-len", "32K",
              "--kv-cache-dtype", "fp8").stdout
    assert "block-FP8 expert intermediate size 1536/8 = 192 is not a multiple of the 128 weight block" in out
    assert "recommended: TP8+EP8" in out
    assert "flags (vllm serve spelling): --tensor-parallel-size 8 --enable-expert-parallel" in out
    assert "memory model (per GPU)" in out and "usable = gpu_memory * gpu_memory_utilization" in out


def test_four_by_96(m25_dir):
    r = json.loads(run("--model", str(m25_dir), "--gpus", "4", "--gpu-memory", "96GB", "--json").stdout)
    tp4 = r["layouts"][0]
    assert (tp4["name"], tp4["weights_bytes_per_gpu"], tp4["kv_tokens_per_replica"], tp4["max_concurrent_seqs"]) == \
        ("TP4", 57677307648, 426192, 2)
    assert r["recommended"] == "TP4"


def test_nothing_fits_exits_2(m25_dir):
    p = run("--model", str(m25_dir), "--gpus", "2", "--gpu-memory", "80GiB", check=False)
    assert p.returncode == 2, p.stderr
    assert "recommended: none" in p.stdout and "exceed the usable" in p.stdout


def read_st(path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def test_tiny_checkpoint_index_matches_arithmetic(tmp_path):
    """make-tiny writes a real sharded checkpoint (fp32 router, bf16 rest): the byte total of
    config arithmetic must equal the index's total_size exactly."""
    model = tmp_path / "tiny"
    subprocess.run([BIN, "make-tiny", str(model)], check=True, capture_output=True)
    r = json.loads(run("--model", str(model), "--gpus", "2", "--gpu-memory", "8GiB", "--json").stdout)
    assert r["sources"]["index"].endswith("model.safetensors.index.json")
    assert r["checkpoint"]["index_minus_computed_bytes"] == 0, r["checkpoint"]
    assert r["checkpoint"]["index_tensors"] == r["checkpoint"]["computed_tensors"]
    assert r["warnings"] == []
    # Same with the FP8 variant (block scales included).
    fp8 = tmp_path / "tiny-fp8"
    subprocess.run([BIN, "make-tiny", str(fp8), "--fp8", "--block-size", "32"], check=True, capture_output=True)
    r = json.loads(run("--model", str(fp8), "--gpus", "2", "--gpu-memory", "8GiB", "--json").stdout)
    assert r["checkpoint"]["index_minus_computed_bytes"] == 0, r["checkpoint"]
    assert r["checkpoint"]["index_fp8_scale_tensors"] > 0


def test_single_file_checkpoint_header(tmp_path):
    """No index, one model.safetensors: names and total size come from its header only."""
    model = tmp_path / "tiny"
    subprocess.run([BIN, "make-tiny", str(model)], check=True, capture_output=True)
    merged, data = {}, b""
    for shard in sorted(model.glob("model-*.safetensors")):
        header, body = read_st(shard)
        for k, v in header.items():
            if k == "__metadata__":
                continue
            b, e = v["data_offsets"]
            merged[k] = {**v, "data_offsets": [len(data) + b, len(data) + e]}
        data += body
        shard.unlink()
    (model / "model.safetensors.index.json").unlink()
    h = json.dumps(merged).encode()
    (model / "model.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + data)
    r = json.loads(run("--model", str(model), "--gpus", "2", "--gpu-memory", "8GiB", "--json").stdout)
    assert r["sources"]["index"].endswith("model.safetensors (header)")
    assert r["checkpoint"]["index_total_size"] == len(data)
    assert r["checkpoint"]["index_tensors"] == len(merged)
    assert r["checkpoint"]["index_minus_computed_bytes"] == 0, r["checkpoint"]


def test_bad_inputs(tmp_path, m25_dir):
    p = run("--model", str(m25_dir), "--gpus", "8", "--gpu-memory", "lots", check=False)
    assert p.returncode == 1 and "size 'lots'" in p.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    p = run("--model", str(tmp_path / "bad"), "--gpus", "1", "--gpu-memory", "1GB", check=False)
    assert p.returncode == 1 and "not valid JSON" in p.stderr
    p = run("--model", "./no/such/dir/here", "--gpus", "1", "--gpu-memory", "1GB", check=False)
    assert p.returncode == 1 and "not a directory" in p.stderr


class Hub:
    """A minimal hub: GET /{repo}/resolve/{rev}/{file}; records requests."""

    def __init__(self, files, redirect=None, status=None):
        self.files, self.redirect, self.status, self.requests = files, redirect, status or {}, []
        hub = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                hub.requests.append((self.path, self.headers.get("authorization")))
                if self.path in hub.status:
                    self.send_response(hub.status[self.path])
                    self.end_headers()
                    return
                if hub.redirect and self.path in hub.redirect:
                    self.send_response(302)
                    self.send_header("Location", hub.redirect[self.path])
                    self.end_headers()
                    return
                body = hub.files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()


def test_fetch_from_hub_with_token_and_revision():
    cfg = M25.read_bytes()
    idx = json.dumps(m25_index(mtp=True)).encode()
    hub = Hub({"/MiniMaxAI/MiniMax-M2.5/resolve/refs%2Fpr%2F1/config.json": cfg,
               "/MiniMaxAI/MiniMax-M2.5/resolve/refs%2Fpr%2F1/model.safetensors.index.json": idx})
    try:
        r = json.loads(run("--model", "MiniMaxAI/MiniMax-M2.5", "--revision", "refs/pr/1", "--gpus", "8",
                           "--gpu-memory", "141GB", "--json",
                           env={"HF_ENDPOINT": f"http://127.0.0.1:{hub.port}/", "HF_TOKEN": "hf_secret"}).stdout)
    finally:
        hub.close()
    assert [p for p, _ in hub.requests] == ["/MiniMaxAI/MiniMax-M2.5/resolve/refs%2Fpr%2F1/config.json",
                                            "/MiniMaxAI/MiniMax-M2.5/resolve/refs%2Fpr%2F1/model.safetensors.index.json"]
    assert all(a == "Bearer hf_secret" for _, a in hub.requests)
    assert r["sources"]["config"] == "MiniMaxAI/MiniMax-M2.5/config.json@refs/pr/1"
    assert r["checkpoint"]["mtp"]["present_modules"] == 1
    assert r["recommended"] == "TP8+EP8"


def test_fetch_redirect_drops_token_and_missing_index():
    cdn = Hub({"/signed/config.json": M25.read_bytes()})
    # "localhost" is another host name than 127.0.0.1 for libcurl: the token must not follow.
    hub = Hub({}, redirect={"/org/m/resolve/main/config.json": f"http://localhost:{cdn.port}/signed/config.json"})
    try:
        r = json.loads(run("--model", "org/m", "--gpus", "4", "--gpu-memory", "96GB", "--json",
                           env={"HF_ENDPOINT": f"http://127.0.0.1:{hub.port}", "HF_TOKEN": "hf_secret"}).stdout)
    finally:
        hub.close()
        cdn.close()
    assert hub.requests[0] == ("/org/m/resolve/main/config.json", "Bearer hf_secret")
    assert cdn.requests == [("/signed/config.json", None)]
    assert r["sources"]["index"] is None and "index_total_size" not in r["checkpoint"]
    assert r["recommended"] == "TP4"


def test_fetch_errors():
    hub = Hub({}, status={"/org/gated/resolve/main/config.json": 401})
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{hub.port}"}
    try:
        p = run("--model", "org/missing", "--gpus", "1", "--gpu-memory", "1GB", env=env, check=False)
        assert p.returncode == 1 and "config.json not found" in p.stderr
        p = run("--model", "org/gated", "--gpus", "1", "--gpu-memory", "1GB", env=env, check=False)
        assert p.returncode == 1 and "HTTP 401" in p.stderr and "HF_TOKEN" in p.stderr
        n = len(hub.requests)
        p = run("--model", "org/m", "--gpus", "1", "--gpu-memory", "1GB", env={**env, "HF_HUB_OFFLINE": "1"},
                check=False)
        assert p.returncode == 1 and "HF_HUB_OFFLINE" in p.stderr and len(hub.requests) == n
    finally:
        hub.close()


# Qwen3-MoE (published configs, no weights): plan's arithmetic and the registry's declared
# tensors agree (bf16: 2 bytes a parameter), and the architecture is reported as supported.
@pytest.mark.parametrize("name,params", [("qwen3-30b-a3b", 30532122624), ("qwen3-235b-a22b", 235093634560)])
def test_plan_qwen3_moe_configs(name, params):
    d = REPO / "tests/fixtures/models" / name
    p = run("--model", str(d), "--gpus", "8", "--gpu-memory", "141GB", "--json", check=False)
    assert p.returncode in (0, 2), p.stderr
    r = json.loads(p.stdout)
    assert r["architecture"]["supported"] is True and r["architecture"]["name"] == "Qwen3MoeForCausalLM"
    assert r["architecture"]["params_total"] == params
    assert r["checkpoint"]["computed_bytes"] == 2 * params
    assert r["recommended"] is not None, r


def test_plan_reports_unsupported_architecture(tmp_path):
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "num_hidden_layers": 2,
           "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 100, "max_position_embeddings": 256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = json.loads(run("--model", str(tmp_path), "--gpus", "1", "--gpu-memory", "80GB", "--json", check=False).stdout)
    assert r["architecture"]["supported"] is False
    assert "Qwen3MoeForCausalLM" in r["architecture"]["problem"]
    assert any("cannot serve" in w for w in r["warnings"])
