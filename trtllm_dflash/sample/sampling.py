"""Per-request sampling parameters, the token distributions they define, and on-device sampling.

Random numbers are counter-based: every uniform is a hash of (the request's key, the step counter,
the draw's purpose, its lane), computed with integer tensor ops on the logits' device. So sampling
needs no host loop, no generator objects and no copies; a seeded request draws the same numbers
whatever else shares its batch (reproducible per request); and a step can be captured in a CUDA
graph (the counters are tensors). Tokens are drawn by inverting each row's CDF with one uniform.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from ..utils.errors import DFlashError

MASK32 = 0xFFFFFFFF
# Purposes: one stream of uniforms each, so no two draws of one step share a number.
FIRST, PROPOSE, ACCEPT, BONUS = range(4)


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

    @property
    def filtered(self) -> bool:
        """top-k or top-p asks for the sorted path."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1)

    def key(self) -> int:
        """The request's 32-bit random key: from the seed (any int), or fresh entropy without one."""
        if self.seed is None:
            return secrets.randbits(32)
        s = self.seed & 0xFFFFFFFFFFFFFFFF
        return (s ^ (s >> 32)) & MASK32


@dataclass
class SamplingBatch:
    """Per-row sampling settings for one pass, [B] tensors on the model's device, and host flags
    (known without a device sync) that pick the fast paths."""

    temperature: torch.Tensor  # [B] fp32; 0 = greedy
    top_p: torch.Tensor  # [B] fp32
    top_k: torch.Tensor  # [B] long; 0 = off
    keys: torch.Tensor  # [B] long, the requests' 32-bit random keys, hashed once (`of`): uniforms' first round
    counters: torch.Tensor  # [B] long, the rows' step counters (a stream of uniforms per step)
    all_greedy: bool
    any_greedy: bool
    filtered: bool  # some row uses top-k / top-p

    @classmethod
    def of(cls, params: list[SamplingParams], keys: list[int], counters: torch.Tensor) -> SamplingBatch:
        device = counters.device
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            keys=_mix32(torch.tensor(keys, dtype=torch.long, device=device)),
            counters=counters,
            **cls.flags(params),
        )

    @staticmethod
    def flags(params: list[SamplingParams]) -> dict[str, bool]:
        """The host flags of a batch of these settings."""
        return {"all_greedy": all(p.greedy for p in params), "any_greedy": any(p.greedy for p in params),
                "filtered": any(p.filtered for p in params)}

    def rows(self, index, params: list[SamplingParams]) -> SamplingBatch:
        """Rows `index` (a slice or a [B] long tensor) of this per-slot table, for requests of settings `params`
        (their flags: known on the host)."""
        return SamplingBatch(self.temperature[index], self.top_p[index], self.top_k[index], self.keys[index],
                             self.counters[index], **self.flags(params))

    def move(self, src: int, dst: int) -> None:
        """Per-slot table: slot src's settings to slot dst (a request changes slot; counters are the table's own)."""
        for name in ("temperature", "top_p", "top_k", "keys"):
            tensor = getattr(self, name)
            tensor[dst] = tensor[src]

    def write(self, index: torch.Tensor, rows: SamplingBatch) -> None:
        """Per-slot table: the settings of `rows` into slots `index` [B] (the counters are the table's own)."""
        for name in ("temperature", "top_p", "top_k", "keys"):
            getattr(self, name)[index] = getattr(rows, name)


def token_probs(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits [B, T, V] -> probabilities [B, T, V] (fp32).

    Greedy rows get the one-hot of the argmax (written in place), so greedy and sampled rows share
    one acceptance rule and greedy stays exact (first index on ties, as `torch.argmax` and
    `transformers` do). The vocabulary is sorted only when some row asks for top-k or top-p.
    """
    logits = logits.float()
    greedy = (sb.temperature == 0)[:, None, None]
    scaled = logits / torch.where(greedy, 1.0, sb.temperature[:, None, None])
    probs = _filtered_probs(scaled, sb) if sb.filtered else torch.softmax(scaled, dim=-1)
    if sb.any_greedy:
        best = logits.argmax(-1, keepdim=True)  # [B, T, 1]
        probs.masked_fill_(greedy, 0.0).scatter_(-1, best, torch.where(greedy, 1.0, probs.gather(-1, best)))
    return probs


def _filtered_probs(scaled: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    vocab = scaled.shape[-1]
    rank = torch.arange(vocab, device=scaled.device)
    k = torch.where(sb.top_k > 0, sb.top_k.clamp(max=vocab), vocab)[:, None, None]
    sorted_probs = torch.softmax(sorted_logits.masked_fill(rank >= k, float("-inf")), dim=-1)
    # top-p keeps the smallest prefix whose mass reaches p (the first token always stays).
    keep = (sorted_probs.cumsum(-1) - sorted_probs) < sb.top_p[:, None, None]
    sorted_probs = sorted_probs * keep
    sorted_probs = sorted_probs / sorted_probs.sum(-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2^32 for x in [0, 2^32) in two int64 ops and no overflow: a constant c >= 2^31 is replaced by
    # c - 2^32, which is the same mod 2^32, so |x * c| < 2^63; & keeps the low 32 bits (two's complement)
    return (x * (c - (1 << 32) if c >= 1 << 31 else c)) & MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32: full avalanche), on int64 tensors in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniforms(sb: SamplingBatch, purpose: int, t: int) -> torch.Tensor:
    """[B, t] uniforms in [0, 1) (fp64, 32 random bits: finer than float32's 24 that samplers commonly draw),
    row b from (keys[b], counters[b], purpose, lane): two hash rounds, the step's then the lane's, about 25
    small integer ops (every op counts: at batch 1 on a CPU they cost more than the softmax and the draw)."""
    lane = torch.arange(purpose << 16, (purpose << 16) + t, device=sb.keys.device)  # purposes: disjoint lanes
    h = _mix32(sb.keys ^ (sb.counters & MASK32))[:, None]
    return _mix32(h ^ lane).double() * 2.0 ** -32


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs [B, T, V] (rows need not sum to 1), u [B, T] uniforms -> tokens [B, T]: the first index
    whose cumulative mass exceeds u times the row's total (zero-probability tokens are never drawn)."""
    cdf = probs.cumsum(-1)
    total = cdf[..., -1]
    # strictly below the total, so the first larger entry is a token with mass
    target = torch.minimum((u * total.double()).to(cdf.dtype), torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target[..., None], right=True)[..., 0].clamp_(max=probs.shape[-1] - 1)
