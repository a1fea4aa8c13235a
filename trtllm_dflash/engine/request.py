"""What a caller asks for and what it gets back, with per-request statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sample.sampling import SamplingParams
from ..utils.errors import DFlashError


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop_ids: tuple[int, ...] | None = None  # None: the target's default stop tokens
    ignore_eos: bool = False  # never stop on a stop token (load tests: exactly max_new_tokens)

    def validate(self, vocab_size: int, max_positions: int) -> None:
        if not self.prompt_ids:
            raise DFlashError("empty prompt: at least one prompt token is required")
        bad = [t for t in self.prompt_ids if not 0 <= t < vocab_size]
        if bad:
            raise DFlashError(f"prompt token id {bad[0]} outside the vocabulary (vocab_size {vocab_size})")
        if self.max_new_tokens < 1:
            raise DFlashError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        self.check_length(max_positions, "the target's max_position_embeddings")

    def check_length(self, limit: int, name: str) -> None:
        """Prompt + output positions within `limit` (named in the message: whose limit it is)."""
        total = len(self.prompt_ids) + self.max_new_tokens
        if total > limit:
            raise DFlashError(f"prompt length {len(self.prompt_ids)} + max_new_tokens {self.max_new_tokens} = {total} "
                              f"exceeds {name} {limit}")


def pooled_tau(results: list[Result]) -> float:
    """Tokens per verify step over all steps of all results (nan when none verified)."""
    steps = [n for r in results for n in r.acceptance_lengths]
    return sum(steps) / len(steps) if steps else float("nan")


@dataclass
class Result:
    """Generated ids only (the prompt excluded), and how they were produced.

    acceptance_lengths: tokens emitted per verify step (accepted drafts + the target's own
    token, after truncation at a stop token or the length limit); the first token comes from
    prefill, so len(output_ids) == 1 + sum(acceptance_lengths).
    """

    output_ids: list[int] = field(default_factory=list)
    acceptance_lengths: list[int] = field(default_factory=list)
    finish_reason: str = ""  # "stop" | "length"
    prompt_tokens: int = 0
    start_s: float = 0.0  # monotonic clock, seconds
    first_token_s: float = 0.0
    finish_s: float = 0.0
    drafted_tokens: int = 0  # drafts proposed to the target
    accepted_tokens: int = 0  # drafts the target accepted
    draft_lengths: list[int] = field(default_factory=list)  # drafts per verify step (0: a plain step)

    @property
    def tau(self) -> float:
        """Mean tokens per verify step, bonus included (1.0 for plain decoding)."""
        steps = self.acceptance_lengths
        return sum(steps) / len(steps) if steps else 0.0

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.start_s

    @property
    def tpot_s(self) -> float:
        """(E2E - TTFT) / (OSL - 1), the field's definition; 0 for a single token."""
        n = len(self.output_ids)
        return (self.finish_s - self.first_token_s) / (n - 1) if n > 1 else 0.0

    @property
    def tokens_per_s(self) -> float:
        elapsed = self.finish_s - self.start_s
        return len(self.output_ids) / elapsed if elapsed > 0 else 0.0

    def summary(self) -> dict:
        return dict(output_ids=self.output_ids, acceptance_lengths=self.acceptance_lengths, tau=self.tau,
                    ttft_s=self.ttft_s, tpot_s=self.tpot_s, tokens_per_s=self.tokens_per_s,
                    finish_reason=self.finish_reason, prompt_tokens=self.prompt_tokens,
                    drafted_tokens=self.drafted_tokens, accepted_tokens=self.accepted_tokens,
                    draft_lengths=self.draft_lengths)
