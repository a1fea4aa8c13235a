"""Issue 16 on a GPU: the cost policy (`--draft-len auto`) against plain decoding and against always drafting the
whole block, offline, the built-in pair on one CUDA device in the device's default step mode (cuda-graphs).

    python benchmarks/gpu_policy.py --out DIR [--repeats 5] [--deadline-s 400]
                                    [--points short:1,short:4,short:16,1024:1,1024:16]
    python benchmarks/gpu_policy.py --device cpu --step-mode eager --repeats 1 --points short:1 --out /tmp/p  # smoke

The served benchmark's workload without the server (newcomer_admission.py's: held-out snippets and 1024-token
windows, 128 new tokens, EOS ignored, closed loop of `concurrency` requests, 6 per client, after the served
warm-up), run by two generators of the built-in pair (float32) in one process: plain decoding, and DFlash with
the cost policy (calibrated once on this device, a fresh policy per repeat, like a fresh server) or with every
step drafting 15 tokens. The cases alternate order per repeat. Per point: output tokens/s, each DFlash case's
ratio to plain per repeat (median, range), requests that never drafted, and whether every request's output
equals plain decoding's token for token (greedy). Writes DIR/gpu_policy.json after every repeat, so a lease
that runs out keeps the repeats done; no repeat starts after --deadline-s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from newcomer_backoff import (capacity, closed_loop, offline_pairs, parse_points, served_warm_up,  # noqa: E402
                              write_results)
from serve_dflash_vs_plain import NEW_TOKENS  # noqa: E402

from trtllm_dflash.draft_length.policy import CostBasedDraftLen, FixedDraftLen  # noqa: E402

WARMUP = 4  # requests of each context, as the served benchmark's --warmup 4
CASES = ("plain", "auto (cost policy)", "always 15")


def one_server(generator, policy, prompts: dict, points: list[tuple[str, int]], outputs: dict) -> dict:
    """newcomer_backoff.one_server with each point's outputs kept in outputs[point]."""
    if policy is not None:
        generator.policy = policy
    generator.allocate(max(c for _, c in points), capacity(generator), generator.block)
    served_warm_up(generator, prompts, WARMUP)
    run = {}
    for context, c in points:
        key = f"{context}:{c}"
        outputs[key] = []
        run[key] = closed_loop(generator, prompts[context], c, outputs[key])
    return run


def mismatches(outputs: dict, reference: dict) -> dict:
    """point -> requests whose output differs from plain decoding's (0 where greedy DFlash is exact)."""
    return {key: sum(a != b for a, b in zip(outputs[key], reference[key])) for key in reference}


def device_record(device: str) -> dict:
    if not device.startswith("cuda"):
        return {"device": device}
    props = torch.cuda.get_device_properties(device)
    return {"device": device, "gpu": props.name, "gpu_memory_gib": props.total_memory / 2**30,
            "cuda": torch.version.cuda}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=4, help="torch CPU threads (the host side of each step)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--step-mode", default=None, help="eager, compile or cuda-graphs; default: the device's")
    p.add_argument("--points", default="short:1,short:4,short:16,1024:1,1024:16", help="context:concurrency")
    p.add_argument("--deadline-s", type=float, default=1e9, help="no repeat starts after this many seconds")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args()
    args.output = Path(args.out) / "gpu_policy.json"
    points = parse_points(args.points)
    load_before, started, clock = os.getloadavg(), time.time(), time.perf_counter()
    spec, plain, prompts, calibrated = offline_pairs(args.threads, max(c for _, c in points), args.device,
                                                     args.step_mode)
    print(f"[{time.perf_counter() - clock:5.0f} s] loaded and calibrated", file=sys.stderr, flush=True)
    runs, wrong = {name: [] for name in CASES}, {name: [] for name in CASES[1:]}
    for r in range(args.repeats):
        if time.perf_counter() - clock > args.deadline_s:
            print(f"deadline: {r} repeats done", file=sys.stderr)
            break
        outputs = {}
        for name in (CASES if r % 2 == 0 else CASES[::-1]):
            policy = {"plain": None, "auto (cost policy)": CostBasedDraftLen(calibrated.cost),
                      "always 15": FixedDraftLen(spec.generator.block - 1)}[name]
            outputs[name] = {}
            generator = plain.generator if name == "plain" else spec.generator
            runs[name].append(one_server(generator, policy, prompts, points, outputs[name]))
        for name in CASES[1:]:
            wrong[name].append(mismatches(outputs[name], outputs["plain"]))
        print(f"[{time.perf_counter() - clock:5.0f} s] repeat {r}: " + "; ".join(
            f"{n} " + " ".join(f"{runs[n][-1][k][0] / runs['plain'][-1][k][0]:.2f}" for k in runs[n][-1])
            for n in CASES[1:]) + f"; outputs differing from plain: {[wrong[n][-1] for n in CASES[1:]]}",
            file=sys.stderr, flush=True)
        write_results(args, started, load_before, runs, points, {
            "device": device_record(args.device), "step_mode": spec.generator.step_mode.mode,
            "warmup": WARMUP, "new_tokens": NEW_TOKENS, "requests_differing_from_plain": wrong,
            "calibration_s": calibrated.cost.meta.get("calibration_s")})


if __name__ == "__main__":
    main()
