"""Identical `dflash-generate` runs (the issue-48 example): is `--draft-len auto`'s tau repeatable on a busy machine?

Runs `dflash-generate --target builtin --drafter builtin --prompt "def main():" --max-new-tokens 128 --draft-len
auto --json` as fresh processes, sharing one cached step-cost model of the pair (a scratch
$TRTLLM_DFLASH_CACHE_DIR, calibrated by an untimed first run), two rules per round in alternating order: the
live cost correction as it is (`dead_band`) and without its dead band (`noise_blind`:
`CorrectionSettings(noise=0)`, the decayed shrunk mean alone). A busy background Python process runs during every
other round. Reported per rule: tau per run, its spread (max - min) / (2 median), tokens/s, and the load average
when each run ended.

    python benchmarks/draft_len_repeats.py --runs 6 --output benchmarks/results/draft_len_repeats.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--target", "builtin", "--drafter", "builtin", "--prompt", "def main():", "--max-new-tokens", "128",
        "--draft-len", "auto", "--json"]
# the rule before the dead band: the same correction with noise 0 (trtllm_dflash/draft_length/live_cost.py)
NOISE_BLIND = ("import trtllm_dflash.draft_length.live_cost as L; "
               "L.StepCostCorrection.__init__.__defaults__ = (L.CorrectionSettings(noise=0.0),); ")


def generate(cache: str, noise_blind: bool, threads: int) -> dict:
    code = ((NOISE_BLIND if noise_blind else "") + "import sys; from trtllm_dflash.cli.generate import main; "
            f"sys.argv = ['dflash-generate'] + {ARGS + ['--threads', str(threads)]!r}; main()")
    env = dict(os.environ, TRTLLM_DFLASH_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"dflash-generate failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
    return json.loads(lines[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=6, help="rounds, each one run per rule (default 6)")
    p.add_argument("--threads", type=int, default=2, help="dflash-generate --threads (default 2)")
    p.add_argument("--output", help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, got {args.runs}")
    report = {"command": "python benchmarks/draft_len_repeats.py " + " ".join(argv or sys.argv[1:]),
              "dflash_generate": ARGS, "threads": args.threads, "load_average_at_start": os.getloadavg(),
              "background_load": "a busy python process during every other round"}
    runs = {"dead_band": [], "noise_blind": []}
    busy = None
    with tempfile.TemporaryDirectory() as cache:
        generate(cache, False, args.threads)  # calibrates the pair once; every timed run reads that model
        try:
            for i in range(args.runs):
                loaded = i % 2 == 1
                if loaded and busy is None:
                    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                elif not loaded and busy is not None:
                    busy.kill()
                    busy.wait()
                    busy = None
                for blind in ((False, True) if i % 4 < 2 else (True, False)):
                    r = generate(cache, blind, args.threads)
                    runs["noise_blind" if blind else "dead_band"].append(
                        {"tau": r["tau"], "tokens_per_s": r["tokens_per_s"], "background_load": loaded,
                         "drafting_steps": sum(1 for k in r["draft_lengths"] if k > 0),
                         "steps": len(r["draft_lengths"]), "load_average_1min": os.getloadavg()[0]})
                print(i, {k: round(v[-1]["tau"], 2) for k, v in runs.items()}, file=sys.stderr, flush=True)
        finally:
            if busy is not None:
                busy.kill()
    report["runs"] = runs
    report["summary"] = {}
    for rule, rs in runs.items():
        tau = [r["tau"] for r in rs]
        m = statistics.median(tau)
        report["summary"][rule] = {"tau": {"median": m, "min": min(tau), "max": max(tau)},
                                   "tau_spread": (max(tau) - min(tau)) / (2 * m),
                                   "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs)}
    report["load_average_at_end"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(json.dumps(report["summary"]))
    if not args.output:
        print(text)


if __name__ == "__main__":
    main()
