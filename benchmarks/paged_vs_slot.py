"""The paged KV cache's decode step against the slot layout it replaced, on the CPU (docs/paged-kv.md).

    python benchmarks/paged_vs_slot.py [--baseline 3c65fd8] [--rounds 5] [--threads 1] [--out FILE]

The baseline revision (main before the paged cache landed: every slot owned max_seq_len positions) is checked out
in a temporary git worktree. Each round runs one probe process from this tree and one from the baseline's, the
order alternating (AB, BA, ...), with the same torch thread count. A probe loads the built-in pair in float32,
warms up, and decodes held-out prompts (64 new tokens, EOS ignored) in four cases: plain decoding and DFlash with
the whole block (draft 15), each at batch 1 (4 prompts one at a time) and batch 8 (8 prompts at once). It reports
seconds per output token after the first (the decode steps; prefill excluded) and the output ids. The JSON keeps,
per case, the ratio paged / slot of every round with its median, min and max, and whether the outputs of the two
trees were identical. Both trees import trtllm_dflash from a copy of their own, laid out as installed (plugins/
inside), with this venv.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "paged_vs_slot.json"
CASES = {"plain_b1": (0, 1), "dflash15_b1": (15, 1), "plain_b8": (0, 8), "dflash15_b8": (15, 8)}  # (k, batch)
NEW_TOKENS = 64


def probe(threads: int) -> dict:
    """Run inside one tree: every case once after a warm-up -> {case: {"s_per_token", "ids"}}."""
    import torch
    from trtllm_dflash.engine.pipeline import load_pipeline
    from trtllm_dflash.engine.request import Request

    from trtllm_dflash.draft_length.policy import FixedDraftLen
    from trtllm_dflash.pairs import held_out_texts, stdlib_pair

    torch.set_num_threads(threads)
    pipeline = load_pipeline(*stdlib_pair())
    gen = pipeline.generator
    prompts = [tuple(pipeline.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in held_out_texts(8)]
    out = {}
    for name, (k, batch) in [("warm-up", (15, 8)), *CASES.items()]:
        gen.policy = FixedDraftLen(k)
        chosen = prompts[:4] if batch == 1 else prompts[:batch]
        results = []
        for i in range(0, len(chosen), batch):
            results += gen.generate([Request(p, NEW_TOKENS, ignore_eos=True) for p in chosen[i:i + batch]])
        decode_s = sum(r.finish_s - r.first_token_s for r in results)
        out[name] = {"s_per_token": decode_s / sum(len(r.output_ids) - 1 for r in results),
                     "ids": [r.output_ids for r in results]}
    del out["warm-up"]
    return out


def site(tree: Path, out: Path) -> Path:
    """The tree's package laid out as an install lays it out, in `out`: trtllm_dflash/ copied, and a flat-layout
    tree's top-level plugins/ (which its pyproject maps into the package) copied inside it. On PYTHONPATH it is
    found before this venv's editable install, which maps trtllm_dflash to one checkout whatever tree runs."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(tree / "trtllm_dflash", out / "trtllm_dflash", ignore=ignore)
    if (tree / "plugins").is_dir():
        shutil.copytree(tree / "plugins", out / "trtllm_dflash" / "plugins", ignore=ignore)
    return out


def run_probe(tree: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, __file__, "--probe", "--threads", str(threads)], env=env, cwd=tree,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"probe in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default="3c65fd8", help="the slot layout's revision")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe:
        print(json.dumps(probe(args.threads)))
        return 0
    base = Path(tempfile.mkdtemp(prefix="paged-vs-slot-")) / "slot"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.baseline], check=True)
    sites = base.parent / "sites"
    trees = {"paged": site(ROOT, sites / "paged"), "slot": site(base, sites / "slot")}
    load_before, start = list(os.getloadavg()), time.time()
    rounds = []
    try:
        for r in range(args.rounds):
            order = ["paged", "slot"] if r % 2 == 0 else ["slot", "paged"]
            rounds.append({name: run_probe(trees[name], args.threads) for name in order})
            print(f"round {r}: " + ", ".join(f"{c} {rounds[-1]['paged'][c]['s_per_token'] / rounds[-1]['slot'][c]['s_per_token']:.3f}"
                                              for c in CASES), file=sys.stderr, flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
        shutil.rmtree(base.parent, ignore_errors=True)
    cases = {}
    for c in CASES:
        ratios = [rd["paged"][c]["s_per_token"] / rd["slot"][c]["s_per_token"] for rd in rounds]
        cases[c] = {"paged_over_slot": ratios, "median": statistics.median(ratios), "min": min(ratios),
                    "max": max(ratios), "within_5_percent": statistics.median(ratios) <= 1.05,
                    "ms_per_token_paged_median": 1e3 * statistics.median(rd["paged"][c]["s_per_token"] for rd in rounds),
                    "outputs_identical": all(rd["paged"][c]["ids"] == rd["slot"][c]["ids"] for rd in rounds)}
    result = {"command": " ".join(["python", "benchmarks/paged_vs_slot.py", *sys.argv[1:]]),
              "device": f"cpu: {platform.processor() or platform.machine()}", "threads": args.threads,
              "baseline": args.baseline, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "wall_s": time.time() - start, "load_average_before": load_before,
              "load_average_after": list(os.getloadavg()), "new_tokens": NEW_TOKENS, "cases": cases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({c: {k: v for k, v in s.items() if k != "paged_over_slot"} for c, s in cases.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
