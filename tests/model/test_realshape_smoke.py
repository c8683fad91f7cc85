"""CPU smoke test of scripts/realshape_check.py (the device-only real-shape check): with
--tiny shapes it writes the hub-layout FP8 checkpoint, gets HF transformers' reference and runs
`moeserve generate --device cpu` through every generate case. The CPU backend computes in f32
with exactly dequantised weights, so it must match HF to ~1e-6; this checks the script's
checkpoint writer (tensor names, FP8 block scales, config) and its comparison code. Skipped
where torch/transformers are not installed (they are not CI dependencies)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "realshape_check.py")


def test_realshape_script_on_cpu(tmp_path):
    try:
        import torch  # noqa: F401
        from transformers import MiniMaxM2ForCausalLM  # noqa: F401
    except Exception as e:  # ImportError, or transformers refusing its dependency versions
        pytest.skip(f"torch/transformers oracle unavailable: {e}")
    ck, out = tmp_path / "ck", tmp_path / "out"
    subprocess.run([sys.executable, SCRIPT, "make", "--tiny", "--device", "cpu", "--layers", "2", "--dir", str(ck)],
                   check=True)
    r = subprocess.run([sys.executable, SCRIPT, "check", "--tiny", "--device", "cpu", "--dir", str(ck),
                        "--bin", os.environ["MOESERVE_BIN"], "--out", str(out), "--bound", "1e-4"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.load(open(out / "realshape_report.json"))
    assert rep["ok"] and len(rep["cases"]) == 10
    for c in rep["cases"]:
        assert c["ids"] == c["ref_ids"], c["case"]
        assert max(s["rel_err"] for s in c["steps"]) < 1e-4, c["case"]
    # Routing is spread over the experts (not degenerate) in every prefill.
    assert all(u["distinct_experts"] > 8 for u in rep["expert_use_prefill"])
