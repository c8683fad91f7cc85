"""Draft heads for the demo model (scripts/train_demo.py): MiniMax-M2 / DeepSeek-V3-style MTP
modules and an EAGLE-3 draft head, as small torch modules (transformers has neither), plus
their acceptance measurement.

Shapes: B batch, T tokens, H hidden, V target vocabulary, Vd draft vocabulary.

MTP module k (k = 1..K), checkpoint prefix model.layers.{L+k-1}. (L = num_hidden_layers), in
the DeepSeek-V3 / GLM layout (shared/reference/wave2-research.md section 2):
    x   = eh_proj(cat([enorm(E(tok_{t+k})), hnorm(h^{k-1}_t)], -1))   # embedding first
    h^k = DecoderLayer_k(x)            # a full MiniMax-M2 decoder layer (attention + MoE)
    logits_k = lm_head(shared_head.norm(h^k))    # predicts tok_{t+k+1}; lm_head is the target's
with h^0 the target's final hidden state after model.norm (DeepSeek's convention) and h^k
(k >= 1) the previous module's output before shared_head.norm. No shared_head.head and no
embed_tokens copy are stored: both are the target's (config: mtp_shares_embedding_and_head).

EAGLE-3 (SpecForge / vLLM `LlamaForCausalLMEagle3` names; section 1 of the same file):
    g      = fc(cat([a_1, a_2, a_3], -1))  # three target residual streams (taps) [T, 3H] -> [T, H]
    x      = cat([input_layernorm(E(tok_{t+1})), hidden_norm(g)], -1)          # [T, 2H]
    resid  = g ; a = o_proj(attn(q/k/v_proj(x)))                              # Llama attention, RoPE
    resid  = a + resid ; m = mlp(post_attention_layernorm(resid)) ; prenorm = m + resid
    logits = lm_head(norm(prenorm))    # [T, Vd]; target id = draft id + d2t[draft id]
Chained steps feed the previous step's `prenorm` as g and the drafted token, one position on.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms(x, self.weight, self.eps)


class MTPModule(nn.Module):
    def __init__(self, config, layer_idx):
        from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2DecoderLayer
        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        self.enorm, self.hnorm = RMSNorm(H, eps), RMSNorm(H, eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.block = MiniMaxM2DecoderLayer(config, layer_idx)
        self.shared_head_norm = RMSNorm(H, eps)

    def forward(self, emb_next, h_prev, pos_emb):
        """emb_next [B, T, H] = E(tok_{t+k}); h_prev [B, T, H]. Returns h^k [B, T, H]."""
        x = self.eh_proj(torch.cat([self.enorm(emb_next), self.hnorm(h_prev)], -1))
        return self.block(x, position_embeddings=pos_emb, attention_mask=None)

    def state_dict_hub(self, prefix):
        """Tensors under the hub names (experts split into w1/w3/w2 as the main layers are)."""
        from demo_export import layer_to_hub
        bf = lambda t: t.detach().to(torch.bfloat16).contiguous()
        out = {prefix + "enorm.weight": bf(self.enorm.weight), prefix + "hnorm.weight": bf(self.hnorm.weight),
               prefix + "eh_proj.weight": bf(self.eh_proj.weight),
               prefix + "shared_head.norm.weight": bf(self.shared_head_norm.weight)}
        out.update(layer_to_hub(self.block, prefix))
        return out


class MTPHeads(nn.Module):
    def __init__(self, config, k=3):
        super().__init__()
        L = config.num_hidden_layers
        self.mods = nn.ModuleList([MTPModule(config, L + i) for i in range(k)])

    def losses(self, target, ids, h0, pos_emb):
        """Teacher-forced training losses, one per module. ids [B, T]; h0 [B, T, H] (post-norm,
        detached); embedding and lm_head are the target's, detached so MTP training leaves the
        target unchanged."""
        E = target.model.embed_tokens.weight.detach()
        W = target.lm_head.weight.detach()
        out, h = [], h0
        T = ids.shape[1]
        for k, m in enumerate(self.mods, start=1):
            # row t uses tok_{t+k} and predicts tok_{t+k+1}: valid rows 0..T-k-2
            emb = F.embedding(ids[:, k:], E)                      # [B, T-k, H]
            h = m(emb, h[:, :T - k], _crop(pos_emb, T - k))
            logits = F.linear(m.shared_head_norm(h[:, :-1]), W).float()
            out.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, k + 1:].reshape(-1)))
        return out

    @torch.no_grad()
    def teacher_chain(self, target, ids, h0, pos_emb):
        """h^0..h^K teacher-forced on ids (the accepted sequence): list, h^k [B, T-k, H]."""
        E = target.model.embed_tokens.weight
        hs, h, T = [h0], h0, ids.shape[1]
        for k, m in enumerate(self.mods, start=1):
            h = m(F.embedding(ids[:, k:], E), h[:, :T - k], _crop(pos_emb, T - k))
            hs.append(h)
        return hs

    @torch.no_grad()
    def draft_at(self, target, ids, hs, rows, pos_emb):
        """Chain drafts at the given rows of one sequence. ids [1, T] the accepted (greedy)
        sequence, hs its teacher chain, rows [P] positions t; the target's own next token at t
        is ids[t+1]. Module k at row t sees the drafted token of module k-1 and the previous
        module's chain state at t, while rows s < t hold the accepted sequence's values, as a
        draft KV cache filled at verification does: each of the P copies of the prefix has
        only its row t replaced. Returns [P, K] drafted tokens (position t+1+k predicted)."""
        E, W = target.model.embed_tokens.weight, target.lm_head.weight
        P, n = rows.shape[0], int(rows.max()) + 1
        ar = torch.arange(P, device=ids.device)
        tok = ids[0, rows + 1]
        h_prev = hs[0][0, rows]
        drafts = []
        for k, m in enumerate(self.mods, start=1):
            emb_t = F.embedding(ids[:, k:k + n], E).expand(P, n, -1).clone()   # teacher inputs
            hp_t = hs[k - 1][:, :n].expand(P, n, -1).clone()
            emb_t[ar, rows] = F.embedding(tok, E)
            hp_t[ar, rows] = h_prev
            h = m(emb_t, hp_t, _crop(pos_emb, n))[ar, rows]                     # [P, H]
            tok = F.linear(m.shared_head_norm(h), W).argmax(-1)
            drafts.append(tok)
            h_prev = h
        return torch.stack(drafts, -1)


def _crop(pos_emb, n):
    cos, sin = pos_emb
    return cos[:, :n], sin[:, :n]


def rope_cos_sin(positions, dim, theta):
    """positions [...] int -> cos, sin [..., dim] (Llama / NeoX half rotation)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    f = positions.float()[..., None] * inv
    emb = torch.cat([f, f], -1)
    return emb.cos(), emb.sin()


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Eagle3(nn.Module):
    def __init__(self, cfg, target_embed):
        """cfg: the draft's config dict (hidden_size, target_hidden_size, num_attention_heads,
        num_key_value_heads, head_dim, intermediate_size, draft_vocab_size, rms_norm_eps,
        rope_theta). target_embed: the target's embedding (shared, not trained here)."""
        super().__init__()
        H, Ht = cfg["hidden_size"], cfg["target_hidden_size"]
        nh, nkv, hd, I = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"]
        eps = cfg["rms_norm_eps"]
        self.cfg = cfg
        self.embed = target_embed
        self.fc = nn.Linear(3 * Ht, H, bias=False)
        self.input_layernorm, self.hidden_norm = RMSNorm(H, eps), RMSNorm(H, eps)
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, cfg["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg["vocab_size"], dtype=torch.bool))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def _qkv(self, tok, g, pos):
        """tok [B, T], g [B, T, H], pos [B, T] -> q [B, nh, T, hd], k, v [B, nkv, T, hd], resid."""
        c = self.cfg
        B, T = tok.shape
        x = torch.cat([self.input_layernorm(F.embedding(tok, self.embed.weight.detach()).to(g.dtype)),
                       self.hidden_norm(g)], -1)
        q = self.q_proj(x).view(B, T, c["num_attention_heads"], c["head_dim"]).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c["num_key_value_heads"], c["head_dim"]).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c["num_key_value_heads"], c["head_dim"]).transpose(1, 2)
        cos, sin = rope_cos_sin(pos, c["head_dim"], c["rope_theta"])
        cos, sin = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def _finish(self, attn, g):
        """attn [B, nh, T, hd] -> (logits [B, T, Vd], prenorm [B, T, H])."""
        B, _, T, _ = attn.shape
        resid = self.o_proj(attn.transpose(1, 2).reshape(B, T, -1)) + g
        h = self.post_attention_layernorm(resid)
        prenorm = self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)) + resid
        return self.lm_head(self.norm(prenorm)), prenorm

    def unrolled(self, aux, ids, steps, feed_drafts=False):
        """Test-time-training unroll over all rows at once. aux [B, T, 3Ht] (taps at each
        position), ids [B, T]. Step j, row i: token ids[i+1+j] (ground truth, i.e. the accepted
        token), position i+j, hidden = fc(aux_i) for j = 0 else step j-1's prenorm at row i; it
        attends to step-0 keys at rows 0..i (the draft KV cache of the verified prefix) and to
        its own chain's keys of steps 1..j at row i. Returns logits per step [B, T-1-j, Vd]
        aligned so row i predicts ids[i+2+j]. With feed_drafts, steps j >= 1 take the previous
        step's drafted token (argmax mapped through d2t) instead, as at inference."""
        c = self.cfg
        B, T = ids.shape
        rep = c["num_attention_heads"] // c["num_key_value_heads"]
        scale = 1.0 / math.sqrt(c["head_dim"])
        g = self.fc(aux[:, :T - 1])
        n = T - 1
        pos0 = torch.arange(n, device=ids.device).expand(B, n)
        keys0 = vals0 = None
        chain_k, chain_v, outs = [], [], []
        for j in range(steps):
            n_j = T - 1 - j
            tok = ids[:, 1 + j:1 + j + n_j] if (j == 0 or not feed_drafts) else prev[:, :n_j]
            q, k, v = self._qkv(tok, g[:, :n_j], pos0[:, :n_j] + j)
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            if j == 0:
                keys0, vals0 = k, v
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                k0, v0 = keys0[:, :, :n_j], vals0[:, :, :n_j]
                s0 = (q @ k0.transpose(-1, -2)) * scale                           # [B, nh, n_j, n_j]
                s0 = s0.masked_fill(~torch.ones(n_j, n_j, dtype=torch.bool, device=q.device).tril(), float("-inf"))
                ck = [kk[:, :, :n_j] for kk in chain_k] + [k]
                cv = [vv[:, :, :n_j] for vv in chain_v] + [v]
                sd = torch.stack([(q * kk).sum(-1) * scale for kk in ck], -1)       # [B, nh, n_j, j]
                p = torch.softmax(torch.cat([s0, sd], -1).float(), -1).to(q.dtype)
                a = p[..., :n_j] @ v0 + (p[..., n_j:, None] * torch.stack(cv, -2)).sum(-2)
            if j > 0:
                chain_k.append(k)
                chain_v.append(v)
            logits, prenorm = self._finish(a, g[:, :n_j])
            outs.append(logits)
            am = logits.argmax(-1)
            prev = am + self.d2t[am]
            g = prenorm
        return outs

    def hub_state_dict(self):
        p = "midlayer."
        sd = {"fc.weight": self.fc.weight, p + "input_layernorm.weight": self.input_layernorm.weight,
              p + "hidden_norm.weight": self.hidden_norm.weight,
              p + "self_attn.q_proj.weight": self.q_proj.weight, p + "self_attn.k_proj.weight": self.k_proj.weight,
              p + "self_attn.v_proj.weight": self.v_proj.weight, p + "self_attn.o_proj.weight": self.o_proj.weight,
              p + "post_attention_layernorm.weight": self.post_attention_layernorm.weight,
              p + "mlp.gate_proj.weight": self.gate_proj.weight, p + "mlp.up_proj.weight": self.up_proj.weight,
              p + "mlp.down_proj.weight": self.down_proj.weight, "norm.weight": self.norm.weight,
              "lm_head.weight": self.lm_head.weight, "d2t": self.d2t, "t2d": self.t2d}
        return sd


def eagle_loss(step_logits, target_logits, t2d, weights):
    """Soft cross-entropy against the target's own distribution restricted to the draft
    vocabulary (as SpecForge trains). step_logits[j] [B, n_j, Vd] predicts the token after
    position i+1+j, whose target distribution is target_logits[:, i+1+j] [.., V]. Rows whose
    target argmax is outside the draft vocabulary are masked."""
    total, accs = 0.0, []
    for j, lg in enumerate(step_logits):
        n_j = lg.shape[1]
        tl = target_logits[:, 1 + j:1 + j + n_j].float()
        p = torch.softmax(tl[..., t2d], -1)                          # [B, n_j, Vd]
        mask = t2d[tl.argmax(-1)].float()
        lq = torch.log_softmax(lg.float(), -1)
        loss = -((p * lq).sum(-1) * mask).sum() / mask.sum().clamp(min=1)
        total = total + weights[j] * loss
        accs.append(((lg.argmax(-1) == p.argmax(-1)).float() * mask).sum().item() / max(mask.sum().item(), 1))
    return total, accs


def acceptance(draft_tokens, greedy_next, valid):
    """Per-position conditional acceptance of chain drafts against the target's greedy tokens.
    draft_tokens [N, K]: drafted tokens for positions +1..+K after the target's own next token;
    greedy_next [N, K]: the target's greedy tokens at those positions; valid [N] rows whose
    K tokens lie inside the generated continuation. Returns (rates[k] = P(draft k right | drafts
    1..k-1 right), counts, mean accepted drafts per step)."""
    d, g = draft_tokens[valid], greedy_next[valid]
    ok = (d == g)
    K = d.shape[1]
    alive = torch.ones(d.shape[0], dtype=torch.bool, device=d.device)
    rates, counts, accepted = [], [], torch.zeros(d.shape[0], device=d.device)
    for k in range(K):
        n = int(alive.sum())
        hit = alive & ok[:, k]
        rates.append(float(hit.sum()) / max(n, 1))
        counts.append(n)
        accepted += hit.float()
        alive = hit
    return rates, counts, float(accepted.mean()) if d.shape[0] else 0.0
