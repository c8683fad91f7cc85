"""EAGLE-3 training and the evaluations of scripts/train_demo.py (acceptance of the MTP and
EAGLE-3 drafts per position on held-out text, tool-call success on held-out prompts).
Shapes: B batch, T tokens, H hidden, V vocab, Vd draft vocab, K draft length."""
import os
import re
import time

import numpy as np
import torch
import torch.nn.functional as F

import demo_heads

K = 3          # draft length measured (= the number of MTP modules)


def _target_pass(model, taps, x):
    """Frozen target forward; returns (logits [B, T, V], aux [B, T, 3H], h0 [B, T, H])."""
    out = model.model(x)
    h0 = out.last_hidden_state
    return model.lm_head(h0), taps.aux(), h0


def train_eagle(args, model, taps, data, rng, dev, say):
    from train_demo import EAGLE, batch
    on_gpu = dev.type == "cuda"
    for p in model.parameters():
        p.requires_grad_(False)
    eagle = demo_heads.Eagle3(EAGLE, model.model.embed_tokens).to(dev)
    V, Vd = EAGLE["vocab_size"], EAGLE["draft_vocab_size"]
    # draft vocabulary: the Vd tokens the target itself predicts most often (its argmax)
    counts = torch.zeros(V, dtype=torch.long, device=dev)
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=on_gpu):
        for _ in range(20):
            lg, _, _ = _target_pass(model, taps, batch(rng, data, args.batch, args.seq, args.p_docs, dev))
            counts += torch.bincount(lg.argmax(-1).reshape(-1), minlength=V)
    counts[counts == 0] = -1  # never-predicted tokens last; ties broken by id (stable sort)
    order = torch.sort(counts, descending=True, stable=True).indices[:Vd]
    draft_ids = torch.sort(order).values
    eagle.d2t.copy_(draft_ids - torch.arange(Vd, device=dev))
    eagle.t2d.zero_()
    eagle.t2d[draft_ids] = True
    covered = counts.clamp(min=0)[draft_ids].sum().item() / max(counts.clamp(min=0).sum().item(), 1)
    say(f"EAGLE-3 draft vocab: {Vd} tokens cover {covered:.4f} of the target's argmax tokens")
    opt = torch.optim.AdamW(eagle.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=on_gpu)
    total = args.eagle_steps or 10 ** 9
    t0, step, weights = time.time(), 0, [1.0, 0.8, 0.64]
    curve = []
    while step < total:
        x = batch(rng, data, args.batch, args.seq, args.p_docs, dev)
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=on_gpu):
            tl, aux, _ = _target_pass(model, taps, x)
        f = min(1.0, step / 50)
        for g in opt.param_groups:
            g["lr"] = args.lr * f if step < 50 else args.lr * max(0.1, 1 - step / max(total, 1))
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=on_gpu):
            outs = eagle.unrolled(aux.detach(), x, K)
            loss, accs = demo_heads.eagle_loss(outs, tl, eagle.t2d, weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(eagle.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == 20 and not args.eagle_steps:
            if on_gpu:
                torch.cuda.synchronize()
            per = (time.time() - t0) / 20
            total = max(60, int(20 + (args.eagle_budget_s - (time.time() - t0)) / per))
            say(f"EAGLE-3 speed {per * 1000:.1f} ms/step -> {total} steps")
        if step % args.log_every == 0 or step == total:
            curve.append([step, loss.item()] + accs)
            say(f"eagle step {step}/{total} loss {loss.item():.3f} teacher-forced top1 "
                + " ".join(f"{a:.3f}" for a in accs))
    return eagle, {"steps": step, "seconds": round(time.time() - t0, 1), "curve": curve,
                   "draft_vocab_coverage": covered}


@torch.no_grad()
def _greedy_sequences(model, data, n, prompt_len, new, dev):
    """n held-out prefixes (half validation prose, half validation dialogs) continued greedily
    by the target: [n, prompt_len + new] in float32."""
    rs = np.random.RandomState(7)
    rows = []
    for k in range(n):
        if k % 2 == 0:
            s = rs.randint(0, data["docs_val"].size - prompt_len - 1)
            rows.append(data["docs_val"][s:s + prompt_len])
        else:
            st = data["dlg_val_starts"]
            s = int(st[rs.randint(0, st.size - 1)]) + rs.randint(0, 200)
            s = min(s, data["dlg_val"].size - prompt_len - 1)
            rows.append(data["dlg_val"][s:s + prompt_len])
    x = torch.from_numpy(np.stack(rows).astype(np.int64)).to(dev)
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0, eos_token_id=None)
    return out


@torch.no_grad()
def measure_acceptance(model, mtp, eagle, taps, data, dev, say, n=48, prompt_len=96, new=96):
    """Per-position acceptance of MTP (chain of its 3 modules) and EAGLE-3 (3 chained steps) on
    greedy continuations of held-out text, in float32: at each position t of the continuation
    the target's own next token is S[t+1]; draft k (k = 1..3) guesses S[t+1+k]."""
    S = _greedy_sequences(model, data, n, prompt_len, new, dev)
    Tn = S.shape[1]
    rows = torch.arange(prompt_len - 1, Tn - 2 - K + 1, device=dev)    # t with S[t+1..t+1+K] generated
    res = {"sequences": n, "prompt_tokens": prompt_len, "generated_tokens": new, "positions": 0}
    mtp_d, eag_d, truth, consistent = [], [], [], 0
    for b in range(n):
        s = S[b:b + 1]
        logits, aux, h0 = _target_pass(model, taps, s)
        consistent += (logits[0, rows].argmax(-1) == s[0, rows + 1]).sum().item()
        pos_emb = model.model.rotary_emb(h0, torch.arange(Tn, device=dev)[None])
        hs = mtp.teacher_chain(model, s, h0, pos_emb)
        mtp_d.append(mtp.draft_at(model, s, hs, rows, pos_emb))
        outs = eagle.unrolled(aux, s, K, feed_drafts=True)
        ed = []
        for j, lg in enumerate(outs):
            am = lg[0].argmax(-1)
            ed.append((am + eagle.d2t[am])[rows])
        eag_d.append(torch.stack(ed, -1))
        truth.append(torch.stack([s[0, rows + 1 + k] for k in range(1, K + 1)], -1))
    mtp_d, eag_d, truth = torch.cat(mtp_d), torch.cat(eag_d), torch.cat(truth)
    valid = torch.ones(truth.shape[0], dtype=torch.bool, device=dev)
    res["positions"] = int(truth.shape[0])
    res["target_greedy_consistency"] = consistent / truth.shape[0]
    for name, d in (("mtp", mtp_d), ("eagle3", eag_d)):
        rates, counts, mean_acc = demo_heads.acceptance(d, truth, valid)
        res[name] = {"conditional_acceptance": rates, "positions_tried": counts, "mean_accepted_of_3": mean_acc,
                     "unconditional_top1": [(d[:, k] == truth[:, k]).float().mean().item() for k in range(K)]}
        say(f"acceptance {name}: per position {[round(r, 3) for r in rates]} (tried {counts}), "
            f"mean accepted {mean_acc:.3f} of {K}")
    return res


_TOOL_RE = re.compile(r"<minimax:tool_call>(.*?)</minimax:tool_call>", re.S)
_INVOKE_RE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.S)
_PARAM_RE = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.S)
REQUIRED = {"calculator": ["expression"], "get_current_time": ["timezone"],
            "convert_units": ["value", "from_unit", "to_unit"]}


def parse_calls(text):
    calls = []
    for block in _TOOL_RE.findall(text):
        for name, body in _INVOKE_RE.findall(block):
            calls.append((name, dict(_PARAM_RE.findall(body))))
    return calls


@torch.no_grad()
def _greedy_batch(model, prompts, tok, dev, max_new):
    """Greedy continuations of token-id prompts (left-padded batch); decoded text up to EOS."""
    pad, eos = tok.token_to_id("]!p~["), tok.token_to_id("[e~[")
    n = max(len(p) for p in prompts)
    x = torch.full((len(prompts), n), pad, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, p in enumerate(prompts):
        x[i, n - len(p):] = torch.tensor(p)
        mask[i, n - len(p):] = 1
    out = model.generate(x.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new, do_sample=False,
                         pad_token_id=pad, eos_token_id=eos)
    texts = []
    for i in range(len(prompts)):
        ids = out[i, n:].tolist()
        if eos in ids:
            ids = ids[:ids.index(eos)]
        texts.append(tok.decode(ids, skip_special_tokens=False))
    return texts


@torch.no_grad()
def eval_followups(model, follow, tok_path, dev, say, max_new=96):
    """Tool-result accuracy on held-out follow-ups (demo_dialogs.held_out_followups, rendered up
    to the tool's result with the generation prompt): the share whose final answer (the text
    after </think>, no tool call) contains every expected string exactly."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    texts = _greedy_batch(model, [f["ids"] for f in follow], tok, dev, max_new)
    ok, per_tool, samples = 0, {}, []
    for f, text in zip(follow, texts):
        answer = text.split("</think>")[-1] if "</think>" in text else ""
        good = bool(answer.strip()) and not parse_calls(text) and all(e in answer for e in f["expect"])
        ok += good
        t = per_tool.setdefault(f["tool"], [0, 0])
        t[0] += good
        t[1] += 1
        samples.append({"tool": f["tool"], "result": f["messages"][-1]["content"], "expect": f["expect"],
                        "ok": good, "output": text})
    res = {"followups": len(follow), "exact": ok, "rate": ok / max(len(follow), 1), "per_tool": per_tool}
    say(f"held-out tool-result follow-ups: answer repeats the result exactly {ok}/{len(follow)} {per_tool}")
    return res, samples


@torch.no_grad()
def eval_prompts(model, held, tok_path, dev, say, max_new=200):
    """Greedy answers to the held-out prompts (rendered with the chat template, ending in
    '<think>\\n'). A tool prompt succeeds when the answer holds exactly the expected tool's
    invoke with all its required parameters; a plain prompt when it holds no tool call and
    some text after </think>."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    pad, eos = tok.token_to_id("]!p~["), tok.token_to_id("[e~[")
    n = max(len(h["ids"]) for h in held)
    x = torch.full((len(held), n), pad, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, h in enumerate(held):
        x[i, n - len(h["ids"]):] = torch.tensor(h["ids"])
        mask[i, n - len(h["ids"]):] = 1
    out = model.generate(x.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new, do_sample=False,
                         pad_token_id=pad, eos_token_id=eos)
    ok_tool = ok_plain = n_tool = n_plain = 0
    samples = []
    for i, h in enumerate(held):
        ids = [t for t in out[i, n:].tolist()]
        if eos in ids:
            ids = ids[:ids.index(eos)]
        text = tok.decode(ids, skip_special_tokens=False)
        calls = parse_calls(text)
        if h["tool"]:
            n_tool += 1
            good = len(calls) >= 1 and calls[0][0] == h["tool"] and all(k in calls[0][1] for k in REQUIRED[h["tool"]])
            ok_tool += good
        else:
            n_plain += 1
            good = not calls and "</think>" in text and text.split("</think>")[-1].strip() != ""
            ok_plain += good
        samples.append({"prompt": h["prompt"], "expected_tool": h["tool"], "ok": bool(good), "output": text})
    res = {"tool_prompts": n_tool, "tool_success": ok_tool, "plain_prompts": n_plain, "plain_success": ok_plain}
    say(f"held-out prompts: tool calls {ok_tool}/{n_tool}, plain answers {ok_plain}/{n_plain}")
    return res, samples
