"""Model card (README.md) and loss curve (loss.png) of assets/demo-model, from a training run's
metrics.json (scripts/train_demo.py) and prepare.json. Every number in the card is read from
those files; nothing is typed in by hand."""
import json
import os


def _size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


def plot(curve, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [c[0] for c in curve]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, [c[1] for c in curve], label="main model (next token)")
    for k in range(2, len(curve[0])):
        ax.plot(steps, [c[k] for c in curve], label=f"MTP module {k - 1} (token +{k})", alpha=0.7)
    ax.set_xlabel("step")
    ax.set_ylabel("training cross-entropy (nats)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def argument_check(samples):
    """Held-out tool prompts whose first call also has the right arguments: the calculator's
    expression exactly as asked, the clock's IANA zone of the asked city, the converter's value.
    Returns {tool: [right, asked]}."""
    import re
    import demo_dialogs
    import train_eagle
    zones = {v: k for k, v in demo_dialogs.HELD_OUT_ZONES.items()}
    out = {"calculator": [0, 0], "get_current_time": [0, 0], "convert_units": [0, 0]}
    for smp in samples:
        t, p = smp["expected_tool"], smp["prompt"]
        if not t:
            continue
        out[t][1] += 1
        calls = train_eagle.parse_calls(smp["output"])
        if not calls or calls[0][0] != t:
            continue
        a = calls[0][1]
        if t == "calculator":
            good = a.get("expression") == re.search(r"(?:out|of) (.*?)[.?]$", p).group(1)
        elif t == "get_current_time":
            good = a.get("timezone") == zones[[c for c in zones if c in p][0]]
        else:
            good = a.get("value") == re.search(r"(\d+)", p).group(1)
        out[t][0] += good
    return out


def weaknesses(m, args_ok):
    """Known weaknesses, from the run's own held-out results (failed prompts and follow-ups)."""
    out = ["Cities outside the training dialogs (Rome, Chicago, Seoul) cannot be mapped to their time "
           f"zone by a model that never saw them: right zones {args_ok['get_current_time'][0]}/"
           f"{args_ok['get_current_time'][1]}."]
    failed = [s["prompt"] for s in m["samples"] if not s["ok"]]
    if failed:
        out.append("Held-out prompts answered wrongly: " + ", ".join(f'"{p}"' for p in failed) + ".")
    tr = m.get("followup_samples") or []
    bad = [s for s in tr if not s["ok"]]
    if bad:
        out.append(f"Tool-result follow-ups whose answer does not repeat the result ({len(bad)} of {len(tr)}), e.g. "
                   + "; ".join(f"result `{s['result']}` -> `{s['output'].split('</think>')[-1].strip()[:80]}`"
                               for s in bad[:3]) + ".")
    out.append("Offer the three tools as the training dialogs do; a model this small repeats the "
               "training dialogs' phrasings and knows no facts beyond the Python glossary.")
    return "\n".join("* " + x for x in out)


def write_card(dest, m, prep, g16, g8, server=None):
    """server: optional results of scripts/demo_tool_results.py --prompts --json against
    `moeserve serve` on this folder (CPU), shown beside the training script's own numbers."""
    from train_demo import MODEL
    arch = m.get("model", MODEL)
    plot(m["loss_curve"], os.path.join(dest, "loss.png"))
    args_ok = argument_check(m["samples"])
    acc, v, te, tr = m["acceptance"], m["val"], m["tool_eval"], m["tool_result_eval"]
    per_tool = ", ".join(f"{k} {a}/{b}" for k, (a, b) in tr["per_tool"].items())
    server_rows = ""
    if server:
        server_rows = (f"| the same through `moeserve serve` on this folder (CPU, bf16; README flags; "
                       f"`scripts/demo_tool_results.py --prompts`): parsed `tool_calls` / English plain answers / "
                       f"tool-result follow-ups repeating the result | {server['tool_ok']}/{server['tool_n']}, "
                       f"{server['plain_ok']}/{server['plain_n']}, {server['exact']}/{server['n']} |\n")
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
    s16, s8, se = _size(dest), _size(os.path.join(dest, "fp8")), _size(os.path.join(dest, "eagle3"))
    samples = []
    seen = set()
    for smp in m["samples"]:
        key = smp["expected_tool"] or "plain"
        if list(seen).count(key) == 0 or key == "plain":
            if key in seen and key != "plain":
                continue
            seen.add(key)
            samples.append(smp)
        if len(samples) >= 7:
            break
    sample_md = "\n\n".join(
        f"**Prompt:** {s['prompt']} (expected: {s['expected_tool'] or 'an answer, no tool'}; "
        f"{'ok' if s['ok'] else 'FAILED'})\n\n```\n<think>\n{s['output'].strip()}\n```" for s in samples)
    fs = m.get("followup_samples") or []
    pick = ([x for x in fs if x["ok"]][:2] + [x for x in fs if not x["ok"]][:1])
    sample_md += "\n\nHeld-out tool-result follow-ups (the question, the tool call and the tool's result in the prompt):\n\n" + \
        "\n\n".join(f"**Tool result:** `{x['result']}` (must repeat {', '.join(x['expect'])}; "
                    f"{'ok' if x['ok'] else 'FAILED'})\n\n```\n<think>\n{x['output'].strip()}\n```" for x in pick)
    n_total = m["params_main"] + m["params_mtp"]
    card = f"""# moeserve demo model (MiniMax-M2 architecture, {m['params_main'] / 1e6:.1f} M parameters)

A very small language model of MiniMax-M2's own architecture, trained from scratch for moeserve's
demo, tests and speculative-decoding work. It speaks simple English, reasons inside
`<think>...</think>` and calls three demo tools in MiniMax's XML format. It is a toy in
knowledge: it knows a little of the Python documentation and nothing else, and its arithmetic
is only right when it uses the calculator tool.

Trained by `scripts/train_demo.py` (prepare, train, then `scripts/demo_ship.py`); see that file
for the exact commands. Seed {m['seed']}.

## Architecture

`MiniMaxM2ForCausalLM` (transformers), hub tensor layout of MiniMaxAI/MiniMax-M2.5:

| | |
|---|---|
| layers | {arch['num_hidden_layers']} (full attention), hidden {arch['hidden_size']} |
| attention | GQA: {arch['num_attention_heads']} query heads, {arch['num_key_value_heads']} KV heads, head_dim {arch['head_dim']}; partial RoPE (rotary_dim {arch['rotary_dim']}, theta {arch['rope_theta']:g}); full-width QK RMSNorm (`qk_norm_type: per_layer`) |
| MoE | {arch['num_local_experts']} experts (SwiGLU, {arch['intermediate_size']} wide), top-{arch['num_experts_per_tok']}, sigmoid router with `e_score_correction_bias` (updated by the auxiliary-loss-free rule of DeepSeek-V3, rate 1e-3 per step) |
| vocabulary | 8192 = tokenizer size (8146 BPE + 46 added tokens) |
| MTP | 3 modules at `model.layers.6-8.` (`enorm`, `hnorm`, `eh_proj`, one MoE decoder layer, `shared_head.norm`; embedding and `lm_head` shared), `num_mtp_modules: 3` |
| parameters | {m['params_main'] / 1e6:.2f} M main model ({m['params_main'] - 2 * 8192 * 256:,} outside the embedding and lm_head) + {m['params_mtp'] / 1e6:.2f} M MTP = {n_total / 1e6:.2f} M |
| files | bf16 {s16 / 1e6:.1f} MB (this folder), FP8 {s8 / 1e6:.1f} MB (`fp8/`: 128x128 blocks, e4m3fn + `weight_scale_inv`), EAGLE-3 {se / 1e6:.1f} MB (`eagle3/`) |

Size trade-off: the issue asked for 20-60 M parameters but also at most about 40 MB for bf16 +
FP8 + EAGLE-3 together; both cannot hold, and the 40 MB cap is kept: {n_total / 1e6:.1f} M parameters,
of which 4.2 M are the embedding and lm_head, which stay bf16 in the FP8 copy too (experts
{arch['intermediate_size']} wide; the first shipped model's 96-wide experts took 43.7 MB); all three copies take
{(s16 + s8 + se) / 1e6:.1f} MB (tokenizer and card included). A model this small
repeats phrasings from its training dialogs and gets facts wrong; it is meant to show that the
engine, the parsers and the draft heads work end to end, not to be useful.

## Training data

* **English text**: the reStructuredText sources of the Python 3.11 documentation as shipped by the
  Debian package **python3.11-doc** (3.11.2-6+deb12u9, `usr/share/doc/python3.11/html/_sources`),
  licensed under the **PSF License Agreement version 2** (see the package's
  `usr/share/doc/python3.11-doc/copyright` and the docs' own `license.rst.txt`: "Python software
  and documentation are licensed under the PSF License Agreement"; code examples also 0BSD). The
  PSF licence allows preparing and distributing derivative works provided the PSF copyright notice
  ("Copyright (c) 2001-2023 Python Software Foundation; All Rights Reserved") and the licence are
  retained and the changes summarised. Summary of changes: only prose paragraphs were kept
  (markup, code and tables removed, `scripts/demo_corpus.py`), and a language model was trained
  on them. {prep['doc_files']} files, {prep['docs_train_tokens']:,} training tokens, {prep['docs_val_tokens']:,} held out
  (every 20th file).
* **Synthetic dialogs** from `scripts/demo_dialogs.py` ({prep['dialogs']:,} dialogs,
  {prep['dialog_tokens']:,} tokens): questions answered from the Python glossary and section
  texts, arithmetic with the steps in the reasoning, small talk, and tool calls to `calculator`,
  `get_current_time` and `convert_units` with the tool's result and a final answer. Rendered
  through MiniMax-M2.5's chat template, so the training text is the text moeserve's server feeds.
* Mix: {100 * m.get('p_docs', 0.35):.0f}% of the {m['seq']}-token windows from the prose, the rest from dialogs
  (starting at a dialog; {m['seq']} tokens hold a whole dialog with all three tools, ~540 tokens, so
  the tool's result and the final answer are inside the window).
* Of the dialogs, 55% are tool calls with the tool's result (as JSON with a string or a number,
  or bare text; results of one to seven digits, negative, decimal, with units) and a final answer
  in varied phrasings that repeats the result exactly.

Tokenizer: byte-level BPE trained with HF `tokenizers` on the training prose and dialogs (o200k
pre-tokenizer regex and ByteLevel decoder, as MiniMax-M2), plus MiniMax-M2's added tokens as far as
they are documented: `]!p~[`, `]~b]`, `[e~[` (EOS), `]!d~[`, `]~!b[` (BOS), the media markers and
M2.5's named `extra_special_tokens` as special tokens; `<think>`, `</think>`, `<minimax:tool_call>`,
`</minimax:tool_call>` as non-special added tokens. The `<issue_*>` and `<jupyter_*>` families are
not documented by name and are missing. The ids differ from the real tokenizer's (200000+).

## Training

One {m['device']}, torch {m['torch']}: {m['steps']} steps of {m['batch']} x {m['seq']} tokens
({m['tokens_seen'] / 1e6:.0f} M tokens) in {m['train_seconds_main']:.0f} s for the model and its MTP modules
(AdamW, peak lr {m['lr']}, warmup then cosine to 10%, bf16 autocast; MTP losses on detached target
states, so they do not change the model), then {m['eagle_train']['steps']} steps
({m['eagle_train']['seconds']:.0f} s) for EAGLE-3; {m['total_seconds']:.0f} s for the whole run with evaluation.
Re-running gives the same data and initialisation; GPU kernels are not bitwise deterministic.
The step counts were picked by the script from the speed of steps 10-30 for budgets of
{m.get('budget_s', 0):.0f} s and {m.get('eagle_budget_s', 0):.0f} s (the device allowance of this retrain); to repeat this run:
`scripts/train_demo_gpu.sh DOCS OUT --steps {m['steps']} --eagle-steps {m['eagle_train']['steps']} --batch {m['batch']} --p-docs {m.get('p_docs', 0.35)}`
(its `prepare` step with `--tokenizer assets/demo-model` keeps this tokenizer; docs/bench/log.md
has the retrain's tries).

![training loss](loss.png)

## Results (from the run's metrics.json, committed as training_metrics.json with train.log)

| | |
|---|---|
| validation perplexity, held-out Python docs prose | {v['docs_ppl']:.2f} (loss {v['docs_loss']:.3f}) |
| validation perplexity, held-out dialogs (same generator, other seed) | {v['dialog_ppl']:.3f} (loss {v['dialog_loss']:.3f}) |
| held-out tool prompts (phrasings, cities, numbers not in training) answered with the right tool and all required parameters | {te['tool_success']} / {te['tool_prompts']} |
| of those, with the right arguments: calculator expression / clock time zone / converter value | {args_ok['calculator'][0]}/{args_ok['calculator'][1]}, {args_ok['get_current_time'][0]}/{args_ok['get_current_time'][1]}, {args_ok['convert_units'][0]}/{args_ok['convert_units'][1]} |
| held-out plain prompts answered without a tool call | {te['plain_success']} / {te['plain_prompts']} |
| held-out tool-result follow-ups whose final answer repeats the tool's result exactly (calculator result, converter value, clock time and date) | {tr['exact']} / {tr['followups']} ({per_tool}) |
{server_rows}
Known weaknesses, seen in these outputs and in `tests/server/test_demo_model.py`:
{weaknesses(m, args_ok)}

Acceptance of the draft heads (greedy chain of 3 drafts after the target's own token, on
{acc['positions']} positions of greedy continuations of held-out text; rate k = share of drafts k
that match the target's greedy token among positions where drafts 1..k-1 matched):

| head | position 1 | position 2 | position 3 | mean accepted drafts (of 3) |
|---|---|---|---|---|
| MTP (modules 1-3 chained) | {fmt(acc['mtp']['conditional_acceptance'][:1])} | {fmt(acc['mtp']['conditional_acceptance'][1:2])} | {fmt(acc['mtp']['conditional_acceptance'][2:3])} | {acc['mtp']['mean_accepted_of_3']:.3f} |
| EAGLE-3 (3 chained steps) | {fmt(acc['eagle3']['conditional_acceptance'][:1])} | {fmt(acc['eagle3']['conditional_acceptance'][1:2])} | {fmt(acc['eagle3']['conditional_acceptance'][2:3])} | {acc['eagle3']['mean_accepted_of_3']:.3f} |

EAGLE-3 head: `eagle3/` (`LlamaForCausalLMEagle3`, hidden 256, one layer, draft vocabulary 2048
with `d2t` / `t2d`, covering {m['eagle_train']['draft_vocab_coverage']:.4f} of the target's
argmax tokens), taps `eagle_aux_hidden_state_layer_ids: [2, 3, 5]` in vLLM's convention (the
residual stream entering layers 2, 3 and 5), embedding shared with the target. Trained on the
frozen target's own output distributions with 3 unrolled steps (SpecForge-style test-time training).

## Golden tests

HF transformers float32 logits for {len(g16['cases'])} chat prompts ({g16['new_tokens']} greedy tokens each),
bf16 and FP8: `tests/fixtures/golden/demo_bf16`, `demo_fp8`, checked by `test_demo_golden` (CTest label
`model`) against moeserve's CPU backend within 1e-4 (max |d| / max |ref|). Reference: {g16['reference']}.

## Sample answers (greedy, from the run)

Held-out prompts, rendered with the chat template (tools offered) and generated greedily after
the template's `<think>` opening:

{sample_md}

## Licence

The weights are a derivative of the Python documentation (PSF License Agreement v2, notice above)
and of moeserve's own synthetic dialogs; moeserve's licence applies to the rest.
"""
    with open(os.path.join(dest, "README.md"), "w") as fh:
        fh.write(card)


if __name__ == "__main__":
    import argparse
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="rewrite the model card from a run's metrics.json")
    ap.add_argument("--run", required=True)
    ap.add_argument("--dest", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                   "assets", "demo-model"))
    ap.add_argument("--golden", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                     "tests", "fixtures", "golden"))
    ap.add_argument("--server", help="scripts/demo_tool_results.py --prompts --json output")
    a = ap.parse_args()
    mm = json.load(open(os.path.join(a.run, "metrics.json")))
    write_card(a.dest, mm, mm["prepare"], json.load(open(os.path.join(a.golden, "demo_bf16", "golden.json"))),
               json.load(open(os.path.join(a.golden, "demo_fp8", "golden.json"))),
               json.load(open(a.server)) if a.server else None)
