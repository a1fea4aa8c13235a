"""One benchmark script on two trees side by side: this checkout (head) against a revision (base).

    python benchmarks/tree_ab.py --base REV --script cpu_decode.py [--rounds 3] [--threads 1] [--control]
                                 [--out FILE] -- <the script's own arguments>

The base revision is extracted with `git archive` into a temporary directory. Each tree's package is laid out
as installed (paged_vs_slot.site: plugins/ inside trtllm_dflash/) and each tree runs its own copy of the script
(module paths differ between trees), in a fresh process with PYTHONPATH=<its site>, OMP_NUM_THREADS and the
script's --threads fixed, writing its JSON (--output) to a temporary file. A round runs every arm once, the
order rotating from round to round. --control adds a second copy of head ("control"): control / head reads
what two equal trees differ by on this machine. serve_dflash_vs_plain.py's tritonservers ignore PYTHONPATH
(the Python backend stub), so that script's `serve` is handed the arm's site as `package`.

Headline numbers per script (HEADLINES): cpu_decode.py records ratios within a run only, so its numbers are
each case's median (plain_vs_hf*: this runtime's tokens/s over transformers `generate`, the same yardstick in
both trees; sampling_overhead as T=1 / greedy per-token time); serve_dflash_vs_plain.py's are each server's
median output tokens/s and DFlash / plain per context and concurrency. The JSON keeps every run's numbers,
head / base per round with median, min and max, control / head likewise, and whether head / base's median is
within the control's spread or better; a table prints last.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from paged_vs_slot import site  # a sibling script, not a package

ROOT = HERE.parent


def cpu_decode_headlines(record: dict) -> dict[str, tuple[float, str]]:
    """-> {case: (median, "higher" | "lower" is better)}, the direction read from the case's goal."""
    out = {}
    for name, case in record["cases"].items():
        value = 1 + case["median"] if name == "sampling_overhead" else case["median"]
        out[name] = (value, "higher" if case["goal"].startswith(">=") else "lower")
    return out


def serve_headlines(record: dict) -> dict[str, tuple[float, str]]:
    """-> {"<context> c=<n> <server> tok/s" and "... <server>/plain": (median over the script's repeats, "higher")}."""
    out = {}
    for point in record["table"]:
        where = f"{point['context']} c={point['concurrency']}"
        for name, tok_s in point["tok_s_median"].items():
            out[f"{where} {name} tok/s"] = (tok_s, "higher")
            if name != "plain":
                out[f"{where} {name}/plain"] = (point[name]["over_plain"]["median"], "higher")
    return out


HEADLINES = {"cpu_decode.py": cpu_decode_headlines, "serve_dflash_vs_plain.py": serve_headlines}


def extract(base: str, into: Path) -> tuple[Path, str]:
    """The base revision's files under `into`; -> (tree, its commit)."""
    commit = git("rev-parse", "--verify", f"{base}^{{commit}}")
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"tree_ab: git archive {commit} failed")
    return into, commit


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def run_arm(tree: Path, arm_site: Path, args, out: Path) -> dict:
    """One fresh process running the tree's copy of the script; -> the JSON it wrote."""
    script = tree / "benchmarks" / args.script
    command = [sys.executable, __file__, "--launch", str(script), str(arm_site), "--",
               *args.script_args, "--threads", str(args.threads), "--output", str(out)]
    env = {**os.environ, "PYTHONPATH": str(arm_site), "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, check=False, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tree_ab: {script} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def launch(script: Path, arm_site: Path, argv: list[str]) -> int:
    """Inside an arm's process: `script`'s main with argv, its siblings found beside it, not beside this file."""
    sys.path[:] = [str(script.parent), *(p for p in sys.path if Path(p).resolve() != HERE)]
    sys.argv = [str(script), *argv]
    module = importlib.import_module(script.stem)
    if hasattr(module, "serve"):  # the servers' stub ignores PYTHONPATH: model.py puts the site first itself
        module.serve = functools.partial(module.serve, package=arm_site)
    return module.main() or 0


def run_rounds(trees: dict[str, tuple[Path, Path]], args, tmp: Path) -> tuple[list[dict], dict[str, str]]:
    """Every arm once per round, the order rotating; -> one row per run, and which way each metric is better."""
    arms, runs, better = list(trees), [], {}
    for r in range(args.rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            load, start = list(os.getloadavg()), time.time()
            record = run_arm(*trees[arm], args, tmp / f"{arm}-{r}.json")
            metrics = HEADLINES[args.script](record)
            runs.append({"round": r, "arm": arm, "wall_s": time.time() - start, "load_average_before": load,
                         "metrics": {name: value for name, (value, _) in metrics.items()}})
            better.update((name, way) for name, (_, way) in metrics.items())
            print(f"round {r} {arm:7} {runs[-1]['wall_s']:7.1f} s  load {load[0]:.2f}", file=sys.stderr, flush=True)
    return runs, better


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "each": values}


def summarize(runs: list[dict], better: dict[str, str], rounds: int) -> dict[str, dict]:
    """Per metric every run has: each arm's values by round, head / base and control / head per round, and whether
    head / base's median is within the control's spread or better."""
    value = {(run["arm"], run["round"]): run["metrics"] for run in runs}
    arms = sorted({run["arm"] for run in runs}, key=["base", "head", "control"].index)
    out = {}
    for name, way in better.items():
        if not all(name in run["metrics"] for run in runs):
            continue
        each = {arm: [value[arm, r][name] for r in range(rounds)] for arm in arms}
        entry = {"better": way, **{arm: spread(each[arm]) for arm in arms},
                 "head_over_base": spread([h / b for h, b in zip(each["head"], each["base"])])}
        if "control" in each:
            control = spread([c / h for c, h in zip(each["control"], each["head"])])
            median = entry["head_over_base"]["median"]
            entry["control_over_head"] = control
            entry["within_control"] = median >= control["min"] if way == "higher" else median <= control["max"]
        out[name] = entry
    return out


def table(metrics: dict[str, dict]) -> str:
    header = (f"{'metric':<34} {'better':>6} {'base':>9} {'head':>9}  {'head/base (min-max)':<22}"
              f"{'control/head (min-max)':<24}ok")
    lines = [header]
    for name, m in metrics.items():
        hb, ch = m["head_over_base"], m.get("control_over_head")
        cells = f"{hb['median']:.3f} ({hb['min']:.3f}-{hb['max']:.3f})"
        control = f"{ch['median']:.3f} ({ch['min']:.3f}-{ch['max']:.3f})" if ch else "-"
        lines.append(f"{name:<34} {m['better']:>6} {m['base']['median']:>9.3f} {m['head']['median']:>9.3f}  "
                     f"{cells:<22}{control:<24}{m.get('within_control', '-')}")
    return "\n".join(lines)


def parse(argv: list[str]):
    mine, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", help="the revision to compare against (a commit, tag or branch)")
    p.add_argument("--script", choices=sorted(HEADLINES), help="the benchmark, under each tree's benchmarks/")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS and the script's --threads")
    p.add_argument("--control", action="store_true", help="a second copy of head, run in every round too")
    p.add_argument("--out", type=Path, help="default: a JSON named after the script in benchmarks/results/tree_ab/")
    p.add_argument("--launch", nargs=2, type=Path, metavar=("SCRIPT", "SITE"), help=argparse.SUPPRESS)
    args = p.parse_args(mine)
    args.script_args = theirs
    if args.launch is None:
        if not args.base or not args.script:
            p.error("--base and --script are required")
        if args.rounds < 1:
            p.error("--rounds must be at least 1")
        taken = [flag for flag in ("--threads", "--output") if any(a.split("=")[0] == flag for a in theirs)]
        if taken:
            p.error(f"{taken[0]} after --: tree_ab sets it (give --threads to tree_ab)")
        args.out = args.out or ROOT / "benchmarks" / "results" / "tree_ab" / args.script.replace(".py", ".json")
    return args


def main() -> int:
    args = parse(sys.argv[1:])
    if args.launch:
        return launch(*args.launch, args.script_args)
    load_before, started = list(os.getloadavg()), time.time()
    tmp = Path(tempfile.mkdtemp(prefix="tree-ab-"))
    try:
        base, base_commit = extract(args.base, tmp / "base")
        trees = {"base": (base, site(base, tmp / "site-base")), "head": (ROOT, site(ROOT, tmp / "site-head"))}
        if args.control:
            trees["control"] = (ROOT, site(ROOT, tmp / "site-control"))
        runs, better = run_rounds(trees, args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    metrics = summarize(runs, better, args.rounds)
    record = {"command": " ".join(["python", "benchmarks/tree_ab.py", *sys.argv[1:]]),
              "script": args.script, "script_args": args.script_args, "rounds": args.rounds, "threads": args.threads,
              "base": {"rev": args.base, "commit": base_commit},
              "head": {"commit": git("rev-parse", "HEAD"), "uncommitted_changes": bool(git("status", "--porcelain"))},
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "wall_s": time.time() - started,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_average_before": load_before, "load_average_after": list(os.getloadavg())},
              "metrics": metrics, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(table(metrics))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
