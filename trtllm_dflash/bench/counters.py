"""The server's Prometheus counters, scraped before and after a point and differenced.

Acceptance comes from the difference over the point, never from the cumulative totals:
AL = 1 + d(accepted) / d(draft steps), acceptance rate = d(accepted) / d(drafted).
"""

from __future__ import annotations

import math
import re

# short name -> the Prometheus counter the dflash Triton model exports
COUNTERS = {
    "requests": "dflash_requests_total",
    "failed": "dflash_failed_requests_total",
    "generated_tokens": "dflash_generated_tokens_total",
    "draft_steps": "dflash_draft_steps_total",
    "drafted_tokens": "dflash_drafted_tokens_total",
    "accepted_tokens": "dflash_accepted_tokens_total",
    "decode_steps": "dflash_decode_steps_total",  # batch steps
    "plain_steps": "dflash_plain_steps_total",  # ... that drafted nothing
    "draft_len_sum": "dflash_step_draft_length_sum",  # the draft-length histogram's sum over batch steps
    "prefix_hit_tokens": "dflash_prefix_cache_hit_tokens_total",  # torch engines' paged KV pool (docs/paged-kv.md)
    "prefix_tokens": "dflash_prefix_cache_queried_tokens_total",
    "preemptions": "dflash_preemptions_total",
}
DRAFTER_INFO = "dflash_drafter_info"  # a gauge of 1 whose label `method` names the drafting method (or none)
METHOD_LABEL = re.compile(r'method="([^"]*)"')
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value, summed over label sets (one model or several)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            try:
                value = float(match.group(3))
            except ValueError:
                continue
            values[match.group(1)] = values.get(match.group(1), 0.0) + value
    return values


def drafter_method(text: str) -> str | None:
    """The drafting method a dflash server names in its metrics (dflash, dflash2, none); None when it names none."""
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1) == DRAFTER_INFO and match.group(2) and float(match.group(3)) == 1:
            method = METHOD_LABEL.search(match.group(2))
            if method:
                return method.group(1)
    return None


def snapshot(metrics: dict[str, float]) -> dict[str, float] | None:
    """Our counters out of a scrape; None when the server exports none of them."""
    found = {short: metrics[name] for short, name in COUNTERS.items() if name in metrics}
    return found or None


def difference(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """after - before per counter; None when either scrape is missing or a counter went down (a restart)."""
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in before if k in after}
    if any(v < 0 for v in delta.values()):
        return None
    return delta


def draft_lengths(delta: dict[str, float] | None) -> tuple[float | None, float | None]:
    """-> (mean draft length per batch step, share of plain steps) over the point; None where the server
    does not export them or took no step."""
    steps = (delta or {}).get("decode_steps", 0)
    if not steps or "draft_len_sum" not in delta or "plain_steps" not in delta:
        return None, None
    return delta["draft_len_sum"] / steps, delta["plain_steps"] / steps


def prefix_cache(delta: dict[str, float] | None) -> tuple[float | None, float | None]:
    """-> (share of prompt tokens whose KV came from the prefix cache, preemptions) over the point; None where the
    server does not export them (TensorRT-LLM engines) or looked up no prompt."""
    delta = delta or {}
    queried = delta.get("prefix_tokens", 0)
    hit_rate = delta["prefix_hit_tokens"] / queried if queried and "prefix_hit_tokens" in delta else None
    return hit_rate, delta.get("preemptions")


def acceptance(delta: dict[str, float] | None) -> tuple[float | None, float | None]:
    """-> (acceptance length, acceptance rate) over the point; None where no drafts were made."""
    if not delta:
        return None, None
    steps, drafted, accepted = (delta.get(k, math.nan) for k in ("draft_steps", "drafted_tokens", "accepted_tokens"))
    length = 1 + accepted / steps if steps > 0 and math.isfinite(accepted) else None
    rate = accepted / drafted if drafted > 0 and math.isfinite(accepted) else None
    return length, rate
