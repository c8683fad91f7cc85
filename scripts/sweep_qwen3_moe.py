"""Qwen3-MoE cases for scripts/sweep_vs_hf.py (`--arch qwen3_moe`): random tiny
`Qwen3MoeForCausalLM` checkpoints in the hub layout Qwen publishes, checked against HF
transformers by sweep_vs_hf.py's check_case (same bounds, same excusals).

Varied: hidden size, heads / KV heads (MHA, GQA, MQA), head_dim (per-head QK-norm weights
[head_dim]), experts and top-k (1 .. num_experts), norm_topk_prob, dense layers through
mlp_only_layers and decoder_sparse_step (with their own intermediate_size), expert sizes that
are not multiples of 128, odd vocabularies, rms_norm_eps, RoPE theta and scaling in each
spelling real files use (top-level rope_theta; transformers v5 rope_parameters with
default / linear / yarn), tie_word_embeddings, checkpoint dtypes, FP8 e4m3 block-scaled
projections as Qwen ships them (weight_scale_inv, f32 or bf16 scales; dims not multiples of the
block: partial edge blocks; the router and norms unquantised), one or many shards.
"""
import torch
from transformers import Qwen3MoeForCausalLM

from sweep_vs_hf import weight_writer

HF_CLASS = Qwen3MoeForCausalLM
ROUTING_BIAS_PARAM = False
HAS_MTP = False

EDGE_CASES = [
    dict(name="q3_gqa_top_theta", heads=4, kv_heads=2, head_dim=32, rope="top"),
    dict(name="q3_mqa_norm_topk", heads=6, kv_heads=1, head_dim=16, norm_topk=True, rope="rope_parameters"),
    dict(name="q3_no_renorm", norm_topk=False, experts=8, top_k=3),
    dict(name="q3_topk_eq_experts", experts=4, top_k=4, norm_topk=True),
    dict(name="q3_mlp_only_layers", layers=3, mlp_only=[1], sparse_step=1, experts=8, dense_inter=72),
    dict(name="q3_sparse_step2", layers=4, sparse_step=2, mlp_only=[], experts=6, dense_inter=40),
    dict(name="q3_yarn_x4", rope="yarn", factor=4.0, orig_max=64),
    dict(name="q3_linear_x2", rope="linear", factor=2.0),
    dict(name="q3_fp8_b128_edges", fp8=(128, 128), hidden=192, inter=160, dense_inter=224, head_dim=48, heads=4,
         kv_heads=2, layers=2, sparse_step=2, mlp_only=[], experts=8, top_k=2),
    dict(name="q3_fp8_b64_bf16_scales", fp8=(64, 64), scale_dtype="bfloat16", hidden=96, inter=100),
    dict(name="q3_fp8_b32x96_odd", fp8=(32, 96), hidden=100, inter=70, vocab=997),
    dict(name="q3_tied_f16", tie=True, dtype="float16"),
    dict(name="q3_head128_f32", head_dim=128, heads=2, kv_heads=1, hidden=128, dtype="float32"),
    dict(name="q3_long_prompt", prompt_len=150, hidden=64, head_dim=16, heads=4, kv_heads=2),
    dict(name="q3_theta_absent", rope="absent"),
    dict(name="q3_many_shards_mixed", dtype="mixed", shards=6),
]


def draw_case(rng, base):
    c = {}
    head_dim = base.get("head_dim", rng.choice([16, 32, 48, 64, 128]))
    heads = base.get("heads", rng.choice([1, 2, 3, 4, 6, 8]))
    kv_choices = [k for k in range(1, heads + 1) if heads % k == 0]
    layers = base.get("layers", rng.choice([1, 2, 3]))
    c.update(
        head_dim=head_dim,
        heads=heads,
        kv_heads=base.get("kv_heads", rng.choice(kv_choices)),
        hidden=base.get("hidden", rng.choice([32, 64, 96, 100, 128, 144, 200])),
        layers=layers,
        experts=base.get("experts", rng.choice([1, 2, 4, 5, 8, 12])),
        inter=base.get("inter", rng.choice([24, 40, 64, 72, 100, 136])),
        dense_inter=base.get("dense_inter", rng.choice([32, 56, 96, 150])),
        vocab=base.get("vocab", rng.choice([257, 311, 500, 777, 1001])),
        eps=base.get("eps", rng.choice([1e-6, 1e-5, 3e-6])),
        theta=base.get("theta", rng.choice([1e6, 1e4, 5e6, 123456.0])),
        rope=base.get("rope", rng.choice(["top", "top", "rope_parameters", "yarn", "linear", "absent"])),
        factor=base.get("factor", rng.choice([2.0, 4.0])),
        orig_max=base.get("orig_max", rng.choice([32, 64, 128])),
        dtype=base.get("dtype", rng.choice(["bfloat16", "bfloat16", "float16", "float32", "mixed"])),
        fp8=base.get("fp8", rng.choice([None, None, (128, 128), (64, 64), (32, 96), (48, 48)])),
        scale_dtype=base.get("scale_dtype", "float32"),
        shards=base.get("shards", rng.choice([0, 1, 2, 3, -2])),
        norm_topk=base.get("norm_topk", rng.random() < 0.6),
        sparse_step=base.get("sparse_step", rng.choice([1, 1, 1, 2])),
        mlp_only=base.get("mlp_only", sorted(rng.sample(range(layers), rng.choice([0, 0, 1])))),
        tie=base.get("tie", rng.random() < 0.15),
        prompt_len=base.get("prompt_len", rng.choice([1, 2, 5, 17, 40, 90])),
        new_tokens=base.get("new_tokens", 8),
        seed=base.get("seed", rng.randrange(1 << 30)),
    )
    c["top_k"] = base.get("top_k", rng.randint(1, c["experts"]))
    c["rotary"] = head_dim  # Qwen3 rotates the whole head (HF applies cos/sin of head_dim width)
    c["routing_bias"] = False
    c["mtp_modules"], c["mtp_tensors"] = 0, False
    c["name"] = base.get("name", "random")
    return c


def sparse_layer(c, l):
    """HF's rule: sparse iff not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0."""
    return l not in c["mlp_only"] and c["experts"] > 0 and (l + 1) % c["sparse_step"] == 0


def hub_config(c):
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": c["hidden"],
        "num_hidden_layers": c["layers"],
        "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv_heads"],
        "head_dim": c["head_dim"],
        "max_position_embeddings": 1024,
        "intermediate_size": c["dense_inter"],
        "moe_intermediate_size": c["inter"],
        "num_experts": c["experts"],
        "num_experts_per_tok": c["top_k"],
        "norm_topk_prob": c["norm_topk"],
        "decoder_sparse_step": c["sparse_step"],
        "mlp_only_layers": c["mlp_only"],
        "hidden_act": "silu",
        "attention_bias": False,
        "use_sliding_window": False,
        "rms_norm_eps": c["eps"],
        "vocab_size": c["vocab"],
        "tie_word_embeddings": c["tie"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": {"mixed": "bfloat16"}.get(c["dtype"], c["dtype"]),
    }
    if c["rope"] == "top":
        cfg["rope_theta"] = c["theta"]
    elif c["rope"] == "rope_parameters":
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": c["theta"]}
    elif c["rope"] == "linear":
        cfg["rope_parameters"] = {"rope_type": "linear", "rope_theta": c["theta"], "factor": c["factor"]}
    elif c["rope"] == "yarn":
        cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": c["theta"], "factor": c["factor"],
                                  "original_max_position_embeddings": c["orig_max"]}
    if c["fp8"]:
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                      "weight_block_size": list(c["fp8"])}
    return cfg


def hf_config(c, cfg):
    r = {k: v for k, v in cfg.items() if k != "quantization_config"}
    r["torch_dtype"] = "float32"
    return r


def gate_scores(logits):
    return torch.softmax(logits, dim=-1)


def extra_params(c):
    return 0


def describe(c):
    dense = [l for l in range(c["layers"]) if not sparse_layer(c, l)]
    return (f"H{c['hidden']} L{c['layers']} dense{dense} h{c['heads']}/{c['kv_heads']} D{c['head_dim']} "
            f"rope={c['rope']} E{c['experts']}k{c['top_k']}{'n' if c['norm_topk'] else ''} I{c['inter']}/"
            f"{c['dense_inter']} V{c['vocab']} {c['dtype']} fp8={c['fp8']} shards={c['shards']} P{c['prompt_len']}")


def make_weights(c):
    randn, put, put_linear, stored, values = weight_writer(c)
    H, D, I, DI, E, V = c["hidden"], c["head_dim"], c["inter"], c["dense_inter"], c["experts"], c["vocab"]
    Hq, Hkv = c["heads"] * D, c["kv_heads"] * D
    put("model.embed_tokens.weight", randn(V, H))
    for l in range(c["layers"]):
        p = f"model.layers.{l}."
        put(p + "input_layernorm.weight", 1 + 0.1 * randn(H))
        put(p + "post_attention_layernorm.weight", 1 + 0.1 * randn(H))
        put_linear(p + "self_attn.q_proj.weight", randn(Hq, H, std=H ** -0.5))
        put_linear(p + "self_attn.k_proj.weight", randn(Hkv, H, std=H ** -0.5))
        put_linear(p + "self_attn.v_proj.weight", randn(Hkv, H, std=H ** -0.5))
        put_linear(p + "self_attn.o_proj.weight", randn(H, Hq, std=Hq ** -0.5))
        put(p + "self_attn.q_norm.weight", 1 + 0.1 * randn(D))
        put(p + "self_attn.k_norm.weight", 1 + 0.1 * randn(D))
        if sparse_layer(c, l):
            put(p + "mlp.gate.weight", randn(E, H, std=2 * H ** -0.5))
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                put_linear(q + "gate_proj.weight", randn(I, H, std=H ** -0.5))
                put_linear(q + "up_proj.weight", randn(I, H, std=H ** -0.5))
                put_linear(q + "down_proj.weight", randn(H, I, std=I ** -0.5))
        else:
            put_linear(p + "mlp.gate_proj.weight", randn(DI, H, std=H ** -0.5))
            put_linear(p + "mlp.up_proj.weight", randn(DI, H, std=H ** -0.5))
            put_linear(p + "mlp.down_proj.weight", randn(H, DI, std=DI ** -0.5))
    put("model.norm.weight", 1 + 0.1 * randn(H))
    if not c["tie"]:
        put("lm_head.weight", randn(V, H, std=2 * H ** -0.5))
    return stored, values
