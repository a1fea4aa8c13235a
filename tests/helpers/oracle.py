"""Independent references the runtime is checked against: transformers, and the spec's algorithm."""

from __future__ import annotations

import torch


def speculators_blocks(model_cls, config_cls, path, sequence: list[int], hf):
    """speculators' own drafter forward (eager attention) over `sequence`: every position p < len - block is an
    anchor whose block [token p, MASK...] sees the target's features before p -> (hidden [A, B, H], logits
    [A, B, V], the model). `_backbone_forward` is the part of forward() before the loss."""
    cfg = config_cls.from_pretrained(str(path))
    cfg.transformer_layer_config._attn_implementation = "eager"
    model = model_cls.from_pretrained(str(path), config=cfg).eval()
    ids = torch.tensor([sequence])
    anchors = len(sequence) - cfg.block_size
    loss_mask = torch.zeros(1, len(sequence))
    loss_mask[:, :anchors] = 1
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in cfg.aux_hidden_state_layer_ids], dim=-1)
        hidden, logits, *_ = model._backbone_forward(feats, ids, loss_mask, out.hidden_states[-1],
                                                     torch.zeros_like(ids), max_anchors=anchors)
    return hidden.view(anchors, cfg.block_size, -1), logits.view(anchors, cfg.block_size, -1), model


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by full recomputation with the transformers model (no cache, no shortcuts)."""
    ids = torch.tensor([prompt])
    out = []
    for _ in range(n):
        nxt = int(model(ids).logits[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


class ReferenceDrafter:
    """The drafter as the spec states it, from transformers' Qwen3 pieces, recomputing the whole
    context every step (no draft cache), with the reference's masks for sliding-window layers."""

    def __init__(self, cfg: dict, weights: dict[str, torch.Tensor]):
        from transformers import AutoConfig
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        # As the reference is loaded: AutoConfig of the config's model_type (Qwen3 layers built from it).
        self.cfg, self.w = cfg, weights
        self.hf_cfg = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("architectures", "dflash_config")})
        self.rotary = Qwen3RotaryEmbedding(self.hf_cfg)
        self.eps = self.hf_cfg.rms_norm_eps
        self.layer_types = getattr(self.hf_cfg, "layer_types", None) or ["full_attention"] * cfg["num_hidden_layers"]
        self.sliding_window = self.hf_cfg.sliding_window

    def norm(self, x, name):
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        n = Qwen3RMSNorm(x.shape[-1], self.eps)
        n.weight.data = self.w[name]
        return n(x)

    def lin(self, x, name):
        """nn.Linear by name, with its bias when the checkpoint has one (attention_bias drafters)."""
        out = x @ self.w[name + ".weight"].T
        return out + self.w[name + ".bias"] if name + ".bias" in self.w else out

    def __call__(self, ctx_feat: torch.Tensor, block_emb: torch.Tensor, start: int) -> torch.Tensor:
        """ctx_feat: [1, start, n*H] features of positions 0..start-1; block_emb: [1, B, H] -> [1, B, H]."""
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

        w, d = self.w, self.cfg["head_dim"]
        nb = block_emb.shape[1]
        fused = self.norm(ctx_feat @ w["fc.weight"].T, "hidden_norm.weight")
        pos = torch.arange(start + nb)[None]
        cos, sin = self.rotary(block_emb, pos)
        x = block_emb
        for i, kind in enumerate(self.layer_types):
            p = f"layers.{i}."
            h = self.norm(x, p + "input_layernorm.weight")
            kv_in = torch.cat([fused, h], dim=1)
            q = self.norm(self.lin(h, p + "self_attn.q_proj").view(1, nb, -1, d), p + "self_attn.q_norm.weight")
            k = self.norm(self.lin(kv_in, p + "self_attn.k_proj").view(1, start + nb, -1, d), p + "self_attn.k_norm.weight")
            v = self.lin(kv_in, p + "self_attn.v_proj").view(1, start + nb, -1, d).transpose(1, 2)
            q, _ = apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), cos[:, -nb:], sin[:, -nb:])
            _, k = apply_rotary_pos_emb(k.transpose(1, 2), k.transpose(1, 2), cos, sin)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            scores = q @ k.transpose(-1, -2) / d**0.5  # [1, H, B, start + B]
            qp, kp = torch.arange(start, start + nb)[:, None], torch.arange(start + nb)[None]
            visible = torch.ones(nb, start + nb, dtype=torch.bool)
            if kind == "sliding_attention":  # causal inside the window, as the reference does
                visible &= (kp <= qp) & (qp - kp < self.sliding_window)
            scores = scores.masked_fill(~visible, float("-inf"))
            attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, nb, -1)
            x = x + self.lin(attn, p + "self_attn.o_proj")
            h = self.norm(x, p + "post_attention_layernorm.weight")
            gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        return self.norm(x, "norm.weight")


@torch.no_grad()
def reference_dflash_greedy(hf, drafter: ReferenceDrafter, prompt: list[int], n: int, block: int,
                            draft_lens: list[int] | None = None, embed=None):
    """The spec's generation loop at batch 1, greedy, target recomputed in full every step.

    draft_lens: drafts per step, in turn (0: a plain step, the drafter does not run); default block - 1.
    embed: how the block is embedded (default: the target's input embedding module).
    -> (output ids, acceptance lengths, drafts of every drafting step)."""
    cfg = drafter.cfg
    ids_layers = cfg["dflash_config"]["target_layer_ids"]
    mask = cfg["dflash_config"]["mask_token_id"]
    embed, lm_head = embed or hf.get_input_embeddings(), hf.lm_head

    def target(seq):
        out = hf(torch.tensor([seq]), output_hidden_states=True)
        return out.logits[0], torch.cat([out.hidden_states[i + 1] for i in ids_layers], dim=-1)

    logits, feats = target(prompt)
    seq = list(prompt) + [int(logits[-1].argmax())]
    out, lengths, all_drafts = [seq[-1]], [], []
    start = len(prompt)
    step = 0
    while len(out) < n:
        k = block - 1 if draft_lens is None else draft_lens[step % len(draft_lens)]
        step += 1
        drafts = []
        if k > 0:
            block_ids = [seq[start]] + [mask] * k
            hidden = drafter(feats[:, :start], embed(torch.tensor([block_ids])), start)
            drafts = lm_head(hidden[0, 1:]).argmax(-1).tolist()
            all_drafts.append(drafts)
        logits, feats = target(seq[: start + 1] + drafts)
        posterior = logits[start:].argmax(-1).tolist()
        a = 0
        while a < len(drafts) and drafts[a] == posterior[a]:
            a += 1
        new = (drafts[:a] + [posterior[a]])[: n - len(out)]
        out += new
        lengths.append(len(new))
        seq = seq[: start + 1] + drafts[:a] + [posterior[a]]
        start += a + 1
    return out, lengths, all_drafts


def held_out_ids(target, count: int) -> list[list[int]]:
    """Token ids of `count` held-out stdlib snippets (trtllm_dflash.pairs.held_out_texts), by `target`'s tokenizer."""
    from trtllm_dflash.engine.pipeline import load_pipeline

    from trtllm_dflash.pairs import held_out_texts

    tokenizer = load_pipeline(target).tokenizer
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in held_out_texts(count)]
