"""`moeserve bench-model --device cpu` end to end: --verify-tokens / --routing-overlap wired to the
JSON report (rows, distinct experts, speedups), --measure-routing-overlap on the demo model, and
bad values refused with a message and a non-zero exit before anything runs."""
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(os.environ.get("MOESERVE_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BIN = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
MODEL = ["--synthetic", "minimax-m2-tiny", "--layers", "2", "--iters", "2"]
TINY = ["--device", "cpu", *MODEL]


def run(*args, check=True):
    p = subprocess.run([BIN, "bench-model", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


def report(tmp_path, *args):
    out = tmp_path / "r.json"
    p = run(*TINY, *args, "--json", str(out))
    return json.loads(out.read_text()), p.stdout


def test_verify_rows_with_full_overlap(tmp_path):
    r, text = report(tmp_path, "--batch-sizes", "1", "2", "--contexts", "48", "--verify-tokens", "0", "3",
                     "--routing-overlap", "1.0")
    v = r["verify"]
    assert "draft" in v["note"] and v["routing"]["overlap"] == 1.0
    assert "--verify-tokens 0 3" in r["command"]
    rows = {(x["batch"], x["k"]): x for x in v["rows"]}
    assert set(rows) == {(1, 0), (1, 3), (2, 0), (2, 3)}
    for b in (1, 2):
        d, s = rows[(b, 0)], rows[(b, 3)]
        assert s["distinct_experts_per_layer_per_seq"] == 4.0  # top-4, every token the same experts
        assert s["ratio_vs_decode"] == pytest.approx(s["step_ms"] / d["step_ms"])
        assert s["speedup_at_accept_len"]["2.5"] == pytest.approx(2.5 * d["step_ms"] / s["step_ms"])
    assert rows[(1, 3)]["distinct_experts_per_layer"] == 4.0
    assert len(v["eagle3_k3"]) == 2
    assert "x@2.5" in text  # the printed table


def test_router_routing_reads_more_experts(tmp_path):
    r, _ = report(tmp_path, "--batch-sizes", "1", "--contexts", "32", "--verify-tokens", "0", "2")
    rows = {x["k"]: x for x in r["verify"]["rows"]}
    assert rows[0]["distinct_experts_per_layer"] == 4.0
    assert 4.0 < rows[2]["distinct_experts_per_layer"] <= 12.0
    assert rows[2]["speedup_at_accept_len"]["3.0"] is not None


def test_measure_routing_overlap_on_the_demo_model(tmp_path):
    prompts = json.loads((REPO / "tests/fixtures/spec_acceptance/prompts.json").read_text())["prompts"][:2]
    (tmp_path / "p.json").write_text(json.dumps({"prompts": prompts}))
    out = tmp_path / "o.json"
    p = run(str(REPO / "assets/demo-model"), "--device", "cpu", "--measure-routing-overlap", str(tmp_path / "p.json"),
            "--overlap-decode-tokens", "8", "--json", str(out))
    o = json.loads(out.read_text())["routing_overlap"]
    assert o["top_k"] == 2 and o["model_experts"] == 8 and o["chance_overlap"] == 0.25
    assert 0.0 <= o["generated"]["overlap"] <= 1.0 and o["prompt"]["pairs"] == 2 * (len(prompts[0]) - 1)
    assert "routing overlap of" in p.stdout


@pytest.mark.parametrize("args,msg", [
    (["--verify-tokens", "0", "2", "--routing-overlap", "1.5"], "--routing-overlap 1.5"),
    (["--verify-tokens", "-1"], "--verify-tokens -1"),
    (["--routing-overlap", "0.5"], "give --verify-tokens too"),
    (["--measure-routing-overlap", "x.json"], "--measure-routing-overlap"),
])
def test_bad_values_are_refused(args, msg):
    p = run(*TINY, *args, check=False)
    assert p.returncode != 0
    assert msg in p.stderr + p.stdout


def test_unknown_device_is_refused():
    p = run("--device", "tpu", *MODEL, check=False)
    assert p.returncode != 0
    assert "--device tpu: expected cuda or cpu" in p.stderr + p.stdout
