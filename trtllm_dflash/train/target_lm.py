"""Pre-train the built-in pair's small Qwen3 target on the stdlib corpus (next-token prediction).

The model is transformers' own Qwen3ForCausalLM, saved with `save_pretrained`: the target is a
plain Hugging Face checkpoint that the runtime loads like any published one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..utils.errors import DFlashError
from .corpus import SourceFile
from .schedule import warmup_cosine


@dataclass(frozen=True)
class TargetShape:
    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 2048

    def hf_config(self, eos_id: int):
        from transformers import Qwen3Config

        return Qwen3Config(**self.__dict__, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                           eos_token_id=eos_id, bos_token_id=eos_id, pad_token_id=eos_id, dtype="float32")


@dataclass(frozen=True)
class PretrainConfig:
    seq_len: int = 256
    batch: int = 16  # sequences per step
    steps: int = 1500
    lr: float = 2e-3
    warmup: int = 60
    weight_decay: float = 0.1
    seed: int = 0

    def __post_init__(self):
        for name in ("seq_len", "batch", "steps"):
            if getattr(self, name) < 1:
                raise DFlashError(f"{name} must be at least 1, got {getattr(self, name)}")


def token_stream(files: list[SourceFile], tokenizer) -> torch.Tensor:
    """Every file's tokens followed by EOS, concatenated -> [T] int64."""
    ids: list[int] = []
    for f in files:
        ids.extend(tokenizer(f.text, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def pretrain(stream: torch.Tensor, shape: TargetShape, cfg: PretrainConfig, eos_id: int, log=print, model=None):
    """-> the trained transformers model (eval mode) and its per-step losses. `model`: any transformers
    causal LM to train instead of the Qwen3 of `shape` (MoE ones, as a one-off MoE drafter run did)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(cfg.seed)
    model = model if model is not None else Qwen3ForCausalLM(shape.hf_config(eos_id))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: warmup_cosine(i, cfg.warmup, cfg.steps, floor=0.1))
    g = torch.Generator().manual_seed(cfg.seed)
    losses, t0 = [], time.time()
    model.train()
    for step in range(cfg.steps):
        starts = torch.randint(0, len(stream) - cfg.seq_len - 1, (cfg.batch,), generator=g)
        batch = torch.stack([stream[s:s + cfg.seq_len] for s in starts.tolist()])  # [batch, seq_len]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == cfg.steps - 1:
            recent = sum(losses[-20:]) / len(losses[-20:])
            log(f"target step {step + 1}/{cfg.steps} loss {recent:.3f} ({time.time() - t0:.0f} s)")
    return model.eval(), losses


def save_target(model, tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
