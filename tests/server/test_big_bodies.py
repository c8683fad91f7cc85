"""The largest allowed request bodies against `moeserve serve --device cpu` on the tiny model
(CTest label `stress`, issue 25 items 5 and 7): while several clients post bodies just under
the default 32 MiB limit (many short messages, one huge message, many tools), /health must
answer within 100 ms (p99; max with a margin for a loaded 2-core CI machine), and after the
bodies are done the server's RSS must return near its idle figure, round after round.
Figures are printed (pytest -s) and quoted in docs/reliability.md.

MOESERVE_BIG_BODIES_CLIENTS (default 4) and MOESERVE_BIG_BODIES_ROUNDS (default 2) scale it."""
import json
import os
import signal
import threading
import time

import pytest

from test_stress import NAME, connect, http_get, read_response, rss_mb, start_server

LIMIT = 32 << 20  # serve's default --max-request-body-bytes
CLIENTS = int(os.environ.get("MOESERVE_BIG_BODIES_CLIENTS", "4"))
ROUNDS = int(os.environ.get("MOESERVE_BIG_BODIES_ROUNDS", "2"))


def request_bytes(path, obj):
    data = json.dumps(obj).encode()
    assert len(data) < LIMIT, len(data)
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def fill(make, unit_bytes):
    """The largest n with len(json(make(n))) under the limit less a small margin."""
    n = max(1, (LIMIT - 4096) // unit_bytes)
    while len(json.dumps(make(n))) >= LIMIT - 1024:
        n = int(n * 0.97)
    return make(n)


def bodies():
    msg = {"role": "user", "content": "hello there"}
    many_messages = fill(lambda n: {"model": NAME, "max_tokens": 1, "messages": [msg] * n}, len(json.dumps(msg)) + 2)
    huge_message = {"model": NAME, "max_tokens": 1,
                    "messages": [{"role": "user", "content": "lorem ipsum dolor sit amet " * ((LIMIT - 4096) // 27)}]}
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city for some days",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}}
    many_tools = fill(lambda n: {"model": NAME, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                                 "tools": [tool] * n}, len(json.dumps(tool)) + 2)
    return [("messages", request_bytes("/v1/chat/completions", many_messages)),
            ("content", request_bytes("/v1/chat/completions", huge_message)),
            ("tools", request_bytes("/v1/chat/completions", many_tools)),
            ("tokenize", request_bytes("/tokenize", {"model": NAME, "messages": many_messages["messages"]}))]


def post(data, out):
    try:
        with connect(out["port"], timeout=600) as s:
            s.sendall(data)
            out["statuses"].append(read_response(s)[0])
    except Exception as e:  # noqa: BLE001 - reported by the test
        out["errors"].append(repr(e))


@pytest.fixture(scope="module")
def big_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("big")
    proc, port, log = start_server(tmp)
    yield proc, port
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    log.close()


def run_round(proc, port, shapes):
    """CLIENTS concurrent big bodies (shapes in turn) while /health is probed on fresh
    connections every 10 ms. Returns (statuses, latencies s, wall s, peak RSS MB)."""
    out = {"port": port, "statuses": [], "errors": []}
    senders = [threading.Thread(target=post, args=(shapes[i % len(shapes)][1], out)) for i in range(CLIENTS)]
    peak = rss_mb(proc.pid)
    t0 = time.time()
    for t in senders:
        t.start()
    lat = []
    while any(t.is_alive() for t in senders):
        t1 = time.perf_counter()
        st = http_get(port, "/health")[0]
        lat.append(time.perf_counter() - t1)
        assert st == 200
        peak = max(peak, rss_mb(proc.pid))
        time.sleep(0.01)
    wall = time.time() - t0
    for t in senders:
        t.join()
    assert not out["errors"], out["errors"]
    return out["statuses"], sorted(lat), wall, peak


def settled_rss(proc, idle, timeout=10.0):
    """RSS once the server has released the round's memory (polled: the last body's
    release may lag its response by a moment)."""
    end = time.time() + timeout
    r = rss_mb(proc.pid)
    while time.time() < end and r > idle + 32:
        time.sleep(0.1)
        r = rss_mb(proc.pid)
    return r


def test_health_and_rss_with_largest_bodies(big_server):
    proc, port = big_server
    shapes = bodies()
    idle = rss_mb(proc.pid)
    rows = []
    for rnd in range(ROUNDS):
        statuses, lat, wall, peak = run_round(proc, port, shapes)
        after = settled_rss(proc, idle)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        rows.append((rnd, statuses, len(lat), lat[len(lat) // 2], p99, lat[-1], wall, peak, after))
        # Every body is answered: 400 (the tiny model's 1024-token context refuses the
        # prompt; /tokenize answers 200) or 503 (the preparation queue's byte bound).
        assert len(statuses) == CLIENTS and set(statuses) <= {200, 400, 503}, statuses
    print(f"\nbody shapes: " + ", ".join(f"{n} {len(b) / 1e6:.1f} MB" for n, b in shapes) + f"; idle RSS {idle:.0f} MB")
    print("| round | clients | statuses | probes | /health p50 ms | p99 ms | max ms | wall s | RSS peak MB | RSS after MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rnd, st, n, p50, p99, mx, wall, peak, after in rows:
        counts = {s: st.count(s) for s in sorted(set(st))}
        print(f"| {rnd} | {CLIENTS} | {counts} | {n} | {p50 * 1e3:.1f} | {p99 * 1e3:.1f} | {mx * 1e3:.1f} | {wall:.1f} | "
              f"{peak:.0f} | {after:.0f} |")
    for rnd, st, n, p50, p99, mx, wall, peak, after in rows:
        assert n >= 20, "too few probes: the round ended before it was measured"
        assert p99 < 0.1, f"round {rnd}: /health p99 {p99 * 1e3:.1f} ms"
        # The worst single probe on a loaded 2-core machine (other builds running: 228 ms at a
        # load average of 14) is the scheduler's, not the server's; an io thread that waited
        # on preparation would take seconds (a 32 MiB body takes 10-40 s to prepare).
        assert mx < 0.5, f"round {rnd}: /health max {mx * 1e3:.1f} ms"
        # Preparation's memory goes back to the system after each round (2.5 GB stayed before
        # the prep pool trimmed the heap); what remains is caches and allocator slack, and
        # the bound is against the idle figure, so it cannot grow from round to round.
        assert after < idle + 128, f"round {rnd}: RSS {after:.0f} MB after, {idle:.0f} MB idle"
