"""dflash-bench: `sweep` a served model over load points, `report` runs as frontiers and tables, `plan` a
deployment from AIConfigurator's silicon data before the hardware is at hand.

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
    p.add_argument("--plan", metavar="PLAN_DIR", help="a dflash-bench plan directory: its frontiers beside the runs' "
                   "(output tok/s/GPU), in the report's table and plan_overlay.png")


def tune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="[K=]RUN_DIR", help="sweep runs at a fixed draft length K (read from "
                   "the run's draft-length counters when not given; K=0 for plain decoding); repeats of one K are "
                   "combined by their median")
    p.add_argument("--output", required=True, help="the draft_len_schedule file to write (YAML)")


def plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target: an AIConfigurator model id (Qwen/Qwen3-8B, "
                   "openai/gpt-oss-120b, ...) or a directory with its config.json")
    p.add_argument("--drafter", required=True, help="DFlash or DFlash2 drafter directory (its config.json, "
                   "z-lab's or speculators' layout: the method is read from it)")
    p.add_argument("--gpu", required=True, help="AIConfigurator system: h100_sxm, h200_sxm, b200_sxm, b300_sxm, "
                   "gb200, gb300 (or h100, h200, b200, b300)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs of the node: TP x replicas")
    p.add_argument("--tp", nargs="+", metavar="N", help="TP sizes to try (default: every power of two dividing --gpus)")
    p.add_argument("--isl", type=int, default=1024, help="input tokens a request (default 1024)")
    p.add_argument("--osl", type=int, default=1024, help="output tokens a request (default 1024)")
    p.add_argument("--acceptance", metavar="FILE", help="per-position acceptance profile (JSON, format "
                   "dflash-acceptance-profile/1: docs/benchmarking.md)")
    p.add_argument("--tau", type=float, help="instead: mean acceptance length at the drafter's block size (bonus "
                   "token included), with a geometric profile")
    p.add_argument("--interactivity", nargs="+", metavar="TOK_S", help="tok/s/user floors of the table "
                   "(default 50 100 200 300 500)")
    p.add_argument("--batches", nargs="+", metavar="B", help="running batch sizes per replica "
                   "(default 1 2 4 ... 512)")
    p.add_argument("--backend-version", default="current", help="TensorRT-LLM version of AIConfigurator's data: "
                   "current (default), previous, next, or a version of its slots")
    p.add_argument("--verify-attention", default="per-query", help="verify attention over k + 1 tokens a request: "
                   "per-query (default: k + 1 decode queries, AIConfigurator's MTP convention, an upper bound) or "
                   "per-request (one KV read a request, a lower bound); the drafter's attention likewise")
    p.add_argument("--eagle3", metavar="DIR", help="an EAGLE-3 drafter (its config.json): a second baseline, "
                   "one layer run k times a step")
    p.add_argument("--eagle3-acceptance", metavar="FILE", help="its acceptance profile (the format of --acceptance)")
    p.add_argument("--eagle3-tau", type=float, help="instead: its mean acceptance length at --eagle3-max-draft-len")
    p.add_argument("--eagle3-max-draft-len", type=int, default=3, help="the longest EAGLE-3 chain planned "
                   "(default 3)")
    p.add_argument("--output", help="directory for plan.json, points.csv, frontier.png and the schedule files")
    p.add_argument("--json", action="store_true", help="print plan.json on stdout")


def acceptance_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="files of dflash-generate --json output (one object a "
                   "line; pooled), or one dflash-bench sweep run directory")
    p.add_argument("--draft-len", type=int, help="a sweep's fixed draft length (default: from its counters)")
    p.add_argument("--note", help="the profile's source text (default: the runs and their step count)")
    p.add_argument("--output", required=True, help="the profile file to write (JSON, for dflash-bench plan "
                   "--acceptance)")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Benchmark a served model at fixed load points; report throughput per GPU "
                                      "at fixed interactivity.")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    sweep_flags(sub.add_parser("sweep", help="measure a served model over load points"))
    report_flags(sub.add_parser("report", help="frontiers, table and plots of one or more runs"))
    tune_flags(sub.add_parser("tune", help="a draft_len_schedule (concurrency -> draft length) from sweeps at fixed "
                                           "draft lengths, for dflash-build --backend trtllm --draft-len-schedule"))
    acceptance_flags(sub.add_parser("acceptance", help="a per-position acceptance profile for plan --acceptance, "
                                                       "from dflash-generate --json runs or a sweep"))
    plan_flags(sub.add_parser("plan", help="project plain decoding's and DFlash's throughput at fixed interactivity "
                                           "from AIConfigurator's silicon data (needs the plan extra)"))
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

    spec = ReportSpec(tuple(args.runs), args.output, args.baseline, args.interactivity, args.interpolation,
                      args.plan)
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


def run_acceptance_command(args: argparse.Namespace) -> int:
    from ..bench.plan.acceptance import write_profile
    from ..bench.plan.measured import profile_from_runs

    if args.draft_len is not None and args.draft_len < 1:
        raise DFlashError(f"--draft-len must be >= 1, got {args.draft_len}")
    profile = profile_from_runs(args.runs, args.draft_len, args.note)
    path = write_profile(args.output, profile)
    rates = " ".join(f"{a:.3f}" for a in profile.per_position)
    print(f"acceptance profile ({len(profile.per_position)} positions: {rates}; E[tokens | k = "
          f"{len(profile.per_position)}] {profile.tokens_per_step(len(profile.per_position)):.2f}): {path}")
    return 0


def numbers(values: list[str] | None, kind: type, flag: str) -> tuple:
    """`--tp 1 2 4` or `--tp 1,2,4`."""
    try:
        return tuple(kind(v) for item in values or () for v in item.split(",") if v)
    except ValueError:
        raise DFlashError(f"{flag}: expected numbers, got {' '.join(values)!r}") from None


def run_plan_command(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..bench.plan import run_plan
    from ..bench.plan.inputs import DEFAULT_BATCHES, DEFAULT_LEVELS, PlanSpec

    spec = PlanSpec(target=args.target, drafter=args.drafter, gpu=args.gpu, gpus=args.gpus, isl=args.isl,
                    osl=args.osl, tp=numbers(args.tp, int, "--tp"), acceptance=args.acceptance, tau=args.tau,
                    interactivity=numbers(args.interactivity, float, "--interactivity") or DEFAULT_LEVELS,
                    backend_version=args.backend_version,
                    batches=numbers(args.batches, int, "--batches") or DEFAULT_BATCHES,
                    verify_attention=args.verify_attention, eagle3=args.eagle3,
                    eagle3_acceptance=args.eagle3_acceptance, eagle3_tau=args.eagle3_tau,
                    eagle3_max_draft_len=args.eagle3_max_draft_len, output=args.output)
    plan, _ = run_plan(spec)
    if args.json:
        print(json.dumps(plan, indent=1))
        return 0
    for row in plan["at_interactivity"]:
        c = row["config"]
        best = f"TP{c['tp']} x{c['replicas']}, batch {c['batch']}, k {c['draft_len']}" if c else "unreachable"
        eagle3 = f", eagle3 {row['eagle3_tok_s_gpu']}" if "eagle3_tok_s_gpu" in row else ""
        print(f">= {row['tok_s_user']:g} tok/s/user: plain {row['plain_tok_s_gpu']}, dflash {row['dflash_tok_s_gpu']}"
              f"{eagle3} tok/s/GPU (ratio {row['ratio']}; {best})")
    print(f"plan: {Path(args.output) / 'plan.json' if args.output else '(no --output)'} ({plan['provenance']['database']}, {plan['run_seconds']} s)")
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
    if args.command == "acceptance":
        return run_acceptance_command(args)
    if args.command == "plan":
        return run_plan_command(args)
    raise DFlashError("choose a command: sweep, report or tune (measured runs: dflash-bench sweep --help), or "
                      "acceptance and plan (a projection: dflash-bench plan --help)")


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
