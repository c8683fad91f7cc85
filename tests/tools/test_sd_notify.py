"""`moeserve serve` speaks the systemd notify protocol: STATUS= lines while loading, READY=1
once the model is loaded and warmed up (then /health answers 200), STOPPING=1 at SIGTERM.
Runs the built-in tiny model on CPU with NOTIFY_SOCKET pointing at a datagram socket we bind
(a path, and an abstract '@' name)."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(os.environ.get("MOESERVE_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BIN = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny") / "model"
    subprocess.run([BIN, "make-tiny", str(model)], check=True, capture_output=True)
    return model


def recv_until(sock, want, deadline):
    msgs = []
    while time.time() < deadline:
        sock.settimeout(max(0.05, deadline - time.time()))
        try:
            data = sock.recv(4096).decode()
        except socket.timeout:
            break
        msgs.append(data)
        if any(want in line.split("\n") for line in [data]):
            return msgs
    raise AssertionError(f"no {want!r} in {msgs!r}")


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_notify_lifecycle(tiny, tmp_path, kind):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if kind == "path":
        addr = str(tmp_path / "notify.sock")
        sock.bind(addr)
        env_addr = addr
    else:
        name = f"moeserve-test-{os.getpid()}-{time.time_ns()}"
        sock.bind("\0" + name)
        env_addr = "@" + name
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([BIN, "serve", str(tiny), "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NOTIFY_SOCKET": env_addr})
    try:
        msgs = recv_until(sock, "READY=1", time.time() + 120)
        lines = [l for m in msgs for l in m.split("\n")]
        ready = lines.index("READY=1")
        status = [l for l in lines[:ready] if l.startswith("STATUS=")]
        assert any("tokenizer" in s for s in status) and any("model weights" in s for s in status) and \
            any("warming up" in s for s in status), lines
        # READY=1 means serving: /health answers at once.
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        assert "warm-up: 1 token" in (tmp_path / "server.log").read_text()
        proc.send_signal(signal.SIGTERM)
        msgs = recv_until(sock, "STOPPING=1", time.time() + 60)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()


def test_no_notify_socket_is_fine(tiny, tmp_path):
    """Without NOTIFY_SOCKET (or with a dead one) serve starts and stops as before."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env["NOTIFY_SOCKET"] = str(tmp_path / "nobody-listens.sock")
    proc = subprocess.Popen([BIN, "serve", str(tiny), "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
