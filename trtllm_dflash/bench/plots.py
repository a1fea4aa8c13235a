"""The report's PNGs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .frontier import curve

if TYPE_CHECKING:
    from .report import Run

X, Y = "interactivity_median", "total_throughput_per_gpu"
DPI = 120


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_all(out: Path, runs: list[Run], levels: tuple[float, ...], method: str) -> list[Path]:
    return [frontier_png(out / "frontier.png", runs, levels, method),
            ttft_png(out / "ttft_vs_throughput.png", runs),
            acceptance_png(out / "acceptance_vs_concurrency.png", runs)]


def save(fig, ax, path: Path, empty_note: str | None) -> Path:
    if empty_note:
        ax.text(0.5, 0.5, empty_note, ha="center", va="center", transform=ax.transAxes)
    elif ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def frontier_png(path: Path, runs: list[Run], levels: tuple[float, ...], method: str) -> Path:
    import numpy as np

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for i, run in enumerate(runs):
        color = f"C{i}"
        pts = [(p[X], p[Y]) for p in run.points if p.get(X) is not None and p.get(Y) is not None]
        if not pts:
            continue
        drawn = True
        ax.scatter(*zip(*pts), color=color, alpha=0.35, s=18)
        front = run.frontier
        if len(front) > 1:
            xs = np.linspace(front[0][0], front[-1][0], 200)
            ax.plot(xs, curve(front, method)(xs), color=color)
        ax.plot(*zip(*front), "o", color=color, label=run.label)
    for level in levels:
        ax.axvline(level, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("interactivity (tok/s/user, median)")
    ax.set_ylabel("throughput per GPU (total tok/s/GPU)")
    ax.set_title("Pareto frontier")
    return save(fig, ax, path, None if drawn else "no completed points")


def ttft_png(path: Path, runs: list[Run]) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for i, run in enumerate(runs):
        pts = sorted((p["load"], p[Y], p["ttft_ms_median"]) for p in run.points
                     if None not in (p.get("load"), p.get(Y), p.get("ttft_ms_median")))
        if pts:
            drawn = True
            ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", color=f"C{i}", label=run.label)
    ax.set_xlabel("throughput per GPU (total tok/s/GPU)")
    ax.set_ylabel("TTFT median (ms)")
    ax.set_title("TTFT against throughput")
    return save(fig, ax, path, None if drawn else "no completed points")


def acceptance_png(path: Path, runs: list[Run]) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for i, run in enumerate(runs):
        pts = sorted((p["load"], p["acceptance_length"]) for p in run.points
                     if None not in (p.get("load"), p.get("acceptance_length")))
        if pts:
            drawn = True
            ax.plot(*zip(*pts), "o-", color=f"C{i}", label=run.label)
    if drawn:
        ax.set_xscale("log", base=2)
    ax.set_xlabel("load (concurrency, or requests/s)")
    ax.set_ylabel("acceptance length (server counters)")
    ax.set_title("Acceptance length against load")
    return save(fig, ax, path, None if drawn else "no acceptance data (the server exported no draft counters)")
