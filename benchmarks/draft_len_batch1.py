"""Batch 1, one user: `dflash-generate --draft-len auto` against plain decoding and against `--draft-len 15`.

What a single user meets: every run is its own `dflash-generate --target builtin --drafter builtin --prompt P
--max-new-tokens 128 --ignore-eos --threads T --json` process (plain decoding: no `--drafter`), greedy, float32, a
fresh policy deciding from its own step times (nothing calibrated). Prompts: held-out snippets and HARD_OPENINGS
(code openings whose first full blocks accept few drafts, then an easy stretch). The three decodings run prompt by
prompt, in a rotating order, for --repeats rounds, so machine drift lands on all three alike. Reported per prompt
(tokens/s as each run's JSON reports it, start-up excluded): medians over rounds, auto / the better of plain and 15
(of the medians, and per round), and auto's tau spread (max - min) / median over the identical runs; each auto
run's draft lengths and acceptance lengths per step (the policy's decisions) are kept.

`--load` runs a dedicated busy second process (a one-thread Python loop) for the whole run.

`--blocks` adds the deterministic check behind drafting the whole block (speculative/dflash.py): accepted drafts
per drafting step at fixed draft lengths k, drafting k+1 tokens versus the whole block and keeping k (in process).

    python benchmarks/draft_len_batch1.py --prompts 3 --repeats 5 --threads 1 --load \
        --output benchmarks/results/draft_len_batch1_load.json
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

import torch

NEW_TOKENS = 128
DECODINGS = ("plain", "15", "auto")
HARD_OPENINGS = ("def fibonacci(n):", "class Stack:", "import os\nimport sys\n\n")


sys.path.insert(0, str(Path(__file__).parent))
from serve_dflash_vs_plain import BusyProcess  # noqa: E402


def engine(root: Path) -> Path:
    from serve_dflash_vs_plain import served_engine

    return served_engine(root, max_batch=16, made_by="benchmarks/draft_len_batch1.py")


def prompt_texts(count: int) -> list[str]:
    from trtllm_dflash.pairs import held_out_texts

    return held_out_texts(count) + list(HARD_OPENINGS)


def prompt_ids(engine: Path, texts: list[str]) -> list[tuple[int, ...]]:
    from trtllm_dflash.checkpoint.hf import load_tokenizer
    from trtllm_dflash.engine.loader import read_torch_manifest

    tokenizer = load_tokenizer(engine / read_torch_manifest(engine).tokenizer)
    return [tuple(tokenizer.encode(t, add_special_tokens=False)) for t in texts]


def generate_command(decoding: str, prompt: str, threads: int) -> list[str]:
    command = [sys.executable, "-m", "trtllm_dflash.cli.generate", "--target", "builtin", "--prompt", prompt,
               "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos", "--threads", str(threads), "--json"]
    return command if decoding == "plain" else command + ["--drafter", "builtin", "--draft-len", decoding]


def run(decoding: str, prompt: str, threads: int) -> dict:
    """One `dflash-generate` process -> its tokens/s, tau and per-step trace."""
    done = subprocess.run(generate_command(decoding, prompt, threads), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"draft_len_batch1.py: dflash-generate ({decoding}) failed: {done.stderr.strip()[-2000:]}")
    out = json.loads(done.stdout)
    return {"tokens_per_s": out["tokens_per_s"], "tau": out.get("tau") or 1.0, "output_ids": out["output_ids"],
            "draft_lengths": out.get("draft_lengths", []), "acceptance_lengths": out.get("acceptance_lengths", [])}


def rounds(texts: list[str], repeats: int, threads: int) -> list[dict]:
    """[round] {decoding: [prompt] run}, decodings in rotating order per prompt and round."""
    out = []
    for r in range(repeats):
        order = DECODINGS[r % 3:] + DECODINGS[: r % 3]
        runs = {d: [None] * len(texts) for d in DECODINGS}
        for i, text in enumerate(texts):
            for d in order[i % 3:] + order[: i % 3]:
                runs[d][i] = run(d, text, threads)
        out.append(runs)
        print(f"round {r}: " + ", ".join(f"{d} {statistics.median(x['tokens_per_s'] for x in runs[d]):.1f} tok/s"
                                         for d in DECODINGS) + f" (median over prompts), load {os.getloadavg()[0]:.1f}",
              file=sys.stderr, flush=True)
    return out


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "each": values}


def per_prompt(runs: list[dict], i: int) -> dict:
    tps = {d: [r[d][i]["tokens_per_s"] for r in runs] for d in DECODINGS}
    med = {d: statistics.median(v) for d, v in tps.items()}
    tau = {d: [r[d][i]["tau"] for r in runs] for d in ("15", "auto")}
    return {"tokens_per_s": {d: spread(v) for d, v in tps.items()},
            "auto_over_best_of_medians": med["auto"] / max(med["plain"], med["15"]),
            "auto_over_best": spread([a / max(p, f) for a, p, f in zip(tps["auto"], tps["plain"], tps["15"])]),
            "auto_over_plain": spread([a / p for a, p in zip(tps["auto"], tps["plain"])]),
            "15_over_plain": spread([f / p for f, p in zip(tps["15"], tps["plain"])]),
            "tau": {d: spread(v) for d, v in tau.items()},
            "tau_spread_auto": (max(tau["auto"]) - min(tau["auto"])) / statistics.median(tau["auto"]),
            "opening_acceptance_15": runs[0]["15"][i]["acceptance_lengths"][:4],
            "auto_traces": [{"draft_lengths": r["auto"][i]["draft_lengths"],
                             "acceptance_lengths": r["auto"][i]["acceptance_lengths"]} for r in runs]}


def summary(runs: list[dict], texts: list[str]) -> dict:
    prompts = [{"prompt": t[:60], "hard_opening": t in HARD_OPENINGS, **per_prompt(runs, i)}
               for i, t in enumerate(texts)]
    same = all(r[d][i]["output_ids"] == runs[0]["plain"][i]["output_ids"] for r in runs for d in DECODINGS
               for i in range(len(texts)))
    return {"prompts": prompts,
            "auto_over_best_of_medians": spread([p["auto_over_best_of_medians"] for p in prompts]),
            "tau_spread_auto": spread([p["tau_spread_auto"] for p in prompts]),
            "outputs_identical_to_plain": same}


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
    p.add_argument("--prompts", type=int, default=3, help="held-out snippets, besides HARD_OPENINGS (default 3)")
    p.add_argument("--repeats", type=int, default=5, help="rounds over all prompts and decodings (default 5)")
    p.add_argument("--threads", type=int, default=1, help="dflash-generate --threads (default 1)")
    p.add_argument("--blocks", action="store_true", help="also measure drafting the whole block vs k+1 tokens")
    p.add_argument("--load", action="store_true", help="a dedicated busy second process for the whole run")
    p.add_argument("--output", help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    if args.prompts < 0 or args.repeats < 1 or args.threads < 1:
        raise SystemExit(f"--prompts must be at least 0, --repeats and --threads at least 1, got {args.prompts}, "
                         f"{args.repeats} and {args.threads}")
    torch.set_num_threads(args.threads)
    from trtllm_dflash.engine.calibrate import device_name

    texts = prompt_texts(args.prompts)
    report = {"command": "python benchmarks/draft_len_batch1.py " + " ".join(argv or sys.argv[1:]),
              "device": device_name(torch.device("cpu")), "threads": args.threads, "new_tokens": NEW_TOKENS,
              "prompts": len(texts), "repeats": args.repeats,
              "background_load": "a dedicated busy python process for the whole run" if args.load else None,
              "load_average_at_start": os.getloadavg()}
    if args.load:
        with BusyProcess():
            report["summary"] = summary(rounds(texts, args.repeats, args.threads), texts)
    else:
        report["summary"] = summary(rounds(texts, args.repeats, args.threads), texts)
    report["load_average_at_end"] = os.getloadavg()
    if args.blocks:
        from trtllm_dflash.engine.loader import load_engine

        with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
            engine_dir = engine(Path(tmp))
            report["accepted_drafts_per_step"] = blocks(load_engine(engine_dir, step_mode="eager"),
                                                        prompt_ids(engine_dir, texts))
    text = json.dumps(report, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
    for row in report["summary"]["prompts"]:
        t = row["tokens_per_s"]
        print(f"{row['prompt'][:24]!r:28} plain {t['plain']['median']:6.1f} 15 {t['15']['median']:6.1f} auto "
              f"{t['auto']['median']:6.1f} tok/s; auto/best {row['auto_over_best_of_medians']:.2f}; tau spread "
              f"{row['tau_spread_auto']:.2f}")
    if not args.output:
        print(text)


if __name__ == "__main__":
    main()
