"""Step seconds when a serving process loads on one thread and steps on another, against one torch thread.

    python benchmarks/torch_thread_steps.py [--repeats 3] [--threads 2]

The built-in pair (float32, DFlash), 16 slots, a batch of 16 requests pinned at a 128-token context;
the step cost of draft length 0 (a plain step) and 8, timed as the step-cost calibration times them
(draft_length/calibrate.py: median of 5 interleaved steps). Two layouts, each in a fresh process
(libgomp's thread pools are per process), alternating per repeat:
- split: the engine loaded and warmed up on the main thread, the steps timed on a second thread
  (how the Triton model ran before serve/torch_thread.py: initialize loads, the serving loop steps);
- one thread: load and steps on one serve.torch_thread.TorchThread (how it runs now).
The split layout also times steps on the main thread (its calibration's view before the fix).
Writes benchmarks/results/torch_thread_steps.json: per repeat ms, medians and split / one-thread ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "torch_thread_steps.json"
BATCH, CONTEXT, DRAFT_LENS = 16, 128, (0, 8)


def steps_ms(generator) -> list[float]:
    from trtllm_dflash.draft_length.calibrate import CalibrationPlan, measure

    model = measure(generator, CalibrationPlan((BATCH,), DRAFT_LENS, (CONTEXT,), repeats=5))
    return [1e3 * s for s in model.seconds[0][0]]


def child(layout: str, threads: int, engine: str) -> dict:
    import torch

    from trtllm_dflash.engine import load_engine
    from trtllm_dflash.serve.torch_thread import TorchThread

    def load():
        torch.set_num_threads(threads)
        g = load_engine(Path(engine), decoding="dflash").generator
        g.allocate(BATCH, 1280, g.block)
        return g

    if layout == "one thread":
        worker = TorchThread()
        g = worker.call(load)
        return {"steps_ms": worker.call(lambda: steps_ms(g))}
    g = load()
    main = steps_ms(g)
    box = []
    second = threading.Thread(target=lambda: box.append(steps_ms(g)))
    second.start()
    second.join()
    return {"steps_ms": box[0], "main_thread_steps_ms": main}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", nargs=2, metavar=("LAYOUT", "ENGINE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.threads, args.child[1])))
        return
    import tempfile

    import torch

    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.pairs import stdlib_pair

    target, drafter = stdlib_pair()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        engine = str(Path(tmp) / "engine")
        build_engine(BuildSpec(str(target), str(drafter), engine, dtype="float32", max_batch_size=BATCH,
                               max_seq_len=1280), "benchmarks/torch_thread_steps.py")
        for rep in range(args.repeats):
            for layout in (("split", "one thread") if rep % 2 == 0 else ("one thread", "split")):
                out = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--child", layout, engine],
                                     check=True, capture_output=True, text=True).stdout
                rows.append({"layout": layout, "repeat": rep, **json.loads(out.strip().splitlines()[-1])})
                print(f"repeat {rep + 1}: {layout:10} {rows[-1]['steps_ms']}", file=sys.stderr, flush=True)
    summary = {}
    for i, k in enumerate(DRAFT_LENS):
        split = [r["steps_ms"][i] for r in rows if r["layout"] == "split"]
        one = [r["steps_ms"][i] for r in rows if r["layout"] == "one thread"]
        main_thread = [r["main_thread_steps_ms"][i] for r in rows if r["layout"] == "split"]
        ratios = [s / o for s, o in zip(split, one)]
        summary[f"draft_len_{k}"] = {"split_ms_median": statistics.median(split), "one_thread_ms_median": statistics.median(one),
                                     "split_main_thread_ms_median": statistics.median(main_thread),
                                     "split_over_one_thread": {"median": statistics.median(ratios), "min": min(ratios),
                                                               "max": max(ratios)}}
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                          "threads": args.threads, "torch": torch.__version__, "load_average_at_end": os.getloadavg()},
              "batch": BATCH, "context": CONTEXT, "rows": rows, "summary": summary}
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    for k, s in summary.items():
        r = s["split_over_one_thread"]
        print(f"{k}: split {s['split_ms_median']:.1f} ms (main thread {s['split_main_thread_ms_median']:.1f}), one thread "
              f"{s['one_thread_ms_median']:.1f} ms; split / one thread {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")


if __name__ == "__main__":
    main()
