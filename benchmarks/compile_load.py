"""How long the built-in pair's DFlash engine takes to load in `compile` mode on a cold inductor cache, and how
many graphs its warm-up compiles (`step_mode.compile_step_shapes`).

    python benchmarks/compile_load.py [--threads 2] [--output benchmarks/results/compile_load.json]

The inductor cache is a fresh temporary directory (TORCHINDUCTOR_CACHE_DIR, set before torch is imported).
One load per run: compile time on this shared CPU varies from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "compile_load.json"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
    import torch

    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    load_pipeline(*stdlib_pair(), step_mode="compile")
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "torch": torch.__version__, "threads": args.threads, "load_s": time.perf_counter() - started,
              "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"]}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
