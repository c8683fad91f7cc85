#!/usr/bin/env python3
"""Per-kernel timeline of one traced CUDA-graph replay (MOESERVE_KTRACE build, see
src/backend/cuda/common/ktrace.h).  Usage: ktrace_timeline.py PREFIX [ROWS_SHOWN]

PREFIX.csv: one row per block (thread 0 at its pdl_wait: global timer before/after the wait).
PREFIX.launches.csv: the PDL launches noted at capture, in launch order.

For each grid (in order of its first wait exit, i.e. of its predecessor's completion):
  enter0 / enter1: first / last block reaching its wait (resident, pre-wait work issued)
  exit0 / exit1:   first / last block leaving it (predecessor complete)
  dur:  next grid's exit0 - this grid's exit0 (this kernel's time in the chain)
  lead: exit0 - enter0 (how long before its predecessor ended the first block was resident)
  late: enter1 - exit0 (> 0: blocks that only became resident after the predecessor ended)
Then the same per kernel name, averaged over its occurrences (layers)."""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"moeserve::cuda::(\(anonymous namespace\)::)?", "", name)
    base = name.split("(")[0]
    return base[:60]


def main():
    prefix = sys.argv[1]
    rows = list(csv.DictReader(open(prefix + ".csv")))
    launches = list(csv.DictReader(open(prefix + ".launches.csv")))
    grids = defaultdict(list)
    for r in rows:
        grids[int(r["gridid"])].append(r)
    g = []
    for gid, rs in grids.items():
        te = [int(r["t_enter"]) for r in rs]
        tx = [int(r["t_exit"]) for r in rs]
        g.append(dict(gid=gid, nb=int(rs[0]["nblocks"]), nt=int(rs[0]["nthreads"]), n=len(rs),
                      enter0=min(te), enter1=max(te), exit0=min(tx), exit1=max(tx)))
    g.sort(key=lambda x: x["exit0"])
    t0 = g[0]["enter0"] if g else 0
    # Name grids by launch order: launches that did not record (no thread-0 wait) are skipped by
    # matching shapes in order.
    # (Kernels launched without launch_pdl, e.g. the cluster-launched decode attention, are not
    # noted: such a grid is named by its shape and the launch list is not advanced.)
    li = 0
    for x in g:
        name = f"? {x['nb']} blocks x {x['nt']}"
        for j in range(li, min(li + 3, len(launches))):
            l = launches[j]
            if int(l["nblocks"]) == x["nb"] and int(l["nthreads"]) == x["nt"]:
                name = short(l["name"])
                li = j + 1
                break
        x["name"] = name
    print(f"{len(g)} grids, {len(rows)} block records, {len(launches)} noted launches; times in us from the first enter")
    print(f"{'#':>4} {'kernel':<44} {'blocks':>6} {'rec':>5} {'enter0':>8} {'enter1':>8} {'exit0':>8} {'exit1':>8} {'dur':>6} {'lead':>6} {'late':>6}")
    per = defaultdict(list)
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    for i, x in enumerate(g):
        dur = (g[i + 1]["exit0"] - x["exit0"]) / 1e3 if i + 1 < len(g) else float("nan")
        lead = (x["exit0"] - x["enter0"]) / 1e3
        late = (x["enter1"] - x["exit0"]) / 1e3
        per[x["name"]].append((dur, lead, late))
        if i < limit:
            print(f"{i:>4} {x['name'][:44]:<44} {x['nb']:>6} {x['n']:>5} {(x['enter0']-t0)/1e3:>8.1f} {(x['enter1']-t0)/1e3:>8.1f} "
                  f"{(x['exit0']-t0)/1e3:>8.1f} {(x['exit1']-t0)/1e3:>8.1f} {dur:>6.1f} {lead:>6.1f} {late:>6.1f}")
    print()
    print(f"{'kernel':<60} {'count':>5} {'dur':>7} {'lead':>6} {'late':>6}  (means, us)")
    tot = 0.0
    for name, v in sorted(per.items(), key=lambda kv: -sum(d for d, _, _ in kv[1] if d == d)):
        ds = [d for d, _, _ in v if d == d]
        md = sum(ds) / len(ds) if ds else float("nan")
        tot += sum(ds)
        print(f"{name:<60} {len(v):>5} {md:>7.2f} {sum(a for _, a, _ in v)/len(v):>6.2f} {sum(c for _, _, c in v)/len(v):>6.2f}")
    if g:
        print(f"span first enter -> last exit: {(g[-1]['exit1'] - t0)/1e3:.1f} us; sum of durations {tot:.1f} us")


if __name__ == "__main__":
    main()
