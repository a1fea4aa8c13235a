"""Split full checkpoints into tensor-parallel rank shards (and back), following `parallel.py`.

A shard holds exactly the tensors, names and shapes of the rank's model built with
`Parallel(rank, world)`, so loading it is the ordinary name-and-shape-checked assignment.
MoE experts (models/moe.py) are split inside each expert like the dense MLP: `experts.w13`
[E, H, gate | up] by columns of each half, `experts.w2` [E, I, H] by rows of I; routers are
replicated; gpt-oss attention sinks [H] follow their query heads. DeepSeek-V4's attention (one K=V head, its
compressors and indexer) is replicated, as transformers' tp plan has it; its experts and shared expert split.
"""

from __future__ import annotations

import re

import torch

from ..config.model import DecoderConfig
from ..distributed.parallel import HeadSplit, padded_vocab

# split output rows (g_proj: Laguna's output gates; q_b_proj, kv_b_proj: multi-head latent attention's heads)
COLUMN = ("q_proj", "gate_proj", "up_proj", "in_proj_z", "in_proj_b", "in_proj_a", "g_proj", "q_b_proj", "kv_b_proj")
KV = ("k_proj", "v_proj")  # split (or replicate) by KV head
ROW = ("o_proj", "down_proj", "out_proj")  # split input columns; bias on rank 0
QKV = ("in_proj_qkv", "conv1d")  # Gated DeltaNet q | k | v rows: each part split by head
PER_HEAD = (".linear_attn.A_log", ".linear_attn.dt_bias")  # one value per value head: split
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")
# full-width QK-norm (MiniMax-M2): q_norm [H * D], k_norm [H_kv * D], one weight per channel of their heads
NORMS_BY_HEAD = {".self_attn.q_norm.weight": "column", ".self_attn.k_norm.weight": "kv"}
FULL_WIDTH_QK_NORM = ("minimax_m2",)


# experts sit under the MLP (`mlp.experts`), or beside it (Gemma 4: `layers.<i>.experts`)
EXPERTS = {".experts.w13": "halves", ".experts.w13_bias": "halves", ".experts.w2": "expert_rows",
           ".experts.w2_bias": "rank0", ".self_attn.sinks": "column"}
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _kind(name: str, cfg: DecoderConfig) -> str:
    if name in VOCAB:
        return "vocab"
    if ".self_attn." in name and getattr(cfg, "deepseek_v4", None) is not None:
        return "replicated"
    if name.endswith(PER_HEAD):
        return "column"
    if getattr(cfg, "model_type", None) in FULL_WIDTH_QK_NORM and name.endswith(tuple(NORMS_BY_HEAD)):
        return NORMS_BY_HEAD[name[name.rindex(".self_attn."):]]
    for suffix, kind in EXPERTS.items():
        if name.endswith(suffix):
            return kind
    for group, kinds in (("column", COLUMN), ("kv", KV), ("row", ROW), ("qkv", QKV)):
        if any(f".{k}." in name for k in kinds):
            return group
    return "replicated"  # norms, fc, hidden_norm


def _kv_split(name: str, cfg: DecoderConfig, world: int) -> tuple[HeadSplit, int]:
    """The KV heads split and head_dim of the layer `name` belongs to (Gemma 4's full-attention layers have their
    own: `DecoderConfig.kv_heads_and_dim`)."""
    kv_heads, head_dim = cfg.kv_heads_and_dim(int(LAYER.search(name)[1]))
    return HeadSplit(cfg.num_attention_heads, kv_heads, world), head_dim


def _qkv_parts(cfg: DecoderConfig) -> list[int]:
    lin = cfg.linear_attention
    return [lin.key_dim, lin.key_dim, lin.value_dim]


def shard_tensor(name: str, t: torch.Tensor, cfg: DecoderConfig, rank: int, world: int) -> torch.Tensor:
    if world == 1:
        return t
    kind = _kind(name, cfg)
    if kind == "vocab":
        padded = torch.cat([t, t.new_zeros(padded_vocab(t.shape[0], world) - t.shape[0], *t.shape[1:])])
        return padded.chunk(world, dim=0)[rank].clone()
    if kind == "column":
        return t.chunk(world, dim=0)[rank].clone()
    if kind == "qkv":
        return torch.cat([part.chunk(world, dim=0)[rank] for part in t.split(_qkv_parts(cfg))])
    if kind == "halves":  # [..., gate | up]: the rank's columns of each half
        return torch.cat([half.chunk(world, dim=-1)[rank] for half in t.chunk(2, dim=-1)], dim=-1)
    if kind == "expert_rows":
        return t.chunk(world, dim=1)[rank].clone()
    if kind == "rank0":  # a bias added after the all-reduce's partial sums: counted once
        return t.clone() if rank == 0 else torch.zeros_like(t)
    if kind == "kv":
        split, d = _kv_split(name, cfg, world)
        heads = split.kv_heads_of(rank)
        return t[heads.start * d: heads.stop * d].clone()
    if kind == "row":
        if name.endswith(".bias"):
            return t.clone() if rank == 0 else torch.zeros_like(t)
        return t.chunk(world, dim=1)[rank].clone()
    return t


def shard_state(state: dict[str, torch.Tensor], cfg: DecoderConfig, rank: int, world: int) -> dict[str, torch.Tensor]:
    return {name: shard_tensor(name, t, cfg, rank, world) for name, t in state.items()}


def unshard_state(shards: list[dict[str, torch.Tensor]], cfg: DecoderConfig, vocab_size: int) -> dict[str, torch.Tensor]:
    """Reassemble rank shards into the full checkpoint (inverse of `shard_state`)."""
    world = len(shards)
    if world == 1:
        return dict(shards[0])
    full = {}
    for name in shards[0]:
        parts = [s[name] for s in shards]
        kind = _kind(name, cfg)
        if kind == "vocab":
            full[name] = torch.cat(parts)[:vocab_size]
        elif kind == "column":
            full[name] = torch.cat(parts)
        elif kind == "qkv":
            local = [n // world for n in _qkv_parts(cfg)]
            full[name] = torch.cat([torch.cat([p.split(local)[i] for p in parts]) for i in range(3)])
        elif kind == "halves":
            full[name] = torch.cat([torch.cat([p.chunk(2, dim=-1)[h] for p in parts], dim=-1) for h in (0, 1)], dim=-1)
        elif kind == "expert_rows":
            full[name] = torch.cat(parts, dim=1)
        elif kind == "rank0":
            full[name] = parts[0]
        elif kind == "kv":
            split = _kv_split(name, cfg, world)[0]
            first_rank = {split.kv_heads_of(r).start: r for r in reversed(range(world))}  # one copy per head
            full[name] = torch.cat([parts[first_rank[h]] for h in sorted(first_rank)])
        elif kind == "row":
            full[name] = parts[0] if name.endswith(".bias") else torch.cat(parts, dim=1)
        else:
            full[name] = parts[0]
    return full
