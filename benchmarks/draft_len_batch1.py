"""Batch 1, one user: `--draft-len auto` against plain decoding and against `--draft-len 15`, same prompts.

What a single user of `dflash-generate` meets: each request runs alone with a fresh policy (as a fresh
`dflash-generate` process does), greedy, float32, the built-in pair, deciding from its own step times (nothing calibrated).
The three decodings run prompt by prompt, in a rotating order, for --repeats rounds, so machine drift lands on
all three alike. Reported per decoding: tokens/s summed over the prompts per round (median and range over
rounds), each round's ratio to plain and to the better of plain and 15, and tau (tokens per verify step) per prompt
over the rounds (its spread: how repeatable one prompt's run is; `tau_spread_auto` gives each prompt's
(max - min) / (2 median) and how many prompts stay within +-15 %).

`--load` runs a second busy Python process (one core's worth of spinning) during every other prompt slot,
alternating by round, so each prompt's repeats meet the machine both with and without it: auto's choices
must not follow another process's load.

`--blocks` adds the deterministic check behind drafting the whole block (speculative/dflash.py): accepted drafts
per drafting step at fixed draft lengths k, drafting k+1 tokens versus the whole block and keeping k.

    python benchmarks/draft_len_batch1.py --prompts 8 --repeats 5 --load \
        --output benchmarks/results/draft_len_batch1.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

NEW_TOKENS = 128
DECODINGS = ("plain", "15", "auto")


def engine(root: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from serve_dflash_vs_plain import served_engine

    return served_engine(root, max_batch=16, made_by="benchmarks/draft_len_batch1.py")


def prompts(engine: Path, count: int) -> list[tuple[int, ...]]:
    from trtllm_dflash.checkpoint.hf import load_tokenizer
    from trtllm_dflash.engine.loader import read_torch_manifest

    from trtllm_dflash.pairs import held_out_texts

    tokenizer = load_tokenizer(engine / read_torch_manifest(engine).tokenizer)
    return [tuple(tokenizer.encode(t, add_special_tokens=False)) for t in held_out_texts(count)]


def run(pipelines, engine: Path, decoding: str, ids) -> dict:
    from trtllm_dflash.engine.draft_len import make_policy
    from trtllm_dflash.engine.request import Request

    generator = pipelines["plain" if decoding == "plain" else "dflash"].generator
    if decoding != "plain":  # a fresh policy per request: what one `dflash-generate` run starts from
        generator.policy = make_policy(decoding, generator.block - 1, engine)
    began = time.perf_counter()
    result = generator.generate([Request(ids, NEW_TOKENS, ignore_eos=True)])[0]
    seconds = time.perf_counter() - began
    return {"tokens": len(result.output_ids), "seconds": seconds, "tau": result.tau,
            "drafting_steps": sum(1 for k in result.draft_lengths if k > 0), "steps": len(result.draft_lengths),
            "output_ids": result.output_ids}


class BackgroundLoad:
    """A second busy Python process, on while `set(True)`: one core's worth of load from outside the run."""

    def __init__(self):
        self.proc = None

    def set(self, on: bool) -> None:
        if on and self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        elif not on and self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def rounds(pipelines, engine, all_ids, repeats: int, load: BackgroundLoad | None = None) -> list[dict]:
    out = []
    for r in range(repeats):
        order = DECODINGS[r % 3:] + DECODINGS[: r % 3]
        runs = {d: [] for d in DECODINGS}
        for i, ids in enumerate(all_ids):
            loaded = load is not None and (i + r) % 2 == 1
            if load is not None:
                load.set(loaded)
            for d in order[i % 3:] + order[: i % 3]:
                runs[d].append({**run(pipelines, engine, d, ids), "background_load": loaded})
        out.append(runs)
        tps = {d: sum(x["tokens"] for x in runs[d]) / sum(x["seconds"] for x in runs[d]) for d in DECODINGS}
        print(f"round {r}: " + ", ".join(f"{d} {v:.1f} tok/s" for d, v in tps.items()), file=sys.stderr)
    return out


def summary(runs: list[dict]) -> dict:
    def spread(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    tps = {d: [sum(x["tokens"] for x in r[d]) / sum(x["seconds"] for x in r[d]) for r in runs] for d in DECODINGS}
    best = [max(p, f) for p, f in zip(tps["plain"], tps["15"])]
    prompts_n = len(runs[0]["auto"])
    tau = {d: [spread([r[d][i]["tau"] for r in runs]) for i in range(prompts_n)] for d in ("15", "auto")}
    same = all(r[d][i]["output_ids"] == runs[0]["plain"][i]["output_ids"] for r in runs for d in DECODINGS
               for i in range(prompts_n))
    return {
        "tokens_per_s": {d: spread(v) for d, v in tps.items()},
        "auto_over_plain": spread([a / p for a, p in zip(tps["auto"], tps["plain"])]),
        "auto_over_15": spread([a / f for a, f in zip(tps["auto"], tps["15"])]),
        "auto_over_best": spread([a / b for a, b in zip(tps["auto"], best)]),
        "15_over_plain": spread([f / p for f, p in zip(tps["15"], tps["plain"])]),
        "tau_per_prompt": tau,
        "tau_widest_spread_auto": max((t["max"] - t["min"]) / (2 * t["median"]) for t in tau["auto"]),
        "tau_spread_auto": {"per_prompt": [(t["max"] - t["min"]) / (2 * t["median"]) for t in tau["auto"]],
                            "within_15pct": sum((t["max"] - t["min"]) / (2 * t["median"]) <= 0.15 for t in tau["auto"]),
                            "prompts": prompts_n},
        "tau_auto_runs": [[r["auto"][i]["tau"] for r in runs] for i in range(prompts_n)],
        "drafting_step_share_auto": sum(x["drafting_steps"] for r in runs for x in r["auto"])
        / sum(x["steps"] for r in runs for x in r["auto"]),
        "outputs_identical_to_plain": same,
    }


def blocks(pipeline, all_ids, lens=(1, 2, 4, 8, 15)) -> dict:
    """Accepted drafts per drafting step at fixed k: drafting k+1 tokens ('prefix') or the whole block ('full')."""
    from dataclasses import replace

    from trtllm_dflash.engine.request import Request

    from trtllm_dflash.draft_length.policy import FixedDraftLen

    generator, proposer, out = pipeline.generator, pipeline.generator.proposer, {}
    full = proposer.propose
    prefix = lambda batch, num_drafts: full(replace(batch, block=0), num_drafts)  # noqa: E731 (k + 1 tokens)
    for k in lens:
        generator.policy, row = FixedDraftLen(k), {}
        for name, propose in (("prefix", prefix), ("full", full)):
            proposer.propose = propose
            accepted = steps = 0
            for ids in all_ids:
                res = generator.generate([Request(ids, NEW_TOKENS, ignore_eos=True)])[0]
                accepted += res.accepted_tokens
                steps += sum(1 for d in res.draft_lengths if d > 0)
            row[name] = accepted / steps
        proposer.propose = full
        out[str(k)] = row
        print(f"k={k}: accepted drafts/step prefix {row['prefix']:.2f}, full {row['full']:.2f}", file=sys.stderr)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=10, help="held-out snippets (default 10)")
    p.add_argument("--repeats", type=int, default=5, help="rounds over all prompts and decodings (default 5)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--blocks", action="store_true", help="also measure drafting the whole block vs k+1 tokens")
    p.add_argument("--load", action="store_true", help="a busy background process during every other prompt slot")
    p.add_argument("--output", help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    if args.prompts < 1 or args.repeats < 1:
        raise SystemExit(f"--prompts and --repeats must be at least 1, got {args.prompts} and {args.repeats}")
    torch.set_num_threads(args.threads)
    from trtllm_dflash.engine.calibrate import device_name
    from trtllm_dflash.engine.loader import load_engine

    with tempfile.TemporaryDirectory() as tmp:
        engine_dir = engine(Path(tmp))
        pipelines = {"plain": load_engine(engine_dir, decoding="plain", step_mode="eager"),
                     "dflash": load_engine(engine_dir, step_mode="eager")}
        all_ids = prompts(engine_dir, args.prompts)
        load = BackgroundLoad() if args.load else None
        with torch.inference_mode():
            report = {"command": "python benchmarks/draft_len_batch1.py " + " ".join(argv or sys.argv[1:]),
                      "device": device_name(torch.device("cpu")), "threads": args.threads,
                      "new_tokens": NEW_TOKENS, "prompts": args.prompts, "repeats": args.repeats,
                      "background_load": "a busy python process in every other prompt slot" if load else None,
                      "load_average_at_start": os.getloadavg()}
            try:
                report["summary"] = summary(rounds(pipelines, engine_dir, all_ids, args.repeats, load))
            finally:
                if load is not None:
                    load.set(False)
            if args.blocks:
                report["accepted_drafts_per_step"] = blocks(pipelines["dflash"], all_ids)
            report["load_average_at_end"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(json.dumps(report["summary"]["auto_over_best"]))
    if not args.output:
        print(text)


if __name__ == "__main__":
    main()
