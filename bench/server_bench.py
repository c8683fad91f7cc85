#!/usr/bin/env python3
"""Server streaming throughput with the replay backend (no model compute).

Starts `moeserve serve --test-replay-backend` (small vocab so sampling is cheap), opens
--streams concurrent streaming /v1/completions requests of --tokens tokens each over raw
asyncio sockets (the client parses only the final usage chunk, so it stays cheaper than the
server), and reports streamed tokens/s and the server's CPU time per streamed token.

  python3 bench/server_bench.py --bin build/moeserve --streams 256 --tokens 256
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


async def run_load(port, streams, tokens):
    body = json.dumps({"prompt": [1, 2, 3, 4], "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    return await asyncio.gather(*[one_stream(port, body) for _ in range(streams)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "build/moeserve"))
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--io-threads", type=int, default=1)
    args = ap.parse_args()
    tok_dir = Path(args.tokenizer_dir) if args.tokenizer_dir else None
    for cand in [REPO.parent / "shared/data/tokenizers/qwen3", Path("/work/shared/data/tokenizers/qwen3")]:
        if tok_dir is None and (cand / "tokenizer.json").exists():
            tok_dir = cand
    tmp = Path(tempfile.mkdtemp())
    model = tmp / "model"
    model.mkdir()
    shutil.copy(tok_dir / "tokenizer.json", model)
    shutil.copy(tok_dir / "tokenizer_config.json", model)
    # Token ids 200..711: ordinary byte-level pieces; vocab 1024 keeps sampling cheap.
    script = {"vocab_size": 1024, "max_model_len": 4096, "num_kv_blocks": 65536, "end_token": 0,
              "scripts": [{"marker": [], "tokens": [200 + (i % 512) for i in range(4000)]}]}
    (tmp / "replay.json").write_text(json.dumps(script))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([args.bin, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                             "--test-replay-backend", str(tmp / "replay.json"), "--max-num-seqs", str(args.streams),
                             "--max-num-batched-tokens", "8192", "--io-threads", str(args.io_threads),
                             "--log-level", "warn"] if False else [args.bin, "--log-level", "warn", "serve", str(model), "--host", "127.0.0.1", "--port",
                             str(port), "--test-replay-backend", str(tmp / "replay.json"), "--max-num-seqs",
                             str(args.streams), "--max-num-batched-tokens", "8192", "--io-threads",
                             str(args.io_threads)])
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        asyncio.run(run_load(port, 8, 16))  # warm-up
        c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
        counts = asyncio.run(run_load(port, args.streams, args.tokens))
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
           "io_threads": args.io_threads, "cores": os.cpu_count()}
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
