"""DFlash against plain decoding over repeated sweeps: the ratio at each interactivity, as a median with
its spread, so one noisy run is not read as the result.

Each repeat is one sweep of each decoding, run back to back (alternating which goes first); its ratio at a
level is read as `dflash-bench report` reads one pair of runs (report.headline). Across repeats: the median
of the ratios where both runs reach the level, their min and max, and in how many repeats that was.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from .frontier import AT_OR_ABOVE
from .report import Run, headline
from .results import write_atomic


def ratio_rows(pairs: list[tuple[Run, Run]], levels: tuple[float, ...], method: str = "pchip") -> list[dict[str, Any]]:
    """pairs: (candidate run, baseline run) per repeat -> one row per level."""
    readings = [headline([cand, base], levels, base.label, method) for cand, base in pairs]
    rows = []
    for i, level in enumerate(levels):
        per_repeat = [next(r for r in rows_ if r["interactivity"] == level and r["label"] == cand.label)
                      for rows_, (cand, _) in zip(readings, pairs)]
        ratios = [r["ratio_to_baseline"] for r in per_repeat]
        measured = [x for x in ratios if x is not None]
        rows.append({
            "interactivity": level, "ratios": ratios, "repeats_measured": len(measured), "repeats": len(pairs),
            "median": statistics.median(measured) if measured else None,
            "min": min(measured) if measured else None, "max": max(measured) if measured else None,
            # a ratio read below a run's lowest measured interactivity is a lower bound; so is a median of them
            "lower_bound": any(r["basis"] == AT_OR_ABOVE for r, x in zip(per_repeat, ratios) if x is not None),
        })
    return rows


def markdown(rows: list[dict[str, Any]], candidate: str, baseline: str) -> str:
    lines = [f"| interactivity (tok/s/user) | {candidate} ÷ {baseline}: median (min–max) | repeats measured |",
             "|---|---|---|"]
    for row in rows:
        if row["median"] is None:
            cell = "n/a"
        else:
            bound = "≥ " if row["lower_bound"] else ""
            cell = f"{bound}{row['median']:.2f}x ({row['min']:.2f}–{row['max']:.2f})"
        lines.append(f"| {row['interactivity']:g} | {cell} | {row['repeats_measured']} of {row['repeats']} |")
    return "\n".join(lines)


def write(out: Path, rows: list[dict[str, Any]], candidate: str, baseline: str, settings: dict) -> str:
    text = markdown(rows, candidate, baseline)
    write_atomic(out / "repeats.json", json.dumps({"candidate": candidate, "baseline": baseline,
                                                   "settings": settings, "rows": rows}, indent=2) + "\n")
    write_atomic(out / "repeats.md", f"# {candidate} ÷ {baseline} over {rows[0]['repeats'] if rows else 0} "
                                     f"repeats\n\n{text}\n")
    return text
