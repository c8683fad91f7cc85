#!/usr/bin/env python3
"""N concurrent streaming clients against `moeserve serve --device cpu` on the tiny model
(issue 25's load check: 1,000 and 2,000 streams). Every client opens its own connection at
once and sends one streaming /v1/completions; a fraction disconnects after a random number of
events (half FIN, half RST). Checked per client: a 200 stream ends with finish_reason
"length", usage counting every token, [DONE] and the chunk terminator (else "lost" or
"truncated"); a refusal is a 429 (engine queue full) or 503 (connection cap) with an error
body. After each round: the running / waiting / KV gauges must return to 0, and the server's
open descriptors and RSS are printed before / after. Exit status 1 if the server crashed, a
stream was lost or truncated, a 5xx other than the documented 503 appeared, or the gauges
stayed up.

usage: scripts/load_streams.py [--bin build/moeserve] [--streams 1000,2000] [--repeats 2]
                               [--max-tokens 16] [--disconnect 0.1] [--port P (a running server)]
"""
import argparse
import asyncio
import json
import os
import random
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

NAME = "tiny"


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


async def read_response(reader):
    """(status, body bytes, complete) of one HTTP/1.1 response (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    hdr = {k.lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
    if "content-length" in hdr:
        return status, await reader.readexactly(int(hdr["content-length"])), True
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return status, body, True
        body += data[:-2]


async def get(port, path):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    st, body, _ = await read_response(r)
    w.close()
    return st, body


async def gauges(port):
    out = {}
    for line in (await get(port, "/metrics"))[1].decode().splitlines():
        for g in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            if line.startswith(g + "{"):
                out[g] = out.get(g, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def check_stream(body, max_tokens):
    events = [e[6:] for e in body.decode().split("\n\n") if e.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "truncated"
    chunks = [json.loads(e) for e in events[:-1]]
    finish = [c["finish_reason"] for ch in chunks for c in ch["choices"] if c.get("finish_reason")]
    if finish != ["length"] or chunks[-1].get("usage", {}).get("completion_tokens") != max_tokens:
        return "truncated"
    return "ok"


async def client(port, seed, a, res):
    rnd = random.Random(seed)
    body = json.dumps({"model": NAME, "prompt": f"load {seed} " * (1 + seed % 7), "max_tokens": a.max_tokens,
                       "stream": True, "ignore_eos": True, "temperature": 0.8, "seed": seed,
                       "stream_options": {"include_usage": True}}).encode()
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    disconnect = rnd.random() < a.disconnect
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError as e:
        res["connect_error"] += 1
        res["errors"].append(f"{seed}: connect {e!r}")
        return
    try:
        w.write(req)
        await w.drain()
        if disconnect:
            want, got = rnd.randint(1, a.max_tokens), b""
            while got.count(b"data: ") < want:
                d = await r.read(4096)
                if not d:
                    break
                got += d
            if rnd.random() < 0.5:  # RST instead of FIN
                w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            res["disconnected"] += 1
            return
        st, data, _ = await asyncio.wait_for(read_response(r), a.timeout)
        res["status"][st] = res["status"].get(st, 0) + 1
        if st == 200:
            verdict = check_stream(data, a.max_tokens)
            res[verdict] += 1
            if verdict != "ok":
                res["errors"].append(f"{seed}: {verdict}: {data[-200:]!r}")
        elif st not in (429, 503) or b"error" not in data:
            res["unexpected"] += 1
            res["errors"].append(f"{seed}: status {st}: {data[:200]!r}")
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError, asyncio.LimitOverrunError) as e:
        res["lost"] += 1
        res["errors"].append(f"{seed}: lost {e!r}")
    finally:
        w.close()


async def round_(port, n, rnd, a):
    res = {"ok": 0, "truncated": 0, "lost": 0, "disconnected": 0, "connect_error": 0, "unexpected": 0, "status": {}, "errors": []}
    t0 = time.time()
    await asyncio.gather(*(client(port, rnd * 100000 + i, a, res) for i in range(n)))
    return res, time.time() - t0


async def settle(port, pid, timeout=30):
    t0 = time.time()
    g = {}
    while time.time() - t0 < timeout:
        g = await gauges(port)
        if all(v == 0 for v in g.values()):
            return g, time.time() - t0
        await asyncio.sleep(0.1)
    return g, None


async def main_async(a, port, pid):
    rows, failed = [], False
    for n in [int(x) for x in a.streams.split(",")]:
        for rep in range(a.repeats):
            fd0, rss0 = (fds(pid), rss_mb(pid)) if pid else (0, 0)
            res, wall = await round_(port, n, len(rows), a)
            g, took = await settle(port, pid)
            await asyncio.sleep(0.5)  # the server's side of the closed connections
            fd1, rss1 = (fds(pid), rss_mb(pid)) if pid else (0, 0)
            alive = pid == 0 or os.waitpid(pid, os.WNOHANG) == (0, 0)
            fives = sum(v for k, v in res["status"].items() if k >= 500 and k != 503)
            bad = (not alive or res["lost"] or res["truncated"] or fives or took is None or res["connect_error"]
                   or res["unexpected"])
            failed |= bool(bad)
            rows.append((n, rep, res, wall, took, fd0, fd1, rss0, rss1, alive, fives))
            print(f"{n} streams (repeat {rep}): {wall:.1f} s, statuses {dict(sorted(res['status'].items()))}, "
                  f"complete {res['ok']}, disconnected {res['disconnected']}, lost {res['lost']}, "
                  f"truncated {res['truncated']}, connect errors {res['connect_error']}, gauges 0 after "
                  f"{took if took is None else round(took, 2)} s, fds {fd0}->{fd1}, RSS {rss0:.0f}->{rss1:.0f} MB, "
                  f"server {'alive' if alive else 'DEAD'}", flush=True)
            for e in res["errors"][:5]:
                print("   ", e)
            if not alive:
                return rows, True
    print("\n| streams | repeat | wall s | 200 complete | disconnected (planned) | 429 | 503 | other 5xx | lost | "
          "truncated | gauges 0 after s | server fds before -> after | RSS MB before -> after | crashed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, rep, res, wall, took, fd0, fd1, rss0, rss1, alive, fives in rows:
        st = res["status"]
        print(f"| {n} | {rep} | {wall:.1f} | {res['ok']} | {res['disconnected']} | {st.get(429, 0)} | {st.get(503, 0)} | "
              f"{fives} | {res['lost']} | {res['truncated']} | {took if took is None else f'{took:.2f}'} | "
              f"{fd0} -> {fd1} | {rss0:.0f} -> {rss1:.0f} | {'no' if alive else 'YES'} |")
    return rows, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/moeserve")
    ap.add_argument("--streams", default="1000,2000")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--disconnect", type=float, default=0.1, help="fraction of clients that leave mid-stream")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--port", type=int, default=0, help="use a running server (no fd/RSS figures)")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve argument (repeatable)")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    proc = None
    port, pid = a.port, 0
    if not port:
        tmp = tempfile.mkdtemp()
        subprocess.run([a.bin, "make-tiny", f"{tmp}/model"], check=True, capture_output=True)
        port = free_port()
        log = open(f"{tmp}/server.log", "w")
        proc = subprocess.Popen([a.bin, "serve", f"{tmp}/model", "--served-model-name", NAME, "--device", "cpu",
                                 "--host", "127.0.0.1", "--port", str(port), *a.serve_arg],
                                stdout=log, stderr=subprocess.STDOUT)
        pid = proc.pid
        for _ in range(600):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        print(f"server pid {pid}, log {tmp}/server.log, fd limit {hard}", flush=True)
    try:
        rows, failed = asyncio.run(main_async(a, port, pid))
    finally:
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=120)
            print(f"SIGTERM: exit {rc}")
            failed |= rc != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
