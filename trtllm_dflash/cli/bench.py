"""dflash-bench: `sweep` a served model over load points, `report` runs as frontiers and tables.

Exit status: 0 done; 1 the sweep was cut short (the server died; partial results are kept), or a
point had no successful request (the most common error is printed; results are kept); 2 bad input
(one line on stderr); 130 interrupted.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..utils.cli import Parser, run_cli
from ..utils.errors import DFlashError

PROG = "dflash-bench"


def sweep_flags(p: argparse.ArgumentParser) -> None:
    # Every default is None: a preset fills what the flags leave out, then SweepSpec's defaults.
    p.add_argument("--preset", help="YAML file of sweep settings (keys as the flags, e.g. prompts_per_point)")
    p.add_argument("--url", help="server: http://host:8000 (Triton HTTP, OpenAI) or host:8001 (Triton gRPC)")
    p.add_argument("--model", help="model name on the server")
    p.add_argument("--api", help="triton-http (default) | triton-grpc | openai")
    p.add_argument("--concurrency", help="requests in flight per point, e.g. 1,2,4,8,16,32,64 (default); "
                   "with --request-rate: one in-flight cap")
    p.add_argument("--request-rate", help="Poisson arrivals instead, requests/s per point, e.g. 1,2,4")
    p.add_argument("--prompts-per-point", type=int, help="measured requests per point (default 10 x load)")
    p.add_argument("--duration", type=float, help="seconds of arrivals per point, instead of --prompts-per-point")
    p.add_argument("--warmup", type=int, help="requests before each point, not measured (default 2 x load)")
    p.add_argument("--isl", type=int, help="input tokens of random prompts (default 1024)")
    p.add_argument("--osl", type=int, help="output tokens, EOS ignored (default 1024)")
    p.add_argument("--isl-range", type=float, help="random input lengths in [range x ISL, ISL] (default 0.8)")
    p.add_argument("--dataset", help="JSONL prompts instead: {\"prompt\": ...} or {\"messages\": [...]} per line")
    p.add_argument("--tokenizer", help="model directory, engine directory (its tokenizer/), or hub id")
    p.add_argument("--num-gpus", type=int, help="GPUs serving, TP x PP x replicas (default: the engine's TP, else 1)")
    p.add_argument("--label", help="name of this run in reports (default: the model name)")
    p.add_argument("--output", help="run directory (default bench_runs/<label>-<UTC time>)")
    p.add_argument("--seed", type=int, help="prompts and arrivals (default 0)")
    p.add_argument("--timeout", type=float, help="seconds before a request counts as stuck (default 600)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default 0, greedy)")
    p.add_argument("--metrics-url", help="Prometheus endpoint with the dflash counters (default, Triton APIs: "
                   "the metrics port dflash-serve pairs with the URL's port (HTTP + 2, gRPC + 1), then 8002; "
                   "'none' to skip)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--baseline", help="label of the run the ratios divide by (default: the first run)")
    p.add_argument("--interactivity", default="50,100,200,500", help="tok/s/user levels of the table")
    p.add_argument("--interpolation", default="pchip", help="pchip (default) | linear")
    p.add_argument("--output", default="bench_report", help="report directory (default bench_report)")


def tune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="[K=]RUN_DIR", help="sweep runs at a fixed draft length K (read from "
                   "the run's draft-length counters when not given; K=0 for plain decoding); repeats of one K are "
                   "combined by their median")
    p.add_argument("--output", required=True, help="the draft_len_schedule file to write (YAML)")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Benchmark a served model at fixed load points; report throughput per GPU "
                                      "at fixed interactivity.")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    sweep_flags(sub.add_parser("sweep", help="measure a served model over load points"))
    report_flags(sub.add_parser("report", help="frontiers, table and plots of one or more runs"))
    tune_flags(sub.add_parser("tune", help="a draft_len_schedule (concurrency -> draft length) from sweeps at fixed "
                                           "draft lengths, for dflash-build --backend trtllm --draft-len-schedule"))
    return p


def run_sweep_command(args: argparse.Namespace, argv: list[str]) -> int:
    from ..bench.spec import SweepSpec
    from ..bench.sweep import dominant_error, run_sweep

    flags = {k: v for k, v in vars(args).items() if k not in ("command", "preset", "no_progress")}
    spec = SweepSpec.from_sources(args.preset, flags)
    result = run_sweep(spec, shlex.join([PROG, *argv]), progress=not args.no_progress)
    if result.status != "complete":
        print(f"{PROG}: error: sweep cut short: {result.error}; partial results in {result.run_dir}", file=sys.stderr)
        return 1
    empty = result.empty_points()
    if empty:
        message, count, sent = dominant_error(empty)
        print(f"{PROG}: error: no request succeeded at point {', '.join(p['point'] for p in empty)}; most common "
              f"error ({count} of {sent} requests): {message}; results in {result.run_dir}", file=sys.stderr)
        return 1
    print(f"results: {result.run_dir}")
    return 0


def run_report_command(args: argparse.Namespace) -> int:
    from ..bench.report import make_report
    from ..bench.spec import ReportSpec

    spec = ReportSpec(tuple(args.runs), args.output, args.baseline, args.interactivity, args.interpolation)
    report = make_report(spec)
    print(f"report: {report.dir / 'report.md'}")
    return 0


def run_tune_command(args: argparse.Namespace) -> int:
    from ..bench.tune import read_table, schedule_from, tune_table_markdown
    from ..draft_length.schedule import write_schedule

    table = read_table(args.runs)
    schedule, notes = schedule_from(table)
    print("median output tok/s per concurrency and draft length k:")
    print(tune_table_markdown(table, schedule))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    path = write_schedule(args.output, schedule)
    print(f"draft_len_schedule {schedule.as_option()} (max_draft_len {schedule.max_draft_len}; above concurrency "
          f"{schedule.steps[-1][0]} speculation is off): {path}")
    return 0


def run(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.command == "sweep":
        return run_sweep_command(args, argv)
    if args.command == "report":
        return run_report_command(args)
    if args.command == "tune":
        return run_tune_command(args)
    raise DFlashError("choose a command: sweep, report or tune (dflash-bench sweep --help)")


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
