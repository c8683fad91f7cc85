#!/usr/bin/env bash
# Two moeserve binaries' bench-model on one GPU in the same call, interleaved (A B A B ...), so
# machine-start noise does not decide an A/B: 30 MiniMax-M2.5 layers (synthetic FP8), decode
# batch 1 8 64 at 1k context and the 8k prefill, REPS rounds; medians per binary at the end.
#   A=path/moeserve_a B=path/moeserve_b OUT=dir [REPS=3] gpu_bin_ab.sh
set -u
R=${OUT:?}/bin_ab
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$R/gpu.txt" 2>&1
for rep in $(seq 1 "${REPS:-3}"); do
  for tag in A B; do
    bin=${!tag}
    timeout 120 "$bin" bench-model --synthetic minimax-m2.5 --layers 30 --batch-sizes 1 8 64 --contexts 1024 \
      --prefill-tokens 8192 --iters 20 --json "$R/${tag}_$rep.json" > "$R/${tag}_$rep.log" 2>&1
    echo "$tag rep $rep rc=$?: $(grep -E '^(1|8|64) |prefill' "$R/${tag}_$rep.log" | tr -s ' ' | tr '\n' '|')"
  done
done
python3 - "$R" <<'PY'
import json, sys, glob, statistics, os
r = sys.argv[1]
for tag in "AB":
    rows = {}
    for f in sorted(glob.glob(os.path.join(r, f"{tag}_*.json"))):
        try: j = json.load(open(f))
        except Exception as e: print(tag, f, "unreadable", e); continue
        for d in j.get("decode", []):
            rows.setdefault(f"decode b{d.get('batch')} ctx{d.get('context')}", []).append(d.get("step_ms"))
        p = j.get("prefill")
        if p: rows.setdefault("prefill", []).append(p.get("ms"))
    print(tag, {k: (round(statistics.median([x for x in v if x is not None]), 3) if any(x is not None for x in v) else None, v) for k, v in rows.items()})
PY
