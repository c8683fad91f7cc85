"""Cross-check moeserve's safetensors reader/writer against the reference Python package.

Python writes -> C++ reads (st_tool dump, byte-exact); C++ writes -> Python reads
(safetensors.deserialize / safe_open, byte-exact). ST_TOOL points at the built st_tool.
"""
import json
import os
import subprocess

import numpy as np
import pytest
import safetensors
from safetensors.numpy import save_file

TOOL = os.environ.get("ST_TOOL")
pytestmark = pytest.mark.skipif(not TOOL, reason="ST_TOOL not set (run through ctest)")

# Reference dtype names for the numpy dtypes the Python package can write on its own.
NP_DTYPES = {
    "F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64,
    "U8": np.uint8, "BOOL": np.bool_,
}


def fixtures():
    rng = np.random.default_rng(7)
    out = {}
    for i, (name, dt) in enumerate(NP_DTYPES.items()):
        shape = (3, 4) if i % 2 else (5,)
        if dt is np.bool_:
            out[f"t.{name}"] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dt, np.floating):
            out[f"t.{name}"] = rng.standard_normal(shape).astype(dt)
        else:
            out[f"t.{name}"] = rng.integers(-1000, 1000, size=shape).astype(dt)
    out["scalar"] = np.array(1.5, dtype=np.float32)
    return out


def run_tool(*args):
    r = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def raw_tensors(path):
    """{name: (dtype, shape, bytes)} for every tensor, via the reference parser."""
    with open(path, "rb") as f:
        return {n: (v["dtype"], list(v["shape"]), bytes(v["data"]))
                for n, v in safetensors.deserialize(f.read())}


def test_python_writes_cpp_reads(tmp_path):
    arrays = fixtures()
    p = tmp_path / "py.safetensors"
    save_file(arrays, str(p), metadata={"format": "pt"})
    dumped = json.loads(run_tool("dump", p))
    assert set(dumped) == set(arrays)
    want = raw_tensors(p)
    for name, arr in arrays.items():
        d = dumped[name]
        assert d["dtype"] == want[name][0]
        assert d["shape"] == list(arr.shape)
        assert bytes.fromhex(d["hex"]) == arr.tobytes()


def test_cpp_writes_python_reads(tmp_path):
    arrays = fixtures()
    src = tmp_path / "src.safetensors"
    save_file(arrays, str(src))
    out = tmp_path / "cpp.safetensors"
    run_tool("copy", src, out)
    got = raw_tensors(out)
    assert set(got) == set(arrays)
    with safetensors.safe_open(str(out), framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "writer": "moeserve"}
        for name, arr in arrays.items():
            back = f.get_tensor(name)
            assert back.dtype == arr.dtype and back.shape == arr.shape
            assert back.tobytes() == arr.tobytes()


def test_cpp_sharded_python_reads(tmp_path):
    arrays = fixtures()
    src = tmp_path / "src.safetensors"
    save_file(arrays, str(src))
    d = tmp_path / "sharded"
    run_tool("reshard", src, d, 40)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(arrays)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in arrays.values())
    assert len(set(index["weight_map"].values())) > 2
    for name, shard in index["weight_map"].items():
        with safetensors.safe_open(str(d / shard), framework="numpy") as f:
            assert f.get_tensor(name).tobytes() == arrays[name].tobytes()


def test_bf16_fp8_both_ways(tmp_path):
    """BF16 / F8_E4M3 need torch on the Python side; byte patterns must survive both ways."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch
    g = torch.Generator().manual_seed(3)
    tensors = {
        "bf": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "f8": torch.randn(6, generator=g).clamp(-400, 400).to(torch.float8_e4m3fn),
    }
    p = tmp_path / "t.safetensors"
    save_torch(tensors, str(p))
    dumped = json.loads(run_tool("dump", p))
    assert dumped["bf"]["dtype"] == "BF16" and dumped["f8"]["dtype"] == "F8_E4M3"
    for name, t in tensors.items():
        assert bytes.fromhex(dumped[name]["hex"]) == t.view(torch.uint8).numpy().tobytes()
    out = tmp_path / "cpp.safetensors"
    run_tool("copy", p, out)
    got = raw_tensors(out)
    for name, t in tensors.items():
        assert got[name][2] == t.view(torch.uint8).numpy().tobytes()
        assert got[name][1] == list(t.shape)
