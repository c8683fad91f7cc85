"""`moeserve service`: the generated unit passes `systemd-analyze verify`, and its ExecStart
gives back exactly the serve arguments (checked with an independent reading of systemd's
quoting rules, systemd.syntax(7) and systemd.service(5))."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(os.environ.get("MOESERVE_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BIN = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))

# Words systemd quoting must keep verbatim. ";" and "" are extra served-model-name values:
# `service` parses with serve's own flag table, so stray positionals would be refused there.
TRICKY = ["--served-model-name", "minimax m2.5", ";", "", "--chat-template", "{{ \"%s\" }} $HOME ${X} 100%",
          "--api-key", "a'b\"c\\d", "--hf-overrides", "{\"rope_theta\": 1000000}"]


def service(*args, check=True):
    p = subprocess.run([BIN, "service", *args], capture_output=True, text=True, timeout=60)
    if check:
        assert p.returncode == 0, p.stderr
    return p


C_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "\"": "\"",
         "'": "'", "s": " "}


def systemd_words(line):
    """ExecStart= value -> argv: specifiers (%% -> %), then words with quotes and C escapes,
    then $$ -> $ (the only environment rule our quoting uses)."""
    assert "%" not in line.replace("%%", ""), f"unescaped specifier in {line!r}"
    line = line.replace("%%", "%")
    words, i, n = [], 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        w, quote, started = "", None, True
        while i < n:
            c = line[i]
            if quote is None and c in " \t":
                break
            if c in "\"'" and (quote is None or quote == c):
                quote = None if quote == c else c
                i += 1
                continue
            if c == "\\":
                e = line[i + 1]
                if e == "x":
                    w += chr(int(line[i + 2:i + 4], 16))
                    i += 4
                    continue
                w += C_ESC[e]
                i += 2
                continue
            w += c
            i += 1
        assert quote is None, f"unterminated quote in {line!r}"
        assert started
        words.append(w)
    out = []
    for w in words:
        assert not re.search(r"(?<!\$)\$(?!\$)", w.replace("$$", "")), f"unescaped $ in {w!r}"
        out.append(w.replace("$$", "$"))
    return out


def directives(unit):
    d = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            d.setdefault(k, []).append(v)
    return d


def test_exec_start_round_trip(tmp_path):
    model = tmp_path / "model dir"
    model.mkdir()
    os.chdir(tmp_path)
    unit = service("model dir", "--port", "8000", *TRICKY, "--tensor_parallel_size=2", "--name", "m25",
                   "--user", "root", "--env", "NCCL_SOCKET_IFNAME=lo").stdout
    d = directives(unit)
    argv = systemd_words(d["ExecStart"][0])
    assert argv[0] == str(Path(BIN).resolve()) and argv[1] == "serve"
    # The relative model directory became absolute; everything else is verbatim and in order
    # (flag names with underscores arrive with dashes: main.cpp normalises them as vLLM does).
    assert argv[2:] == [str(model), "--port", "8000", *TRICKY, "--tensor-parallel-size=2"]
    assert d["Type"] == ["notify"] and d["Restart"] == ["on-failure"] and d["LimitNOFILE"] == ["65536"]
    assert d["User"] == ["root"] and d["SyslogIdentifier"] == ["m25"]
    env = [systemd_words(v)[0] for v in d["Environment"]]
    assert "CUDA_VISIBLE_DEVICES=0,1" in env and "NCCL_SOCKET_IFNAME=lo" in env and \
        "HF_HOME=/var/lib/m25/huggingface" in env


def test_systemd_analyze_verify(tmp_path):
    sa = shutil.which("systemd-analyze")
    if sa is None:
        pytest.skip("systemd-analyze is not installed (scripts/install-deps.sh installs the systemd package)")
    model = tmp_path / "model"
    model.mkdir()
    env_file = tmp_path / "env"
    env_file.write_text("HF_TOKEN=x\n")
    unit = service(str(model), "--port", "8000", *TRICKY, "-tp", "4", "--name", "moeserve-test", "--user", "root",
                   "--env-file", str(env_file)).stdout
    path = tmp_path / "moeserve-test.service"
    path.write_text(unit)
    p = subprocess.run([sa, "verify", str(path)], capture_output=True, text=True, timeout=120)
    # verify prints problems of the unit file itself with its path; unrelated system units
    # (absent in a container) are not ours to judge.
    ours = [l for l in (p.stdout + p.stderr).splitlines() if str(path) in l or "moeserve-test" in l]
    assert p.returncode == 0 and not ours, p.stdout + p.stderr
    # And verify does catch a broken unit here (the check can fail).
    bad = tmp_path / "moeserve-bad.service"
    bad.write_text(unit.replace("Type=notify", "Type=notifyy").replace(str(Path(BIN).resolve()), "/nonexistent/moeserve"))
    p = subprocess.run([sa, "verify", str(bad)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 or "moeserve-bad" in p.stdout + p.stderr, p.stdout + p.stderr


def test_cpu_device_has_no_cuda_env_and_errors(tmp_path):
    unit = service(str(tmp_path), "--device", "cpu").stdout
    assert "CUDA_VISIBLE_DEVICES" not in unit and "Type=notify" in unit
    p = service(check=False)
    assert p.returncode == 1 and "give the serve flags" in p.stderr
    p = service(str(tmp_path), "--name", "bad name", check=False)
    assert p.returncode == 1 and "--name" in p.stderr
    p = service(str(tmp_path), "--env", "NOT-A-VAR=1", check=False)
    assert p.returncode == 1 and "not a variable name" in p.stderr
