"""dflash-build: build an engine directory; `inspect` and `verify` an existing one."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from ..builder.backend import BACKENDS, backend_for
from ..builder.spec import QUANTS
from ..builder.trtllm.tables import known_versions
from ..checkpoint.loader import DTYPES
from ..config.manifest import Manifest
from ..utils.cli import run_cli
from ..utils.errors import DFlashError
from .common import model_path

PROG = "dflash-build"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Build a DFlash engine directory from a target and its drafter. "
                                "Also: 'dflash-build inspect ENGINE_DIR [--json]', 'dflash-build verify ENGINE_DIR', "
                                "'dflash-build calibrate ENGINE_DIR' (this machine's step cost, a prior for --draft-len auto), "
                                "'dflash-build compile ENGINE_DIR' (this machine's step graphs, stored in the engine), "
                                "'dflash-build options ENGINE_DIR' (a trtllm engine's options, paths absolute).")
    p.add_argument("--config", help="YAML file with the same settings (flags override it)")
    p.add_argument("--target", help="target model directory, hub id, or 'builtin'")
    p.add_argument("--drafter", help="DFlash or DFlash2 drafter directory, hub id, 'builtin' or 'builtin-dflash2'")
    p.add_argument("--output", help="engine directory to create")
    # choices are validated by BuildSpec, so a bad value is one line naming it
    p.add_argument("--backend", help=f"{' | '.join(BACKENDS)} (default torch)")
    p.add_argument("--tp", type=int, help="tensor-parallel size")
    p.add_argument("--dtype", help=f"{' | '.join(DTYPES)} (default bfloat16)")
    p.add_argument("--quant", help=f"{' | '.join(QUANTS)}: Model Optimizer quantization of the target (trtllm backend)")
    p.add_argument("--calib", help="JSONL calibration prompts ({\"prompt\": ...} or {\"text\": ...} per line)")
    p.add_argument("--block-size", type=int)
    p.add_argument("--max-batch-size", type=int)
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--max-num-tokens", type=int)
    p.add_argument("--force", action="store_true", default=None, help="replace an existing output directory")
    t = p.add_argument_group("trtllm backend")
    t.add_argument("--gpu", help="the serving GPU (b200, b300, h100, h200, ...): picks the DFlash attention and MoE "
                   "backends (default: the build host's GPU)")
    t.add_argument("--gpu-memory-gib", type=float, help="memory per GPU the weights and DFlash arena must fit "
                   "(default 80)")
    t.add_argument("--dflash-attention-backend", help="VANILLA | TRTLLM (SM100/SM103) | FA4 (SM90)")
    t.add_argument("--moe-backend", help="moe_config.backend for MoE targets (default: from the target and GPU)")
    t.add_argument("--kv-cache-dtype", help="auto | fp8 | nvfp4 (default auto: the model dtype)")
    t.add_argument("--draft-len-schedule", metavar="FILE", help="draft-length schedule (dflash-bench tune writes it)")
    t.add_argument("--rejection-sampling", action="store_true", default=None,
                   help="speculative_config.use_rejection_sampling for sampled (T > 0) requests")
    t.add_argument("--chunked-prefill", action="store_true", default=None, help="enable_chunked_prefill")
    t.add_argument("--cuda-graph-batch-sizes", type=batch_sizes, metavar="N,N,...",
                   help="cuda_graph_config.batch_sizes (default: generated up to --max-batch-size)")
    t.add_argument("--llm-option", action="append", metavar="KEY=VALUE", help="any other TensorRT-LLM option, "
                   "e.g. kv_cache_config.host_cache_size=0 (repeatable; checked against upstream's field table)")
    t.add_argument("--trtllm-version", metavar="V", help="the TensorRT-LLM release the engine is served with: picks "
                   f"the field table options are checked against (known: {', '.join(known_versions())}; default "
                   "the newest)")
    t.add_argument("--prefix-reuse", type=int, metavar="TAIL", help="KV-cache block reuse, the drafter's context "
                   "recomputed for the last TAIL prompt tokens of a cache hit (TensorRT-LLM >= 1.4.0rc1; default off)")
    return p


def batch_sizes(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def run_build(argv: list[str]) -> int:
    from ..builder.builder import build_engine
    from ..builder.spec import BuildSpec

    args = vars(build_parser().parse_args(argv))
    config = args.pop("config")
    spec = BuildSpec.from_sources(config, args)
    # 'builtin' names the shipped pair, from a flag or from the YAML file alike
    spec = replace(spec, **{role: str(model_path(getattr(spec, role), role)) for role in ("target", "drafter")})
    out = build_engine(spec, shlex.join([PROG, *argv]))
    print(f"built {spec.backend} engine: {out}")
    details = Manifest.read(out).backend_details
    if "memory" in details:
        print(details["memory"]["summary"])
    for warning in details.get("warnings", ()):
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    return 0


def inspect_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} inspect", description="Print an engine's manifest.")
    p.add_argument("engine_dir")
    p.add_argument("--json", action="store_true")
    return p


def run_inspect(argv: list[str]) -> int:
    args = inspect_parser().parse_args(argv)
    m = Manifest.read(args.engine_dir)
    if args.json:
        print(json.dumps(vars(m), indent=2))
        return 0
    print(f"engine       {args.engine_dir} (format {m.format_version}, built by trtllm-dflash {m.tool_version})")
    print(f"backend      {m.backend}  tp {m.tp_size}  dtype {m.dtype}  quantization {m.quantization}")
    print(f"target       {m.target['source']} ({m.target['model_type']}, {m.target['num_hidden_layers']} layers)")
    print(f"drafter      {m.drafter['source']} (block size {m.block_size})")
    print("limits       " + "  ".join(f"{k} {v}" for k, v in m.limits.items()))
    print(f"files        {len(m.files)}; built with: {m.build_command}")
    for key, value in m.backend_details.items():
        print(f"{key:<12} {value}")
    extra = backend_for(m.backend).inspect_lines(Path(args.engine_dir)) if m.backend in BACKENDS else []
    if extra:  # what the backend adds beyond the manifest (a manifest of an unknown backend is still printed)
        print("\n".join(extra))
    return 0


def verify_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} verify", description="Re-hash an engine's files and re-check its "
                                "weights' names and shapes against the configs.")
    p.add_argument("engine_dir")
    return p


def run_verify(argv: list[str]) -> int:
    from ..builder.verify import verify_engine

    args = verify_parser().parse_args(argv)
    ok, lines = verify_engine(args.engine_dir)
    for line in lines:
        print(line)
    return 0 if ok else 1


def calibrate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} calibrate", description="Measure this machine's decode-step cost for a "
                                "torch engine (batch x draft length x context) and cache it in ENGINE/calibration/, "
                                "where --draft-len auto reads it as the prior of the step times it measures. Valid "
                                "for this device and thread count only.")
    p.add_argument("engine_dir")
    p.add_argument("--max-batch-size", type=int, help="largest running batch measured (default: the engine's)")
    p.add_argument("--threads", type=int, help="torch threads, as the server will run (default: dflash-serve's, "
                   "the cores this process may use, at most 8)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per grid point (the median is kept)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--step-mode", default="auto", help="how steps run, as the server will run them: eager, compile, "
                   "cuda-graphs, or auto (default: cuda-graphs on CUDA, eager on a CPU; a cache key)")
    p.add_argument("--json", action="store_true", help="print the cost model as JSON")
    return p


def run_calibrate(argv: list[str]) -> int:
    from ..engine.draft_len import calibrate_engine
    from ..utils.threads import set_threads

    args = calibrate_parser().parse_args(argv)
    set_threads(args.threads)  # the calibration is valid for this thread count only (its cache key)
    if args.repeats < 1:
        raise DFlashError(f"--repeats must be at least 1, got {args.repeats}")
    model, where = calibrate_engine(args.engine_dir, args.max_batch_size, args.repeats, args.device, args.step_mode)
    if args.json:
        print(json.dumps(model.to_json(), indent=1))
        return 0
    print(cost_table(model))
    print(f"{model.meta['device']}, {model.meta['threads']} threads, {model.meta['calibration_s']:.1f} s; "
          + (f"cached in {where}" if where else "not cached: neither the engine directory nor the user cache "
             "is writable"))
    return 0


def run_compile(argv: list[str]) -> int:
    from ..builder.compile_graphs import compile_engine
    from ..engine.loader import read_torch_manifest
    from ..utils.threads import set_threads

    p = argparse.ArgumentParser(prog=f"{PROG} compile", description="Compile every step graph a torch engine's "
                                "server runs on this machine (prefill, each batch bucket, the drafter; every "
                                "tensor-parallel rank) and store them in ENGINE_DIR/compiled/ under this machine's "
                                "key, where dflash-serve and dflash-generate --engine load them instead of compiling. "
                                "Also calibrates the step cost for the same key when the engine has none.")
    p.add_argument("engine_dir")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--step-mode", default="auto", help="compile or cuda-graphs, as the engine will be run (default "
                   "auto: cuda-graphs on CUDA, compile on a CPU)")
    p.add_argument("--threads", type=int, help="torch threads, as the engine will run (a CPU key; default: "
                   "dflash-serve's and dflash-generate's, the cores this process may use, at most 8)")
    p.add_argument("--no-calibrate", action="store_true", help="skip the step-cost calibration")
    args = p.parse_args(argv)
    set_threads(args.threads, read_torch_manifest(args.engine_dir).tp_size)
    mode = args.step_mode
    if mode == "auto" and not args.device.startswith("cuda"):
        mode = "compile"  # a CPU's auto is eager, which has nothing to compile
    for where in compile_engine(args.engine_dir, args.device, mode, not args.no_calibrate,
                                log=lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True)):
        print(f"compiled graphs: {where}")
    return 0


def cost_table(model) -> str:
    """Milliseconds per step: one block per context, a row per batch size, a column per draft length."""
    lines = []
    for c, context in enumerate(model.contexts):
        lines.append(f"context {context}: ms per step (rows: running batch; columns: draft length)")
        lines.append("batch " + "".join(f"{k:>8}" for k in model.draft_lens))
        for b, batch in enumerate(model.batch_sizes):
            lines.append(f"{batch:>5} " + "".join(f"{1e3 * s:>8.1f}" for s in model.seconds[c][b]))
    return "\n".join(lines)


def options_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} options", description="A trtllm engine's TensorRT-LLM options with "
                                "its drafter's path absolute for where the engine is now, for `trtllm-serve "
                                "ENGINE_DIR/target --config FILE` from any directory (the engine's own "
                                "llm_options.yaml is relative to it, and TensorRT-LLM resolves paths against the "
                                "working directory).")
    p.add_argument("engine_dir")
    p.add_argument("--output", "-o", help="file to write (default: standard output)")
    return p


def run_options(argv: list[str]) -> int:
    from ..builder.trtllm.engine import write_options_at

    args = options_parser().parse_args(argv)
    text = write_options_at(args.engine_dir, args.output)
    if args.output is None:
        print(text, end="")
    return 0


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    """The parsers of `dflash-build SUBCOMMAND` (docs/cli.md is generated from these and build_parser)."""
    return {"inspect": inspect_parser(), "verify": verify_parser(), "calibrate": calibrate_parser(),
            "options": options_parser()}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"inspect": run_inspect, "verify": run_verify, "calibrate": run_calibrate, "options": run_options,
                "compile": run_compile}
    if argv and argv[0] in commands:
        return run_cli(PROG, lambda: commands[argv[0]](argv[1:]))
    return run_cli(PROG, lambda: run_build(argv))


if __name__ == "__main__":
    sys.exit(main())
