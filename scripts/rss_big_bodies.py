#!/usr/bin/env python3
"""Server RSS with many concurrent request bodies just under the 32 MiB body limit (issue 25).

Serves `moeserve make-tiny` on the CPU with the default limits (--max-request-body-bytes 32 MiB,
--prep-threads 2), then sends rounds of C concurrent POST /v1/chat/completions whose bodies are
~32 MB of short messages (the shape that costs the most to prepare: JSON, message copies, the
chat template, tokenisation; the tiny model's 256-token context then refuses them with 400).
Samples the server's VmRSS every 50 ms and prints, per round: statuses, wall time, RSS before,
peak and after, and /health latency during the round. VmHWM at the end is the process peak.

usage: scripts/rss_big_bodies.py [--bin build/moeserve] [--rounds 1,4,8,16] [--mb 31.5]
"""
import argparse
import concurrent.futures as cf
import http.client
import json
import os
import socket
import subprocess
import tempfile
import threading
import time


def rss_kb(pid, key="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def body_of(mb):
    one = {"role": "user", "content": "hello there"}
    n = int(mb * 1e6 / len(json.dumps(one)))
    b = json.dumps({"model": "tiny", "max_tokens": 1, "messages": [one] * n}).encode()
    while len(b) > 32 * 1024 * 1024 - 64:  # under the limit (413 otherwise)
        n = int(n * 0.98)
        b = json.dumps({"model": "tiny", "max_tokens": 1, "messages": [one] * n}).encode()
    return b


def post(port, body, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def health_ms(port):
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/health")
    c.getresponse().read()
    c.close()
    return (time.perf_counter() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/moeserve")
    ap.add_argument("--rounds", default="1,4,8,16")
    ap.add_argument("--mb", type=float, default=31.5)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    subprocess.run([a.bin, "make-tiny", f"{tmp}/model"], check=True, capture_output=True)
    port = free_port()
    log = open(f"{tmp}/server.log", "w")
    proc = subprocess.Popen([a.bin, "serve", f"{tmp}/model", "--served-model-name", "tiny", "--device", "cpu",
                             "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if health_ms(port) >= 0:
                    break
            except OSError:
                time.sleep(0.1)
        body = body_of(a.mb)
        print(f"body {len(body) / 1e6:.1f} MB ({len(body)} bytes), server pid {proc.pid}, idle RSS "
              f"{rss_kb(proc.pid) / 1024:.0f} MiB")
        print("| concurrent | statuses | wall s | RSS before MiB | RSS peak MiB | RSS after MiB | /health max ms |")
        print("|---|---|---|---|---|---|---|")
        for conc in [int(x) for x in a.rounds.split(",")]:
            before = rss_kb(proc.pid)
            peak = [before]
            stop = threading.Event()
            probes = []

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], rss_kb(proc.pid))
                    time.sleep(0.05)

            def probe():
                while not stop.is_set():
                    probes.append(health_ms(port))
                    time.sleep(0.2)

            ts = [threading.Thread(target=sample), threading.Thread(target=probe)]
            for t in ts:
                t.start()
            t0 = time.time()
            with cf.ThreadPoolExecutor(conc) as ex:
                statuses = list(ex.map(lambda _: post(port, body), range(conc)))
            wall = time.time() - t0
            time.sleep(1.0)
            stop.set()
            for t in ts:
                t.join()
            after = rss_kb(proc.pid)
            counts = {s: statuses.count(s) for s in sorted(set(statuses))}
            print(f"| {conc} | {counts} | {wall:.1f} | {before / 1024:.0f} | {peak[0] / 1024:.0f} | {after / 1024:.0f} | "
                  f"{max(probes) if probes else float('nan'):.1f} |")
        print(f"VmHWM (process peak): {rss_kb(proc.pid, 'VmHWM') / 1024:.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
