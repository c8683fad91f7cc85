#!/usr/bin/env python3
"""Golden fixtures for the MiniMax-M2 model: tiny random checkpoints in the hub's own layout
plus reference outputs from Hugging Face transformers' own MiniMaxM2ForCausalLM.

For each fixture this writes tests/fixtures/golden/<name>/:
  config.json, generation_config.json        hub-style (model_type minimax_m2)
  model-0000k-of-0000n.safetensors + index   hub tensor names (block_sparse_moe.experts.{e}.w1/w2/w3)
  golden.json                                prompt ids, reference greedy ids, margins, versions
  ref_logits.npy   float32 [N, vocab]        row k = logits from which generated token k was chosen
  ref_full_logits.npy float32 [P+N-1, vocab] one teacher-forced forward over prompt + generated[:-1]

The reference runs HF's model code in float32. FP8 fixtures are loaded into HF with their
dequantised weights (fp8 * weight_scale_inv per block, computed in float32) through HF's own
loader (from_pretrained on a dequantised hub-named copy), so HF's checkpoint conversion
mapping (w1/w3 -> mlp.experts.gate_up_proj, w2 -> down_proj, block_sparse_moe -> mlp) is the
one exercised. Usage: python3 scripts/make_golden.py [--out tests/fixtures/golden] [--check]
(--check regenerates elsewhere and compares with the committed fixtures, e.g. on another machine).
--family qwen3_moe makes the Qwen3-MoE fixtures instead (scripts/golden_qwen3_moe.py: the same
files, from transformers' Qwen3MoeForCausalLM; --only and --check do not apply there).
--family deepseek_v3 makes the DeepSeek-V3 / Kimi-K2.5 fixtures (scripts/golden_deepseek_v3.py,
transformers' DeepseekV3ForCausalLM; --only names fixtures there, --check does not apply).
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import MiniMaxM2ForCausalLM

FIXTURES = {
    # bf16 checkpoint, no quantisation.
    "tiny_bf16": dict(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, rotary_dim=16,
                      inter=64, experts=8, top_k=2, vocab=1000, fp8=None, seed=11, mtp_tensors=True),
    # FP8 with 128x128 blocks; every FP8 dim is a multiple of 128.
    "tiny_fp8_b128": dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, rotary_dim=32,
                          inter=128, experts=8, top_k=2, vocab=1000, fp8=(128, 128), seed=12),
    # FP8 with 128x128 blocks; hidden (192), head widths (192, 96) and expert size (160)
    # are not multiples of 128, so edge blocks are partial and scales are ceil-divided.
    "tiny_fp8_partial": dict(hidden=192, layers=2, heads=4, kv_heads=2, head_dim=48, rotary_dim=24,
                             inter=160, experts=8, top_k=2, vocab=1000, fp8=(128, 128), seed=13),
    # Found by scripts/sweep_vs_hf.py's edge cases: non-square FP8 blocks [128, 48] (partial
    # blocks on both axes; TP=4 re-grids 72/4 = 18-wide expert slices), MQA (8 query heads on
    # one KV head), head_dim 80 with quarter RoPE given only in rope_parameters (with its own
    # rope_theta), F16 dense tensors, odd vocab.
    "tiny_fp8_nonsquare": dict(hidden=160, layers=2, heads=8, kv_heads=1, head_dim=80, rotary_dim=20,
                               inter=72, experts=6, top_k=3, vocab=777, fp8=(128, 48), seed=21,
                               dtype="float16", rope="rope_parameters", theta=10000.0),
    # MHA, full RoPE with no rotary/theta keys (HF defaults), F32/F16/BF16 tensors mixed, tied
    # embeddings (no lm_head tensor), no routing bias, top-1 routing, eps 1e-5, 3 layers,
    # a 60-token prompt.
    "tiny_mixed_tied": dict(hidden=96, layers=3, heads=4, kv_heads=4, head_dim=24, rotary_dim=24,
                            inter=40, experts=4, top_k=1, vocab=513, fp8=None, seed=22, dtype="mixed",
                            rope="none", tie=True, routing_bias=False, eps=1e-5, prompt_len=60,
                            embed_std=0.05),
}
PROMPT_LEN = 7
NEW_TOKENS = 8


def hub_config(f):
    cfg = {
        "architectures": ["MiniMaxM2ForCausalLM"],
        "model_type": "minimax_m2",
        "hidden_size": f["hidden"],
        "num_hidden_layers": f["layers"],
        "num_attention_heads": f["heads"],
        "num_key_value_heads": f["kv_heads"],
        "head_dim": f["head_dim"],
        "max_position_embeddings": 4096,
        "intermediate_size": f["inter"],
        "shared_intermediate_size": 0,
        "num_local_experts": f["experts"],
        "num_experts_per_tok": f["top_k"],
        "scoring_func": "sigmoid",
        "use_routing_bias": f.get("routing_bias", True),
        "use_qk_norm": True,
        "qk_norm_type": "per_layer",
        "hidden_act": "silu",
        "rms_norm_eps": f.get("eps", 1e-06),
        "attn_type_list": [1] * f["layers"],
        "vocab_size": f["vocab"],
        "tie_word_embeddings": f.get("tie", False),
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": {"mixed": "bfloat16"}.get(f.get("dtype", "bfloat16"), f.get("dtype", "bfloat16")),
        "use_mtp": True,
        "num_mtp_modules": 1,
        "mtp_transformer_layers": 1,
        "use_cache": True,
    }
    rope = f.get("rope", "both")
    if rope == "both":
        # vLLM/SGLang read rotary_dim; HF v5 reads partial_rotary_factor (top level or in
        # rope_parameters). Write both so every engine applies the same partial RoPE.
        cfg["rotary_dim"] = f["rotary_dim"]
        cfg["partial_rotary_factor"] = f["rotary_dim"] / f["head_dim"]
        cfg["rope_theta"] = f.get("theta", 5000000.0)
    elif rope == "rope_parameters":
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": f.get("theta", 5000000.0),
                                  "partial_rotary_factor": f["rotary_dim"] / f["head_dim"]}
    else:
        assert rope == "none" and f["rotary_dim"] == f["head_dim"] and "theta" not in f
    if f["fp8"]:
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "float8_e4m3fn",
            "quant_method": "fp8",
            "weight_block_size": list(f["fp8"]),
            "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"],
        }
    return cfg


def quantize_fp8(w, block):
    """Block-wise FP8 (e4m3fn) with float32 multipliers `weight_scale_inv` of shape
    [ceil(out/bo), ceil(in/bi)]. Returns (fp8 tensor, scales, dequantised float32)."""
    bo, bi = block
    out_f, in_f = w.shape
    so, si = math.ceil(out_f / bo), math.ceil(in_f / bi)
    scales = torch.empty(so, si, dtype=torch.float32)
    for a in range(so):
        for b in range(si):
            blk = w[a * bo:(a + 1) * bo, b * bi:(b + 1) * bi]
            scales[a, b] = max(blk.abs().max().item(), 1e-12) / 448.0
    s_full = scales.repeat_interleave(bo, 0)[:out_f].repeat_interleave(bi, 1)[:, :in_f]
    q = (w / s_full).clamp(-448, 448).to(torch.float8_e4m3fn)
    deq = q.to(torch.float32) * s_full  # what the model must compute with
    return q, scales, deq


def make_weights(f):
    """Hub-named tensors (as stored) and their float32 values (as the model must see them)."""
    g = torch.Generator().manual_seed(f["seed"])

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    H, D, I, E = f["hidden"], f["head_dim"], f["inter"], f["experts"]
    Hq, Hkv, V = f["heads"] * D, f["kv_heads"] * D, f["vocab"]
    stored, values = {}, {}

    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    pick = {"bfloat16": lambda: torch.bfloat16, "float16": lambda: torch.float16,
            "float32": lambda: torch.float32,
            "mixed": lambda: dtypes[int(torch.randint(0, 3, (1,), generator=g))]}[f.get("dtype", "bfloat16")]

    def put_bf16(name, t):  # the fixture's dense dtype (bf16 unless the fixture says otherwise)
        b = t.to(pick())
        stored[name] = b
        values[name] = b.to(torch.float32)

    def put_f32(name, t):
        stored[name] = t.contiguous()
        values[name] = t.contiguous()

    def put_linear(name, t):  # name ends with .weight
        if f["fp8"]:
            q, s, deq = quantize_fp8(t, f["fp8"])
            stored[name] = q
            stored[name + "_scale_inv"] = s
            values[name] = deq
        else:
            put_bf16(name, t)

    # Tied fixtures use a small embedding so the residual stream is not dominated by the
    # token's own embedding (else the tied lm_head just repeats the last token).
    put_bf16("model.embed_tokens.weight", randn(V, H, std=f.get("embed_std", 1.0)))
    for l in range(f["layers"]):
        p = f"model.layers.{l}."
        put_bf16(p + "input_layernorm.weight", 1.0 + 0.1 * randn(H))
        put_bf16(p + "post_attention_layernorm.weight", 1.0 + 0.1 * randn(H))
        put_linear(p + "self_attn.q_proj.weight", randn(Hq, H, std=H ** -0.5))
        put_linear(p + "self_attn.k_proj.weight", randn(Hkv, H, std=H ** -0.5))
        put_linear(p + "self_attn.v_proj.weight", randn(Hkv, H, std=H ** -0.5))
        put_linear(p + "self_attn.o_proj.weight", randn(H, Hq, std=Hq ** -0.5))
        put_bf16(p + "self_attn.q_norm.weight", 1.0 + 0.1 * randn(Hq))
        put_bf16(p + "self_attn.k_norm.weight", 1.0 + 0.1 * randn(Hkv))
        # Router in fp32 as in the real checkpoint; logits of O(1) so routing is non-trivial.
        put_f32(p + "block_sparse_moe.gate.weight", randn(E, H, std=2.0 * H ** -0.5))
        if f.get("routing_bias", True):
            put_f32(p + "block_sparse_moe.e_score_correction_bias", 0.1 * randn(E))
        for e in range(E):
            q = p + f"block_sparse_moe.experts.{e}."
            put_linear(q + "w1.weight", randn(I, H, std=H ** -0.5))
            put_linear(q + "w3.weight", randn(I, H, std=H ** -0.5))
            put_linear(q + "w2.weight", randn(H, I, std=I ** -0.5))
    put_bf16("model.norm.weight", 1.0 + 0.1 * randn(H))
    if not f.get("tie"):
        put_bf16("lm_head.weight", randn(V, H, std=2.0 * H ** -0.5))
    return stored, values


def write_sharded(directory, tensors, shards=2):
    """Hub layout: model-0000k-of-0000n.safetensors + model.safetensors.index.json."""
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[k * per:(k + 1) * per]}
        save_file(part, os.path.join(directory, fname), metadata={"format": "pt"})
        for n, t in part.items():
            weight_map[n] = fname
            total += t.numel() * t.element_size()
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)


def router_margin(model):
    """Smallest gap between the k-th and (k+1)-th biased router score seen, via hooks."""
    margins = []

    def hook(mod, args, _out):
        hs, bias = args[0], args[1]
        logits = torch.nn.functional.linear(hs.reshape(-1, mod.hidden_dim).to(mod.weight.dtype), mod.weight)
        s = torch.sigmoid(logits.float()) + bias
        top = torch.topk(s, mod.top_k + 1, dim=-1).values
        margins.append((top[:, mod.top_k - 1] - top[:, mod.top_k]).min().item())

    handles = [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers]
    return margins, handles


def build_fixture(name, f, out_dir, ref_dir):
    d = os.path.join(out_dir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    cfg = hub_config(f)
    stored, values = make_weights(f)
    main_names = set(values)
    if f.get("mtp_tensors"):
        # Stand-ins for MTP module 0 (model.layers.{L}.*): a loader must recognise and skip them.
        g = torch.Generator().manual_seed(f["seed"] + 7)
        L, H = f["layers"], f["hidden"]
        stored[f"model.layers.{L}.enorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        stored[f"model.layers.{L}.eh_proj.weight"] = torch.randn(H, 2 * H, generator=g).to(torch.bfloat16)
        stored[f"model.layers.{L}.input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, fh, indent=2)
    write_sharded(d, stored)

    # HF reference: a dequantised float32 copy in hub naming, loaded by HF's own loader.
    ref_cfg = dict(cfg)
    ref_cfg.pop("quantization_config", None)
    # HF 5.x turns use_mtp into MTP-assisted generation; the reference is plain greedy decoding
    # of the main model (MTP tensors are not part of it), so drop the MTP keys there.
    for key in ("use_mtp", "num_mtp_modules", "mtp_transformer_layers"):
        ref_cfg.pop(key, None)
    ref_cfg["torch_dtype"] = "float32"
    with open(os.path.join(ref_dir, "config.json"), "w") as fh:
        json.dump(ref_cfg, fh, indent=2)
    save_file({k: v.contiguous() for k, v in values.items() if k in main_names},
              os.path.join(ref_dir, "model.safetensors"))
    model, info = MiniMaxM2ForCausalLM.from_pretrained(
        ref_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model.eval()
    # Without use_routing_bias there is no bias tensor: HF (which has no such option) keeps
    # its zero-initialised buffer, i.e. the same selection.
    allowed = set() if f.get("routing_bias", True) else {
        f"model.layers.{l}.mlp.e_score_correction_bias" for l in range(f["layers"])}
    info["missing_keys"] = set(info["missing_keys"]) - allowed
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, f"{name}: HF loading problems {bad}"
    for layer in model.model.layers:
        if not f.get("routing_bias", True):
            assert not layer.mlp.e_score_correction_bias.any()
    assert model.config.rope_parameters.get("partial_rotary_factor", 1.0) == f["rotary_dim"] / f["head_dim"]
    assert model.config.rope_parameters["rope_theta"] == f.get("theta", 5000000.0)
    if f.get("tie"):
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # Check that HF's conversion put hub tensors where we expect (w1|w3 -> gate_up_proj).
    ex = model.model.layers[0].mlp.experts
    w1 = values["model.layers.0.block_sparse_moe.experts.3.w1.weight"]
    w3 = values["model.layers.0.block_sparse_moe.experts.3.w3.weight"]
    assert torch.equal(ex.gate_up_proj[3].detach(), torch.cat([w1, w3], 0))
    assert torch.equal(ex.down_proj[3].detach(), values["model.layers.0.block_sparse_moe.experts.3.w2.weight"])
    if f.get("routing_bias", True):
        assert torch.equal(model.model.layers[1].mlp.e_score_correction_bias,
                           values["model.layers.1.block_sparse_moe.e_score_correction_bias"])

    g = torch.Generator().manual_seed(f["seed"] + 1000)
    prompt_len = f.get("prompt_len", PROMPT_LEN)
    prompt = torch.randint(3, f["vocab"], (1, prompt_len), generator=g)
    margins, handles = router_margin(model)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    for h in handles:
        h.remove()
    gen = out.sequences[0, prompt_len:].tolist()
    assert len(gen) == NEW_TOKENS
    logits = torch.stack([x[0] for x in out.logits]).to(torch.float32).numpy()
    assert [int(np.argmax(r)) for r in logits] == gen
    top2 = np.sort(logits, axis=1)[:, -2:]
    argmax_margin = float((top2[:, 1] - top2[:, 0]).min())
    with torch.no_grad():
        full = model(out.sequences[:, :-1]).logits[0].to(torch.float32).numpy()
    np.save(os.path.join(d, "ref_logits.npy"), logits.astype(np.float32))
    np.save(os.path.join(d, "ref_full_logits.npy"), full.astype(np.float32))
    golden = {
        "prompt_ids": prompt[0].tolist(),
        "generated_ids": gen,
        "reference": f"transformers {transformers.__version__} MiniMaxM2ForCausalLM, float32, eager "
                     f"attention, torch {torch.__version__}",
        "fp8_block": list(f["fp8"]) if f["fp8"] else None,
        "min_router_margin": min(margins),
        "min_argmax_margin": argmax_margin,
    }
    with open(os.path.join(d, "golden.json"), "w") as fh:
        json.dump(golden, fh, indent=2)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{name}: generated {gen}; router margin {min(margins):.3g}; argmax margin {argmax_margin:.3g}; "
          f"{size / 1e6:.2f} MB")
    if min(margins) < 1e-4 or argmax_margin < 1e-3:
        print(f"WARNING {name}: a near-tie could make the comparison fragile; change the seed", file=sys.stderr)
        return False
    return True


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "golden"))
    ap.add_argument("--only", nargs="*", help="fixture names")
    ap.add_argument("--family", default="minimax_m2", choices=["minimax_m2", "qwen3_moe", "deepseek_v3"],
                    help="which architecture's fixtures to make")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory and compare with the committed fixtures "
                         "(checkpoints byte-identical, reference logits within 1e-5 relative, same ids)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.family == "qwen3_moe":
        if args.only or args.check:
            ap.error("--only / --check are not implemented for --family qwen3_moe")
        import runpy
        sys.argv = [os.path.join(here, "golden_qwen3_moe.py"), args.out]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return 0
    if args.family == "deepseek_v3":
        if args.check:
            ap.error("--check is not implemented for --family deepseek_v3")
        import runpy
        sys.argv = [os.path.join(here, "golden_deepseek_v3.py"), args.out] + list(args.only or [])
        runpy.run_path(sys.argv[0], run_name="__main__")
        return 0
    ok = True
    fixtures, build = FIXTURES, build_fixture
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fixtures") if args.check else args.out
        os.makedirs(out, exist_ok=True)
        for name, f in fixtures.items():
            if args.only and name not in args.only:
                continue
            ref_tmp = os.path.join(tmp, "hf", name)
            os.makedirs(ref_tmp)
            ok &= build(name, f, out, ref_tmp)
            if args.check:
                ok &= compare_fixture(os.path.join(out, name), os.path.join(args.out, name))
    return 0 if ok else 1


def compare_fixture(new, old):
    """--check: the committed fixture must be reproducible on this machine."""
    ok = True
    for fname in sorted(os.listdir(new)):
        a, b = os.path.join(new, fname), os.path.join(old, fname)
        if not os.path.exists(b):
            print(f"CHECK {old}: {fname} missing")
            ok = False
        elif fname.endswith(".npy"):
            x, y = np.load(a), np.load(b)
            err = float(np.abs(x - y).max() / np.abs(y).max())
            print(f"CHECK {os.path.basename(old)}/{fname}: max|new-old|/max|old| = {err:.3g}")
            ok &= err <= 1e-5
        elif fname == "golden.json":
            ga, gb = json.load(open(a)), json.load(open(b))
            same = ga["prompt_ids"] == gb["prompt_ids"] and ga["generated_ids"] == gb["generated_ids"]
            print(f"CHECK {os.path.basename(old)}/golden.json: ids {'identical' if same else 'DIFFER'} "
                  f"({ga['reference']})")
            ok &= same
        elif open(a, "rb").read() != open(b, "rb").read():
            print(f"CHECK {os.path.basename(old)}/{fname}: DIFFERS")
            ok = False
    return ok


if __name__ == "__main__":
    sys.exit(main())
