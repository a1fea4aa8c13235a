"""A `dflash-bench plan` projection beside measured sweeps in `dflash-bench report --plan`.

The comparison is in output tokens/s per GPU, the plan's own metric (its frontier: plan.json `frontier`, one list
a method), against each run's frontier of (median interactivity, `output_throughput_per_gpu`): the report's
headline is total (input + output) throughput, which the plan does not project. Both frontiers are read at the
report's levels the same way (frontier.read_frontier: interpolated inside, a lower bound below, n/a above).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..utils.errors import DFlashError
from .frontier import AT_OR_ABOVE, Point, pareto_frontier, read_frontier

if TYPE_CHECKING:
    from .report import Run

X, Y = "interactivity_median", "output_throughput_per_gpu"
PLAN_FORMAT = "dflash-plan/1"  # bench/plan/__init__.py FORMAT (not imported: the report must not need the extra)


@dataclass
class Plan:
    path: Path
    inputs: dict[str, Any]
    provenance: dict[str, Any]
    fronts: dict[str, list[Point]]  # method -> (tok/s/user, output tok/s/GPU), by rising interactivity

    @property
    def label(self) -> str:
        return f"plan {self.inputs.get('target')} on {self.inputs.get('gpus')} x {self.provenance.get('system')}"


def load_plan(where: str | Path) -> Plan:
    """A plan directory (its plan.json) or the plan.json itself."""
    path = Path(where)
    path = path / "plan.json" if path.is_dir() else path
    if not path.is_file():
        raise DFlashError(f"--plan: no plan.json at {where}")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise DFlashError(f"--plan: {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT or not isinstance(data.get("frontier"), dict):
        raise DFlashError(f"--plan: {path} is not a dflash-bench plan ({PLAN_FORMAT} with a 'frontier')")
    fronts = {name: pareto_frontier((p["tok_s_user"], p["tok_s_gpu"]) for p in entries)
              for name, entries in data["frontier"].items()}
    return Plan(path, data.get("inputs") or {}, data.get("provenance") or {}, fronts)


def measured_front(run: Run) -> list[Point]:
    return pareto_frontier((p.get(X), p.get(Y)) for p in run.points)


def overlay_rows(runs: list[Run], plan: Plan, levels: tuple[float, ...], method: str) -> list[dict[str, Any]]:
    """Per level: each run's and each plan method's output tok/s/GPU, with how it was read."""
    curves = [(run.label, "measured", measured_front(run)) for run in runs]
    curves += [(f"plan: {name}", "plan", front) for name, front in plan.fronts.items()]
    readings = {label: read_frontier(front, levels, method) for label, _kind, front in curves}
    return [{"interactivity": level, "label": label, "kind": kind, "output_tok_s_gpu": readings[label][i][0],
             "basis": readings[label][i][1]} for i, level in enumerate(levels) for label, kind, _f in curves]


def mismatches(runs: list[Run], plan: Plan) -> list[str]:
    """Where the plan's inputs differ from a run's settings: said beside the table, not hidden."""
    notes = []
    for run in runs:
        settings = run.manifest.get("settings") or {}
        for key in ("isl", "osl"):
            if settings.get(key) is not None and settings.get(key) != plan.inputs.get(key):
                notes.append(f"{run.label}: {key.upper()} {settings.get(key)}, the plan's {plan.inputs.get(key)}")
        if run.manifest.get("num_gpus") not in (None, plan.inputs.get("gpus")):
            notes.append(f"{run.label}: {run.manifest.get('num_gpus')} GPUs, the plan's {plan.inputs.get('gpus')}")
    return notes


def overlay_markdown(rows: list[dict[str, Any]], plan: Plan, runs: list[Run]) -> str:
    labels = list(dict.fromkeys(r["label"] for r in rows))
    lines = ["| interactivity (tok/s/user) | " + " | ".join(f"{label}: output tok/s/GPU" for label in labels) + " |",
             "|---" * (len(labels) + 1) + "|"]
    by_level: dict[float, list[str]] = {}
    for r in rows:
        value = r["output_tok_s_gpu"]
        cell = "n/a" if value is None else ("≥ " if r["basis"] == AT_OR_ABOVE else "") + f"{value:.1f}"
        by_level.setdefault(r["interactivity"], []).append(cell)
    lines += [f"| {level:g} | " + " | ".join(cells) + " |" for level, cells in by_level.items()]
    source = (f"Projection `{plan.path}` ({plan.label}; {plan.provenance.get('database')}; acceptance "
              f"{plan.provenance.get('acceptance')}): output tokens/s per GPU, both read off their frontiers as the "
              f"headline is; a projection of another machine is not a measurement of this one.")
    notes = mismatches(runs, plan)
    return "\n\n".join([source, "\n".join(lines)] + ([f"Inputs differ: {'; '.join(notes)}."] if notes else []))


def overlay_png(path: Path, runs: list[Run], plan: Plan, levels: tuple[float, ...], method: str) -> Path:
    import numpy as np

    from .frontier import curve
    from .plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = [(run.label, measured_front(run), "-", f"C{i}") for i, run in enumerate(runs)]
    styles += [(f"plan: {name}", front, "--", f"C{len(runs) + i}") for i, (name, front) in enumerate(plan.fronts.items())]
    for label, front, line, color in styles:
        if len(front) > 1:
            xs = np.linspace(front[0][0], front[-1][0], 200)
            ax.plot(xs, curve(front, method)(xs), line, color=color)
        if front:
            ax.plot(*zip(*front), "o" if line == "-" else "s", color=color, label=label, fillstyle="full" if
                    line == "-" else "none")
    for level in levels:
        ax.axvline(level, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("interactivity (tok/s/user)")
    ax.set_ylabel("throughput per GPU (output tok/s/GPU)")
    ax.set_title(f"measured (solid) beside {plan.label} (dashed)", fontsize="small")
    return save(fig, ax, path, None if any(f for _l, f, _s, _c in styles) else "no frontier points")
