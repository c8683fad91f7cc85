#!/usr/bin/env python3
"""Routing margins of a golden fixture's reference run (DeepSeek-V3 family, bf16 hub layout):
python3 scripts/golden_route_margins.py FIXTURE_DIR [...]  (on a machine with torch + transformers)

One float32 HF forward over prompt + generated[:-1] (the teacher-forced steps of the golden tests),
hooks on every MoE layer's router input; per token and layer, with s = sigmoid(logits) +
e_score_correction_bias as HF's noaux_tc routing selects:
  group margin  = (topk_group-th best group score) - (next group's), group score = sum of its
                  two best s (only when n_group > topk_group)
  expert margin = (top_k-th best s among the kept groups) - (next one's)
The smaller of the two is the token's routing margin at that layer: how far the reference is from
choosing other experts. Per step (step 0: every prompt token; step k: token len(prompt) + k - 1) the
minimum over the step's tokens and layers is written to FIXTURE_DIR/route_margins.json, which
tests/cuda/test_cuda_golden.cpp reads: a bf16-sized activation error can flip a choice whose margin
is below about 1e-2 and then change the logits by far more than a bf16 error (other experts).
"""
import json
import os
import sys

import numpy as np
import torch
import transformers as T


def margins(fixture):
    g = json.load(open(os.path.join(fixture, "golden.json")))
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    model = T.AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ng, tg, k = cfg.get("n_group", 1) or 1, cfg.get("topk_group", 1) or 1, cfg["num_experts_per_tok"]
    per_layer = []

    def hook(mod, inputs):
        x = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
        logits = x @ mod.weight.float().T
        s = torch.sigmoid(logits) + mod.e_score_correction_bias.float()
        E = s.shape[-1]
        m = torch.full((s.shape[0],), float("inf"))
        keep = torch.ones_like(s, dtype=torch.bool)
        if ng > tg:
            gs = s.view(-1, ng, E // ng).topk(2, dim=-1).values.sum(-1)  # [T, ng]
            srt = gs.sort(dim=-1, descending=True).values
            m = torch.minimum(m, srt[:, tg - 1] - srt[:, tg])
            gidx = gs.topk(tg, dim=-1).indices
            gmask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gidx, True)
            keep = gmask.unsqueeze(-1).expand(-1, ng, E // ng).reshape(-1, E)
        sk = s.masked_fill(~keep, float("-inf")).sort(dim=-1, descending=True).values
        m = torch.minimum(m, sk[:, k - 1] - sk[:, k])
        per_layer.append(m.numpy())

    handles = [layer.mlp.gate.register_forward_pre_hook(hook) for layer in model.model.layers
               if hasattr(layer.mlp, "gate")]
    ids = g["prompt_ids"] + g["generated_ids"][:-1]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    tok = np.min(np.stack(per_layer), axis=0)  # [positions]
    P = len(g["prompt_ids"])
    steps = [float(tok[:P].min())] + [float(tok[P + i - 1]) for i in range(1, len(g["generated_ids"]))]
    return steps


def main():
    for d in sys.argv[1:]:
        steps = margins(d)
        out = {"route_margin_per_step": steps, "transformers": T.__version__, "torch": torch.__version__}
        with open(os.path.join(d, "route_margins.json"), "w") as fh:
            json.dump(out, fh)
        print(os.path.basename(d.rstrip("/")), " ".join(f"{m:.3g}" for m in steps))


if __name__ == "__main__":
    main()
