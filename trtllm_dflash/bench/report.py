"""`dflash-bench report`: frontiers of one or more runs, throughput per GPU at fixed interactivity, plots,
and a Markdown report. `make_report(spec)` is what the CLI calls.

    report.md                     the report, embedding the PNGs
    table.csv, table.json         throughput per GPU at each interactivity level, per run, ratio to the baseline
    frontier.png                  throughput per GPU against interactivity, all points and each frontier
    ttft_vs_throughput.png        median TTFT against throughput per GPU
    acceptance_vs_concurrency.png acceptance length (server counters) against load
    plan_overlay.png              with --plan: each run's output-throughput frontier beside the plan's (overlay.py)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.errors import DFlashError
from . import overlay
from .frontier import AT_OR_ABOVE, ON_FRONTIER, Point, pareto_frontier, read_frontier
from .results import MANIFEST, SUMMARY_JSON, csv_text, utc_now, write_atomic
from .spec import ReportSpec

X, Y = "interactivity_median", "total_throughput_per_gpu"
NA = "n/a"


@dataclass
class Run:
    label: str
    dir: Path
    manifest: dict[str, Any]
    points: list[dict[str, Any]]
    status: str

    @property
    def frontier(self) -> list[Point]:
        return pareto_frontier((p.get(X), p.get(Y)) for p in self.points)


@dataclass
class Report:
    dir: Path
    baseline: str
    rows: list[dict[str, Any]]  # interactivity, label, throughput_per_gpu, ratio_to_baseline (None: n/a)
    files: list[Path] = field(default_factory=list)
    plan: Any = None  # overlay.Plan with --plan
    overlay: list[dict[str, Any]] = field(default_factory=list)  # overlay.overlay_rows


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise DFlashError(f"not a dflash-bench run directory (no {MANIFEST}): {path}")
    manifest, summary = read_json(path / MANIFEST), read_json(path / SUMMARY_JSON)
    points = summary.get("points")
    if not isinstance(points, list):
        raise DFlashError(f"{path / SUMMARY_JSON}: no 'points' list")
    return Run(str(manifest.get("label") or path.name), path, manifest, points, str(manifest.get("status")))


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DFlashError(f"missing {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DFlashError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DFlashError(f"{path}: expected a JSON object")
    return data


def load_runs(dirs: tuple[str, ...]) -> list[Run]:
    runs = [load_run(d) for d in dirs]
    seen: dict[str, Path] = {}
    for run in runs:
        if run.label in seen:
            raise DFlashError(f"two runs share the label {run.label!r} ({seen[run.label]}, {run.dir}): "
                              "label runs apart with dflash-bench sweep --label")
        seen[run.label] = run.dir
    return runs


def headline(runs: list[Run], levels: tuple[float, ...], baseline: str, method: str) -> list[dict[str, Any]]:
    """Throughput per GPU read off each run's frontier at each level, with how it was read (`basis`); ratio
    to the baseline run's, only where the baseline's value is on its frontier (a lower bound over a lower
    bound bounds nothing). A ratio is itself a lower bound when the run's value is."""
    readings = {run.label: read_frontier(run.frontier, levels, method) for run in runs}
    rows = []
    for i, level in enumerate(levels):
        base, base_basis = readings[baseline][i]
        for run in runs:
            value, basis = readings[run.label][i]
            ratio = value / base if value is not None and base and base_basis == ON_FRONTIER else None
            rows.append({"interactivity": level, "label": run.label, "throughput_per_gpu": value, "basis": basis,
                         "ratio_to_baseline": ratio})
    return rows


def make_report(spec: ReportSpec) -> Report:
    from . import plots

    runs = load_runs(spec.runs)
    labels = [r.label for r in runs]
    baseline = spec.baseline or labels[0]
    if baseline not in labels:
        raise DFlashError(f"--baseline: no run is labelled {baseline!r} (labels: {', '.join(labels)})")
    out = Path(spec.output)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, baseline, headline(runs, spec.interactivity, baseline, spec.interpolation))
    if spec.plan:
        report.plan = overlay.load_plan(spec.plan)
        report.overlay = overlay.overlay_rows(runs, report.plan, spec.interactivity, spec.interpolation)
        report.files.append(overlay.overlay_png(out / "plan_overlay.png", runs, report.plan, spec.interactivity,
                                                spec.interpolation))
    report.files += write_table(out, report, runs, spec)
    report.files += plots.write_all(out, runs, spec.interactivity, spec.interpolation)
    write_atomic(out / "report.md", markdown(report, runs, spec))
    report.files.append(out / "report.md")
    return report


def write_table(out: Path, report: Report, runs: list[Run], spec: ReportSpec) -> list[Path]:
    shown = [{k: (NA if v is None else v) for k, v in row.items()} for row in report.rows]
    write_atomic(out / "table.csv", csv_text(shown))
    data = {"metric": "total-token throughput per GPU (tok/s/GPU) on the Pareto frontier, at median interactivity "
                      "(tok/s/user); basis 'frontier': read off the frontier (interpolated between measured points), "
                      "'at_or_above': below the lowest measured interactivity, the best throughput measured at or "
                      "above the level (a lower bound, as is its ratio); null: the run never reaches that interactivity",
            "interpolation": spec.interpolation, "baseline": report.baseline, "levels": list(spec.interactivity),
            "rows": report.rows, "frontiers": {r.label: r.frontier for r in runs},
            "runs": {r.label: str(r.dir) for r in runs}}
    if report.plan:
        data["plan_overlay"] = {"plan": str(report.plan.path), "metric": "output tok/s/GPU at median interactivity, "
                                "each run's and each plan method's frontier", "rows": report.overlay,
                                "frontiers": report.plan.fronts, "input_mismatches": overlay.mismatches(runs, report.plan)}
    write_atomic(out / "table.json", json.dumps(data, indent=2) + "\n")
    return [out / "table.csv", out / "table.json"]


def fmt(value: float | None, spec: str = ".1f") -> str:
    return NA if value is None else format(value, spec)


INTRO = ("The headline throughput per GPU is total-token (input + output) throughput divided by the GPUs serving "
         "(output-token throughput per GPU is in the point tables); interactivity is 1000 / TPOT(ms) of the point's "
         "median TPOT, TPOT = (E2E - TTFT) / (OSL - 1), which AIPerf and vLLM call inter-token latency (ITL); the "
         "gaps between streamed chunks are the inter-chunk latency, a diagnostic.")
PLOTS = ["![frontier](frontier.png)", "![TTFT against throughput](ttft_vs_throughput.png)",
         "![acceptance length against load](acceptance_vs_concurrency.png)"]


def markdown(report: Report, runs: list[Run], spec: ReportSpec) -> str:
    note = (f"tok/s/GPU read off each run's Pareto frontier ({spec.interpolation} interpolation, never "
            f"extrapolated); ≥: below the run's lowest measured interactivity, the best throughput it measured at "
            f"or above the level (a lower bound, not interpolated); in brackets the ratio to `{report.baseline}`, or why "
            f"there is none; {NA}: the run never reaches that interactivity.")
    sections = [
        ["# dflash-bench report", f"Generated {utc_now()} from {len(runs)} run(s). {INTRO}"],
        ["## Runs", runs_table(runs)],
        ["## Throughput per GPU at fixed interactivity", headline_table(report, runs), note, *PLOTS],
        ["## Points"] + [f"### {run.label}\n\n{points_table(run.points)}" for run in runs],
    ]
    if report.plan:
        sections.insert(3, ["## Beside the plan", overlay.overlay_markdown(report.overlay, report.plan, runs),
                            "![measured beside the plan](plan_overlay.png)"])
    return "\n\n".join(block for section in sections for block in section) + "\n"


def runs_table(runs: list[Run]) -> str:
    lines = ["| label | status | API | model | drafter | ISL / OSL | GPUs | engine manifest | directory |",
             "|---" * 9 + "|"]
    for run in runs:
        s, engine = run.manifest.get("settings", {}), run.manifest.get("engine") or {}
        shape = f"dataset {Path(s['dataset']).name}" if s.get("dataset") else f"{s.get('isl')} / {s.get('osl')}"
        digest = engine.get("manifest_sha256", "")[:12] or NA
        method = run.manifest.get("drafter_method") or NA  # the server's dflash_drafter_info metric
        lines.append(f"| {run.label} | {run.status} | {s.get('api')} | {s.get('model')} | {method} | {shape} | "
                     f"{run.manifest.get('num_gpus')} | {digest} | `{run.dir}` |")
    return "\n".join(lines)


def headline_table(report: Report, runs: list[Run]) -> str:
    labels = [r.label for r in runs]
    lines = ["| interactivity (tok/s/user) | " + " | ".join(f"{label}: total tok/s/GPU" for label in labels) + " |",
             "|---" * (len(labels) + 1) + "|"]
    by_level: dict[float, list[str]] = {}
    base = {row["interactivity"]: row for row in report.rows if row["label"] == report.baseline}
    for row in report.rows:
        bound = "≥ " if row["basis"] == AT_OR_ABOVE else ""
        cell = bound + fmt(row["throughput_per_gpu"])
        if row["label"] != report.baseline and row["throughput_per_gpu"] is not None:
            ratio = row["ratio_to_baseline"]
            cell += f" ({bound}{ratio:.2f}x)" if ratio is not None else f" ({no_ratio(base[row['interactivity']])})"
        by_level.setdefault(row["interactivity"], []).append(cell)
    lines += [f"| {level:g} | " + " | ".join(cells) + " |" for level, cells in by_level.items()]
    return "\n".join(lines)


def no_ratio(base: dict[str, Any]) -> str:
    """Why a run's value has no ratio to the baseline's at this level, in words."""
    if base["throughput_per_gpu"] is None:
        return f"no ratio: {base['label']} never reaches this interactivity"
    return f"no ratio: {base['label']} has only a lower bound here"


POINT_COLUMNS = [  # header, summary keys (shown "a / b"), format
    ("point", ("point",), "s"), ("ok / sent", ("completed", "requests"), "d"),
    ("TTFT p50 / p99 ms", ("ttft_ms_median", "ttft_ms_p99"), ".1f"),
    ("TPOT (ITL) p50 / p99 ms", ("tpot_ms_median", "tpot_ms_p99"), ".2f"),
    ("inter-chunk p50 ms", ("inter_chunk_latency_ms_median",), ".2f"),
    ("interactivity p50 / p99", ("interactivity_median", "interactivity_p99"), ".1f"),
    ("tok/s/GPU (total / output)", (Y, "output_throughput_per_gpu"), ".1f"),
    ("AL (counters)", ("acceptance_length",), ".2f"),
    ("acceptance (counters / responses)", ("acceptance_rate", "acceptance_rate_responses"), ".3f"),
    ("draft length mean / plain-step share", ("draft_len_mean", "plain_step_share"), ".2f"),
    ("prefix hit rate (tokens) / preemptions", ("prefix_hit_rate", "preemptions"), ".2f"),
]


def points_table(points: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(c[0] for c in POINT_COLUMNS) + " |", "|---" * len(POINT_COLUMNS) + "|"]
    for p in points:
        cells = [" / ".join(fmt(p.get(k), spec) for k in keys) for _, keys, spec in POINT_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
