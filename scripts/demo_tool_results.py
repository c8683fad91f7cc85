#!/usr/bin/env python3
"""Tool-result accuracy of the demo model through a running moeserve server (issue 20): the
held-out tool-result follow-ups of scripts/demo_dialogs.py (held-out phrasings and values; the
user's question, the assistant's tool call, the tool's result) are sent to /v1/chat/completions
with the demo's three tools, greedy; a follow-up counts when the final answer (the content after
</think>, no tool call) repeats every expected string of the result exactly.

Serve as the README does (`--tool-call-parser minimax_m2 --reasoning-parser
minimax_m2_append_think --enable-auto-tool-choice`), then:
  python3 scripts/demo_tool_results.py --base-url http://127.0.0.1:8000 [-n 30] [--prompts] [--json out.json]
(--prompts: also the held-out plain and tool prompts of the model card: parsed tool_calls,
English answers.)
tests/server/test_demo_model.py runs the same measurement (measure()) on a 12-item subset."""
import argparse
import json
import os
import random
import re
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


def english(text):
    """Mostly letters and spaces, five words or more, a sentence end (test_demo_model.py's rule)."""
    words = re.findall(r"[A-Za-z]+", text)
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return len(words) >= 5 and letters >= 0.8 * max(len(text), 1) and re.search(r"[.!?]", text) is not None


def measure_prompts(base):
    """The held-out prompts of train_demo.py (demo_dialogs.held_out_prompts, seed SEED - 1):
    tool prompts must come back as parsed tool_calls of the expected tool, plain prompts as
    English reasoning and answer without a tool call. Returns (tool ok, tools, plain ok, plains, rows)."""
    items = demo_dialogs.held_out_prompts(random.Random(SEED - 1))
    counts, rows = {"tool": [0, 0], "plain": [0, 0]}, []
    for it in items:
        c = ask(base, [{"role": "user", "content": it["prompt"]}], demo_dialogs.ALL_TOOLS, 160)
        m = c["message"]
        calls = m.get("tool_calls") or []
        content = m.get("content") or ""
        if it["tool"]:
            good = c["finish_reason"] == "tool_calls" and bool(calls) and calls[0]["function"]["name"] == it["tool"]
            shown = calls[0]["function"]["name"] + " " + calls[0]["function"]["arguments"] if calls else content
        else:
            parts = content[len("<think>"):].split("</think>") if content.startswith("<think>") else ["", content]
            good = not calls and len(parts) == 2 and english(parts[0]) and english(parts[1].strip())
            shown = content.split("</think>")[-1].strip()
        k = "tool" if it["tool"] else "plain"
        counts[k][0] += good
        counts[k][1] += 1
        rows.append({"prompt": it["prompt"], "expected_tool": it["tool"], "ok": good, "shown": shown})
    return counts["tool"][0], counts["tool"][1], counts["plain"][0], counts["plain"][1], rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--prompts", action="store_true", help="also the held-out plain and tool prompts")
    a = ap.parse_args()
    if a.prompts:
        t_ok, t_n, p_ok, p_n, prow = measure_prompts(a.base_url.rstrip("/"))
        for r in prow:
            print(("ok   " if r["ok"] else "FAIL ") + f"{r['prompt'][:50]:50} -> {r['shown'][:100]}")
        print(f"held-out prompts: parsed tool_calls {t_ok}/{t_n}, English answers without a tool call {p_ok}/{p_n}")
    res = {}
    if a.prompts:
        res = {"tool_ok": t_ok, "tool_n": t_n, "plain_ok": p_ok, "plain_n": p_n, "prompt_rows": prow}
    ok, n, rows = measure(a.base_url.rstrip("/"), a.n)
    for r in rows:
        print(("ok   " if r["ok"] else "FAIL ") + f"{r['tool']:16} {r['result'][:60]:60} -> {r['answer'][:90]}")
    print(f"tool-result follow-ups whose answer repeats the result exactly: {ok}/{n} ({ok / n:.2f})")
    if a.json:
        json.dump({"exact": ok, "n": n, "rows": rows, **res}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
