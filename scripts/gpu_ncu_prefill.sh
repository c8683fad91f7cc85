#!/usr/bin/env bash
# Nsight Compute per-kernel times of one 8,192-token prefill (device machine): every kernel
# of a `bench-model --layers L` run alone (ncu serialises them; --cache-control none and
# --clock-control none leave L2 and clocks as the run has them), each launch of >= 20 us in
# order with its DRAM bytes and the bandwidth it reached. What the eager profile's op rows do not
# show: which kernel inside an op is far from its floor.
#   BIN=dir-with-moeserve OUT=... LAYERS=2 scripts/gpu_ncu_prefill.sh  -> $OUT/ncu_prefill/{raw.csv,summary.txt}
set -u
BIN=${BIN:-$PWD}
R=${OUT:?}/ncu_prefill
mkdir -p "$R"
ncu --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  "$BIN/moeserve" bench-model --synthetic minimax-m2.5 --layers "${LAYERS:-2}" --batch-sizes 1 --contexts 1024 \
  --iters 1 --prefill-tokens 8192 > "$R/raw.csv" 2> "$R/stderr.txt"
echo "ncu rc=$? $(wc -l < "$R/raw.csv") lines"
python3 - "$R/raw.csv" > "$R/summary.txt" <<'PY'
import csv, sys, collections, re
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr = rows[0]; rows = rows[1:]
ix = {h: i for i, h in enumerate(hdr)}
k = collections.OrderedDict()  # launch id -> name and metrics
for r in rows:
    kid, name, metric, val = r[ix["ID"]], r[ix["Kernel Name"]], r[ix["Metric Name"]], r[ix["Metric Value"]]
    unit = r[ix["Metric Unit"]]
    v = float(val.replace(",", ""))
    scale = {"ns": 1e-3, "us": 1, "usecond": 1, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3,
             "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1)
    d = k.setdefault(kid, {"name": re.sub(r"\(.*", "", name)[:70]})
    d[metric] = v * scale
# The prefill is the run's last forward of 8,192 tokens (its kernels are the long ones).
print("%5s %-70s %10s %9s %9s %7s" % ("id", "kernel", "us", "rd MB", "wr MB", "TB/s"))
for kid, d in k.items():
    t = d.get("gpu__time_duration.sum", 0); rd = d.get("dram__bytes_read.sum", 0) / 1e6; wr = d.get("dram__bytes_write.sum", 0) / 1e6
    if t >= 20:
        print("%5s %-70s %10.1f %9.1f %9.1f %7.2f" % (kid, d["name"], t, rd, wr, (rd + wr) / t))
PY
tail -80 "$R/summary.txt"
