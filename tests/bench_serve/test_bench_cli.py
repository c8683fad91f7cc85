"""`moeserve bench` end to end: against `moeserve serve` with the replay backend (scripted
tokens, fixed sleeps per engine step and per prefill token, so timings are stable), checks
the counts in --result-json, and cross-checks throughput and median TTFT against an
independent client written here on the official openai SDK (AsyncOpenAI, streaming, same
workload and concurrency). Also: the chat endpoint, the built-in tiny model, and clean
failures on a refused connection or bad options."""
import asyncio
import importlib.util
import json
import os
import random
import statistics
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("server_conftest", REPO / "tests/server/conftest.py")
srv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(srv)

BIN = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
STEP_US = 10000       # every engine step sleeps 10 ms
PER_TOKEN_US = 3000   # plus 3 ms per prompt token in the step (prefill cost)
WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud".split()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    text = " ".join(WORDS * 20)  # long ASCII script: every generated token carries text
    # No prefix caching: the same prompts are sent by both clients and every run must pay prefill.
    s = srv.Server(tmp_path_factory.mktemp("bench"), ["--no-enable-prefix-caching"],
                   {"step_sleep_us": STEP_US, "per_token_sleep_us": PER_TOKEN_US,
                    "scripts": [{"marker": [], "tokens": srv.encode(text)}]})
    yield s
    assert s.stop() == 0


def bench(base, *args, timeout=300):
    return subprocess.run([BIN, "bench", "--base-url", base, *args], capture_output=True, text=True, timeout=timeout)


def test_counts_and_layout(server, tmp_path):
    out = tmp_path / "r.json"
    r = bench(server.base, "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "16",
              "--num-prompts", "24", "--max-concurrency", "8", "--ignore-eos", "--result-json", str(out),
              "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
              "--goodput", "ttft:60000", "tpot:60000")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "============ Serving Benchmark Result ============" in r.stdout
    assert "Successful requests:                     24" in r.stdout
    assert "P90 TPOT (ms):" in r.stdout and "Median E2EL (ms):" in r.stdout
    assert "Speculative Decoding" not in r.stdout  # the server exports no spec-decode counters
    j = json.loads(out.read_text())
    assert j["completed"] == 24 and j["failed"] == 0 and j["num_prompts"] == 24
    assert j["output_lens"] == [16] * 24  # --ignore-eos: exact lengths, from usage
    assert j["total_output_tokens"] == sum(j["output_lens"]) == 384
    assert j["total_input_tokens"] == sum(j["input_lens"])
    # Random prompts were built with the served model's tokenizer (found through /v1/models root).
    assert all(abs(n - 32) <= 2 for n in j["input_lens"]), j["input_lens"]
    assert j["tokenizer_id"] != ""
    assert all(len(itl) == 15 for itl in j["itls"])  # one chunk per decode step
    assert j["request_throughput"] == pytest.approx(24 / j["duration"])
    assert j["output_throughput"] == pytest.approx(384 / j["duration"])
    assert j["request_goodput"] == pytest.approx(j["request_throughput"])  # generous SLOs
    assert 1 <= j["max_concurrent_requests"] <= 8
    # TTFT includes at least one prefill step; TPOT at least one decode step.
    assert j["median_ttft_ms"] >= STEP_US / 1000 and j["mean_tpot_ms"] >= STEP_US / 1000 * 0.9
    assert j["p99_e2el_ms"] >= j["median_e2el_ms"] >= j["median_ttft_ms"]
    for lat, ttft, itl in zip(j["latencies"], j["ttfts"], j["itls"]):
        assert lat == pytest.approx(ttft + sum(itl), abs=1e-6)


def test_chat_endpoint_and_jsonl(server, tmp_path):
    ds = tmp_path / "d.jsonl"
    ds.write_text("\n".join(json.dumps({"prompt": f"question {i}", "output_len": 3 + i}) for i in range(4)))
    out = tmp_path / "c.json"
    r = bench(server.base, "--endpoint", "/v1/chat/completions", "--dataset-name", "jsonl", "--dataset-path",
              str(ds), "--num-prompts", "4", "--ignore-eos", "--request-rate", "20", "--burstiness", "0.5",
              "--result-json", str(out), "--disable-tqdm", "--num-warmups", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Warming up with 2 requests..." in r.stdout and "Warmup run completed." in r.stdout
    assert "Request rate configured (RPS):           20.00" in r.stdout
    assert "Burstiness factor: 0.5 (Gamma distribution)" in r.stdout
    j = json.loads(out.read_text())
    assert j["backend"] == "openai-chat" and j["completed"] == 4
    assert j["output_lens"] == [3, 4, 5, 6]
    assert j["request_rate"] == 20 and j["burstiness"] == 0.5


async def sdk_client(base, prompts, max_tokens, concurrency, rate):
    """Independent measurement with the openai SDK, vLLM's definitions: TTFT = first chunk
    with choices; throughput = usage completion tokens / wall time of the whole run.
    rate: None = all released at once, else request i released at (i + 1) / rate
    (vLLM's schedule for --burstiness inf)."""
    import openai
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    sem = asyncio.Semaphore(concurrency)

    async def one(prompt):
        async with sem:
            t0 = time.perf_counter()
            ttft, tokens = None, 0
            stream = await client.completions.create(
                model="replay", prompt=prompt, max_tokens=max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            async for chunk in stream:
                if chunk.choices and ttft is None:
                    ttft = time.perf_counter() - t0
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
            return ttft, tokens

    await one(prompts[0])  # warm-up, as the bench's initial test request
    start = time.perf_counter()
    tasks = []
    for i, p in enumerate(prompts):
        if rate:
            await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one(p)))
    res = await asyncio.gather(*tasks)
    dur = time.perf_counter() - start
    await client.close()
    return sum(t for _, t in res) / dur, statistics.median(t for t, _ in res) * 1000


# Concurrency 1: every request is prefilled alone. Concurrency 4 with all requests released at
# once makes the server's batching of simultaneous prefills racy (median TTFT jumps between
# groups for either client), so that case uses evenly spaced arrivals instead.
@pytest.mark.parametrize("concurrency,rate", [(1, None), (4, 6.0)])
def test_cross_check_with_openai_sdk(server, tmp_path, concurrency, rate):
    n, in_len, out_len = 16, 32, 24
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(in_len)) for _ in range(n)]
    ds = tmp_path / "x.jsonl"
    ds.write_text("\n".join(json.dumps({"prompt": p, "output_len": out_len}) for p in prompts))
    attempts = []
    for _ in range(3):  # a loaded shared machine can disturb one run; any agreeing run passes
        out = tmp_path / "x.json"
        r = bench(server.base, "--dataset-name", "jsonl", "--dataset-path", str(ds), "--num-prompts", str(n),
                  "--max-concurrency", str(concurrency), "--ignore-eos", "--result-json", str(out),
                  "--metric-percentiles", "50", "--disable-tqdm",
                  *(["--request-rate", str(rate), "--burstiness", "inf"] if rate else []))
        assert r.returncode == 0, r.stdout + r.stderr
        j = json.loads(out.read_text())
        assert j["completed"] == n and j["total_output_tokens"] == n * out_len
        sdk_tput, sdk_ttft = asyncio.run(sdk_client(server.base, prompts, out_len, concurrency, rate))
        ours = (j["output_throughput"], j["median_ttft_ms"])
        attempts.append((ours, (sdk_tput, sdk_ttft)))
        if abs(ours[0] / sdk_tput - 1) < 0.05 and abs(ours[1] / sdk_ttft - 1) < 0.05:
            break
    else:
        pytest.fail(f"bench vs openai SDK (throughput tok/s, median TTFT ms) never within 5%: {attempts}")
    print(f"concurrency {concurrency}: (bench, sdk) (tok/s, median TTFT ms) per attempt: {attempts}")


def test_refused_connection_is_a_clean_error(tmp_path):
    port = srv.free_port()  # nothing listens there
    t0 = time.monotonic()
    r = bench(f"http://127.0.0.1:{port}", "--num-prompts", "2", timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error: Failed to fetch models" in r.stderr and "refused" in r.stderr.lower()
    # With --model the first request is the check; retried until --ready-check-timeout-sec.
    r = bench(f"http://127.0.0.1:{port}", "--model", "m", "--num-prompts", "2", "--ready-check-timeout-sec", "1",
              timeout=60)
    assert r.returncode == 1
    assert "Initial test run failed" in r.stderr and "refused" in r.stderr.lower()
    assert time.monotonic() - t0 < 30


def test_bad_options(server, tmp_path):
    for args, msg in [(["--goodput", "itl:5"], "invalid metric name"),
                      (["--metric-percentiles", "200"], "outside [0, 100]"),
                      (["--request-rate", "-3"], "--request-rate"),
                      (["--dataset-name", "sharegpt"], "--dataset-path"),
                      (["--endpoint", "/v1/embeddings"], "does not fit")]:
        r = bench(server.base, "--num-prompts", "1", *args, timeout=60)
        assert r.returncode != 0 and msg in r.stderr, (args, r.stderr)
    r = bench("https://127.0.0.1:1", timeout=60)
    assert r.returncode == 1 and "only http://" in r.stderr
    # A wrong model name is an HTTP 404 from the server: fails at once, no retry loop.
    r = bench(server.base, "--model", "nope", "--num-prompts", "1", timeout=60)
    assert r.returncode == 1 and "Initial test run failed" in r.stderr and "HTTP 404" in r.stderr


def test_tiny_model(tmp_path):
    """The real CPU executor (`moeserve make-tiny`) with its built-in tokenizer."""
    model = tmp_path / "model"
    subprocess.run([BIN, "make-tiny", str(model)], check=True, capture_output=True)
    port = srv.free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([BIN, "serve", str(model), "--served-model-name", "tiny", "--device", "cpu", "--host",
                             "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        import httpx
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            time.sleep(0.05)
        out = tmp_path / "t.json"
        r = bench(f"http://127.0.0.1:{port}", "--random-input-len", "16", "--random-output-len", "8",
                  "--num-prompts", "6", "--max-concurrency", "3", "--ignore-eos", "--result-json", str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        j = json.loads(out.read_text())
        assert j["completed"] == 6 and j["output_lens"] == [8] * 6 and j["model_id"] == "tiny"
        assert j["tokenizer_id"] == str(model)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_foreign_server_spec_decode_and_no_usage(tmp_path):
    """Another OpenAI-compatible server (a stdlib HTTP/1.0 one here: body ends at close, no
    usage chunk, no tokenizer reachable) that exports vLLM's spec-decode counters: the
    acceptance section comes from the /metrics deltas, output lengths from the chunk count."""
    import http.server
    import threading

    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos": [0, 0, 0]}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path == "/v1/models":
                body = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()
            elif self.path == "/metrics":
                with lock:
                    c = dict(counters)
                body = "\n".join(
                    ["# TYPE vllm:spec_decode_num_drafts_total counter",
                     f'vllm:spec_decode_num_drafts_total{{model_name="fake"}} {c["drafts"]}',
                     f'vllm:spec_decode_num_draft_tokens_total{{model_name="fake"}} {c["draft_tokens"]}',
                     f'vllm:spec_decode_num_accepted_tokens_total{{model_name="fake"}} {c["accepted"]}'] +
                    [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="fake",position="{i}"}} {v}'
                     for i, v in enumerate(c["pos"])]).encode() + b"\n"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert req["stream"] and req["stream_options"] == {"include_usage": True}
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0, no length: the body ends when the connection closes
            for i in range(5):
                self.wfile.write(f'data: {json.dumps({"choices": [{"index": 0, "text": f"w{i} "}]})}\n\n'.encode())
                self.wfile.flush()
                time.sleep(0.01)
            self.wfile.write(b"data: [DONE]\n\n")
            with lock:
                counters["drafts"] += 4
                counters["draft_tokens"] += 12
                counters["accepted"] += 6
                counters["pos"] = [counters["pos"][0] + 3, counters["pos"][1] + 2, counters["pos"][2] + 1]

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "f.json"
        r = bench(f"http://127.0.0.1:{httpd.server_address[1]}", "--random-input-len", "8", "--random-output-len", "5",
                  "--num-prompts", "3", "--result-json", str(out), "--explain-metrics")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Note: no tokenizer" in r.stdout
        assert "AIPerf ITL" in r.stdout.split("=" * 50)[-1]  # glossary after the table
        assert "progress: 3/3 requests done" in r.stderr  # not a TTY: plain progress lines
        assert "---------------Speculative Decoding---------------" in r.stdout
        assert "Acceptance rate (%):                     50.00" in r.stdout
        assert "Acceptance length:                       2.50" in r.stdout
        j = json.loads(out.read_text())
        assert j["completed"] == 3 and j["output_lens"] == [5, 5, 5] and j["input_lens"] == [8, 8, 8]
        assert j["generated_texts"][0] == "w0 w1 w2 w3 w4 "
        assert j["spec_decode_num_drafts"] == 12 and j["spec_decode_draft_tokens"] == 36
        assert j["spec_decode_acceptance_rate"] == 50.0 and j["spec_decode_acceptance_length"] == 2.5
        assert j["spec_decode_per_position_acceptance_rates"] == [0.75, 0.5, 0.25]
        assert all(len(itl) == 4 for itl in j["itls"]) and min(j["ttfts"]) > 0
    finally:
        httpd.shutdown()
