"""Malformed checkpoints and arguments for `moeserve inspect` and `moeserve generate`: every case
must end with exit status 1 and a one-line `error: ...` naming the problem on stderr, within the
timeout, never a crash (signal), an abort or a hang. Also checks the --dump-logits .npy format
and seeded sampling across thread counts. The broken checkpoints are derived from the committed
golden fixtures by editing JSON and safetensors headers (no torch needed)."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

BIN = os.environ.get("MOESERVE_BIN", "build/moeserve")
SRC = os.environ.get("MOESERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(SRC, "tests", "fixtures", "golden")


def run(*args, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, env=e)


def expect_error(p, *needles):
    assert p.returncode == 1, f"exit {p.returncode}; stderr: {p.stderr[-2000:]}"
    assert "error:" in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, f"'{n}' not in: {p.stderr}"
    for bad in ("terminate called", "Segmentation", "Aborted", "what():"):
        assert bad not in p.stderr, p.stderr


def copy_fixture(tmp_path, name):
    d = tmp_path / name
    shutil.copytree(os.path.join(GOLDEN, name), d)
    return d


def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)


def shard_of(d, tensor):
    idx = json.load(open(d / "model.safetensors.index.json"))
    return d / idx["weight_map"][tensor]


def edit_config(d, fn):
    cfg = json.load(open(d / "config.json"))
    fn(cfg)
    json.dump(cfg, open(d / "config.json", "w"))


def both(d, *needles):
    """inspect and generate on the same broken checkpoint."""
    expect_error(run("inspect", str(d), "--json"), *needles)
    expect_error(run("generate", "--model", str(d), "--prompt-ids", "3,4", "--max-tokens", "2"), *needles)


# ---- config.json ----

def test_missing_config(tmp_path):
    d = copy_fixture(tmp_path, "tiny_bf16")
    os.remove(d / "config.json")
    both(d, "config.json")
    expect_error(run("inspect", str(tmp_path / "does_not_exist")), "does_not_exist")


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c.update(model_type="llama"), "model_type"),
    (lambda c: c.pop("hidden_size"), "hidden_size"),
    (lambda c: c.pop("vocab_size"), "vocab_size"),
    (lambda c: c.pop("num_local_experts"), "num_local_experts"),
    (lambda c: c.update(hidden_size="128"), "hidden_size"),
    (lambda c: c.update(num_local_experts=8.5), "num_local_experts"),
    (lambda c: c.update(num_hidden_layers=-1), "num_hidden_layers"),
    (lambda c: c.update(num_hidden_layers=10 ** 12), "num_hidden_layers"),
    (lambda c: (c.update(num_hidden_layers=2 * 10 ** 9), c.pop("attn_type_list")), "num_hidden_layers"),
    (lambda c: c.update(vocab_size=0), "vocab_size"),
    (lambda c: c.update(max_position_embeddings="long"), "max_position_embeddings"),
    (lambda c: c.update(eos_token_id="x"), "eos_token_id"),
    (lambda c: c.update(rms_norm_eps="tiny"), "rms_norm_eps"),
    (lambda c: c.update(tie_word_embeddings="no"), "tie_word_embeddings"),
    (lambda c: c.update(num_experts_per_tok=9), "num_experts_per_tok"),
    (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
    (lambda c: c.update(rotary_dim=33), "rotary"),
    (lambda c: c.update(partial_rotary_factor=0.25), "rotary"),
    (lambda c: c.update(rope_parameters=[1, 2]), "rope_parameters"),
    (lambda c: c.update(quantization_config={"quant_method": "awq"}), "quant_method"),
    (lambda c: c.update(head_dim=16, rotary_dim=8), "q_proj"),  # shapes no longer match the weights
    (lambda c: c.update(hidden_size=96), "hidden"),   # embed_tokens [1000, 128] vs 96
    (lambda c: c.update(scoring_func="softmax"), "scoring_func"),
])
def test_bad_config(tmp_path, mutate, needle):
    d = copy_fixture(tmp_path, "tiny_bf16")
    edit_config(d, mutate)
    if needle in ("q_proj", "hidden"):
        # Valid config, wrong shapes: inspect reports mismatched tensors, generate names one.
        p = run("inspect", str(d), "--json")
        expect_error(p, "incomplete")
        assert json.loads(p.stdout)["mismatched_tensors"]
        expect_error(run("generate", "--model", str(d), "--prompt-ids", "3", "--max-tokens", "1"), "shape")
    else:
        both(d, needle)


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null", '{"model_type": "minimax_m2"'])
def test_config_not_an_object(tmp_path, text):
    d = copy_fixture(tmp_path, "tiny_bf16")
    open(d / "config.json", "w").write(text)
    both(d, "config.json")


# ---- safetensors files and the index ----

@pytest.mark.parametrize("keep", [0, 5, 8, 100, -1])
def test_truncated_shard(tmp_path, keep):
    d = copy_fixture(tmp_path, "tiny_bf16")
    shard = d / "model-00002-of-00002.safetensors"
    raw = open(shard, "rb").read()
    open(shard, "wb").write(raw[:keep] if keep >= 0 else raw[:-1])
    both(d, "model-00002-of-00002.safetensors")


def test_index_points_at_missing_shard(tmp_path):
    d = copy_fixture(tmp_path, "tiny_bf16")
    os.remove(d / "model-00002-of-00002.safetensors")
    both(d, "model-00002-of-00002.safetensors")


def test_index_names_unknown_shard(tmp_path):
    d = copy_fixture(tmp_path, "tiny_bf16")
    idx = json.load(open(d / "model.safetensors.index.json"))
    idx["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors"
    json.dump(idx, open(d / "model.safetensors.index.json", "w"))
    both(d, "model-00009-of-00009.safetensors")


@pytest.mark.parametrize("text", ["", "{]", '{"weight_map": 3}', '{"metadata": {}}',
                                  '{"weight_map": {"model.norm.weight": 7}}',
                                  '{"weight_map": {"model.norm.weight": "../x.safetensors"}}'])
def test_bad_index(tmp_path, text):
    d = copy_fixture(tmp_path, "tiny_bf16")
    open(d / "model.safetensors.index.json", "w").write(text)
    both(d, "model.safetensors.index.json")


def test_tensor_with_wrong_shape(tmp_path):
    d = copy_fixture(tmp_path, "tiny_bf16")
    name = "model.layers.1.self_attn.k_proj.weight"  # [64, 128]
    path = shard_of(d, name)
    header, data = read_st(path)
    header[name]["shape"] = header[name]["shape"][::-1]  # same byte count, transposed shape
    write_st(path, header, data)
    p = run("inspect", str(d), "--json")
    expect_error(p, name)
    assert json.loads(p.stdout)["mismatched_tensors"][0]["name"] == name
    expect_error(run("generate", "--model", str(d), "--prompt-ids", "3", "--max-tokens", "1"), name, "shape")


def test_tensor_with_wrong_dtype(tmp_path):
    d = copy_fixture(tmp_path, "tiny_bf16")
    name = "model.layers.0.input_layernorm.weight"  # BF16 [128] -> I16-sized... use I32 [64]
    path = shard_of(d, name)
    header, data = read_st(path)
    header[name]["dtype"], header[name]["shape"] = "I32", [64]
    write_st(path, header, data)
    expect_error(run("generate", "--model", str(d), "--prompt-ids", "3", "--max-tokens", "1"), name)
    expect_error(run("inspect", str(d)), name)


@pytest.mark.parametrize("edit", ["offsets_past_end", "bad_dtype", "header_len_huge", "header_not_json",
                                  "negative_dim", "overlap"])
def test_corrupt_header(tmp_path, edit):
    d = copy_fixture(tmp_path, "tiny_bf16")
    path = d / "model-00001-of-00002.safetensors"
    header, data = read_st(path)
    names = [k for k in header if k != "__metadata__"]
    first = min(names, key=lambda k: header[k]["data_offsets"][0])
    if edit == "offsets_past_end":
        header[first]["data_offsets"][1] += 10 ** 9
    elif edit == "bad_dtype":
        header[first]["dtype"] = "F99"
    elif edit == "negative_dim":
        header[first]["shape"] = [-1]
    elif edit == "overlap":
        second = sorted(names, key=lambda k: header[k]["data_offsets"][0])[1]
        header[second]["data_offsets"][0] -= 2
    if edit == "header_len_huge":
        raw = open(path, "rb").read()
        open(path, "wb").write(struct.pack("<Q", 2 ** 62) + raw[8:])
    elif edit == "header_not_json":
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        open(path, "wb").write(raw[:8] + b"{" + b"x" * (n - 1) + raw[8 + n:])
    else:
        write_st(path, header, data)
    both(d, "model-00001-of-00002.safetensors")


# ---- FP8 scales ----

def test_fp8_tensor_without_scale(tmp_path):
    d = copy_fixture(tmp_path, "tiny_fp8_partial")
    name = "model.layers.1.block_sparse_moe.experts.5.w2.weight_scale_inv"
    idx = json.load(open(d / "model.safetensors.index.json"))
    del idx["weight_map"][name]
    json.dump(idx, open(d / "model.safetensors.index.json", "w"))
    both(d, name)


def test_fp8_scale_with_wrong_shape(tmp_path):
    d = copy_fixture(tmp_path, "tiny_fp8_partial")
    name = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    path = shard_of(d, name)
    header, data = read_st(path)
    r, c = header[name]["shape"]
    header[name]["shape"] = [r * c, 1]
    write_st(path, header, data)
    both(d, name)


def test_fp8_without_quantization_config(tmp_path):
    d = copy_fixture(tmp_path, "tiny_fp8_partial")
    edit_config(d, lambda c: c.pop("quantization_config"))
    both(d, "quantization_config")


def test_fp8_block_size_mismatch(tmp_path):
    d = copy_fixture(tmp_path, "tiny_fp8_partial")
    edit_config(d, lambda c: c["quantization_config"].update(weight_block_size=[64, 64]))
    both(d, "scale")


# ---- generate arguments ----

@pytest.mark.parametrize("ids,needle", [
    ("1000", "out of range"), ("999,1000", "out of range"), ("-3", "negative"), ("1,-1", "negative"),
    ("", "empty"), ("1,,2", "empty"), ("1,2,", "trailing"), ("abc", "abc"), ("1,x", "'x'"), ("1.5", "1.5"),
    ("0x10", "0x10"), ("99999999999999999999", "99999999999999999999"), (" ", "empty"),
])
def test_bad_prompt_ids(ids, needle):
    d = os.path.join(GOLDEN, "tiny_bf16")
    expect_error(run("generate", "--model", d, "--prompt-ids", ids, "--max-tokens", "2"), needle)


@pytest.mark.parametrize("args,needle", [
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-tokens", "-1"], "--max-tokens"),
    (["--max-tokens", "5000"], "max_position_embeddings"),  # fixture: 4096 positions
    (["--max-tokens", "99999999999"], "max-tokens"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--block-size", "0"], "--block-size"),
    (["--prefill-chunk", "-2"], "--prefill-chunk"),
    (["--device", "tpu"], "tpu"),
    (["--dump-logits", "/nonexistent_dir/x.npy"], "/nonexistent_dir/x.npy"),
])
def test_bad_generate_args(args, needle):
    d = os.path.join(GOLDEN, "tiny_bf16")
    p = run("generate", "--model", d, "--prompt-ids", "3,4", *args)
    if p.returncode != 1 and "--max-tokens" in args and "99999999999" in args:
        # The flag parser rejects the value itself: a usage error, exit 2 like argparse.
        assert p.returncode == 2 and "error:" in p.stderr and "max-tokens" in p.stderr, p.stderr
        return
    expect_error(p, needle)


def test_usage_errors_exit_2():
    # Unknown flags and missing required options: "error: ..." and exit 2 (argparse's code).
    for args in (["generate", "--bogus"], ["generate"], ["serve", "--port", "notanumber"], ["nosuchcommand"]):
        p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and p.stderr.startswith("error: "), (args, p.returncode, p.stderr)


def test_dump_logits_to_directory(tmp_path):
    d = os.path.join(GOLDEN, "tiny_bf16")
    expect_error(run("generate", "--model", d, "--prompt-ids", "3", "--dump-logits", str(tmp_path)), str(tmp_path))


def test_prompt_plus_max_tokens_at_limit(tmp_path):
    """prompt + max_tokens == max_position_embeddings is allowed, one more is not."""
    d = copy_fixture(tmp_path, "tiny_bf16")
    edit_config(d, lambda c: c.update(max_position_embeddings=6))
    ok = run("generate", "--model", str(d), "--prompt-ids", "3,4,5", "--max-tokens", "3", "--json")
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["generated_ids"]) == 3
    expect_error(run("generate", "--model", str(d), "--prompt-ids", "3,4,5", "--max-tokens", "4"),
                 "max_position_embeddings")


# ---- --dump-logits format and sampling ----

def test_dump_logits_npy_format(tmp_path):
    """Version 1.0 header, '<f4', C order, shape (N, vocab), data 64-byte aligned; row k is the
    raw logits (before temperature) token k was sampled from: with greedy decoding its argmax,
    and with temperature > 0 the same rows as greedy up to the first differing token."""
    d = os.path.join(GOLDEN, "tiny_bf16")
    g = json.load(open(os.path.join(d, "golden.json")))
    prompt = ",".join(map(str, g["prompt_ids"]))
    npy = tmp_path / "greedy.npy"
    out = json.loads(run("generate", "--model", d, "--prompt-ids", prompt, "--max-tokens", "6", "--json",
                         "--dump-logits", str(npy)).stdout)
    raw = open(npy, "rb").read()
    assert raw[:8] == b"\x93NUMPY\x01\x00"
    hl = struct.unpack("<H", raw[8:10])[0]
    assert (10 + hl) % 64 == 0 and raw[10 + hl - 1:10 + hl] == b"\n"
    with open(npy, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    assert version == (1, 0) and shape == (6, 1000) and fortran is False and dtype == np.dtype("<f4")
    greedy = np.load(npy)
    assert len(raw) == 10 + hl + greedy.nbytes
    assert [int(np.argmax(r)) for r in greedy] == out["generated_ids"]
    ref = np.load(os.path.join(d, "ref_logits.npy"))[:6]
    assert np.abs(greedy - ref).max() / np.abs(ref).max() <= 1e-4

    hot = tmp_path / "hot.npy"
    out_t = json.loads(run("generate", "--model", d, "--prompt-ids", prompt, "--max-tokens", "6", "--json",
                           "--temperature", "5", "--seed", "3", "--dump-logits", str(hot)).stdout)
    sampled = np.load(hot)
    assert sampled.shape == (6, 1000)
    k = next((i for i, (a, b) in enumerate(zip(out_t["generated_ids"], out["generated_ids"])) if a != b), 6)
    assert k < 6, "temperature 5 should leave the greedy path"
    np.testing.assert_array_equal(sampled[:k + 1], greedy[:k + 1])  # raw logits, not divided by T


@pytest.mark.parametrize("name", ["tiny_bf16", "tiny_fp8_partial"])
def test_seeded_sampling_independent_of_threads(name):
    d = os.path.join(GOLDEN, name)
    args = ["generate", "--model", d, "--prompt-ids", "5,6,7,8,9", "--max-tokens", "12", "--temperature", "1.3",
            "--seed", "42", "--json"]
    outs = [json.loads(run(*args, env={"MOESERVE_CPU_THREADS": str(n)}).stdout)["generated_ids"] for n in (1, 2, 3)]
    assert outs[0] == outs[1] == outs[2]
    other = json.loads(run(*args[:-2], "43", "--json").stdout)["generated_ids"]
    assert other != outs[0]  # the seed matters
