"""The served floor at 1024 tokens: plain decoding, DFlash admitting everything plain-only, and DFlash auto.

    python benchmarks/serve_floor_1024.py [--rounds 8] [--threads 2] [--no-snippets]

Three real tritonservers up at once on the engine, calibration and prompts of
benchmarks/serve_dflash_vs_plain.py (built-in pair, float32, max_batch_size 16): `--decoding plain`, DFlash
`--draft-len 0` (every request plain-only: plain decoding's ops in the DFlash engine) and DFlash `--draft-len
auto`. Each first runs the snippet points at concurrency 1, 4 and 16 (as that benchmark's servers do before
their 1024-token points; `--no-snippets` skips them), then per round, in rotating order, the six 1024-token
windows one at a time (128 new tokens, EOS ignored). Per request: seconds, time to first token and drafts
(from the server's response). Printed and written per server: median seconds over all its requests, over
those that never drafted, median time to first token and median decode time (seconds - first token), and
the median over rounds of its round median / plain's. Writes benchmarks/results/serve_floor_1024.json.
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

OUT = Path(__file__).parent / "results" / "serve_floor_1024.json"
CASES = {"plain": ("plain", "auto"), "dflash k=0": ("dflash", "0"), "dflash auto": ("dflash", "auto")}


def one_request(url: str, prompt: str) -> dict:
    start = time.perf_counter()
    reply = post(url, {"text_input": prompt, "sampling_param_max_tokens": NEW_TOKENS,
                       "sampling_param_ignore_eos": True, "sampling_param_exclude_input_from_output": True})
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "ttft_s": (reply["first_token_time_ns"] - reply["arrival_time_ns"]) / 1e9,
            "drafts": reply["total_draft_tokens"]}


def summarize(requests: dict[str, list[dict]], rounds: int) -> dict:
    out = {}
    for name, reqs in requests.items():
        never = [r["seconds"] for r in reqs if r["drafts"] == 0]
        per_round = [statistics.median(r["seconds"] for r in reqs if r["round"] == i) for i in range(rounds)]
        plain = [statistics.median(r["seconds"] for r in requests["plain"] if r["round"] == i) for i in range(rounds)]
        out[name] = {"median_s": statistics.median(r["seconds"] for r in reqs),
                     "never_drafted_median_s": statistics.median(never) if never else None,
                     "never_drafted": len(never), "requests": len(reqs),
                     "ttft_median_s": statistics.median(r["ttft_s"] for r in reqs),
                     "decode_median_s": statistics.median(r["seconds"] - r["ttft_s"] for r in reqs),
                     "seconds_over_plain_median": statistics.median(a / b for a, b in zip(per_round, plain)),
                     "seconds_over_plain": [a / b for a, b in zip(per_round, plain)]}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-snippets", action="store_true")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    from transformers import AutoTokenizer

    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.serve.server import stop_server

    torch.set_num_threads(args.threads)
    names = list(CASES)
    requests = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        engine, _ = served_engine(root, 16, "benchmarks/serve_floor_1024.py")
        prompts = prompt_sets(AutoTokenizer.from_pretrained(stdlib_pair()[0]), quick=False)
        servers = {}
        try:
            for name in names:
                servers[name] = serve(engine, root, *CASES[name], args.threads,
                                      name.replace(" ", "-").replace("=", ""))
            urls = {name: f"{ends.http_url}/v2/models/m/generate" for name, (_, ends) in servers.items()}
            for name in names:
                post(urls[name], {"text_input": prompts["short"][0], "sampling_param_max_tokens": 8})  # warm-up
                if not args.no_snippets:
                    for c in (1, 4, 16):
                        run_point(urls[name], servers[name][1].metrics_url, prompts["short"], c, 6 * c)
            for r in range(args.rounds):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    for i in range(5, -1, -1):  # the served benchmark's order (its clients pop from the end)
                        requests[name].append({"round": r, "window": i, **one_request(urls[name], prompts["1024"][i])})
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{n} {statistics.median(x['seconds'] for x in requests[n] if x['round'] == r):.4f} s"
                    for n in names), file=sys.stderr, flush=True)
        finally:
            for proc, _ in servers.values():
                stop_server(proc)
    table = summarize(requests, args.rounds)
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "threads": args.threads, "snippets_first": not args.no_snippets, "load_average_at_end": os.getloadavg(),
              "table": table, "requests": requests}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'server':>12} {'median s':>9} {'never drafted s':>15} {'(n)':>5} {'ttft s':>7} {'decode s':>8} "
          f"{'÷ plain':>7}")
    for name, t in table.items():
        never = "n/a" if t["never_drafted_median_s"] is None else f"{t['never_drafted_median_s']:.4f}"
        print(f"{name:>12} {t['median_s']:>9.4f} {never:>15} {t['never_drafted']:>5} {t['ttft_median_s']:>7.4f} "
              f"{t['decode_median_s']:>8.4f} {t['seconds_over_plain_median']:>7.3f}")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
