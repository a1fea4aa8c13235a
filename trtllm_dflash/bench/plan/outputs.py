"""The plan's files: plan.json, points.csv, frontier.png, one draft_len_schedule per winning TP layout."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

from ...draft_length.schedule import DraftLenSchedule, write_schedule
from ..frontier import curve
from ..plots import pyplot, save
from .step import PARTS

FRONTIER_KEYS = ("batch", "draft_len", "tok_s_user", "tok_s_gpu", "tp", "replicas", "tokens_per_step")
CSV_KEYS = ("method", "tp", "replicas", "batch", "draft_len", "tok_s_user", "tok_s_gpu", "tpot_ms", "ttft_ms",
            "tokens_per_step", *PARTS, "memory_gib")


def method(p: dict) -> str:
    return p["method"]


def frontier_entry(p: dict) -> dict:
    return {k: (round(p[k], 3) if isinstance(p[k], float) else p[k]) for k in FRONTIER_KEYS}


def schedule_name(tp: int) -> str:
    return f"draft_len_schedule_tp{tp}.yaml"


def build_command(spec, p: dict, schedule: DraftLenSchedule | None, out_dir: Path) -> str:
    """`dflash-build --backend trtllm` for a DFlash configuration (max batch = its batch; draft lengths: the
    layout's schedule, whose first step is max_draft_len)."""
    gpu = spec.gpu.lower().removesuffix("_sxm")
    max_draft = schedule.max_draft_len if schedule else p["draft_len"]
    argv = ["dflash-build", "--backend", "trtllm", "--target", spec.target, "--drafter", spec.drafter,
            "--tp", str(p["tp"]), "--gpu", gpu, "--max-batch-size", str(p["batch"]),
            "--max-seq-len", str(spec.isl + spec.osl), "--block-size", str(max_draft + 1)]
    if schedule:
        argv += ["--draft-len-schedule", str(out_dir / schedule_name(p["tp"]))]
    return shlex.join([*argv, "--output", f"engines/plan-tp{p['tp']}-b{p['batch']}"])


def write_csv(path: Path, points: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_KEYS)
        for p in points:
            row = {**p, **(p.get("step_ms") or {}), "method": method(p)}
            w.writerow([round(row[k], 4) if isinstance(row.get(k), float) else row.get(k, "") for k in CSV_KEYS])
    return path


def write_png(path: Path, points: list[dict], fronts: dict[str, list[dict]], levels, title: str) -> Path:
    import numpy as np

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, front) in enumerate(fronts.items()):
        color = f"C{i}"
        pts = [(p["tok_s_user"], p["tok_s_gpu"]) for p in points if method(p) == name]
        if pts:
            ax.scatter(*zip(*pts), color=color, alpha=0.2, s=10)
        xy = [(p["tok_s_user"], p["tok_s_gpu"]) for p in front]
        if len(xy) > 1:
            xs = np.linspace(xy[0][0], xy[-1][0], 200)
            ax.plot(xs, curve(xy, "pchip")(xs), color=color)
        if xy:
            ax.plot(*zip(*xy), "o", color=color, label=f"{name} (frontier)")
    for level in levels:
        ax.axvline(level, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("interactivity (output tok/s/user)")
    ax.set_ylabel("throughput per GPU (output tok/s/GPU)")
    ax.set_title(title, fontsize="small")
    return save(fig, ax, path, None if points else "no configuration fits in memory")


def write_all(out_dir: Path, plan: dict, points: list[dict], schedules: dict[int, DraftLenSchedule]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [write_schedule(out_dir / schedule_name(tp), s) for tp, s in sorted(schedules.items())]
    (out_dir / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    title = f"{plan['inputs']['target']} on {plan['inputs']['gpus']} x {plan['provenance']['system']}, " \
            f"ISL/OSL {plan['inputs']['isl']}/{plan['inputs']['osl']} (projection)"
    paths += [out_dir / "plan.json", write_csv(out_dir / "points.csv", points),
              write_png(out_dir / "frontier.png", points, plan["frontier"], plan["inputs"]["interactivity"], title)]
    return paths
