"""xgrammar (PyPI) as an oracle, plus the model vocabulary as bytes and a driver of our
matcher (structured_mask_tool).

xgrammar's Python package imports torch / transformers / triton at import time, but its
grammar compiler and matcher (C++ behind tvm_ffi) need none of them: bitmasks are any DLPack
array, and we build TokenizerInfo from raw byte strings. tests/requirements.txt installs
xgrammar with --no-deps plus apache-tvm-ffi and pydantic; here, only when torch /
transformers / triton are NOT installed, placeholder modules stand in for them so the import
succeeds (nothing of theirs is called: a call would fail loudly on the placeholder)."""
import json
import os
import subprocess
import sys
import types

import numpy as np


def import_xgrammar():
    import tvm_ffi  # noqa: F401  (must see the real torch, or none, before the placeholders)

    class _Placeholder(types.ModuleType):
        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {})

    for name in ("torch", "transformers", "triton"):
        try:
            __import__(name)
        except ImportError:
            m = _Placeholder(name)
            m.__path__ = []
            m.tensor = lambda *a, **k: None
            sys.modules[name] = m
    import xgrammar

    return xgrammar


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def load_vocab(tokenizer_json_path):
    """(token_bytes list with b'' for specials, special ids, stop ids) of a byte-level BPE
    tokenizer.json."""
    with open(tokenizer_json_path, encoding="utf-8") as f:
        tj = json.load(f)
    inv = _bytes_to_unicode()
    vocab = dict(tj["model"]["vocab"])
    special = set()
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
        if t.get("special"):
            special.add(t["id"])
    size = max(vocab.values()) + 1
    toks = [b""] * size
    for s, i in vocab.items():
        if i in special:
            continue
        try:
            toks[i] = bytes(inv[c] for c in s)
        except KeyError:  # an added non-special token written as plain text
            toks[i] = s.encode("utf-8")
    return toks, sorted(special)


def synthetic_vocab(size, seed=0):
    """An o200k-sized synthetic byte vocabulary: the 256 bytes, then random JSON-ish and
    word-like pieces (deduplicated), then one EOS."""
    rng = np.random.default_rng(seed)
    toks = [bytes([b]) for b in range(256)]
    seen = set(toks)
    alphabet = list(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:;\"'{}[]()\n\t/\\")
    while len(toks) < size - 1:
        n = int(rng.integers(2, 12))
        t = bytes(int(x) for x in rng.choice(alphabet, n))
        if t not in seen:
            seen.add(t)
            toks.append(t)
    toks.append(b"")  # EOS (special)
    return toks, [size - 1]


def run_tool(job):
    tool = os.environ.get("MOESERVE_MASK_TOOL", "build/tests/structured/structured_mask_tool")
    p = subprocess.run([tool], input=json.dumps(job).encode(), capture_output=True, timeout=600)
    out = json.loads(p.stdout.decode() or "{}")
    if p.returncode != 0:
        raise RuntimeError(out.get("error", p.stderr.decode()))
    return out


def tool_job(toks, special, stop_ids, spec, prefixes, **extra):
    job = {
        "vocab_hex": [t.hex() for t in toks],
        "special": special,
        "stop_ids": stop_ids,
        "mask_size": len(toks),
        "spec": spec,
        "prefixes": prefixes,
    }
    job.update(extra)
    return job


def hex_to_bool(hexmask, size):
    words = np.frombuffer(bytes.fromhex(hexmask), dtype=">u4").astype(np.uint32)
    return unpack_words(words, size)


def unpack_words(words, size):
    bits = ((words[:, None] >> np.arange(32, dtype=np.uint32)[None, :]) & 1).astype(bool)
    return bits.reshape(-1)[:size]


def xgr_compile(xgr, compiler, spec):
    kind = spec["kind"]
    if kind == "json_schema":
        return compiler.compile_json_schema(spec["text"], any_whitespace=spec.get("any_whitespace", True))
    if kind == "regex":
        return compiler.compile_regex(spec["text"])
    if kind == "grammar":
        return compiler.compile_grammar(spec["text"])
    if kind == "choice":
        alts = " | ".join(json.dumps(c) for c in spec["choices"])
        return compiler.compile_grammar("root ::= " + alts)
    if kind == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=spec.get("any_whitespace", True))
    raise ValueError(kind)
