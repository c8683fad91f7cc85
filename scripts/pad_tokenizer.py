#!/usr/bin/env python3
"""Pads a byte-level BPE tokenizer.json to a model's vocab_size, for benchmarks with dummy weights.

A stand-in tokenizer smaller than the model's vocabulary (Qwen3's 151,669 ids for MiniMax-M2.5's
200,064) makes every generated id above it detokenize to "": such tokens ride in the next SSE
chunk, so a chunk carries several tokens and the inter-token latency (time between chunks)
reads as 2-5 decode steps for ~1.4% of the chunks (p99 ITL = 4x the median at every
concurrency in the session-9 run). Each missing id becomes a plain vocabulary entry "Ġ@<id>"
(decodes to " @<id>"; no merge produces it, so encoding real text is unchanged), and the added
tokens are entered at their ids so they keep them.

usage: pad_tokenizer.py IN/tokenizer.json VOCAB_SIZE OUT/tokenizer.json
"""
import json
import sys


def main() -> None:
    src, vocab_size, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    tok = json.load(open(src, encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    # The added (special) tokens enter the model vocabulary at their own ids too: an added
    # token absent from it would be renumbered after the vocabulary (HF's rule) once the
    # vocabulary reaches past it.
    for a in tok.get("added_tokens", []):
        vocab.setdefault(a["content"], a["id"])
    used = set(vocab.values())
    added = 0
    for i in range(vocab_size):
        if i not in used:
            piece = f"\u0120@{i}"
            assert piece not in vocab, piece
            vocab[piece] = i
            added += 1
    json.dump(tok, open(dst, "w", encoding="utf-8"), ensure_ascii=False)
    print(f"{dst}: {added} ids added, vocabulary now covers 0..{vocab_size - 1}")


if __name__ == "__main__":
    main()
