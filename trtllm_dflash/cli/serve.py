"""dflash-serve: write a Triton model repository for an engine and run tritonserver on it."""

from __future__ import annotations

import sys
from pathlib import Path

from ..serve.openai.limits import DEFAULT_MAX_REQUEST_BYTES, MAX_STOP, MAX_STOP_CHARS
from ..utils.cli import Parser, run_cli
from ..utils.errors import DFlashError

PROG = "dflash-serve"


def parser() -> Parser:
    p = Parser(prog=PROG, description="Serve an engine directory with Triton Inference Server.")
    p.add_argument("engine_dir", help="an engine directory from dflash-build (torch or trtllm backend)")
    p.add_argument("--model-repo", default="triton_repo", help="where to write the Triton model repository "
                   "(default triton_repo)")
    p.add_argument("--log-file", metavar="FILE", help="where tritonserver's log is written, besides this terminal "
                   "(default: <model-repo>.log, e.g. triton_repo.log); a start that fails names it")
    p.add_argument("--model-name", default="dflash", help="the model's name in request URLs (default dflash)")
    p.add_argument("--host", default="127.0.0.1", help="address every port listens on (default 127.0.0.1, this "
                   "machine only; 0.0.0.0 for all interfaces)")
    p.add_argument("--triton-host", metavar="ADDR", help="address Triton's HTTP, gRPC and metrics ports listen on "
                   "(default: --host); e.g. --host 0.0.0.0 --triton-host 127.0.0.1 serves the OpenAI API to the "
                   "network and Triton's unauthenticated ports to this machine only")
    p.add_argument("--http-port", type=int, default=8000, help="Triton HTTP/REST port (default 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="Triton gRPC port (default 8001)")
    p.add_argument("--metrics-port", type=int, default=8002, help="Prometheus metrics port (default 8002)")
    p.add_argument("--openai-port", type=int, help="also serve the OpenAI API (/v1/models, /v1/completions, "
                   "/v1/chat/completions) on this port: torch engines through a frontend that forwards to "
                   "tritonserver, trtllm engines through TensorRT-LLM's trtllm-serve")
    p.add_argument("--chat-template", metavar="FILE", help="Jinja chat template for /v1/chat/completions "
                   "(default: the tokenizer's)")
    p.add_argument("--api-key", metavar="KEY", help="OpenAI API: every route but /health answers 401 without the "
                   "header 'Authorization: Bearer KEY' (default: the DFLASH_API_KEY environment variable, which keeps "
                   "the key out of `ps`; the frontend gets it in its environment). Triton's own ports take no key: "
                   "keep them on --triton-host 127.0.0.1")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, help="OpenAI API: larger "
                   f"request bodies are refused with 413 before they are read (default {DEFAULT_MAX_REQUEST_BYTES}, "
                   f"2 MiB). Also refused, with 400 naming the value: prompt + max_tokens over the engine's "
                   f"max_seq_len less a draft block, n other than 1, more than {MAX_STOP} stop sequences or one over "
                   f"{MAX_STOP_CHARS} characters, logprobs")
    p.add_argument("--max-batch-size", type=int, help="running batch (default: the engine's)")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 'overloaded' errors "
                   "(default 256)")
    p.add_argument("--decoding", default="dflash", help="dflash (default) or plain: the target alone, the baseline")
    p.add_argument("--draft-len", default="auto", help="torch engines: draft tokens per step; auto (default: "
                   "chosen every step from the step times and acceptance the server measures), N (fixed), or a "
                   "draft_len_schedule FILE (running batch size -> draft length)")
    p.add_argument("--threads", type=int, help="torch engines: torch threads of the model (default: the cores "
                   "this process may use, divided among the engine's ranks, at most 8)")
    p.add_argument("--step-mode", default="auto", help="torch engines: how decode steps run: eager, compile "
                   "(torch.compile) or cuda-graphs; auto (default): cuda-graphs on a GPU, eager on a CPU; "
                   "tensor-parallel engines run eager")
    p.add_argument("--admission-wait-ms", type=float, default=50.0, help="torch engines: how long a waiting request "
                   "may be held so that one prefill admits several (only where the engine's measured per-call "
                   "admission cost and the arrival rate make that pay; 0: admit at once; default 50)")
    p.add_argument("--kv-cache-gib", type=float, help="torch engines: GiB of the paged KV pool, target and drafter "
                   "(default: 90%% of the GPU memory free after loading; on a CPU enough for every slot at the "
                   "engine's max_seq_len)")
    p.add_argument("--no-prefix-caching", action="store_true", help="torch engines: do not reuse the KV blocks of "
                   "prompt prefixes earlier requests computed")
    p.add_argument("--max-num-tokens", type=int, help="torch engines: prefill prompts longer than this in chunks of "
                   "this many tokens, one chunk between decode steps (default: whole prompts)")
    p.add_argument("--write-only", action="store_true", help="write the repository (and, for trtllm engines, its "
                   "launch scripts) and exit")
    p.add_argument("--repository-only", action="store_true", help="write the model repository alone and exit (the "
                   "launch scripts run this where they serve, so the paths are valid there)")
    p.add_argument("--nodes", type=int, default=1, help="trtllm engines: nodes for the Slurm launch script")
    p.add_argument("--print-launch", metavar="DIR", help="write the repository and launch scripts (one node, Slurm, "
                   "benchmark job) into DIR, print how to run them, and exit")
    p.add_argument("--layout", help="NODESxGPUS of the Slurm script (default 1xTP; NxTP: N replicas, one per node; "
                   "trtllm NxG with N*G = TP: one group across nodes)")
    p.add_argument("--image", help="container image of the Slurm scripts (pyxis --container-image)")
    p.add_argument("--mounts", help="pyxis --container-mounts of the Slurm scripts, SRC:DST[,SRC:DST] "
                   "(default: the engine, repository and script folders at their own paths)")
    return p


def launch_spec(args, manifest, repo: Path):
    """The launch scripts' settings: --layout, else --nodes (N x TP/N); errors name the flag and value."""
    from ..serve.launch import LaunchSpec, check_safe, resolve_layout

    if args.print_launch:
        check_safe("--print-launch", Path(args.print_launch).absolute())
    layout = resolve_layout(manifest.tp_size, args.nodes, args.layout)
    return LaunchSpec(Path(args.engine_dir).absolute(), manifest.backend, manifest.tp_size, repo, layout,
                      args.model_name, args.decoding, args.max_batch_size, args.max_queue, args.http_port,
                      args.grpc_port, args.metrics_port, args.image or "", args.mounts or "")


def print_launch(spec, out: Path) -> None:
    from ..serve.launch import write_launch_scripts

    paths = {p.name: p for p in write_launch_scripts(spec, out)}
    print(f"# {spec.backend} engine, tp_size {spec.tp_size}; Slurm layout {spec.layout} "
          f"({spec.replicas} server{'s' if spec.replicas > 1 else ''}). DRY_RUN=1 prints each script's commands.")
    print(f"bash {paths['launch_single_node.sh']}")
    print(f"IMAGE={spec.container_image} sbatch {paths['launch_slurm.sbatch']}")
    print(f"bash {paths['bench_job.sh']}    # or: SERVE_JOB_ID=JOB sbatch --dependency=after:JOB "
          f"{paths['bench_job.sh']}")


def run(argv: list[str] | None) -> int:
    from dataclasses import asdict

    from ..config.manifest import Manifest
    from ..config.runtime import RuntimeConfig
    from ..serve.locate import find_tritonserver
    from ..serve.repository import ServeSettings, write_repository
    from ..serve.server import Endpoints, check_ports_free, run_foreground

    args = parser().parse_args(argv)
    ends = Endpoints(args.triton_host or args.host, args.http_port, args.grpc_port, args.metrics_port)
    if not (args.repository_only or args.write_only or args.print_launch):
        check_ports_free(ends, args.openai_port, args.host)  # one line now, not a Triton log line after loading
    settings = ServeSettings(args.model_name, args.max_batch_size, args.max_queue,
                             admission_wait_ms=args.admission_wait_ms, **asdict(RuntimeConfig.from_flags(args)))
    repo = Path(args.model_repo).absolute()
    manifest = Manifest.read(Path(args.engine_dir))
    frontend = openai_settings(args)  # checked before anything is written
    if args.repository_only:
        write_repository(Path(args.engine_dir), repo, settings)
        print(f"model repository: {repo} (model '{args.model_name}')", file=sys.stderr)
        return 0
    spec = launch_spec(args, manifest, repo) if manifest.backend == "trtllm" or args.print_launch else None
    model_dir = write_repository(Path(args.engine_dir), repo, settings)
    print(f"model repository: {repo} (model '{args.model_name}')", file=sys.stderr)
    if manifest.backend == "trtllm":
        from ..serve.launch import write_launch_scripts

        for path in write_launch_scripts(spec, repo):
            print(f"launch script: {path}", file=sys.stderr)
    if args.print_launch:
        print_launch(spec, Path(args.print_launch))
        return 0
    if manifest.backend == "trtllm" and frontend is not None:
        if frontend.api_key is not None:  # tensorrt_llm/commands/serve.py @00209af149e7: no such option
            raise DFlashError("--api-key: trtllm-serve, the OpenAI API of trtllm engines, takes no API key; put an "
                              "authenticating reverse proxy in front of it (docs/serving.md)")
        return trtllm_openai(args, manifest, repo)
    if args.write_only:
        return 0
    if manifest.backend == "trtllm" and not (model_dir / "1" / "model.py").exists():
        raise DFlashError("a trtllm engine is served by TensorRT-LLM's llmapi model.py: run inside the "
                          "tritonserver trtllm container with the launch script (dflash-serve --write-only writes "
                          "the repository)")
    install = find_tritonserver(repo.parent / ".dflash-triton")
    print(f"tritonserver: {install.binary} (from the {install.origin}; backends in {install.backend_dir})",
          file=sys.stderr)
    log_file = Path(args.log_file).absolute() if args.log_file else repo.with_name(f"{repo.name}.log")
    print(f"tritonserver starting: loading the model (the next line says when it is ready); log: {log_file}",
          file=sys.stderr, flush=True)
    ready = f"serving on {ends.http_url} (gRPC :{ends.grpc_port}, metrics {ends.metrics_url}); Ctrl-C stops"
    return run_foreground(install, repo, ends, frontend, ready, log_file)


def openai_settings(args):
    """The OpenAI frontend's settings (validated before anything starts), or None without --openai-port."""
    import os

    from ..serve.openai.auth import API_KEY_ENV

    if args.openai_port is None:
        for flag, given in (("--chat-template", args.chat_template), ("--api-key", args.api_key is not None),
                            ("--max-request-bytes", args.max_request_bytes != DEFAULT_MAX_REQUEST_BYTES)):
            if given:
                raise DFlashError(f"{flag} is for the OpenAI API: give --openai-port too")
        return None
    from ..serve.openai.server import FrontendSettings

    if args.api_key == "":
        raise DFlashError("--api-key is empty")
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    host = args.triton_host or args.host
    triton_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return FrontendSettings(args.engine_dir, f"{triton_host}:{args.grpc_port}", args.model_name, args.host,
                            args.openai_port, args.chat_template, args.max_request_bytes, key)


def trtllm_openai(args, manifest, repo: Path) -> int:
    """Print trtllm-serve's command for this engine, then run it (exec) where TensorRT-LLM is installed."""
    import os
    import shlex
    import shutil

    import yaml

    from ..builder.trtllm.engine import read_options_at
    from ..serve.openai.trtllm import model_link, trtllm_serve_command

    engine = Path(args.engine_dir).absolute()
    link = model_link(engine, args.model_name, repo)
    options = link.parent / f"{args.model_name}.llm_options.yaml"  # the engine's options at paths valid here
    options.write_text(yaml.safe_dump(read_options_at(engine), sort_keys=False))
    command = trtllm_serve_command(link, options, manifest.tp_size, args.host, args.openai_port, args.chat_template)
    print(f"OpenAI API (TensorRT-LLM): {shlex.join(command)}", file=sys.stderr, flush=True)
    if args.write_only:
        return 0
    if shutil.which("trtllm-serve") is None:
        raise DFlashError("trtllm-serve is not on PATH: run the command above inside the TensorRT-LLM container "
                          "(it serves the OpenAI API of trtllm engines)")
    os.execvp(command[0], command)


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
