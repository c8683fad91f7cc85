#!/usr/bin/env python3
"""Golden fixtures for the DeepSeek-V3 family (tests/fixtures/golden/dsv3_tiny_*, kimi_tiny_*):
python3 scripts/golden_deepseek_v3.py OUT_DIR [NAME ...] (or make_golden.py --family deepseek_v3
[--out OUT_DIR] [--only NAME ...]); existing fixture folders of those names in OUT_DIR are replaced.

Per fixture: HF's own seeded init of DeepseekV3ForCausalLM (initializer_range 0.1; norm weights
1 + 0.1 N(0,1); e_score_correction_bias 0.05 N(0,1), kept positive-safe: sigmoid scores are in
(0, 1) and the bias is small) -> hub-named tensors (HF's fused experts split back into
mlp.experts.{e}.gate_proj/up_proj/down_proj; router mlp.gate.weight + mlp.gate.e_score_correction_bias
(F32); shared experts mlp.shared_experts.*; MLA self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj,
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}); bf16, or FP8 e4m3 with f32 weight_scale_inv
per 128x128 block as DeepSeek ships it (every linear of the layers; router, norms, embeddings,
lm_head unquantised) -> transformers reloads a dequantised float32 hub-named copy (its own
checkpoint conversion) in float32 with eager attention -> greedy generation: golden.json (prompt,
generated ids), ref_logits.npy [8, V], ref_full_logits.npy (one forward over prompt +
generated[:-1]).

INT4 fixtures (dsv3_tiny_int4) store the routed experts (mlp.experts.*) as compressed-tensors
`pack-quantized` W4A16, as Kimi-K2.5 ships them: weight_packed int32 [out, in/8] (element 8j+i in
bits [4i, 4i+3] of word j, nibble = q + 8, q in [-8, 7]), weight_scale bf16 [out, in/32] (symmetric
minmax: scale = max|w| / 7 per group of 32 inputs), weight_shape int32 [2]; quantization_config
with Kimi's ignore list (lm_head, re: self_attn / shared_experts / dense mlp.*_proj). The
reference runs on the dequantised weights (q * scale, in float32).

Kimi-K2.5 fixtures wrap the same decoder: config.json is KimiK25ForConditionalGeneration with the
decoder under text_config and a vision_config; tensors are prefixed "language_model." and a few
stand-in vision_tower.* / mm_projector.* tensors are added (moeserve must skip them). HF has no
Kimi-K2.5 class without remote code, so the reference is DeepseekV3ForCausalLM on text_config.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers as T
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import quantize_fp8, write_sharded  # noqa: E402

BASE = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=1000,
            initializer_range=0.1, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1, max_position_embeddings=512, topk_method="noaux_tc",
            scoring_func="sigmoid", torch_dtype="bfloat16")
FP8 = dict(activation_scheme="dynamic", fmt="e4m3", quant_method="fp8", weight_block_size=[128, 128])
INT4 = dict(quant_method="compressed-tensors", format="pack-quantized", quantization_status="compressed",
            config_groups=dict(group_0=dict(targets=["Linear"], input_activations=None, output_activations=None,
                                            weights=dict(num_bits=4, type="int", symmetric=True, strategy="group",
                                                         group_size=32, dynamic=False, observer="minmax",
                                                         actorder=None, block_structure=None))),
            ignore=["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            kv_cache_scheme=None)

# name: (seed, quantisation (False | True = FP8 | "int4"), prompt length, config, mtp stand-ins, kimi wrapper)
FIXTURES = {
    # q_lora, grouped routing (4 groups, best 2), first layer dense, interleaved RoPE, plain theta.
    "dsv3_tiny_bf16": (41, False, 9, dict(
        hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24,
        intermediate_size=160, moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, rope_theta=10000.0, rope_interleave=True, num_nextn_predict_layers=0),
        False, False),
    # FP8 128x128 with partial edge blocks, no q_lora (q_proj), one group, top-k not renormalised,
    # 2 shared experts, NeoX RoPE (rope_interleave false), an MTP layer's stand-in tensors.
    "dsv3_tiny_fp8": (42, True, 11, dict(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        intermediate_size=224, moe_intermediate_size=160, n_routed_experts=8, n_shared_experts=2,
        num_experts_per_tok=3, n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=False,
        routed_scaling_factor=1.5, rope_theta=50000.0, rope_interleave=False, num_nextn_predict_layers=1,
        quantization_config=FP8), True, False),
    # YaRN in the hub's spelling (rope_scaling with type, mscale = mscale_all_dim = 1: the softmax
    # scale gets mscale^2, cos/sin none), 2 groups of 4 with both kept, q_lora.
    "dsv3_tiny_yarn": (43, False, 20, dict(
        hidden_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        intermediate_size=128, moe_intermediate_size=48, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=4, n_group=2, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True,
        routed_scaling_factor=2.827, rope_theta=10000.0, rope_interleave=True, num_nextn_predict_layers=0,
        max_position_embeddings=2560, rope_scaling=dict(type="yarn", factor=40.0,
        original_max_position_embeddings=64, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0)),
        False, False),
    # Kimi-K2.5 wrapper (text_config, language_model. prefix, vision stand-ins), YaRN in transformers
    # v5's rope_parameters with mscale != mscale_all_dim (cos/sin scaled too), no dense layer.
    "kimi_tiny_yarn": (44, False, 13, dict(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
        intermediate_size=192, moe_intermediate_size=32, n_routed_experts=16, n_shared_experts=1,
        num_experts_per_tok=4, n_group=1, topk_group=1, first_k_dense_replace=0, norm_topk_prob=True,
        routed_scaling_factor=2.827, rope_interleave=True, num_nextn_predict_layers=0, rms_norm_eps=1e-5,
        max_position_embeddings=4096, rope_parameters=dict(rope_type="yarn", rope_theta=50000.0, factor=64.0,
        original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0, mscale=0.8, mscale_all_dim=1.2)),
        False, True),
    # INT4 pack-quantized routed experts (group 32: hidden 128 and expert width 128 are whole groups,
    # and so is each rank's 32-wide down_proj slice at TP=4), grouped routing, q_lora, a dense first
    # layer (bf16: the ignore list keeps mlp.*_proj).
    "dsv3_tiny_int4": (45, "int4", 10, dict(
        hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24,
        intermediate_size=160, moe_intermediate_size=128, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
        routed_scaling_factor=2.827, rope_theta=10000.0, rope_interleave=True, num_nextn_predict_layers=0,
        quantization_config=INT4), False, False),
}


def quantize_int4(w, group=32):
    """[out, in] float -> (weight_packed int32 [out, in/8], weight_scale bf16 [out, in/group],
    weight_shape int32 [2], the dequantised float32 weight)."""
    out, inp = w.shape
    assert inp % group == 0 and inp % 8 == 0, (out, inp)
    g = w.float().reshape(out, inp // group, group)
    scale = (g.abs().amax(-1, keepdim=True) / 7).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.clamp(torch.round(g / scale.float()), -8, 7).to(torch.int64).reshape(out, inp)
    nib = (q + 8).reshape(out, inp // 8, 8)  # element 8j + i -> bits [4i, 4i+3] of word j
    words = torch.zeros(out, inp // 8, dtype=torch.int64)
    for i in range(8):
        words |= nib[..., i] << (4 * i)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # two's complement
    deq = (q.reshape(out, inp // group, group).float() * scale.float()).reshape(out, inp)
    return words, scale.reshape(out, inp // group), torch.tensor([out, inp], dtype=torch.int32), deq


def is_linear(name):
    # Every projection of the layers (attention, experts, shared experts, dense MLP); not the router.
    return name.endswith(".weight") and "_proj" in name and "layers." in name


def build(name, seed, fp8, P, cfg, mtp, kimi, out, tmp):
    c = {**BASE, **cfg}
    d, r = os.path.join(out, name), os.path.join(tmp, name + "_hf")  # the HF copy stays out of OUT_DIR
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    os.makedirs(r)
    torch.manual_seed(seed)
    hf_cfg = {k: v for k, v in c.items() if k != "quantization_config"}
    hf_cfg["num_nextn_predict_layers"] = 0  # no MTP-assisted generation in the reference
    m = T.DeepseekV3ForCausalLM(T.DeepseekV3Config(**hf_cfg))
    stored, values = {}, {}
    block = FP8["weight_block_size"] if fp8 is True else None

    def put(t, y):
        if fp8 == "int4" and ".mlp.experts." in t:
            base = t[: -len(".weight")]
            stored[base + ".weight_packed"], stored[base + ".weight_scale"], stored[base + ".weight_shape"], \
                values[t] = quantize_int4(y, INT4["config_groups"]["group_0"]["weights"]["group_size"])
        elif block and is_linear(t):
            stored[t], stored[t + "_scale_inv"], values[t] = quantize_fp8(y, block)
        else:
            stored[t] = y.to(torch.float32 if "e_score_correction_bias" in t else torch.bfloat16)
            values[t] = stored[t].float()

    for k, w in m.state_dict().items():
        w = w.float()
        if "norm" in k:
            w = 1 + 0.1 * torch.randn_like(w)
        if "e_score_correction_bias" in k:
            w = 0.05 * torch.randn_like(w)
        if w.dim() < 3:
            put(k, w)
            continue
        for e, x in enumerate(w):  # fused experts [E, 2I, H] / [E, H, I] -> hub names
            parts = zip(x.chunk(2), ("gate", "up")) if "gate_up" in k else [(x, "down")]
            for y, u in parts:
                put(k.split("experts.")[0] + f"experts.{e}.{u}_proj.weight", y)
    L, H = c["num_hidden_layers"], c["hidden_size"]
    if mtp:  # stand-ins of DeepSeek's MTP module at model.layers.{L} (moeserve must skip them)
        p = f"model.layers.{L}."
        for t, shape in [("enorm.weight", [H]), ("hnorm.weight", [H]), ("eh_proj.weight", [H, 2 * H]),
                         ("shared_head.norm.weight", [H]), ("input_layernorm.weight", [H]),
                         ("self_attn.kv_a_layernorm.weight", [c["kv_lora_rank"]])]:
            stored[p + t] = torch.randn(*shape).to(torch.bfloat16)
    if kimi:
        stored = {"language_model." + k: v for k, v in stored.items()}
        for t, shape in [("vision_tower.patch_embed.proj.weight", [32, 3, 2, 2]),
                         ("vision_tower.encoder.blocks.0.wqkv.weight", [96, 32]),
                         ("mm_projector.proj.0.weight", [128, 128])]:
            stored[t] = torch.randn(*shape).to(torch.bfloat16)
        top = dict(architectures=["KimiK25ForConditionalGeneration"], model_type="kimi_k25", bos_token_id=0,
                   eos_token_id=1, pad_token_id=999, tie_word_embeddings=False,
                   text_config={k: v for k, v in c.items() if k not in ("bos_token_id", "eos_token_id")},
                   vision_config=dict(vt_num_hidden_layers=1, vt_hidden_size=32, patch_size=2,
                                      text_hidden_size=H))
        json.dump(top, open(d + "/config.json", "w"), indent=1)
    else:
        json.dump(c, open(d + "/config.json", "w"), indent=1)
    write_sharded(d, stored)
    save_file(values, r + "/model.safetensors")
    json.dump(hf_cfg, open(r + "/config.json", "w"))
    m = T.DeepseekV3ForCausalLM.from_pretrained(r, dtype=torch.float32, attn_implementation="eager").eval()
    prompt = torch.randint(3, c["vocab_size"], (1, P), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        o = m.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True,
                       return_dict_in_generate=True)
        full = m(o.sequences[:, :-1]).logits[0].numpy()
    gen = o.sequences[0, P:].tolist()
    logits = torch.stack([x[0] for x in o.logits]).numpy()
    srt = np.sort(logits, 1)
    np.save(d + "/ref_logits.npy", logits)
    np.save(d + "/ref_full_logits.npy", full)
    margin = float((srt[:, -1] - srt[:, -2]).min())
    json.dump(dict(prompt_ids=prompt[0].tolist(), generated_ids=gen, reference="transformers " + T.__version__,
                   torch=torch.__version__, min_argmax_margin=margin), open(d + "/golden.json", "w"))
    print(name, gen, "min top-2 margin", margin)


def main():
    out = sys.argv[1]
    only = sys.argv[2:]
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    unknown = [n for n in only if n not in FIXTURES]
    if unknown:
        sys.exit(f"unknown fixtures {unknown}; known: {list(FIXTURES)}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (seed, fp8, P, cfg, mtp, kimi) in FIXTURES.items():
            if not only or name in only:
                build(name, seed, fp8, P, cfg, mtp, kimi, out, tmp)


if __name__ == "__main__":
    main()
