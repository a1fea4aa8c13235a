"""Per-request sampling parameters and the token distributions they define."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import DFlashError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 means no top-k; seed None means nondeterministic."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise DFlashError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DFlashError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DFlashError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self) -> torch.Generator:
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


@dataclass
class SamplingBatch:
    """Per-row sampling settings for one step: [B] tensors plus one CPU generator per row."""

    temperature: torch.Tensor  # [B] fp32; 0 = greedy
    top_p: torch.Tensor  # [B]
    top_k: torch.Tensor  # [B] long; 0 = off
    generators: list[torch.Generator]
    all_greedy: bool  # known on the host, so the greedy fast paths need no device sync

    @classmethod
    def of(cls, params: list[SamplingParams], generators: list[torch.Generator], device) -> SamplingBatch:
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            generators=generators,
            all_greedy=all(p.greedy for p in params),
        )


def token_probs(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits [B, T, V] -> probabilities [B, T, V] (fp32).

    Greedy rows get the one-hot of the argmax, so greedy and sampled rows share one acceptance
    rule and greedy stays exact (first index on ties, as `torch.argmax` and `transformers` do).
    """
    logits = logits.float()
    greedy = sb.temperature == 0
    temp = torch.where(greedy, 1.0, sb.temperature)[:, None, None]
    sorted_logits, order = torch.sort(logits / temp, dim=-1, descending=True)
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device)
    k = torch.where(sb.top_k > 0, sb.top_k.clamp(max=vocab), vocab)[:, None, None]
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    # top-p keeps the smallest prefix whose mass reaches p (the first token always stays).
    keep = (sorted_probs.cumsum(-1) - sorted_probs) < sb.top_p[:, None, None]
    sorted_probs = sorted_probs * keep
    sorted_probs = sorted_probs / sorted_probs.sum(-1, keepdim=True)
    probs = torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), vocab).float()
    return torch.where(greedy[:, None, None], one_hot, probs)


def sample_rows(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """probs [B, T, V] -> tokens [B, T]; row b draws from generators[b] (host sync per row)."""
    rows = [torch.multinomial(p.cpu(), 1, generator=g)[:, 0] for p, g in zip(probs, generators)]
    return torch.stack(rows).to(probs.device)


def uniform_rows(shape_t: int, generators: list[torch.Generator], device) -> torch.Tensor:
    """[B, shape_t] uniforms in [0, 1), row b from generators[b]."""
    return torch.stack([torch.rand(shape_t, generator=g) for g in generators]).to(device)
