"""Requests/s and output tokens/s of a CPU Triton deployment of the built-in pair, at concurrency 1, 4, 16.

Builds a torch engine of the built-in pair, serves it with the real tritonserver on loopback, and
keeps N requests in flight (HTTP /generate, 64 new tokens, EOS ignored) for 4 x N requests per
point. Writes benchmarks/results/serve_cpu.json and prints a table last.
Run: python benchmarks/serve_cpu.py
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

OUT = Path(__file__).parent / "results" / "serve_cpu.json"
NEW_TOKENS = 64


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run_point(url: str, prompts: list[str], concurrency: int) -> dict:
    todo = list(range(4 * concurrency))
    lock, replies = threading.Lock(), []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            body = {"text_input": prompts[i % len(prompts)], "sampling_param_max_tokens": NEW_TOKENS,
                    "sampling_param_ignore_eos": True, "sampling_param_exclude_input_from_output": True}
            reply = post(url, body)
            with lock:
                replies.append(reply)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    tokens = sum(r["num_output_tokens"] for r in replies)
    drafted = sum(r["total_draft_tokens"] for r in replies)
    accepted = sum(r["total_accepted_draft_tokens"] for r in replies)
    return {"concurrency": concurrency, "requests": len(replies), "seconds": wall,
            "requests_per_s": len(replies) / wall, "output_tokens_per_s": tokens / wall,
            "acceptance_rate": accepted / drafted if drafted else 0.0}


def main() -> None:
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.builtin import builtin_pair, held_out_prompts
    from trtllm_dflash.engine import free_port
    from trtllm_dflash.serve.locate import find_tritonserver
    from trtllm_dflash.serve.repository import ServeSettings, write_repository
    from trtllm_dflash.serve.server import Endpoints, start_server, stop_server, wait_ready

    target, drafter = builtin_pair()
    prompts = [bytes(p).decode() for p in held_out_prompts(16)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        engine = build_engine(BuildSpec(str(target), str(drafter), str(root / "engine"), dtype="float32",
                                        max_batch_size=16, max_seq_len=512), "benchmarks/serve_cpu.py")
        write_repository(engine, root / "repo", ServeSettings())
        ends = Endpoints("127.0.0.1", free_port(), free_port(), free_port())
        proc = start_server(find_tritonserver(root / "triton"), root / "repo", ends, open(root / "log", "w"))
        try:
            wait_ready(proc)
            url = f"{ends.http_url}/v2/models/dflash/generate"
            post(url, {"text_input": prompts[0], "sampling_param_max_tokens": 8})  # warm-up
            rows = [run_point(url, prompts, c) for c in (1, 4, 16)]
        finally:
            stop_server(proc)
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"platform": platform.platform(), "python": platform.python_version()},
              "engine": "built-in pair, torch backend, float32, TP 1, block 8", "new_tokens": NEW_TOKENS, "rows": rows}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'concurrency':>11} {'requests':>8} {'req/s':>7} {'out tok/s':>10} {'accept rate':>11}")
    for r in rows:
        print(f"{r['concurrency']:>11} {r['requests']:>8} {r['requests_per_s']:>7.2f} {r['output_tokens_per_s']:>10.1f} "
              f"{r['acceptance_rate']:>11.2f}")
    print(f"written: {OUT}")


if __name__ == "__main__":
    main()
