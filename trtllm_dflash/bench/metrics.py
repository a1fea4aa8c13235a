"""Per-point statistics over the requests of one load point (definitions: shared/reference/benchmarking.md).

Latency statistics cover completed requests; throughput counts their tokens over the point's wall
time (first send to last finish, in s), the server's counts where it reports them. Names as the
field uses them (AIPerf 0.13 in brackets): TTFT (time_to_first_token), TPOT = (E2E - TTFT) / (OSL - 1)
(inter_token_latency, ITL), E2E (request_latency), inter-chunk latency (inter_chunk_latency), output
and total (input + output) tokens/s (output_token_throughput, total_token_throughput).
Interactivity statistics derive from the TPOT statistics: median interactivity = 1000 / median
TPOT(ms) (AIPerf's output_token_throughput_per_user is 1 / ITL per request), p99 interactivity =
1000 / p99 TPOT(ms), the slow tail (99% of requests are at least this interactive).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import counters
from .records import RequestRecord
from .spec import LoadPoint

PERCENTILES = {"median": 50, "p90": 90, "p99": 99}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between order statistics (numpy's default, as vLLM/SGLang report)."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def latency_stats(name: str, values_s: Sequence[float]) -> dict[str, float | None]:
    """{name}_ms_{median,p90,p99}, milliseconds."""
    return {f"{name}_ms_{k}": _ms(percentile(values_s, q)) for k, q in PERCENTILES.items()}


def wall_time(records: Sequence[RequestRecord]) -> float:
    """s from the first send to the last finish."""
    ends = [r.end for r in records if r.end is not None]
    return max(ends) - min(r.start for r in records) if ends else 0.0


def throughput(records: Sequence[RequestRecord], wall: float, num_gpus: int) -> dict[str, float | None]:
    done = [r for r in records if r.ok]
    out_tokens = sum(r.osl or 0 for r in done)
    in_tokens = sum(r.input_tokens for r in done)
    per_s = (lambda n: n / wall) if wall > 0 else (lambda n: None)
    total = per_s(in_tokens + out_tokens)
    output = per_s(out_tokens)
    return {
        "input_tokens": in_tokens, "output_tokens": out_tokens,
        "request_throughput": per_s(len(done)),  # requests/s
        "output_throughput": output, "total_throughput": total,  # tokens/s
        "output_throughput_per_gpu": output / num_gpus if output is not None else None,
        "total_throughput_per_gpu": total / num_gpus if total is not None else None,
    }


def response_acceptance(records: Sequence[RequestRecord]) -> float | None:
    """sum(accepted) / sum(drafted) over completed requests that reported both."""
    pairs = [(r.server["accepted_draft_tokens"], r.server["draft_tokens"]) for r in records
             if r.ok and "accepted_draft_tokens" in r.server and "draft_tokens" in r.server]
    drafted = sum(d for _, d in pairs)
    return sum(a for a, _ in pairs) / drafted if drafted else None


def error_pattern(message: str) -> str:
    """Messages that differ only in their numbers (a prompt length, a request id) are one kind of error."""
    return re.sub(r"\d+(\.\d+)?", "#", message)


def top_error(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The most common error of the point (its first message) and how many requests failed with it."""
    failed = [r.error for r in records if not r.ok]
    if not failed:
        return {"top_error": None, "top_error_count": 0}
    kind, count = Counter(map(error_pattern, failed)).most_common(1)[0]
    return {"top_error": next(m for m in failed if error_pattern(m) == kind), "top_error_count": count}


def summarize_point(point: LoadPoint, records: Sequence[RequestRecord], num_gpus: int,
                    counter_delta: dict[str, float] | None) -> dict[str, Any]:
    done = [r for r in records if r.ok]
    tpots = [r.tpot for r in done if r.tpot is not None]
    wall = wall_time(records)
    summary = {
        "point": point.name, "concurrency": point.concurrency, "request_rate": point.rate, "load": point.load,
        "num_gpus": num_gpus, "requests": len(records), "completed": len(done),
        "failed": len(records) - len(done), "timed_out": sum(r.error_kind == "timeout" for r in records),
        "osl_mismatches": sum(r.osl_mismatch for r in done), "isl_mismatches": sum(r.isl_mismatch for r in done),
        "tpot_undefined": len(done) - len(tpots),
        "duration_s": wall,
        **latency_stats("ttft", [r.ttft for r in done]), **latency_stats("tpot", tpots),
        **latency_stats("e2e", [r.e2e for r in done]),
        **latency_stats("inter_chunk_latency", [g for r in done for g in r.inter_chunk_latencies]),
        "tokens_per_chunk": _ratio(sum(r.osl or 0 for r in done), sum(len(r.chunk_times) for r in done)),
        **top_error(records),
    }
    summary["interactivity_median"] = _per_s(summary["tpot_ms_median"])
    summary["interactivity_p99"] = _per_s(summary["tpot_ms_p99"])
    summary.update(throughput(records, wall, num_gpus))
    length, rate = counters.acceptance(counter_delta)
    draft_len, plain_share = counters.draft_lengths(counter_delta)
    prefix_hit_rate, preemptions = counters.prefix_cache(counter_delta)
    summary.update({"acceptance_length": length, "acceptance_rate": rate, "draft_len_mean": draft_len,
                    "plain_step_share": plain_share, "prefix_hit_rate": prefix_hit_rate, "preemptions": preemptions,
                    "acceptance_rate_responses": response_acceptance(records), "counters": counter_delta})
    return summary


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _per_s(ms: float | None) -> float | None:
    return 1000.0 / ms if ms else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None
