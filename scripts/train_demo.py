#!/usr/bin/env python3
"""Trains moeserve's demo model: a small MiniMax-M2-architecture model (transformers'
MiniMaxM2ForCausalLM: GQA, partial RoPE, full-width QK-norm, sigmoid router with score bias,
8 experts top-2) with three MTP modules and an EAGLE-3 draft head (scripts/demo_heads.py).

Three steps (fixed seeds; see assets/demo-model/README.md for the numbers of the shipped run):
  1. prepare (CPU): corpus from the python3.11-doc Debian package (scripts/demo_corpus.py) plus
     synthetic dialogs (scripts/demo_dialogs.py) rendered through MiniMax-M2.5's chat template;
     trains the tokenizer; writes BUILD/data.npz, BUILD/tokenizer/, BUILD/heldout.json.
       apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb /tmp/pydoc
       python3 scripts/train_demo.py prepare --docs /tmp/pydoc --build .demo-build [--tokenizer assets/demo-model]
     (--tokenizer keeps the shipped tokenizer instead of training one, so token ids stay the same)
  2. train (one GPU): main model + MTP jointly (MTP sees detached target states, so it does not
     change the target), then EAGLE-3 on the frozen target's own output distributions; then
     validation perplexity, acceptance per draft position, tool-call success on held-out
     prompts, sample answers. Writes OUT/model-*.safetensors (hub names, bf16), OUT/eagle3.safetensors,
     OUT/metrics.json.
       python3 scripts/train_demo.py train --build .demo-build --out OUT [--steps N]
     Without --steps the step count is chosen from the speed of the first 30 steps so that
     training fits --budget-s; metrics.json records the count, and --steps N repeats the run.
  3. ship (CPU): scripts/demo_ship.py writes assets/demo-model/ (bf16, fp8/, eagle3/, card) and
     the golden fixtures.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_corpus  # noqa: E402
import demo_dialogs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a verbatim copy of shared/data/chat-templates/minimax-m2.5.jinja
TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "shared-data", "chat-templates", "minimax-m2.5.jinja")
SEED = 20260
MODEL = dict(vocab_size=demo_corpus.VOCAB, hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, rotary_dim=32, intermediate_size=64, num_local_experts=8,
             num_experts_per_tok=2, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096,
             num_mtp_modules=3)
EAGLE = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=256, target_hidden_size=256,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
             num_hidden_layers=1, draft_vocab_size=2048, vocab_size=demo_corpus.VOCAB, rms_norm_eps=1e-6,
             rope_theta=10000.0, max_position_embeddings=4096, hidden_act="silu", tie_word_embeddings=False,
             attention_bias=False, torch_dtype="bfloat16",
             # vLLM boundary convention: residual stream entering layers 2, 3 and 5 (outputs of 1, 2, 4)
             eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 3, 5], "use_aux_hidden_state": True,
                           # moeserve: the taps are the residual streams entering layers 2, 3, 5 (Taps)
                           "eagle_aux_hidden_state_convention": "input_of_layer"})
# 768: a dialog with all three tools offered runs to ~540 tokens, so 512-token windows cut off
# the tool's result and the final answer (the shipped 512-token run answered with wrong numbers)
SEQ = 768
_BASE = demo_corpus.VOCAB - len(demo_corpus.SPECIAL) - len(demo_corpus.NOT_SPECIAL)
TOKEN_IDS = {n: _BASE + demo_corpus.SPECIAL.index(t) for n, t in (("bos", "]~!b["), ("eos", "[e~["), ("pad", "]!p~["))}


# ----------------------------------------------------------------------------- prepare
def prepare(args):
    rng = random.Random(SEED)
    template = open(args.template, encoding="utf-8").read()
    docs = demo_corpus.load_python_docs(args.docs)
    n_dlg = args.dialogs
    dialogs = demo_dialogs.make_dialogs(rng, n_dlg, docs["glossary"], docs["sections"])
    val_dialogs = demo_dialogs.make_dialogs(random.Random(SEED + 1), 400, docs["glossary"], docs["sections"])
    rendered = demo_corpus.render_dialogs(dialogs, template)
    rendered_val = demo_corpus.render_dialogs(val_dialogs, template)
    tok_dir = os.path.join(args.build, "tokenizer")
    if args.tokenizer:  # keep a shipped tokenizer (same ids: fixtures of token ids stay valid)
        from tokenizers import Tokenizer
        import shutil
        os.makedirs(tok_dir, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer, f), os.path.join(tok_dir, f))
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    else:
        # tokenizer on all training prose + a slice of the dialogs (their text is repetitive)
        tok = demo_corpus.train_tokenizer(docs["train"] + rendered[:4000], tok_dir, template)

    def enc(texts):
        return [e.ids for e in tok.encode_batch(texts)]

    docs_train = np.array([i for ids in enc([t + "\n\n" for t in docs["train"]]) for i in ids], dtype=np.uint16)
    docs_val = np.array([i for ids in enc([t + "\n\n" for t in docs["val"]]) for i in ids], dtype=np.uint16)

    def stream(texts):
        ids = enc(texts)
        starts = np.cumsum([0] + [len(x) for x in ids[:-1]])
        return np.array([i for x in ids for i in x], dtype=np.uint16), starts.astype(np.int64)

    dlg, dlg_starts = stream(rendered)
    dlg_val, dlg_val_starts = stream(rendered_val)
    held = demo_dialogs.held_out_prompts(random.Random(SEED + 2))
    for h in held:
        text = demo_corpus.render_prompt([{"role": "user", "content": h["prompt"]}],
                                         demo_dialogs.ALL_TOOLS, template)
        h["text"] = text
        h["ids"] = tok.encode(text).ids
    os.makedirs(args.build, exist_ok=True)
    np.savez_compressed(os.path.join(args.build, "data.npz"), docs_train=docs_train, docs_val=docs_val,
                        dlg=dlg, dlg_starts=dlg_starts, dlg_val=dlg_val, dlg_val_starts=dlg_val_starts)
    with open(os.path.join(args.build, "heldout.json"), "w") as fh:
        json.dump(held, fh, indent=1)
    follow = demo_dialogs.held_out_followups(random.Random(SEED + 3))
    for f in follow:
        f["text"] = demo_corpus.render_prompt(f["messages"], f["tools"], template)
        f["ids"] = tok.encode(f["text"]).ids
    with open(os.path.join(args.build, "followups.json"), "w") as fh:
        json.dump(follow, fh, indent=1)
    with open(os.path.join(args.build, "sample_dialogs.txt"), "w") as fh:
        fh.write("\n\n=====\n\n".join(rendered[:6]))
    info = {"doc_files": docs["files"], "docs_train_tokens": int(docs_train.size), "docs_val_tokens": int(docs_val.size),
            "dialogs": n_dlg, "dialog_tokens": int(dlg.size), "dialog_val_tokens": int(dlg_val.size),
            "glossary_terms": len(docs["glossary"]), "sections": len(docs["sections"]), "vocab": tok.get_vocab_size()}
    with open(os.path.join(args.build, "prepare.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(json.dumps(info))


# ----------------------------------------------------------------------------- model
def make_config(attn="sdpa", experts="eager"):
    from transformers import MiniMaxM2Config
    c = MODEL
    cfg = MiniMaxM2Config(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                          intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
                          num_attention_heads=c["num_attention_heads"], num_key_value_heads=c["num_key_value_heads"],
                          head_dim=c["head_dim"], max_position_embeddings=c["max_position_embeddings"],
                          num_local_experts=c["num_local_experts"], num_experts_per_tok=c["num_experts_per_tok"],
                          rms_norm_eps=c["rms_norm_eps"], tie_word_embeddings=False,
                          bos_token_id=TOKEN_IDS["bos"], eos_token_id=TOKEN_IDS["eos"], pad_token_id=TOKEN_IDS["pad"],
                          rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"],
                                           "partial_rotary_factor": c["rotary_dim"] / c["head_dim"]},
                          attn_implementation=attn, experts_implementation=experts)
    return cfg


class Taps:
    """Forward pre-hooks that keep the residual stream entering the given layers (EAGLE-3 taps)
    and the expert load of every MoE block (for the score-bias update)."""

    def __init__(self, model, mtp, tap_ids):
        self.tap_ids, self.saved, self.loads, self.handles = tap_ids, {}, {}, []
        layers = list(model.model.layers)
        for i in tap_ids:
            if i < len(layers):
                self.handles.append(layers[i].register_forward_pre_hook(self._pre(i)))
        blocks = [l.mlp for l in layers] + ([m.block.mlp for m in mtp.mods] if mtp is not None else [])
        self.blocks = blocks
        for b in blocks:
            self.handles.append(b.gate.register_forward_hook(self._load(b)))
        self.count = True

    def _pre(self, i):
        def hook(mod, args):
            self.saved[i] = args[0]
        return hook

    def _load(self, block):
        def hook(mod, args, out):
            if self.count:
                idx = out[2]
                c = torch.bincount(idx.reshape(-1), minlength=block.e_score_correction_bias.numel())
                self.loads[id(block)] = self.loads.get(id(block), 0) + c
        return hook

    def aux(self, final_pre_norm=None):
        return torch.cat([self.saved[i] for i in self.tap_ids], -1)

    @torch.no_grad()
    def update_bias(self, rate):
        """Auxiliary-loss-free balancing (DeepSeek-V3): raise the score bias of under-loaded
        experts, lower it for over-loaded ones."""
        for b in self.blocks:
            c = self.loads.pop(id(b), None)
            if c is None:
                continue
            c = c.float()
            b.e_score_correction_bias += rate * torch.sign(c.mean() - c)


def batch(rng, data, B, T, p_docs, device):
    docs, dlg, starts = data["docs_train"], data["dlg"], data["dlg_starts"]
    rows = []
    for _ in range(B):
        if rng.random() < p_docs:
            s = rng.randint(0, docs.size - T - 2)
            rows.append(docs[s:s + T])
        else:
            s = int(starts[rng.randint(0, starts.size - 1)])
            s = min(s, dlg.size - T - 1)
            rows.append(dlg[s:s + T])
    return torch.from_numpy(np.stack(rows).astype(np.int64)).to(device)


def lr_at(step, total, peak, warm):
    if step < warm:
        return peak * (step + 1) / warm
    f = min(1.0, (step - warm) / max(1, total - warm))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * f)))


@torch.no_grad()
def val_loss(model, data_tokens, device, T=SEQ, max_windows=64, starts=None):
    model.eval()
    tot, n = 0.0, 0
    if starts is None:
        idx = list(range(0, data_tokens.size - T - 1, T))[:max_windows]
    else:
        idx = [int(s) for s in starts if s + T + 1 < data_tokens.size][::max(1, len(starts) // max_windows)][:max_windows]
    for k in range(0, len(idx), 16):
        x = torch.from_numpy(np.stack([data_tokens[s:s + T + 1] for s in idx[k:k + 16]]).astype(np.int64)).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            lg = model(x[:, :-1]).logits.float()
        tot += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
        n += x[:, 1:].numel()
    model.train()
    return tot / max(n, 1)


def train(args):
    from transformers import MiniMaxM2ForCausalLM
    import demo_heads
    import demo_export
    t_start = time.time()
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    rng = random.Random(SEED)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = dev.type == "cuda"
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = True
    data = dict(np.load(os.path.join(args.build, "data.npz")))
    held = json.load(open(os.path.join(args.build, "heldout.json")))
    if args.held_limit:  # smoke tests on a CPU only
        held = held[:args.held_limit // 2] + held[-(args.held_limit - args.held_limit // 2):]
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "train.log"), "w")

    def say(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()

    def build(experts):
        torch.manual_seed(SEED)
        cfg = make_config(experts=experts)
        model = MiniMaxM2ForCausalLM(cfg).to(dev)
        mtp = demo_heads.MTPHeads(cfg, MODEL["num_mtp_modules"]).to(dev)
        mtp.apply(model._init_weights)
        return cfg, model, mtp

    experts = "grouped_mm" if on_gpu else "eager"
    if on_gpu:  # grouped_mm needs a recent torch on the GPU; check it once, else loop over experts
        try:
            cfg, model, mtp = build(experts)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(torch.arange(64, device=dev).view(2, 32)).logits.float().sum().backward()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (any failure of the fast path)
            say(f"grouped_mm experts failed ({type(e).__name__}: {e}); using eager experts")
            experts = "eager"
    cfg, model, mtp = build(experts)
    say(f"experts implementation: {experts}")
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    say(f"device {dev} ({torch.cuda.get_device_name(0) if on_gpu else 'cpu'}), torch {torch.__version__}, "
        f"params main {n_main / 1e6:.2f} M, MTP {n_mtp / 1e6:.2f} M")
    taps = Taps(model, mtp, EAGLE["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    taps.count = True
    params = list(model.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=on_gpu)
    B, T = args.batch, args.seq
    total = args.steps or 10 ** 9
    curve, t0, step = [], time.time(), 0
    model.train()
    while step < total:
        lr = lr_at(step, total if args.steps or step >= 30 else 10 ** 9, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(rng, data, B, T + 1, args.p_docs, dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=on_gpu):
            out = model.model(x[:, :-1])
            h0 = out.last_hidden_state
            logits = model.lm_head(h0).float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            pos = torch.arange(T, device=dev)[None]
            pos_emb = model.model.rotary_emb(h0, pos)
            mtp_losses = mtp.losses(model, x[:, :-1], h0.detach(), pos_emb)
        (loss + sum(mtp_losses)).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        taps.update_bias(args.bias_rate)
        step += 1
        if step == 10 and on_gpu:
            torch.cuda.synchronize()
        if step == 10:
            t10 = time.time()
        if step == 30 and not args.steps:
            if on_gpu:
                torch.cuda.synchronize()
            # steps 10-30: the first steps include kernel selection and allocator warm-up (the
            # shipped run measured over steps 0-30, 191 ms/step, and then ran at ~115 ms/step)
            per = (time.time() - t10) / 20
            total = max(100, int(30 + (args.budget_s - (time.time() - t0)) / per))
            say(f"speed: {per * 1000:.1f} ms/step over steps 10-30 -> {total} steps for {args.budget_s} s")
        if step % args.log_every == 0 or step == total:
            curve.append([step, loss.item()] + [l.item() for l in mtp_losses])
            say(f"step {step}/{total} lr {lr:.2e} loss {loss.item():.3f} mtp "
                + " ".join(f"{l.item():.3f}" for l in mtp_losses) + f" {time.time() - t0:.0f}s")
    train_s = time.time() - t0
    model.eval()
    metrics = {"steps": step, "batch": B, "seq": T, "train_seconds_main": round(train_s, 1), "lr": args.lr,
               "seed": SEED, "tokens_seen": step * B * T, "params_main": n_main, "params_mtp": n_mtp,
               "loss_curve": curve, "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
               "torch": torch.__version__, "p_docs": args.p_docs, "budget_s": args.budget_s,
               "eagle_budget_s": args.eagle_budget_s, "model": MODEL}
    vd = val_loss(model, data["docs_val"], dev)
    vg = val_loss(model, data["dlg_val"], dev, starts=data["dlg_val_starts"])
    metrics["val"] = {"docs_loss": vd, "docs_ppl": math.exp(vd), "dialog_loss": vg, "dialog_ppl": math.exp(vg)}
    say("validation", json.dumps(metrics["val"]))
    tensors = demo_export.model_to_hub(model, mtp)
    demo_export.write_sharded(args.out, tensors, shards=2)

    import shutil
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.build, "tokenizer", f), os.path.join(args.out, f))
    pj = os.path.join(args.build, "prepare.json")
    metrics["prepare"] = json.load(open(pj)) if os.path.exists(pj) else None

    def dump():
        with open(os.path.join(args.out, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=1)

    dump()
    # ---- EAGLE-3 on the frozen target's own distributions; each later phase is kept apart so
    # that a failure in one still leaves the model and the other results
    import traceback
    import train_eagle
    from safetensors.torch import save_file
    taps.count = False
    eagle = None
    try:
        eagle, metrics["eagle_train"] = train_eagle.train_eagle(args, model, taps, data, rng, dev, say)
        save_file({n: (t.detach().to(torch.bfloat16) if t.is_floating_point() else t.detach()).contiguous().cpu()
                   for n, t in eagle.hub_state_dict().items()}, os.path.join(args.out, "eagle3.safetensors"))
    except Exception:  # noqa: BLE001
        metrics["eagle_error"] = traceback.format_exc()
        say(metrics["eagle_error"])
    dump()
    try:
        metrics["tool_eval"], metrics["samples"] = train_eagle.eval_prompts(
            model, held, os.path.join(args.build, "tokenizer", "tokenizer.json"), dev, say, max_new=args.eval_max_new)
    except Exception:  # noqa: BLE001
        metrics["tool_eval_error"] = traceback.format_exc()
        say(metrics["tool_eval_error"])
    dump()
    try:
        follow = json.load(open(os.path.join(args.build, "followups.json")))
        metrics["tool_result_eval"], metrics["followup_samples"] = train_eagle.eval_followups(
            model, follow[:args.held_limit or None], os.path.join(args.build, "tokenizer", "tokenizer.json"), dev, say)
    except Exception:  # noqa: BLE001
        metrics["tool_result_eval_error"] = traceback.format_exc()
        say(metrics["tool_result_eval_error"])
    dump()
    try:
        metrics["acceptance"] = train_eagle.measure_acceptance(model, mtp, eagle, taps, data, dev, say,
                                                               n=args.eval_seqs)
    except Exception:  # noqa: BLE001
        metrics["acceptance_error"] = traceback.format_exc()
        say(metrics["acceptance_error"])
    metrics["total_seconds"] = round(time.time() - t_start, 1)
    dump()
    say(f"done in {metrics['total_seconds']} s")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--docs", required=True, help="folder where python3.11-doc's .deb was unpacked (dpkg -x)")
    p.add_argument("--build", default=os.path.join(ROOT, ".demo-build"))
    p.add_argument("--template", default=TEMPLATE)
    p.add_argument("--dialogs", type=int, default=40000)
    p.add_argument("--tokenizer", help="folder with tokenizer.json + tokenizer_config.json to keep instead of training one")
    t = sub.add_parser("train")
    t.add_argument("--build", default=os.path.join(ROOT, ".demo-build"))
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=0, help="0: pick from the measured speed and --budget-s")
    t.add_argument("--budget-s", type=float, default=92)
    t.add_argument("--eagle-steps", type=int, default=0)
    t.add_argument("--eagle-budget-s", type=float, default=12)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seq", type=int, default=SEQ)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--warmup", type=int, default=150)
    t.add_argument("--p-docs", type=float, default=0.25)
    t.add_argument("--bias-rate", type=float, default=1e-3)
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--eval-seqs", type=int, default=48)
    t.add_argument("--eval-max-new", type=int, default=200)
    t.add_argument("--held-limit", type=int, default=0, help="evaluate only this many held-out prompts")
    args = ap.parse_args()
    {"prepare": prepare, "train": train}[args.cmd](args)


if __name__ == "__main__":
    main()
