#!/usr/bin/env python3
"""Tool-result accuracy of the demo model through a running moeserve server (issue 20): the
held-out tool-result follow-ups of scripts/demo_dialogs.py (held-out phrasings and values; the
user's question, the assistant's tool call, the tool's result) are sent to /v1/chat/completions
with the demo's three tools, greedy; a follow-up counts when the final answer (the content after
</think>, no tool call) repeats every expected string of the result exactly.

Serve as the README does (`--tool-call-parser minimax_m2 --reasoning-parser
minimax_m2_append_think --enable-auto-tool-choice`), then:
  python3 scripts/demo_tool_results.py --base-url http://127.0.0.1:8000 [-n 30] [--json out.json]
tests/server/test_demo_model.py runs the same measurement (measure()) on a 12-item subset."""
import argparse
import json
import os
import random
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_dialogs  # noqa: E402

SEED = 20260 + 3  # train_demo.py's seed for the follow-ups (SEED + 3)


def ask(base, messages, tools, max_tokens=120):
    body = json.dumps({"model": "demo", "messages": messages, "tools": tools, "temperature": 0,
                       "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]


def measure(base, n=30):
    """Returns (exact, n, per-item records) for the first n held-out follow-ups."""
    items = demo_dialogs.held_out_followups(random.Random(SEED), n)
    ok, rows = 0, []
    for it in items:
        c = ask(base, it["messages"], it["tools"])
        m = c["message"]
        content = m.get("content") or ""
        answer = content.split("</think>")[-1]
        good = not m.get("tool_calls") and bool(answer.strip()) and all(e in answer for e in it["expect"])
        ok += good
        rows.append({"tool": it["tool"], "result": it["messages"][-1]["content"], "expect": it["expect"],
                     "ok": good, "answer": answer.strip(), "finish_reason": c["finish_reason"]})
    return ok, len(items), rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args()
    ok, n, rows = measure(a.base_url.rstrip("/"), a.n)
    for r in rows:
        print(("ok   " if r["ok"] else "FAIL ") + f"{r['tool']:16} {r['result'][:60]:60} -> {r['answer'][:90]}")
    print(f"tool-result follow-ups whose answer repeats the result exactly: {ok}/{n} ({ok / n:.2f})")
    if a.json:
        json.dump({"exact": ok, "n": n, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
