"""`dflash-bench tune`: a TensorRT-LLM `draft_len_schedule` from measured sweeps at fixed draft lengths.

Each input is a `dflash-bench sweep` run against a server that drafted a fixed number of tokens per
step (a torch engine served with `--draft-len K`, `--decoding plain` for 0, or a TensorRT-LLM engine
built with `max_draft_len` K). At every concurrency measured, the draft length with the highest
median output throughput wins (several runs of one K are repeats). At a fixed concurrency, higher
throughput is also higher per-user speed, so the winner is the better choice on both axes.

The schedule follows TensorRT-LLM's rules (draft_len_schedule.py): each measured concurrency is a
threshold (batch sizes up to it use its length; above the largest, speculation is off), the first
threshold's length is the engine's max_draft_len, and no later length exceeds it (a later winner
that does is capped, and said so).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..draft_length.policy import best_length
from ..draft_length.schedule import DraftLenSchedule
from ..utils.errors import DFlashError

THROUGHPUT = "output_throughput"  # output tokens/s over the point's wall time


@dataclass
class TuneTable:
    """tokens[(draft_len, concurrency)] = output tok/s of every repeat."""

    tokens: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    @property
    def draft_lens(self) -> list[int]:
        return sorted({k for k, _ in self.tokens})

    @property
    def concurrencies(self) -> list[int]:
        return sorted({c for _, c in self.tokens})

    def median(self, k: int, c: int) -> float | None:
        values = self.tokens.get((k, c))
        return statistics.median(values) if values else None

    def best(self, c: int) -> tuple[int, float]:
        """-> (draft length, median tok/s) of the fastest draft length at concurrency c, by the live policy's own
        rule (`best_length`: ties go to the shorter, and to plain)."""
        lens = [k for k in self.draft_lens if self.median(k, c) is not None]
        k = best_length(lens, [self.median(k, c) for k in lens])
        return k, self.median(k, c)


def parse_entry(entry: str) -> tuple[int | None, Path]:
    """'K=RUN_DIR' or 'RUN_DIR' (then the draft length comes from the run's own counters)."""
    match = re.fullmatch(r"(\d+)=(.+)", entry)
    return (int(match.group(1)), Path(match.group(2))) if match else (None, Path(entry))


def run_draft_len(run, where: str) -> int:
    """The fixed draft length a run's server used, from its draft-length counters (torch engines)."""
    means = {p.get("draft_len_mean") for p in run.points} - {None}
    if not means:
        raise DFlashError(f"{where}: the run does not say its draft length (no draft-length counters); "
                          f"name it as K={where}")
    if len(means) > 1 or abs(next(iter(means)) - round(next(iter(means)))) > 1e-9:
        raise DFlashError(f"{where}: the draft length varied during the run (means {sorted(means)}): tune needs "
                          "runs at a fixed draft length (dflash-serve --draft-len K)")
    return round(means.pop())


def read_table(entries: list[str]) -> TuneTable:
    from .report import load_run

    table = TuneTable()
    for entry in entries:
        k, path = parse_entry(entry)
        run = load_run(path)
        k = run_draft_len(run, str(path)) if k is None else k
        points = [p for p in run.points if p.get("concurrency") and p.get(THROUGHPUT) and not p.get("failed")]
        if not points:
            raise DFlashError(f"{path}: no fixed-concurrency point completed without failures")
        for p in points:
            table.tokens.setdefault((k, int(p["concurrency"])), []).append(float(p[THROUGHPUT]))
        table.sources.append(f"{k}={path}")
    return table


def schedule_from(table: TuneTable) -> tuple[DraftLenSchedule, list[str]]:
    """-> the schedule and notes (lengths capped by TensorRT-LLM's first-threshold rule)."""
    winners = [(c, table.best(c)[0]) for c in table.concurrencies]
    first = winners[0][1]
    notes = [f"concurrency {c}: {k} measured best, capped to max_draft_len {first} (TensorRT-LLM requires the "
             f"smallest threshold's length to be the largest)" for c, k in winners if k > first]
    steps = tuple((c, min(k, first)) for c, k in winners)
    source = "dflash-bench tune " + " ".join(table.sources)
    return DraftLenSchedule(steps, source), notes


def tune_table_markdown(table: TuneTable, schedule: DraftLenSchedule) -> str:
    """Median output tok/s per (concurrency, draft length), the winner, and its gain over plain and the longest."""
    lens = table.draft_lens
    lines = ["| concurrency | " + " | ".join(f"k={k}" for k in lens) + " | chosen k | vs k=0 | vs k=max |",
             "|---" * (len(lens) + 4) + "|"]
    chosen = dict(schedule.steps)
    for c in table.concurrencies:
        cells = [table.median(k, c) for k in lens]
        pick = table.median(chosen[c], c)
        ratio = lambda other: f"{pick / other:.2f}x" if other and pick else "n/a"  # noqa: E731
        lines.append(f"| {c} | " + " | ".join("n/a" if v is None else f"{v:.1f}" for v in cells)
                     + f" | {chosen[c]} | {ratio(table.median(0, c))} | {ratio(table.median(lens[-1], c))} |")
    return "\n".join(lines)
