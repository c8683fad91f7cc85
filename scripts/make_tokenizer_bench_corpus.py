#!/usr/bin/env python3
"""Writes the tokenizer benchmark corpus: ~10 MB of mixed documents (English-like prose,
code, CJK, Cyrillic, Arabic, emoji, digits, whitespace runs), deterministic (fixed seed).
Documents (~1-4 KB each) are separated by the byte 0x1E (ASCII record separator).

Usage: python3 scripts/make_tokenizer_bench_corpus.py OUT [--mb 10]
"""
import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=10.0)
    args = ap.parse_args()
    rng = random.Random(20240601)
    seed_texts = json.loads((ROOT / "tests" / "fixtures" / "tokenizer" / "corpus.json").read_text())
    words = sorted({w for t in seed_texts for w in t.split() if len(w) < 20})
    english = ("the of and to in is was for on that with as by at from it an be this are which or have one had not but "
               "what all were when we there can more if out so said use each she do how their will up other about many "
               "then them these some her would make like him into time has look two write go see number way could people "
               "model token server request expert attention layer memory cache prompt stream latency throughput").split()
    cjk = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理"
    parts, size = [], 0
    target = int(args.mb * 1e6)
    while size < target:
        kind = rng.random()
        if kind < 0.55:
            doc = " ".join(rng.choice(english) for _ in range(rng.randint(150, 600)))
            doc = ". ".join(s.capitalize() for s in doc.split(" the ")) + "."
        elif kind < 0.7:
            lines = []
            for _ in range(rng.randint(20, 80)):
                ind = " " * (4 * rng.randint(0, 3))
                lines.append(f"{ind}{rng.choice(['x', 'y', 'value', 'result'])}_{rng.randint(0, 99)} = "
                             f"compute({rng.randint(0, 9999)}, '{rng.choice(english)}')  # {rng.choice(english)}")
            doc = "\n".join(lines) + "\n"
        elif kind < 0.8:
            doc = "".join(rng.choice(cjk) for _ in range(rng.randint(300, 1200))) + "。"
        elif kind < 0.9:
            doc = " ".join(rng.choice(words) for _ in range(rng.randint(100, 400)))
        else:
            doc = "\r\n".join(" ".join(rng.choice(words + english) for _ in range(rng.randint(3, 12))) +
                              rng.choice(["", " 😀", " 👨‍👩‍👧", "   ", "\t\t", " 12345", " ١٢٣"]) for _ in range(rng.randint(10, 40)))
        b = doc.encode()
        parts.append(b)
        size += len(b) + 1
    Path(args.out).write_bytes(b"\x1e".join(parts))
    print(f"wrote {args.out}: {size} bytes, {len(parts)} documents")


if __name__ == "__main__":
    main()
