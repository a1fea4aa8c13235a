"""DFlash against plain decoding on the same prompts: tau, speed, and a token-for-token check."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from ..engine.generator import Generator
from ..engine.request import Request, Result, pooled_tau


@dataclass
class MethodSummary:
    method: str
    requests: int
    output_tokens: int
    tau: float  # mean tokens per verify step over all steps of all requests
    tokens_per_s: float  # output tokens / wall time, batch 1, summed over requests
    median_ttft_ms: float
    median_tpot_ms: float


@dataclass
class Comparison:
    dflash: MethodSummary
    plain: MethodSummary
    identical_outputs: bool  # greedy: every request's tokens equal plain decoding's

    @property
    def speedup(self) -> float:
        return self.dflash.tokens_per_s / self.plain.tokens_per_s

    def to_dict(self) -> dict:
        return {"dflash": asdict(self.dflash), "plain": asdict(self.plain),
                "identical_outputs": self.identical_outputs, "speedup": self.speedup}

    def table(self) -> str:
        rows = [f"{'method':<8} {'tau':>6} {'tok/s':>9} {'TTFT ms':>9} {'TPOT ms':>9}"]
        for s in (self.plain, self.dflash):
            rows.append(f"{s.method:<8} {s.tau:>6.2f} {s.tokens_per_s:>9.1f} {s.median_ttft_ms:>9.2f} "
                        f"{s.median_tpot_ms:>9.2f}")
        rows.append(f"speedup {self.speedup:.2f}x; outputs identical: {self.identical_outputs}")
        return "\n".join(rows)


def run_one_by_one(gen: Generator, requests: list[Request], block: int | None = None) -> list[Result]:
    gen.generate(requests[:1], block)  # warm-up, excluded
    return [gen.generate([r], block)[0] for r in requests]


def summarize(method: str, results: list[Result]) -> MethodSummary:
    tokens = sum(len(r.output_ids) for r in results)
    wall = sum(r.finish_s - r.start_s for r in results)
    return MethodSummary(method, len(results), tokens, pooled_tau(results), tokens / wall,
                         1e3 * statistics.median(r.ttft_s for r in results),
                         1e3 * statistics.median(r.tpot_s for r in results))


def compare(dflash: Generator, plain: Generator, requests: list[Request], block: int | None = None) -> Comparison:
    spec = run_one_by_one(dflash, requests, block)
    base = run_one_by_one(plain, requests)
    same = all(a.output_ids == b.output_ids for a, b in zip(spec, base))
    return Comparison(summarize("dflash", spec), summarize("plain", base), same)
