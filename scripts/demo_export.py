"""Checkpoint writing for the demo model (scripts/train_demo.py): HF modules -> the hub's
MiniMax-M2 tensor names, the FP8 block-quantised variant, and the folder layout.

Hub names (as MiniMaxAI/MiniMax-M2.5 stores them; transformers converts them on load):
  model.layers.{l}.block_sparse_moe.gate.weight               [E, H]  float32
  model.layers.{l}.block_sparse_moe.e_score_correction_bias   [E]     float32
  model.layers.{l}.block_sparse_moe.experts.{e}.w1|w3.weight  [I, H]  (gate | up)
  model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight     [H, I]  (down)
  model.layers.{l}.self_attn.{q,k,v,o}_proj.weight, q_norm / k_norm (full width), norms
FP8: every Linear of the decoder layers (attention, experts, MTP eh_proj) as float8_e4m3fn with
float32 `weight_scale_inv` per block [ceil(out/128), ceil(in/128)]; gate, e_score_correction_bias,
lm_head, embeddings and norms stay as they are (modules_to_not_convert, as on the hub).
"""
import json
import math
import os

import torch
from safetensors.torch import save_file


def layer_to_hub(layer, prefix):
    """MiniMaxM2DecoderLayer -> {hub name: tensor} (detached, bf16 except router in fp32)."""
    a, m = layer.self_attn, layer.mlp
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous()
    out = {prefix + "input_layernorm.weight": bf(layer.input_layernorm.weight),
           prefix + "post_attention_layernorm.weight": bf(layer.post_attention_layernorm.weight)}
    for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
        out[prefix + f"self_attn.{n}.weight"] = bf(getattr(a, n).weight)
    out[prefix + "block_sparse_moe.gate.weight"] = m.gate.weight.detach().float().contiguous()
    out[prefix + "block_sparse_moe.e_score_correction_bias"] = m.e_score_correction_bias.detach().float().contiguous()
    gu, dn = m.experts.gate_up_proj.detach(), m.experts.down_proj.detach()   # [E, 2I, H], [E, H, I]
    I = gu.shape[1] // 2
    for e in range(gu.shape[0]):
        q = prefix + f"block_sparse_moe.experts.{e}."
        out[q + "w1.weight"] = bf(gu[e, :I])
        out[q + "w3.weight"] = bf(gu[e, I:])
        out[q + "w2.weight"] = bf(dn[e])
    return out


def model_to_hub(model, mtp=None):
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous()
    out = {"model.embed_tokens.weight": bf(model.model.embed_tokens.weight),
           "model.norm.weight": bf(model.model.norm.weight), "lm_head.weight": bf(model.lm_head.weight)}
    for l, layer in enumerate(model.model.layers):
        out.update(layer_to_hub(layer, f"model.layers.{l}."))
    if mtp is not None:
        L = len(model.model.layers)
        for k, m in enumerate(mtp.mods):
            out.update(m.state_dict_hub(f"model.layers.{L + k}."))
    return out


def quantize_fp8(w, block=(128, 128)):
    """Block-wise e4m3fn: returns (fp8 [out, in], weight_scale_inv float32 [ceil(out/bo), ceil(in/bi)])
    with w ~= fp8 * scale (per block); scale = amax / 448."""
    bo, bi = block
    w = w.float()
    o, i = w.shape
    so, si = math.ceil(o / bo), math.ceil(i / bi)
    pad = torch.zeros(so * bo, si * bi)
    pad[:o, :i] = w
    blocks = pad.view(so, bo, si, bi)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / 448.0
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).view(so * bo, si * bi)[:o, :i]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.float().contiguous()


def is_fp8_target(name):
    return (".self_attn." in name and name.endswith("_proj.weight")) or \
        (".experts." in name and name.endswith(".weight")) or name.endswith(".eh_proj.weight")


def to_fp8(tensors, block=(128, 128)):
    out = {}
    for n, t in tensors.items():
        if is_fp8_target(n):
            q, s = quantize_fp8(t, block)
            out[n] = q
            out[n[:-len("weight")] + "weight_scale_inv"] = s
        else:
            out[n] = t
    return out


def write_sharded(directory, tensors, shards):
    """model-0000k-of-0000n.safetensors + model.safetensors.index.json (hub layout)."""
    os.makedirs(directory, exist_ok=True)
    names = sorted(tensors, key=_layer_order)
    # balance shards by bytes
    total = sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    per, parts, cur, acc = total / shards, [], [], 0
    for n in names:
        sz = tensors[n].numel() * tensors[n].element_size()
        if cur and acc + sz > per * (len(parts) + 1) and len(parts) < shards - 1:
            parts.append(cur)
            cur = []
        cur.append(n)
        acc += sz
    parts.append(cur)
    weight_map = {}
    for k, part in enumerate(parts):
        fname = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, os.path.join(directory, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    return [f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors" for k in range(len(parts))]


def _layer_order(n):
    if n.startswith("model.layers."):
        return (1, int(n.split(".")[2]), n)
    return (0 if "embed" in n else 2, 0, n)


def hub_config(model_cfg, tok_ids, fp8_block=None, eagle_dir=None):
    """config.json in the hub's MiniMax-M2 form (keys as MiniMaxAI/MiniMax-M2.5's)."""
    c = model_cfg
    cfg = {
        "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
        "attn_type_list": [1] * c["num_hidden_layers"],
        "head_dim": c["head_dim"], "hidden_act": "silu", "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"], "max_position_embeddings": c["max_position_embeddings"],
        "mtp_transformer_layers": 1, "num_attention_heads": c["num_attention_heads"],
        "num_experts_per_tok": c["num_experts_per_tok"], "num_hidden_layers": c["num_hidden_layers"],
        "num_key_value_heads": c["num_key_value_heads"], "num_local_experts": c["num_local_experts"],
        "num_mtp_modules": c["num_mtp_modules"], "qk_norm_type": "per_layer",
        "rms_norm_eps": c["rms_norm_eps"], "rope_theta": c["rope_theta"], "rotary_dim": c["rotary_dim"],
        "partial_rotary_factor": c["rotary_dim"] / c["head_dim"],
        "scoring_func": "sigmoid", "shared_intermediate_size": 0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "use_mtp": True, "use_qk_norm": True,
        "use_routing_bias": True, "vocab_size": c["vocab_size"],
        "bos_token_id": tok_ids["bos"], "eos_token_id": tok_ids["eos"], "pad_token_id": tok_ids["pad"],
        # Not hub keys: how the MTP modules were trained (see scripts/demo_heads.py).
        "mtp_hidden_convention": "module 1 takes the final hidden after model.norm; module k>1 the "
                                 "previous module's output before shared_head.norm",
        "mtp_shares_embedding_and_head": True,
    }
    if fp8_block:
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn",
                                      "quant_method": "fp8", "weight_block_size": list(fp8_block),
                                      "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}
    return cfg
