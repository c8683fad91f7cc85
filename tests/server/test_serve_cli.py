"""`moeserve serve` as a drop-in for `vllm serve` (issue 17): the flag table (vLLM command
lines start, warn once, or are refused with "not supported yet"), --config YAML, --log-level
after the subcommand, VLLM_API_KEY, bind-first with 503 while loading, CORS, --root-path,
access lines, `serve ORG/NAME` through the hub cache (the stand-in hub of the pull tests),
`service` rejecting what serve rejects. The replay backend stands in for the model."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "tools"))
from fake_hub import FakeHub, Repo  # noqa: E402

BIN = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
QWEN = REPO / "tests/fixtures/shared-data/tokenizers/qwen3"
EOS = 151645


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def model(tmp_path):
    m = tmp_path / "model"
    m.mkdir()
    shutil.copy(QWEN / "tokenizer.json", m)
    shutil.copy(QWEN / "tokenizer_config.json", m)
    (m / "config.json").write_text(json.dumps({"model_type": "minimax_m2", "quantization_config":
                                               {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    (m / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}))
    (tmp_path / "replay.json").write_text(json.dumps(
        {"vocab_size": 151669, "max_model_len": 2048, "num_kv_blocks": 512, "end_token": EOS,
         "scripts": [{"marker": [], "tokens": [9707, 11, 1879, 0]}]}))
    return m


class Serve:
    def __init__(self, tmp, model, *args, env=None, wait=True, replay=True):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.logpath = tmp / f"serve-{self.port}.log"
        self.log = open(self.logpath, "w")
        cmd = [BIN, "serve", str(model), "--host", "127.0.0.1", "--port", str(self.port), *args]
        if replay:
            cmd += ["--test-replay-backend", str(tmp / "replay.json")]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        if wait:
            assert self.wait_ready(), self.text()

    def wait_ready(self, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def text(self):
        self.log.flush()
        return self.logpath.read_text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def run(*args, env=None, timeout=30):
    return subprocess.run([BIN, *args], capture_output=True, text=True, env=env, timeout=timeout)


# Real `vllm serve` command lines (recipes, units, compose files), after the model argument.
STARTS = [
    "--trust-remote-code --dtype auto --kv-cache-dtype auto --load-format auto",
    "--disable-log-requests --uvicorn-log-level warning --enable-chunked-prefill",
    "--compilation-config {\"cudagraph_mode\":\"FULL\"} --async-scheduling --disable-frontend-multiprocessing",
    "-tp 1 --enable_expert_parallel --max-num-seqs 64 --max_num_batched_tokens 4096 --gpu-memory-utilization 0.95",
    "--enable-auto-tool-choice --tool-call-parser minimax_m2 --reasoning-parser minimax_m2_append_think",
    "--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3",  # Qwen3 recipes
    "--served-model-name minimax-m2.5 m25 --max-model-len 2k --enable-prefix-caching --block-size 16",
    "--revision main --allowed-origins [\"*\"] --enable-force-include-usage --disable-log-stats",
    "--quantization fp8 --seed 1 --max-logprobs 10 --generation-config vllm --no-enable-prefix-caching",
    "--pipeline-parallel-size 1 -dp 1 --swap-space 16 --enable-log-requests --root-path /api",
    "--max-num-partial-prefills 2 --long-prefill-token-threshold 128 --max-num-seqs 8 --max-num-batched-tokens 64",
]
REFUSED = [
    ("--speculative-config {\"method\":\"draft_model\",\"model\":\"/x\",\"num_speculative_tokens\":2}",
     "--speculative-config method \"draft_model\""),
    ("--speculative-config {\"method\":\"eagle\",\"model\":\"/x\",\"num_speculative_tokens\":2}",
     "--speculative-config method \"eagle\""),
    ("--kv-cache-dtype fp8_e5m2", "--kv-cache-dtype fp8_e5m2"),
    ("--kv_cache_dtype=int8", "--kv-cache-dtype int8"),
    ("--quantization awq", "--quantization awq"),
    ("--tool-parser-plugin /x/p.py --tool-call-parser mine", "--tool-parser-plugin"),
    ("--lora-modules a=/x/lora", "--lora-modules"),
    ("--dtype float16", "--dtype float16"),
    ("-pp 2", "--pipeline-parallel-size 2"),
    ("--ssl-keyfile k.pem --ssl-certfile c.pem", "--ssl-keyfile"),
    ("--no-enable-chunked-prefill", "--no-enable-chunked-prefill"),
    ("--max-num-seqz 8", "--max-num-seqz"),
    ("--max-long-partial-prefills 2", "--max-long-partial-prefills"),
]


@pytest.mark.parametrize("flags", STARTS)
def test_vllm_command_lines_start(tmp_path, model, flags):
    s = Serve(tmp_path, model, *flags.split())
    try:
        warnings = [ln for ln in s.text().splitlines() if "accepted for vllm compatibility" in ln]
        noops = [f for f in ["--trust-remote-code", "--dtype", "--disable-log-requests", "--uvicorn-log-level",
                             "--enable-chunked-prefill", "--compilation-config", "--async-scheduling",
                             "--disable-frontend-multiprocessing", "--swap-space"] if f in flags]
        if noops:
            assert len(warnings) == 1, s.text()
            for f in noops:
                assert f in warnings[0]
        else:
            assert warnings == [], s.text()
        assert "not expected" not in s.text()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("flags,named", REFUSED)
def test_vllm_command_lines_refused(tmp_path, model, flags, named):
    t0 = time.time()
    r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
            *flags.split())
    assert r.returncode != 0
    assert time.time() - t0 < 10
    assert "not supported yet: " + named in r.stderr, r.stderr
    assert "not expected" not in r.stderr
    if named == "--max-num-seqz":
        assert "did you mean --max-num-seqs" in r.stderr


def test_draft_heads_on_the_replay_backend_refused_before_listening(tmp_path, model):
    # The replay executor has no weights: an mtp / eagle3 draft is refused at argument time,
    # naming the method, before the port is bound (CI once saw this fail after "listening").
    r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
            "--speculative-config", '{"method":"mtp","num_speculative_tokens":1}')
    assert r.returncode != 0
    assert 'method "mtp": the test replay backend runs no draft heads' in r.stderr, r.stderr
    assert "listening" not in r.stderr


def test_deeply_nested_json_flags_refused_naming_the_limit(tmp_path, model):
    # JSON-valued flags go through the bounded parser: 10,000 levels (an argument is at most
    # 128 KiB) are a CLI error naming the nesting limit (exit != 0), never a stack overflow in
    # merge_patch / dump / the checks.
    deep_obj = '{"a":' * 10000 + "1" + "}" * 10000
    deep_list = "[" * 10000 + "]" * 10000
    for flag, text in [("--hf-overrides", deep_obj), ("--speculative-config", deep_obj),
                       ("--allowed-origins", deep_list)]:
        r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
                flag, text)
        assert r.returncode not in (0, -11, -6) and r.returncode > 0, (flag, r.returncode, r.stderr[-500:])
        assert "nested deeper than" in r.stderr, (flag, r.stderr[-500:])
        assert "listening" not in r.stderr


def test_prefill_caps_logged_and_budget_below_max_num_seqs_refused(tmp_path, model):
    s = Serve(tmp_path, model, "--max-num-partial-prefills", "3", "--max-model-len", "1000")
    try:
        # vLLM's rule: more than one partial prefill and no threshold -> 4% of max_model_len
        assert "prefill caps per step: max_num_partial_prefills 3, long_prefill_token_threshold 40" in s.text(), s.text()
    finally:
        assert s.stop() == 0
    r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
            "--max-num-seqs", "64", "--max-num-batched-tokens", "32")
    assert r.returncode != 0
    assert "--max-num-batched-tokens (32) must be greater than or equal to --max-num-seqs (64)" in r.stderr, r.stderr
    r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
            "--long-prefill-token-threshold", "-1")
    assert r.returncode != 0 and "--long-prefill-token-threshold -1: expected >= 0" in r.stderr, r.stderr


def test_other_subcommands_group_their_help():
    for sub, groups in {"bench": ["Server", "Dataset", "Load", "Results and output"],
                        "pull": ["What to fetch", "Transfer", "Output"],
                        "generate": ["Input", "Sampling", "Output", "Engine"],
                        "plan": ["Model and GPUs", "Serving settings", "Output and hub"],
                        "make-tiny": ["Weights", "Shapes", "Tokenizer"],
                        "service": ["systemd unit", "Environment", "Process"]}.items():
        r = run(sub, "--help")
        assert r.returncode == 0, (sub, r.stderr)
        for g in groups:
            assert "\n" + g + ":" in r.stdout, (sub, g, r.stdout)


def test_unknown_parser_names_list_the_known_ones(tmp_path, model):
    for flag, known in [("--tool-call-parser", "deepseek_v3, hermes, kimi_k2, minimax_m2"),
                        ("--reasoning-parser", "deepseek_r1, kimi_k2, minimax_m2, minimax_m2_append_think, qwen3")]:
        r = run("serve", str(model), "--test-replay-backend", str(tmp_path / "replay.json"), "--port", "0",
                flag, "qwen3_nope")
        assert r.returncode != 0
        assert f"{flag} qwen3_nope: unknown (known: {known})" in r.stderr, r.stderr


def test_config_yaml_and_command_line_wins(tmp_path, model):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("served_model_name: from-yaml\nmax-model-len: 1024\nenable-prefix-caching: false\n"
                   "trust_remote_code: true\nhf-overrides:\n  num_hidden_layers: 2\n")
    s = Serve(tmp_path, model, "--config", str(cfg))
    try:
        m = httpx.get(s.base + "/v1/models").json()["data"][0]
        assert m["id"] == "from-yaml" and m["max_model_len"] == 1024
        assert "--trust-remote-code" in s.text()
    finally:
        assert s.stop() == 0
    s = Serve(tmp_path, model, "--config", str(cfg), "--served-model-name", "from-cli")
    try:
        assert httpx.get(s.base + "/v1/models").json()["data"][0]["id"] == "from-cli"
    finally:
        assert s.stop() == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("kv_cache_dtype: fp8_e5m2\n")
    r = run("serve", str(model), "--config", str(bad), "--test-replay-backend", str(tmp_path / "replay.json"))
    assert r.returncode != 0 and "not supported yet: --kv-cache-dtype fp8_e5m2" in r.stderr


def test_log_level_after_subcommand_and_api_key_env(tmp_path, model):
    env = dict(os.environ, VLLM_API_KEY="sekrit")
    env.pop("MOESERVE_API_KEY", None)
    s = Serve(tmp_path, model, "--trust-remote-code", "--log-level", "warn", env=env)
    try:
        assert httpx.get(s.base + "/v1/models").status_code == 401
        assert httpx.get(s.base + "/v1/models", headers={"Authorization": "Bearer sekrit"}).status_code == 200
        lines = s.text().splitlines()
        assert not [ln for ln in lines if " info " in ln], lines  # warn and above only
        assert [ln for ln in lines if "accepted for vllm compatibility" in ln]
    finally:
        assert s.stop() == 0


def test_cors_preflight_and_headers(tmp_path, model):
    s = Serve(tmp_path, model)
    try:
        r = httpx.options(s.base + "/v1/chat/completions",
                          headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                                   "Access-Control-Request-Headers": "authorization, content-type"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "*"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert r.headers["access-control-allow-headers"] == "authorization, content-type"
        r = httpx.get(s.base + "/v1/models", headers={"Origin": "http://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    finally:
        assert s.stop() == 0
    s = Serve(tmp_path, model, "--allowed-origins", '["http://good.example"]', "--allow-credentials")
    try:
        pre = {"Access-Control-Request-Method": "POST"}
        r = httpx.options(s.base + "/v1/completions", headers={"Origin": "http://evil.example", **pre})
        assert r.status_code == 400 and "origin" in r.text
        r = httpx.options(s.base + "/v1/completions", headers={"Origin": "http://good.example", **pre})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://good.example"
        assert r.headers["access-control-allow-credentials"] == "true"
        r = httpx.get(s.base + "/health", headers={"Origin": "http://good.example"})
        assert r.headers["access-control-allow-origin"] == "http://good.example"
        r = httpx.get(s.base + "/health", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in r.headers
    finally:
        assert s.stop() == 0


def test_root_path_access_log_absolute_root_and_port_in_use(tmp_path, model):
    rel = os.path.relpath(model)
    s = Serve(tmp_path, rel, "--root-path", "/api", "--enable-log-requests")
    try:
        r = httpx.get(s.base + "/api/v1/models")
        assert r.status_code == 200
        assert Path(r.json()["data"][0]["root"]).is_absolute()
        assert httpx.get(s.base + "/v1/models").status_code == 200
        r = httpx.post(s.base + "/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200
        time.sleep(0.2)
        assert '"POST /v1/completions" 200 OK' in s.text()
        assert '"GET /v1/models" 200 OK' in s.text()
        # A second server on the same port fails at once.
        t0 = time.time()
        r = run("serve", str(model), "--port", str(s.port), "--host", "127.0.0.1",
                "--test-replay-backend", str(tmp_path / "replay.json"))
        assert r.returncode != 0 and time.time() - t0 < 5, r.stderr
    finally:
        assert s.stop() == 0


def hub_files():
    return {"config.json": json.dumps({"model_type": "minimax_m2"}).encode(),
            "tokenizer.json": (QWEN / "tokenizer.json").read_bytes(),
            "tokenizer_config.json": (QWEN / "tokenizer_config.json").read_bytes(),
            "generation_config.json": json.dumps({"eos_token_id": EOS}).encode()}


def hub_env(hub, tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update({"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hfhome"), "HF_HUB_DOWNLOAD_TIMEOUT": "5"})
    env.update(extra)
    return env


def test_serve_repo_id_through_the_hub_cache(tmp_path, model):
    hub = FakeHub({"acme/replay-moe": Repo(hub_files())})
    try:
        hub.faults["slow"] = 2_000_000  # ~6 MB of tokenizer: a few seconds of "model is loading"
        s = Serve(tmp_path, "acme/replay-moe", env=hub_env(hub, tmp_path), wait=False)
        try:
            saw_503 = False
            for _ in range(200):
                try:
                    h = httpx.get(s.base + "/health", timeout=1)
                    if h.status_code == 503:
                        r = httpx.get(s.base + "/v1/models", timeout=1)
                        assert r.status_code == 503
                        assert "model is loading" in r.json()["error"]["message"]
                        saw_503 = True
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
            assert saw_503, s.text()
            assert s.wait_ready(60), s.text()
            m = httpx.get(s.base + "/v1/models").json()["data"][0]
            assert m["id"] == "acme/replay-moe"
            assert "models--acme--replay-moe/snapshots/" in m["root"]
        finally:
            assert s.stop() == 0
        hub.faults.clear()
        n_requests = len(hub.log)
        # Complete snapshot: served as is, no request to the hub; offline too.
        for extra in ({}, {"HF_HUB_OFFLINE": "1"}):
            s = Serve(tmp_path, "acme/replay-moe", env=hub_env(hub, tmp_path, **extra))
            try:
                assert "complete snapshot" in s.text()
            finally:
                assert s.stop() == 0
        assert len(hub.log) == n_requests
        # Offline with a file missing: the error names it and the pull command.
        snap = next((tmp_path / "hfhome/hub/models--acme--replay-moe/snapshots").iterdir())
        (snap / "tokenizer.json").unlink()
        r = run("serve", "acme/replay-moe", "--test-replay-backend", str(tmp_path / "replay.json"),
                env=hub_env(hub, tmp_path, HF_HUB_OFFLINE="1"))
        assert r.returncode != 0
        assert "tokenizer.json" in r.stderr and "moeserve pull acme/replay-moe" in r.stderr, r.stderr
        # Offline and never fetched.
        r = run("serve", "acme/other", "--test-replay-backend", str(tmp_path / "replay.json"),
                env=hub_env(hub, tmp_path, HF_HUB_OFFLINE="1"))
        assert r.returncode != 0 and "moeserve pull acme/other" in r.stderr
        # Online again: the missing file is fetched, the rest kept.
        s = Serve(tmp_path, "acme/replay-moe", env=hub_env(hub, tmp_path))
        assert s.stop() == 0
        assert (snap / "tokenizer.json").exists()
    finally:
        hub.close()


def test_service_rejects_what_serve_rejects(tmp_path, model):
    r = run("service", str(model), "--kv-cache-dtype", "fp8_e5m2")
    assert r.returncode != 0 and "not supported yet: --kv-cache-dtype fp8_e5m2" in r.stderr
    r = run("service", str(model), "--bogus-flag", "1")
    assert r.returncode != 0 and "not supported yet: --bogus-flag" in r.stderr
    r = run("service", str(model), "--trust-remote-code", "-tp", "4", "--max_model_len", "32k")
    assert r.returncode == 0, r.stderr
    assert "--trust-remote-code" in r.stderr  # the no-op warning, once
    assert "ExecStart=" in r.stdout and "--tensor-parallel-size 4" in r.stdout


def test_moeserve_alone_lists_subcommands():
    r = run()
    assert r.returncode == 0
    for sub in ("serve", "pull", "plan", "service", "bench"):
        assert sub in r.stdout
    r = run("serve", "--help")
    assert "test-replay-backend" not in r.stdout
    assert "Accepted for vllm compatibility" in r.stdout


def test_plan_recommended_command_is_accepted_by_serve_flags(tmp_path):
    cfg = REPO / "tests/fixtures/shared-data/models/minimax-m2.5"
    r = run("plan", "--model", str(cfg), "--gpus", "4", "--gpu-memory", "141GB", "--json")
    assert r.returncode == 0, r.stderr
    cmd = json.loads(r.stdout)["recommended_command"].split()
    assert cmd[:3] == ["moeserve", "serve", str(cfg)] and "--tensor-parallel-size" in cmd
    r = run("service", *cmd[2:])  # the same table and checks as serve
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr


def test_inspect_config_only_and_pull_id_without_slash(tmp_path):
    d = tmp_path / "cfg"
    d.mkdir()
    shutil.copy(REPO / "tests/fixtures/shared-data/models/minimax-m2.5/config.json", d)
    r = run("inspect", str(d))
    assert r.returncode == 0 and "config.json only" in r.stdout and "228.69B total" in r.stdout, r.stderr
    r = run("pull", "gpt2")
    assert r.returncode != 0 and "expected 'org/name'" in r.stderr


@pytest.mark.parametrize("fixture", ["qwen3_tiny_fp8", "tiny_fp8_b128", "qwen3_tiny_bf16"])
def test_dummy_weights_any_architecture_on_cpu(tmp_path, fixture):
    # --load-format dummy: random weights from the architecture's declarations (config.json
    # alone, no safetensors in the folder), on the CPU too; a completion comes back.
    m = tmp_path / "m"
    m.mkdir()
    shutil.copy(REPO / "tests/fixtures/golden" / fixture / "config.json", m)
    shutil.copy(QWEN / "tokenizer.json", m)
    shutil.copy(QWEN / "tokenizer_config.json", m)
    s = Serve(tmp_path, m, "--load-format", "dummy", "--device", "cpu", "--max-model-len", "64", replay=False)
    try:
        r = httpx.post(s.base + "/v1/completions", timeout=60,
                       json={"model": str(m), "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0,
                             "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        arch = json.loads((m / "config.json").read_text())["architectures"][0]
        assert f"random {arch} weights made on the host" in s.text()
    finally:
        s.stop()


def test_unsupported_load_format(tmp_path, model):
    r = run("serve", str(model), "--load-format", "pt", "--port", "0")
    assert r.returncode != 0 and "not supported yet: --load-format pt" in r.stderr
