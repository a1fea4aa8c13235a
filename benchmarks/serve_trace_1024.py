"""Per request, what the DFlash and plain servers do with the served benchmark's 1024-token point at concurrency 1.

    python benchmarks/serve_trace_1024.py [--threads 2] [--rounds 2]

The engine, calibration, server and prompts of benchmarks/serve_dflash_vs_plain.py (built-in pair, float32,
max_batch_size 16, max_seq_len 1280, `--draft-len auto`, real tritonserver): per round a plain server (`--decoding
plain`) and a DFlash server, in alternating order (plain first in even rounds), each runs the snippet points at concurrency 1, 4 and 16 first (as that benchmark's
servers do), then the six 1024-token windows one at a time in the same order (its clients pop from the end),
twice. For each request: wall seconds, time to first token, drafting steps, drafts and accepted drafts (from
the server's response). Printed last: each server's median seconds over its requests that never drafted
(plain-only requests: the ops of plain decoding), per round. Writes
benchmarks/results/serve_trace_1024.json. A few rounds: it shows where the time goes, not a rate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_dflash_vs_plain import NEW_TOKENS, post, prompt_sets, run_point, serve, served_engine  # noqa: E402

OUT = Path(__file__).parent / "results" / "serve_trace_1024.json"


def trace(url: str, metrics_url: str, prompts: dict) -> tuple[dict, list[dict]]:
    post(url, {"text_input": prompts["short"][0], "sampling_param_max_tokens": 8})  # warm-up
    snippets = {c: run_point(url, metrics_url, prompts["short"], c, 6 * c)["output_tokens_per_s"] for c in (1, 4, 16)}
    requests = []
    for i in list(range(5, -1, -1)) * 2:
        start = time.perf_counter()
        reply = post(url, {"text_input": prompts["1024"][i], "sampling_param_max_tokens": NEW_TOKENS,
                           "sampling_param_ignore_eos": True, "sampling_param_exclude_input_from_output": True})
        requests.append({"window": i, "seconds": time.perf_counter() - start,
                         "ttft_s": (reply["first_token_time_ns"] - reply["arrival_time_ns"]) / 1e9,
                         "draft_steps": reply["num_draft_steps"], "drafts": reply["total_draft_tokens"],
                         "accepted": reply["total_accepted_draft_tokens"]})
        print(requests[-1], file=sys.stderr, flush=True)
    return snippets, requests


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    load_before = os.getloadavg()
    import torch
    from transformers import AutoTokenizer

    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.serve.server import stop_server

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        engine, _ = served_engine(root, 16, "benchmarks/serve_trace_1024.py")
        prompts = prompt_sets(AutoTokenizer.from_pretrained(stdlib_pair()[0]), quick=False)
        rounds = []
        for r in range(args.rounds):
            snippets, requests = {}, {}
            for decoding in ("plain", "dflash") if r % 2 == 0 else ("dflash", "plain"):
                proc, ends = serve(engine, root, decoding, "auto", args.threads)
                try:
                    snippets[decoding], requests[decoding] = trace(f"{ends.http_url}/v2/models/m/generate",
                                                                   ends.metrics_url, prompts)
                finally:
                    stop_server(proc)
            rounds.append({"order": list(requests), "snippet_points_tok_s": snippets,
                           "requests_1024_concurrency_1": requests})
    record = {"command": "python " + " ".join(sys.argv),
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "threads": args.threads,
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "rounds": rounds}
    for r, one in enumerate(rounds):
        for decoding, reqs in one["requests_1024_concurrency_1"].items():
            plain_only = [q["seconds"] for q in reqs if q["draft_steps"] == 0]
            print(f"round {r} {decoding:6} seconds per 1024-token request:", " ".join(f"{q['seconds']:.3f}" for q in reqs),
                  f"| never drafted: {len(plain_only)}, median {statistics.median(plain_only):.4f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
