"""dflash-serve: write a Triton model repository for an engine and run tritonserver on it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import run_cli

PROG = "dflash-serve"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Serve an engine directory with Triton Inference Server.")
    p.add_argument("engine_dir")
    p.add_argument("--model-repo", default="triton_repo", help="where to write the model repository")
    p.add_argument("--model-name", default="dflash")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--max-batch-size", type=int, help="running batch (default: the engine's)")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 'overloaded' errors")
    p.add_argument("--decoding", default="dflash", help="dflash (default) or plain: the target alone, the baseline")
    p.add_argument("--write-only", action="store_true", help="write the repository and exit")
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
    from ..builder.manifest import Manifest
    from ..errors import DFlashError
    from ..serve.locate import find_tritonserver
    from ..serve.repository import ServeSettings, write_repository
    from ..serve.server import Endpoints, run_foreground

    args = parser().parse_args(argv)
    settings = ServeSettings(args.model_name, args.max_batch_size, args.max_queue, args.decoding)
    repo = Path(args.model_repo).absolute()
    manifest = Manifest.read(Path(args.engine_dir))
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
    if args.write_only:
        return 0
    if manifest.backend == "trtllm" and not (model_dir / "1" / "model.py").exists():
        raise DFlashError("a trtllm engine is served by TensorRT-LLM's llmapi model.py: run inside the "
                          "tritonserver trtllm container with the launch script (dflash-serve --write-only writes "
                          "the repository)")
    install = find_tritonserver(repo.parent / ".dflash-triton")
    print(f"tritonserver: {install.binary} (from the {install.origin})", file=sys.stderr)
    ends = Endpoints(args.host, args.http_port, args.grpc_port, args.metrics_port)
    print(f"serving on {ends.http_url} (gRPC :{ends.grpc_port}, metrics {ends.metrics_url}); Ctrl-C stops",
          file=sys.stderr)
    return run_foreground(install, repo, ends)


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
