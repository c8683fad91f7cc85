#!/usr/bin/env python3
"""Step 3 of the demo model (see scripts/train_demo.py): from a training run's output folder
writes the shipped model folder and the golden fixtures.

  assets/demo-model/            bf16 checkpoint (hub names, MTP modules at model.layers.6-8),
                                config.json, tokenizer, model card README.md, loss.png
  assets/demo-model/fp8/        the same weights FP8 block-quantised (128x128, e4m3fn,
                                weight_scale_inv), quantization_config in config.json
  assets/demo-model/eagle3/     the EAGLE-3 draft head (SpecForge / vLLM LlamaForCausalLMEagle3)
  tests/fixtures/golden/demo_{bf16,fp8}/   HF transformers float32 reference logits

Usage: python3 scripts/demo_ship.py --run RUN_OUT --build .demo-build
The references run HF's MiniMaxM2ForCausalLM in float32 (eager attention) on the shipped
weights (FP8 dequantised blockwise in float32), as scripts/make_golden.py does.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_export  # noqa: E402
from train_demo import EAGLE, MODEL  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW_TOKENS = 8
GOLDEN_PROMPTS = [
    # (name, messages, tools): rendered with the chat template + generation prompt
    ("plain", [{"role": "user", "content": "What is a list in Python?"}], False),
    ("tool", [{"role": "user", "content": "What time is it in Tokyo?"}], True),
    ("system", [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Hello!"}], False),
]


def load_run(run):
    idx = json.load(open(os.path.join(run, "model.safetensors.index.json")))
    tensors = {}
    for f in sorted(set(idx["weight_map"].values())):
        tensors.update(load_file(os.path.join(run, f)))
    return tensors


def tok_ids(tok_dir):
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    return t, {"bos": t.token_to_id("]~!b["), "eos": t.token_to_id("[e~["), "pad": t.token_to_id("]!p~[")}


def write_folder(d, tensors, cfg, tok_dir, shards, ids):
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    files = demo_export.write_sharded(d, tensors, shards)
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"],
                   "do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 40}, fh, indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(d, f))
    return files


def dequant(tensors, block):
    """FP8 tensors + weight_scale_inv -> float32 values the model must compute with."""
    out = {}
    for n, t in tensors.items():
        if n.endswith("weight_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            s = tensors[n + "_scale_inv"]
            full = s.repeat_interleave(block[0], 0)[:t.shape[0]].repeat_interleave(block[1], 1)[:, :t.shape[1]]
            out[n] = t.float() * full
        else:
            out[n] = t.float()
    return out


def reference(values, cfg, prompts, out_dir):
    """HF float32 greedy decode + teacher-forced logits for each prompt; writes golden.json and
    ref_logits_{k}.npy [NEW_TOKENS, V]."""
    import transformers
    from transformers import MiniMaxM2ForCausalLM
    L = cfg["num_hidden_layers"]
    main = {n: v.contiguous() for n, v in values.items()
            if not (n.startswith("model.layers.") and int(n.split(".")[2]) >= L)}
    with tempfile.TemporaryDirectory() as tmp:
        rc = {k: v for k, v in cfg.items() if k not in ("quantization_config", "use_mtp", "num_mtp_modules",
                                                      "mtp_transformer_layers")}
        rc["torch_dtype"] = "float32"
        json.dump(rc, open(os.path.join(tmp, "config.json"), "w"))
        save_file(main, os.path.join(tmp, "model.safetensors"))
        model, info = MiniMaxM2ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager",
                                                           output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, bad
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = cfg["pad_token_id"]
    os.makedirs(out_dir, exist_ok=True)
    cases = []
    for k, (name, ids) in enumerate(prompts):
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
            gen = out.sequences[0, len(ids):].tolist()
            logits = torch.stack([z[0] for z in out.logits]).float().numpy()
            assert [int(np.argmax(r)) for r in logits] == gen
            top2 = np.sort(logits, axis=1)[:, -2:]
            np.save(os.path.join(out_dir, f"ref_logits_{k}.npy"), logits.astype(np.float32))
        cases.append({"name": name, "prompt_ids": ids, "generated_ids": gen,
                      "min_argmax_margin": float((top2[:, 1] - top2[:, 0]).min())})
    golden = {"cases": cases, "new_tokens": NEW_TOKENS,
              "reference": f"transformers {transformers.__version__} MiniMaxM2ForCausalLM, float32, eager "
                           f"attention, torch {torch.__version__}",
              "fp8_block": cfg.get("quantization_config", {}).get("weight_block_size")}
    json.dump(golden, open(os.path.join(out_dir, "golden.json"), "w"), indent=1)
    return golden


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="output folder of train_demo.py train")
    ap.add_argument("--build", default=os.path.join(ROOT, ".demo-build"))
    ap.add_argument("--dest", default=os.path.join(ROOT, "assets", "demo-model"))
    ap.add_argument("--golden", default=os.path.join(ROOT, "tests", "fixtures", "golden"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    tok_dir = os.path.join(args.build, "tokenizer")
    tok, ids = tok_ids(tok_dir)
    tensors = load_run(args.run)
    cfg = demo_export.hub_config(MODEL, ids)
    write_folder(args.dest, tensors, cfg, tok_dir, 2, ids)
    block = (128, 128)
    fp8 = demo_export.to_fp8(tensors, block)
    cfg8 = demo_export.hub_config(MODEL, ids, fp8_block=block)
    write_folder(os.path.join(args.dest, "fp8"), fp8, cfg8, tok_dir, 1, ids)
    ed = os.path.join(args.dest, "eagle3")
    os.makedirs(ed, exist_ok=True)
    shutil.copy(os.path.join(args.run, "eagle3.safetensors"), os.path.join(ed, "model.safetensors"))
    with open(os.path.join(ed, "config.json"), "w") as fh:
        json.dump(dict(EAGLE, bos_token_id=ids["bos"], eos_token_id=ids["eos"]), fh, indent=2)

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import demo_corpus
    import demo_dialogs
    template = json.load(open(os.path.join(tok_dir, "tokenizer_config.json")))["chat_template"]
    prompts = []
    for name, msgs, tools in GOLDEN_PROMPTS:
        text = demo_corpus.render_prompt(msgs, demo_dialogs.ALL_TOOLS if tools else None, template)
        prompts.append((name, tok.encode(text).ids))
    g16 = reference({n: t.float() for n, t in tensors.items()}, cfg, prompts, os.path.join(args.golden, "demo_bf16"))
    g8 = reference(dequant(fp8, block), cfg8, prompts, os.path.join(args.golden, "demo_fp8"))
    for name, g in (("bf16", g16), ("fp8", g8)):
        for c in g["cases"]:
            print(f"golden {name}/{c['name']}: {len(c['prompt_ids'])} prompt tokens -> {c['generated_ids']} "
                  f"(min argmax margin {c['min_argmax_margin']:.3g})")
    import demo_card
    demo_card.write_card(args.dest, json.load(open(os.path.join(args.run, "metrics.json"))),
                         json.load(open(os.path.join(args.build, "prepare.json"))), g16, g8)


if __name__ == "__main__":
    main()
