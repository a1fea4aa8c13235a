"""Tiny DFlash2 drafters: made and run by speculators 0.9.0 (the oracle), or written in z-lab's layout.

The library has no walk of its own (it scores candidates; `select` is unused there): `reference_walk` walks its
`CandidateSelector.select` left to right as vLLM's DFlash2 speculator does (greedy: best score, the chosen token is
the next predecessor).
"""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.oracle import speculators_blocks
from helpers.tiny_models import drafter_config, drafter_weights, write_drafter

BLOCK, MASK = 8, 95
# A window longer than any test sequence (prompt + output + block): the library's training mask (window before the
# anchor) and the served one (window around each query) then agree.
SLIDING = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64, "use_sliding_window": True}
# three taps (two shifted ones), 4 groups of 8 channels at hidden 32, 4 candidates of rank 8
OPTIONS = dict(conv_kernel_size=3, conv_group_size=8, selector_rank=8, selector_top_k=4)


def perturb(model, codebook_std: float = 0.6) -> None:
    """Every trainable weight off its init: convolutions off the identity (every tap), codebooks large enough that
    the bilinear term moves the argmax of the unary logits."""
    g = torch.Generator().manual_seed(3)
    rnd = lambda p, s: torch.randn(p.shape, generator=g) * s  # noqa: E731
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:  # the verifier's embedding and head
                continue
            if name.endswith("base_kernel"):  # [2, k, H]
                p.copy_(rnd(p, 0.3))
                p[:, 0] += 1
            elif name.endswith("kernel_projection.weight"):
                p.copy_(rnd(p, 0.1))
            elif "codebook" in name:
                p.copy_(rnd(p, codebook_std))
            elif p.dim() == 2:
                p.copy_(rnd(p, 0.2))
            else:
                p.copy_(1 + rnd(p, 0.1))


def library_dflash2(path: Path, verifier: Path, layer_config, **options) -> Path:
    """A DFlash2 speculator made by the library's training entry point and saved by it (aux ids [1, 3] are z-lab's
    target_layer_ids [0, 2])."""
    from speculators.models.dflash2 import DFlash2DraftModel

    torch.manual_seed(0)
    model = DFlash2DraftModel.from_training_args(
        verifier_config=layer_config, verifier_name_or_path=str(verifier), draft_vocab_size=layer_config.vocab_size,
        block_size=BLOCK, target_layer_ids=[1, 3], mask_token_id=MASK, draft_attn_impl="eager",
        **{**OPTIONS, **options})
    perturb(model)
    model.save_pretrained(str(path))
    return path


def library_blocks(path: Path, sequence: list[int], hf):
    """The library's forward over `sequence`, every position p < len - block an anchor whose block
    [token p, MASK...] sees the target's features before p -> (hidden [A, B, H], logits [A, B, V], its selector)."""
    from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig

    hidden, logits, model = speculators_blocks(DFlash2DraftModel, DFlash2SpeculatorConfig, path, sequence, hf)
    return hidden, logits, model.candidate_selector


@torch.no_grad()
def reference_walk(selector, logits: torch.Tensor, hidden: torch.Tensor, anchor: int) -> tuple[list[int], int]:
    """logits [n, V], hidden [n, H] of drafted slots 1..n -> (greedy drafts, how many differ from the unary argmax)."""
    prev, drafts, moved = torch.tensor(anchor), [], 0
    for j in range(len(logits)):
        candidates, scores = selector.select(logits[j], hidden[j], prev)  # [K] unary top-K, their scores
        prev = candidates[scores.argmax()]
        moved += int(prev != candidates[0])
        drafts.append(int(prev))
    return drafts, moved


def zlab_dflash2_config(vocab: int = 96, block_size: int = BLOCK, mask_token_id: int = MASK, **extra) -> dict:
    """z-lab's published DFlash2 layout (TensorRT-LLM PR #19159's fixture of a released config): the DFlash2 fields
    and block_size in dflash_config, top-level is_causal false, sliding layers."""
    cfg = drafter_config(block_size=block_size, mask_token_id=mask_token_id, vocab_size=vocab, **SLIDING)
    del cfg["block_size"], cfg["num_target_layers"]
    cfg["dflash_config"] = {"block_size": block_size, "mask_token_id": mask_token_id, "target_layer_ids": [0, 2],
                            **OPTIONS}
    cfg.update(architectures=["DFlash2DraftModel"], is_causal=False, **extra)
    return cfg


def dflash2_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """v1's tensors plus each layer's two convolutions and the selector, off the identity, under z-lab's names."""
    g = torch.Generator().manual_seed(seed + 100)
    h, vocab, d = cfg["hidden_size"], cfg["vocab_size"], cfg["dflash_config"]
    k, groups, r = d["conv_kernel_size"], h // d["conv_group_size"], d["selector_rank"]
    w = drafter_weights(cfg, seed)
    for layer in range(cfg["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            base = torch.randn(2, k, h, generator=g) * 0.3
            base[:, 0] += 1
            w[f"layers.{layer}.{conv}.base_kernel"] = base
            w[f"layers.{layer}.{conv}.kernel_projection.weight"] = torch.randn(2 * k * groups, h, generator=g) * 0.1
    w.update({"candidate_selector.hidden_projection.weight": torch.randn(r, h, generator=g) * 0.2,
              "candidate_selector.predecessor_codebook": torch.randn(vocab, r, generator=g) * 0.6,
              "candidate_selector.successor_codebook": torch.randn(vocab, r, generator=g) * 0.6})
    return w


def write_zlab_dflash2(path: Path, cfg: dict | None = None, seed: int = 0) -> Path:
    cfg = cfg or zlab_dflash2_config()
    return write_drafter(path, cfg, dflash2_weights(cfg, seed))
