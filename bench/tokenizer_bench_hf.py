#!/usr/bin/env python3
"""HF `tokenizers` side of the tokenizer benchmark: single-thread Tokenizer.encode over each
document of the corpus (0x1E-separated), MB/s per pass. Prints one JSON line.

Usage: RAYON_NUM_THREADS=1 python3 bench/tokenizer_bench_hf.py TOKENIZER_JSON CORPUS [--passes 3]
"""
import argparse
import json
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("corpus")
    ap.add_argument("--passes", type=int, default=3)
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    raw = open(a.corpus, "rb").read()
    docs = [d.decode() for d in raw.split(b"\x1e")]
    rates, ntok = [], 0
    for _ in range(a.passes):
        t0 = time.perf_counter()
        ntok = 0
        for d in docs:
            ntok += len(tok.encode(d, add_special_tokens=False).ids)
        dt = time.perf_counter() - t0
        rates.append(len(raw) / dt / 1e6)
    print(json.dumps({"impl": "hf-tokenizers", "bytes": len(raw), "docs": len(docs), "tokens": ntok,
                      "mb_per_s_first": round(rates[0], 2), "mb_per_s_best": round(max(rates), 2)}))


if __name__ == "__main__":
    main()
