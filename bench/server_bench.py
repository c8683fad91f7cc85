#!/usr/bin/env python3
"""Server streaming throughput with the replay backend (no model compute).

Starts `moeserve serve --test-replay-backend` with a --vocab wide replay model (default
200,064 = MiniMax-M2's vocab_size; each logits row is 0 everywhere except the scripted token
at 30, so the engine's host sampler reads a full row per token), opens --streams concurrent
streaming /v1/completions requests of --tokens tokens each (ignore_eos) over raw asyncio
sockets (the client parses only the final usage chunk, so it stays cheaper than the
server), and reports streamed tokens/s and the server's CPU time (all its threads: HTTP,
engine, sampling) per streamed token. Sampling defaults to vLLM's default (temperature 1,
top_p 1, top_k off).

  python3 bench/server_bench.py --bin build/moeserve --streams 256 --tokens 256

With --model DIR the server runs that checkpoint instead (e.g. `moeserve make-tiny DIR
--vocab-size 200064`) on --device (cpu or cuda); --host-sampling passes serve's flag of that
name, which downloads every logits row and samples on the host instead of on the GPU.

  python3 bench/server_bench.py --model /tmp/tiny200k --device cuda [--host-sampling]
"""
import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_stream(port, body):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = (f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body
    writer.write(req)
    await writer.drain()
    data = bytearray()
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            break
        data += chunk
    writer.close()
    text = data.decode("utf-8", "replace")
    usage = text.rfind('"usage":')
    assert "data: [DONE]" in text and usage > 0, text[-400:]
    return json.loads(text[usage + 8:text.index("}", usage) + 1])["completion_tokens"]


async def run_load(port, streams, tokens, sampling):
    body = json.dumps({"prompt": [1, 2, 3, 4], "max_tokens": tokens, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}, **sampling}).encode()
    return await asyncio.gather(*[one_stream(port, body) for _ in range(streams)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "build/moeserve"))
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--io-threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=200064, help="replay vocabulary (logits row width)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--model", default=None, help="serve this checkpoint instead of the replay backend")
    ap.add_argument("--device", default="cpu", help="with --model: cpu or cuda")
    ap.add_argument("--host-sampling", action="store_true", help="with --model: serve --host-sampling")
    args = ap.parse_args()
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    common = ["--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(args.streams),
              "--max-num-batched-tokens", "8192", "--io-threads", str(args.io_threads)]
    tmp = Path(tempfile.mkdtemp())
    if args.model:
        cmd = [args.bin, "--log-level", "warn", "serve", args.model, "--device", args.device, *common]
        if args.host_sampling:
            cmd.append("--host-sampling")
        args.vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    else:
        tok_dir = Path(args.tokenizer_dir) if args.tokenizer_dir else None
        for cand in [REPO / "tests/fixtures/shared-data/tokenizers/qwen3"]:
            if tok_dir is None and (cand / "tokenizer.json").exists():
                tok_dir = cand
        model = tmp / "model"
        model.mkdir()
        shutil.copy(tok_dir / "tokenizer.json", model)
        shutil.copy(tok_dir / "tokenizer_config.json", model)
        # Token ids 200..711: ordinary byte-level pieces of the tokenizer; the replay vocabulary
        # (logits width) is --vocab.
        script = {"vocab_size": args.vocab, "max_model_len": 4096, "num_kv_blocks": 65536, "end_token": 0,
                  "scripts": [{"marker": [], "tokens": [200 + (i % 512) for i in range(4000)]}]}
        (tmp / "replay.json").write_text(json.dumps(script))
        cmd = [args.bin, "--log-level", "warn", "serve", str(model), "--test-replay-backend", str(tmp / "replay.json"),
               *common]
    proc = subprocess.Popen(cmd)
    try:
        for _ in range(1200):
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        asyncio.run(run_load(port, 8, 16, sampling))  # warm-up
        c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
        counts = asyncio.run(run_load(port, args.streams, args.tokens, sampling))
        t1, c1 = time.perf_counter(), cpu_seconds(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(tmp)
    total = sum(counts)
    assert total == args.streams * args.tokens, (total, args.streams * args.tokens)
    res = {"streams": args.streams, "tokens_per_stream": args.tokens, "total_tokens": total,
           "wall_s": round(t1 - t0, 3), "tokens_per_s": round(total / (t1 - t0), 1),
           "server_cpu_s": round(c1 - c0, 3), "server_cpu_us_per_token": round((c1 - c0) / total * 1e6, 2),
           "io_threads": args.io_threads, "cores": os.cpu_count(), "vocab": args.vocab, **sampling}
    if args.model:
        res.update(model=args.model, device=args.device, host_sampling=args.host_sampling)
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
