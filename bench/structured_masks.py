"""Token-mask time per token, our matcher beside xgrammar (PyPI), same schemas, same
documents, same vocabulary, one run.

    python3 bench/structured_masks.py --tool build/tests/structured/structured_mask_tool

Vocabularies: Qwen3's 151,669 tokens (tests/fixtures/shared-data) and a synthetic
200,064-token byte vocabulary (o200k-sized). Documents: one valid instance per grammar
(bench corpus below), tokenized by greedy longest match over the vocabulary's bytes (a valid
token sequence for both engines). Per token: the mask before it is computed (ours:
Matcher::fill_mask into a uint32 bitset; xgrammar: GrammarMatcher.fill_next_token_bitmask
into an int32 numpy bitmask), then the token is accepted. "cold" is the first pass over the
document on a freshly compiled grammar (ours: each new state's mask is a plain walk of the
vocabulary trie; xgrammar has built its per-rule token classes at compile time); "warm" a
second pass on the same compiled grammar (ours hits the per-state mask cache; xgrammar keeps
no such cache across matchers, so its warm pass measures the same work again); "fresh" (ours
only) the fourth pass: the per-state mask cache is dropped before passes 3 and 4 (pass 3
builds the token classes of the keys met again), so in pass 4 every mask is made from the
classes (OR of the accepted sets + the uncertain tokens through the automaton): the cost of
a state no earlier request reached, once the grammar has been used. "cold after warm-up":
the first pass again on a fresh grammar, but started after the background class warm-up the
server runs after compiling (CompiledGrammar::start_warmup; its wall time in "warm-up ms",
off the sampling path). Compile times are reported too. One thread each (the warm-up: one
more, before the pass). --ours-only skips xgrammar (its columns print "-").
Each figure is the minimum over --reps runs. Prints a markdown table, then the revision and
the command."""
import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/structured"))
import xgr_oracle as xo  # noqa: E402
from corpus import LONG_ENUM, MIXED, PERSON_REFS, WEATHER_TOOL  # noqa: E402

FUNCTION_CALL = {
    "type": "object",
    "properties": {
        "name": {"enum": ["search_web", "read_file", "write_file", "run_shell", "send_email"]},
        "arguments": {"type": "object", "properties": {
            "query": {"type": "string"}, "path": {"type": "string"}, "max_results": {"type": "integer"},
            "recursive": {"type": "boolean"}}, "required": ["query"]},
    },
    "required": ["name", "arguments"],
}

BENCH = [
    ("function_call", {"kind": "json_schema", "text": json.dumps(FUNCTION_CALL)},
     '{"name": "search_web", "arguments": {"query": "latest results of the structured generation benchmark", '
     '"max_results": 10, "recursive": false}}'),
    ("weather_tool", {"kind": "json_schema", "text": json.dumps(WEATHER_TOOL)},
     '{"location": "Paris, France", "unit": "celsius", "days": 7, "include_hourly": true}'),
    ("nested_refs", {"kind": "json_schema", "text": json.dumps(PERSON_REFS)},
     '{"name": "Ada", "age": 36, "address": {"street": "12 Analytical Engine Road", "zip": "10115"}, '
     '"friends": [{"name": "Charles", "age": 45, "friends": []}, {"name": "Mary", "age": 30}]}'),
    ("long_enum", {"kind": "json_schema", "text": json.dumps(LONG_ENUM)},
     '{"country": "country_271", "tags": ["alpha", "beta", "gamma"]}'),
    ("mixed", {"kind": "json_schema", "text": json.dumps(MIXED)},
     '{"id": 42, "score": -3.25e2, "kind": null, "pair": ["x", true], "meta": {"a": 1, "b": 2}, "const": "v1"}'),
    ("regex_classes", {"kind": "regex", "text": r"[A-Z][a-z]+( [A-Z][a-z]+)*, [^,\n]{1,20}\.?"},
     "New York City, United States."),
]


def greedy_tokenize(text, by_bytes, max_len):
    data = text.encode()
    out, i = [], 0
    while i < len(data):
        for n in range(min(max_len, len(data) - i), 0, -1):
            t = by_bytes.get(data[i:i + n])
            if t is not None:
                out.append(t)
                i += n
                break
        else:
            raise ValueError(f"byte {data[i]} has no token")
    return out


def run_xgrammar(xgr, info, spec, ids, size):
    t0 = time.perf_counter()
    compiled = xo.xgr_compile(xgr, xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False), spec)
    compile_ms = (time.perf_counter() - t0) * 1e3
    bm = np.zeros((1, (size + 31) // 32), dtype=np.int32)
    passes = []
    for _ in range(2):
        m = xgr.GrammarMatcher(compiled)
        total = 0.0
        for t in ids:
            a = time.perf_counter()
            m.fill_next_token_bitmask(bm, 0)
            total += time.perf_counter() - a
            assert m.accept_token(t)
        passes.append(total / len(ids) * 1e6)
    return compile_ms, passes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default="build/tests/structured/structured_mask_tool")
    ap.add_argument("--data", default=os.path.join(HERE, "../tests/fixtures/shared-data"))
    ap.add_argument("--reps", type=int, default=3, help="runs per engine and grammar; the minimum is reported")
    ap.add_argument("--ours-only", action="store_true", help="skip xgrammar (quick runs)")
    args = ap.parse_args()
    os.environ["MOESERVE_MASK_TOOL"] = args.tool
    xgr = None if args.ours_only else xo.import_xgrammar()
    vocabs = [("qwen3-151k", *xo.load_vocab(os.path.join(args.data, "tokenizers/qwen3/tokenizer.json")), [151645, 151643])]
    syn, syn_stop = xo.synthetic_vocab(200064)
    vocabs.append(("synthetic-200k", syn, syn_stop, syn_stop))
    print("| vocab | grammar | tokens | ours compile ms | xgr compile ms | ours cold us/tok | ours warm us/tok | "
          "ours fresh us/tok | ours warm-up ms | ours cold after warm-up us/tok | xgr cold us/tok | xgr warm us/tok | "
          "ours classes | ours class KiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for vname, toks, special, stop in vocabs:
        size = len(toks)
        by_bytes = {}
        for i, t in enumerate(toks):
            if t and i not in special:
                by_bytes.setdefault(t, i)
        max_len = max(len(t) for t in toks)
        info = xgr.TokenizerInfo(toks, xgr.VocabType.RAW, vocab_size=size, stop_token_ids=stop) if xgr else None
        job_vocab = xo.tool_job(toks, special, stop, None, None)
        for name, spec, doc in BENCH:
            ids = greedy_tokenize(doc, by_bytes, max_len)
            # --reps runs of each engine, alternating; each figure is its minimum over the runs
            # (a shared, loaded machine only ever adds time).
            xs, ours, warmed = [], [], []
            for _ in range(args.reps):
                if xgr:
                    xs.append(run_xgrammar(xgr, info, spec, ids, size))
                job = dict(job_vocab, spec=spec, prefixes=[ids], repeat=2, masks=False, fresh_pass=True)
                out = xo.run_tool(job)
                assert out["results"][0]["accepted"] == len(ids), name
                ours.append(out)
                out = xo.run_tool(dict(job_vocab, spec=spec, prefixes=[ids], repeat=1, masks=False, warmup=True))
                assert out["results"][0]["accepted"] == len(ids), name
                warmed.append(out)
            xfmt = (lambda f: f"{min(f(x) for x in xs):.0f}") if xs else (lambda f: "-")
            st = ours[0]["stats"]

            def best(key, runs=ours):
                return min(o[key][0] if isinstance(o[key], list) else o[key] for o in runs)
            print(f"| {vname} | {name} | {len(ids)} | {best('compile_ms'):.2f} | "
                  f"{(f'{min(x[0] for x in xs):.2f}' if xs else '-')} | "
                  f"{best('mask_us_cold'):.0f} | {best('mask_us_warm'):.1f} | {best('mask_us_fresh'):.1f} | "
                  f"{best('warmup_ms', warmed):.0f} | {best('mask_us_cold', warmed):.0f} | "
                  f"{xfmt(lambda x: x[1][0])} | {xfmt(lambda x: x[1][1])} | "
                  f"{st['position_classes']} | {st['class_bytes'] / 1024:.0f} |",
                  flush=True)
    rev = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    print(f"\nrevision {rev.strip()}{' (uncommitted changes)' if dirty else ''}; xgrammar {importlib.metadata.version('xgrammar')}; "
          f"command: python3 {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
