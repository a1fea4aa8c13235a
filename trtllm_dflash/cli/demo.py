"""dflash-demo: the README's main job on the built-in pair.

build (a torch engine) -> exactness check (greedy DFlash == plain, token for token) -> serve with
the real tritonserver, DFlash and plain decoding side by side -> --repeats concurrency sweeps of each
with dflash-bench, alternating order -> the report of repeat 1 (table and plots) and the DFlash/plain
ratio at each interactivity over all repeats (median, min-max). Everything lands under --output; the
last lines printed are the tables and where the report is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from ..utils.cli import run_cli

PROG = "dflash-demo"
MODEL = "dflash"
DECODINGS = ("dflash", "plain")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Build, serve and benchmark the built-in pair: DFlash vs plain.")
    p.add_argument("--output", default="build/demo", help="working directory (engine, repositories, runs, report)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="sweep ladder")
    p.add_argument("--prompts-per-point", type=int, default=16, help="measured requests per point (default 16)")
    p.add_argument("--repeats", type=int, default=3, help="sweeps of each decoding, alternating order; the "
                   "ratio is reported as their median with min-max (default 3)")
    p.add_argument("--osl", type=int, default=128, help="output tokens per request (EOS ignored)")
    p.add_argument("--interactivity", default="60,100,150,200,300", help="tok/s/user levels of the table (CPU-sized)")
    p.add_argument("--check-prompts", type=int, default=4, help="held-out prompts of the exactness check")
    p.add_argument("--threads", type=int, help="torch threads of each server (default: the cores available to "
                   "this process, at most 8); recorded with the repeats")
    return p


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build(out: Path) -> Path:
    from ..builder.builder import build_engine
    from ..builder.spec import BuildSpec
    from ..pairs import stdlib_pair

    target, drafter = stdlib_pair()
    spec = BuildSpec(str(target), str(drafter), str(out / "engine"), dtype="float32", max_batch_size=16,
                     max_seq_len=1024, force=True)
    return build_engine(spec, f"{PROG} (built-in pair)")


def check_exact(engine: Path, prompts: list[str], new_tokens: int) -> float:
    """Greedy DFlash output equals plain decoding's on held-out prompts; -> pooled tau."""
    from ..engine.loader import load_engine
    from ..engine.request import Request, pooled_tau
    from ..utils.errors import DFlashError

    spec, plain = load_engine(engine), load_engine(engine, decoding="plain")
    requests = [Request(tuple(spec.tokenizer(p, add_special_tokens=False)["input_ids"]), new_tokens, ignore_eos=True)
                for p in prompts]
    a, b = spec.generator.generate(requests), plain.generator.generate(requests)
    if [r.output_ids for r in a] != [r.output_ids for r in b]:
        raise DFlashError("DFlash output differs from plain decoding: the engine is not lossless")
    return pooled_tau(a)


@contextmanager
def serving(engine: Path, out: Path, decoding: str, threads: int):
    """tritonserver serving the engine with `decoding` until the block ends; -> its Endpoints."""
    from ..engine.loader import free_port
    from ..serve.locate import find_tritonserver
    from ..serve.repository import ServeSettings, write_repository
    from ..serve.server import Endpoints, start_server, stop_server, wait_ready

    repo = out / f"repo-{decoding}"
    write_repository(engine, repo, ServeSettings(MODEL, decoding=decoding, threads=threads))
    ends = Endpoints("127.0.0.1", free_port(), free_port(), free_port())
    with open(out / f"server-{decoding}.log", "w") as server_log:
        server = start_server(find_tritonserver(out / ".triton"), repo, ends, server_log)
        try:
            wait_ready(server, timeout=300)
            log(f"serving {decoding} on {ends.http_url}")
            yield ends
        finally:
            stop_server(server)


def sweep(ends, engine: Path, run_dir: Path, decoding: str, args, dataset: Path) -> Path:
    """One dflash-bench sweep of a running server; -> the run directory."""
    from ..utils.errors import DFlashError
    from .bench import main as bench_main

    shutil.rmtree(run_dir, ignore_errors=True)  # our own working directory: a rerun starts clean
    code = bench_main(["sweep", "--url", ends.http_url, "--model", MODEL, "--concurrency", args.concurrency,
                       "--prompts-per-point", str(args.prompts_per_point), "--osl", str(args.osl),
                       "--dataset", str(dataset), "--tokenizer", str(engine), "--label", decoding,
                       "--output", str(run_dir), "--metrics-url", ends.metrics_url, "--no-progress"])
    if code != 0:
        raise DFlashError(f"the {decoding} sweep failed (exit {code}); see {run_dir}")
    return run_dir


def sweep_repeats(engine: Path, out: Path, args, dataset: Path) -> list[dict[str, Path]]:
    """Both servers up at once (the idle one sleeps); each repeat sweeps both, alternating which goes first,
    so slow drift on a shared machine lands on both sides. -> per repeat {decoding: run directory}."""
    repeats = []
    with ExitStack() as stack:
        ends = {d: stack.enter_context(serving(engine, out, d, args.threads)) for d in DECODINGS}
        for r in range(1, args.repeats + 1):
            order = DECODINGS if r % 2 else DECODINGS[::-1]
            log(f"repeat {r} of {args.repeats}: sweeping {' then '.join(order)} at concurrency {args.concurrency}")
            repeats.append({d: sweep(ends[d], engine, out / "runs" / f"r{r}" / d, d, args, dataset) for d in order})
    return repeats


def run(argv: list[str] | None) -> int:
    from ..bench import repeats as repeat_table
    from ..bench.report import load_run
    from ..pairs import held_out_texts
    from ..utils.errors import DFlashError
    from ..utils.threads import resolve_threads
    from .bench import main as bench_main

    args = parser().parse_args(argv)
    if args.repeats < 1:
        raise DFlashError(f"--repeats must be at least 1, got {args.repeats}")
    args.threads = resolve_threads(args.threads)  # pinned: both servers alike, and recorded
    out = Path(args.output).absolute()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    engine = build(out)
    log(f"built {engine}")
    texts = held_out_texts(256)  # more than a sweep sends (warm-ups included): no prompt repeats within one
    dataset = out / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    tau = check_exact(engine, texts[:args.check_prompts], args.osl)
    log(f"exact: greedy DFlash == plain on {args.check_prompts} held-out prompts (tau {tau:.2f}, block 16)")
    repeats = sweep_repeats(engine, out, args, dataset)
    report = out / "report"
    shutil.rmtree(report, ignore_errors=True)
    code = bench_main(["report", *(str(repeats[0][d]) for d in DECODINGS), "--baseline", "plain",
                       "--interactivity", args.interactivity, "--output", str(report)])
    if code != 0:
        return code
    levels = tuple(float(x) for x in args.interactivity.split(","))
    pairs = [(load_run(r["dflash"]), load_run(r["plain"])) for r in repeats]
    table = repeat_table.write(report, repeat_table.ratio_rows(pairs, levels), "dflash", "plain",
                               {k: getattr(args, k) for k in ("concurrency", "prompts_per_point", "osl", "repeats",
                                                              "threads")})
    print((report / "report.md").read_text())
    print(f"## DFlash ÷ plain over {args.repeats} repeats (report.md above is repeat 1)\n\n{table}\n")
    log(f"done in {time.perf_counter() - t0:.0f} s; report: {report / 'report.md'}, repeats: {report / 'repeats.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
