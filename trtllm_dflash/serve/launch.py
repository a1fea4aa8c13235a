"""Launch scripts for a served engine: one node, a Slurm job, and a benchmark job against either.

Layouts (NODESxGPUS) for an engine of tensor-parallel size T:
- 1xT: one server on one node (both backends).
- NxT, N > 1: N data-parallel replicas, one server per node, each with its own endpoints.
- NxG with N*G = T (trtllm only): one tensor-parallel group spanning N nodes; rank 0 serves.
A torch engine's ranks run inside one Triton process (its model spawns them), so a torch server
never spans nodes: multi-node torch means replicas.

trtllm servers run `trtllm-llmapi-launch tritonserver` under `mpirun -n T` (one node) or
`srun --mpi=pmix` (Slurm); first `dflash-serve ENGINE_DIR --repository-only` rewrites the model
repository with the engine's paths as the container sees them (ENGINE_DIR overrides where the engine
is, so a moved or remounted engine serves), then TensorRT-LLM's own llmapi model files are copied in
(`copy_llmapi_model.sh`). torch servers run `dflash-serve`. Every script runs with
`set -euo pipefail` and prints its commands instead of running them when DRY_RUN=1; IMAGE="" runs the Slurm
scripts without a container.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..utils.errors import DFlashError

BACKENDS = ("torch", "trtllm")
DEFAULT_IMAGES = {"torch": "trtllm-dflash:torch", "trtllm": "trtllm-dflash:trtllm"}  # docker/README.md builds them
TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
REPLICA_REPO = "/tmp/dflash-triton-repo"  # torch replicas: each node writes its own repository (container-local)
BENCH_CONCURRENCY = "1,2,4,8,16,32,64,128"
SAFE = re.compile(r"[A-Za-z0-9_./+:@%=,~-]+")  # what the scripts carry unquoted
READY_TIMEOUT_S = 1800
# mpirun's SIGTERM reaches the ranks, then SIGKILL follows odls_base_sigkill_timeout s later: 1 s by default (Open MPI
# 4.1.4, `ompi_info --param odls all --level 9`), too short for a server to finish its requests and unload. 30 s:
# Slurm's default KillWait between scancel's SIGTERM and SIGKILL.
STOP_GRACE_S = 30
# TensorRT-LLM's Triton llmapi model directory (model.py, helpers.py, ...): relative to the tensorrt_llm
# package, in the image TensorRT-LLM's `tritonrelease` Docker stage builds, and older NGC layouts.
LLMAPI_DIRS = (
    "$pkg/../triton_backend/all_models/llmapi/tensorrt_llm/1",
    "$pkg/triton_backend/all_models/llmapi/tensorrt_llm/1",
    "/app/tensorrt_llm/triton_backend/all_models/llmapi/tensorrt_llm/1",
    "/app/all_models/llmapi/tensorrt_llm/1",
    "/opt/tritonserver/tensorrtllm_backend/all_models/llmapi/tensorrt_llm/1",
)

PRELUDE = """set -euo pipefail
run() { if [ "${DRY_RUN:-0}" = 1 ]; then echo "$*"; else "$@"; fi; }
run_exec() { if [ "${DRY_RUN:-0}" = 1 ]; then echo "$*"; else exec "$@"; fi; }
"""
BACKGROUND = """pids=()
run_bg() { if [ "${DRY_RUN:-0}" = 1 ]; then echo "$* &"; else "$@" & pids+=("$!"); fi; }
wait_all() { local failed=0; for pid in "${pids[@]}"; do wait "$pid" || failed=1; done; return "$failed"; }
"""
CONTAINER = """container=()  # IMAGE="" runs on the nodes themselves (bare metal): no pyxis flags
if [ -n "$IMAGE" ]; then
  container=(--container-image="$IMAGE")
  if [ -n "$MOUNTS" ]; then container+=(--container-mounts="$MOUNTS"); fi
fi
"""


@dataclass(frozen=True)
class Layout:
    nodes: int
    gpus_per_node: int

    @classmethod
    def parse(cls, text: str) -> Layout:
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text or "")
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise DFlashError(f"--layout must be NODESxGPUS with positive integers (e.g. 1x8, 2x8), got {text!r}")
        return cls(int(match[1]), int(match[2]))

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}"

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def resolve_layout(tp_size: int, nodes: int = 1, layout: str | None = None) -> Layout:
    """--layout when given (it must agree with --nodes N > 1), else N x tp_size/N from --nodes."""
    if nodes < 1 or tp_size % nodes:
        raise DFlashError(f"--nodes {nodes} does not divide the engine's tp_size {tp_size}")
    if layout is None:
        return Layout(nodes, tp_size // nodes)
    parsed = Layout.parse(layout)
    if nodes != 1 and nodes != parsed.nodes:
        raise DFlashError(f"--nodes {nodes} contradicts --layout {parsed}")
    return parsed


@dataclass(frozen=True)
class LaunchSpec:
    """Everything the scripts need; validated here so errors name the flag and the value."""

    engine_dir: Path
    backend: str
    tp_size: int
    repo: Path
    layout: Layout
    model_name: str = "dflash"
    decoding: str = "dflash"
    max_batch_size: int | None = None
    max_queue: int = 256
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    image: str = ""  # "" = DEFAULT_IMAGES[backend]
    mounts: str = ""  # pyxis --container-mounts; "" = engine, repository and script folders at their own paths

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise DFlashError(f"unknown engine backend {self.backend!r} (expected one of {', '.join(BACKENDS)})")
        for what, path in (("engine directory", self.engine_dir), ("--model-repo", self.repo)):
            if not path.is_absolute():
                raise DFlashError(f"{what} must be an absolute path in the launch scripts, got {str(path)!r}")
        named = {"engine directory": self.engine_dir, "--model-repo": self.repo, "--model-name": self.model_name,
                 "--image": self.image, "--mounts": self.mounts}
        for what, value in named.items():
            if value:  # an empty image or mounts means the defaults
                check_safe(what, value)
        self.check_layout()
        ports = (self.http_port, self.grpc_port, self.metrics_port)
        if any(not 0 < p < 65536 for p in ports) or len(set(ports)) != 3:
            raise DFlashError(f"ports must be three different numbers in 1..65535, got {ports}")
        for entry in filter(None, self.mounts.split(",")):
            parts = entry.split(":")
            if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]):
                raise DFlashError(f"--mounts entries must be SRC:DST[:FLAGS] with absolute paths, got {entry!r}")

    def check_layout(self) -> None:
        layout, tp = self.layout, self.tp_size
        if self.backend == "torch" and layout.gpus_per_node != tp:
            raise DFlashError(f"--layout {layout}: a torch engine's {tp} tensor-parallel ranks run in one Triton "
                              f"process on one node; use 1x{tp} (one server) or Nx{tp} (N replicas, one per node)")
        if layout.gpus_per_node != tp and layout.world_size != tp:
            raise DFlashError(f"--layout {layout} does not fit the engine's tp_size {tp}: use 1x{tp} (one node), "
                              f"Nx{tp} (N replicas, one per node) or NxG with N*G = {tp} (one group across nodes)")

    @property
    def replicas(self) -> int:
        """Servers in the Slurm layout: one per node when each node holds a whole engine, else one."""
        return self.layout.nodes if self.layout.gpus_per_node == self.tp_size else 1

    @property
    def container_image(self) -> str:
        return self.image or DEFAULT_IMAGES[self.backend]

    def server_args(self) -> str:
        return (f"{TRITONSERVER} --model-repository {self.repo} "
                f"--http-port {self.http_port} --grpc-port {self.grpc_port} --metrics-port {self.metrics_port}")

    def dflash_serve(self, repo: Path | str) -> str:
        """The dflash-serve command of a torch server (binds all interfaces: it runs in a container)."""
        batch = f" --max-batch-size {self.max_batch_size}" if self.max_batch_size else ""
        return (f"dflash-serve {self.engine_dir} --model-repo {repo} --model-name {self.model_name} "
                f"--decoding {self.decoding}{batch} --max-queue {self.max_queue} --host 0.0.0.0 "
                f"--http-port {self.http_port} --grpc-port {self.grpc_port} --metrics-port {self.metrics_port}")

    def repository_command(self) -> str:
        """dflash-serve rewriting this server's repository for the engine at $ENGINE_DIR, where it runs."""
        batch = f" --max-batch-size {self.max_batch_size}" if self.max_batch_size else ""
        return (f'dflash-serve "$ENGINE_DIR" --model-repo {self.repo} --model-name {self.model_name} '
                f"--decoding {self.decoding}{batch} --repository-only")

    def default_mounts(self, out: Path) -> str:
        paths = sorted({self.engine_dir, self.repo, out}, key=lambda p: (len(p.parts), str(p)))
        kept: list[Path] = []
        for p in paths:
            if not any(p.is_relative_to(k) for k in kept):
                kept.append(p)
        return ",".join(f"{p}:{p}" for p in kept)


def check_safe(what: str, value) -> None:
    if not SAFE.fullmatch(str(value)):
        raise DFlashError(f"{what} {str(value)!r} has characters the launch scripts cannot carry "
                          "(spaces, quotes, $, ...): use a plain path or name")


def header(spec: LaunchSpec, what: str, sbatch: tuple[str, ...] = ()) -> str:
    lines = ["#!/usr/bin/env bash", *(f"#SBATCH {s}" for s in sbatch),
             f"# Written by dflash-serve: {what}.",
             f"# Engine {spec.engine_dir} ({spec.backend}, tp_size {spec.tp_size}), model '{spec.model_name}'. "
             "DRY_RUN=1 prints the commands instead of running them."]
    return "\n".join(lines) + "\n" + PRELUDE


def engine_param(spec: LaunchSpec) -> str:
    """ENGINE_DIR: where the engine is when the script runs (set it, and MOUNTS, after moving the engine)."""
    return f'ENGINE_DIR="${{ENGINE_DIR:-{spec.engine_dir}}}"\n'


def params(spec: LaunchSpec, out: Path) -> str:
    """IMAGE and MOUNTS are parameters: environment variables override the generated defaults; an empty IMAGE
    runs without a container."""
    return (f'IMAGE="${{IMAGE-{spec.container_image}}}"\n'
            f'MOUNTS="${{MOUNTS-{spec.mounts or spec.default_mounts(out)}}}"\n')


def copy_llmapi_script() -> str:
    candidates = " \\\n           ".join(f'"{d}"' if "$" in d else d for d in LLMAPI_DIRS)
    return f"""#!/usr/bin/env bash
# Written by dflash-serve: copy TensorRT-LLM's own Triton llmapi model files (model.py, helpers.py, ...)
# into DEST_DIR (<repository>/<model>/1). LLMAPI_MODEL_DIR overrides the search. DRY_RUN=1 prints the copy.
{PRELUDE}dest=${{1:?usage: copy_llmapi_model.sh DEST_DIR}}
find_llmapi_model_dir() {{
  if [ -n "${{LLMAPI_MODEL_DIR:-}}" ]; then echo "$LLMAPI_MODEL_DIR"; return; fi
  if [ -n "${{LLMAPI_MODEL_PY:-}}" ]; then dirname "$LLMAPI_MODEL_PY"; return; fi  # earlier scripts' variable
  local pkg
  pkg=$(python3 -c 'import importlib.util as u; print(u.find_spec("tensorrt_llm").submodule_search_locations[0])' \\
        2>/dev/null || true)
  for d in {candidates}; do
    if [ -f "$d/model.py" ]; then echo "$d"; return; fi
  done
  echo "copy_llmapi_model.sh: no TensorRT-LLM llmapi model.py found; set LLMAPI_MODEL_DIR" >&2
  return 1
}}
src=$(find_llmapi_model_dir)
run cp "$src"/*.py "$dest/"
"""


def single_node_script(spec: LaunchSpec, out: Path) -> str:
    if spec.backend == "torch":
        return (header(spec, f"one {spec.backend} server on this node ({spec.tp_size} GPUs)") +
                f"run_exec {spec.dflash_serve(spec.repo)}\n")
    return (header(spec, f"one server on this node, {spec.tp_size} MPI ranks") + engine_param(spec) +
            f"run {spec.repository_command()}\n"
            f"run bash {out / 'copy_llmapi_model.sh'} {spec.repo / spec.model_name / '1'}\n"
            f"run_exec mpirun --allow-run-as-root --mca odls_base_sigkill_timeout {STOP_GRACE_S} -n {spec.tp_size} "
            f"trtllm-llmapi-launch {spec.server_args()}\n")


def slurm_script(spec: LaunchSpec, out: Path) -> str:
    layout, replicas = spec.layout, spec.replicas
    tasks = 1 if spec.backend == "torch" else layout.gpus_per_node
    what = (f"Slurm, {layout.nodes} node(s) x {layout.gpus_per_node} GPUs, "
            + (f"{replicas} data-parallel replicas (one server per node)" if replicas > 1
               else "one server" + (" (rank 0 of the group serves)" if layout.nodes > 1 else "")))
    sbatch = ("--job-name=dflash-serve", f"--nodes={layout.nodes}", f"--ntasks-per-node={tasks}",
              f"--gpus-per-node={layout.gpus_per_node}", "--exclusive")
    text = header(spec, what, sbatch) + params(spec, out) + CONTAINER
    if spec.backend == "torch":
        repo = REPLICA_REPO if replicas > 1 else spec.repo
        return text + (f"run_exec srun --nodes={layout.nodes} --ntasks-per-node=1 \"${{container[@]}}\" "
                       f"{spec.dflash_serve(repo)}\n")
    text += (engine_param(spec) + f"run srun --nodes=1 --ntasks=1 \"${{container[@]}}\" {spec.repository_command()}\n"
             f"run srun --nodes=1 --ntasks=1 \"${{container[@]}}\" "
             f"bash {out / 'copy_llmapi_model.sh'} {spec.repo / spec.model_name / '1'}\n")
    if replicas == 1:
        return text + (f"run_exec srun --nodes={layout.nodes} --ntasks-per-node={tasks} --mpi=pmix "
                       f"\"${{container[@]}}\" trtllm-llmapi-launch {spec.server_args()}\n")
    return text + BACKGROUND + (
        f"for node in $(seq 0 {replicas - 1}); do\n"
        f"  run_bg srun --nodes=1 --ntasks={tasks} --relative=\"$node\" --mpi=pmix \"${{container[@]}}\" "
        f"trtllm-llmapi-launch {spec.server_args()}\n"
        "done\nwait_all\n")


BENCH_BODY = r"""
server_urls() {
  if [ -n "${URLS:-}" ]; then echo "$URLS"; return; fi
  if [ -z "${SERVE_JOB_ID:-}" ]; then echo "http://127.0.0.1:$PORT"; return; fi
  local hosts
  hosts=$(scontrol show hostnames "$(squeue -h -j "$SERVE_JOB_ID" -o %N)")
  if [ -z "$hosts" ]; then echo "bench_job.sh: serving job $SERVE_JOB_ID has no nodes (not running?)" >&2; return 1; fi
  if [ "$REPLICAS" = 1 ]; then hosts=$(head -n 1 <<<"$hosts"); fi  # rank 0's node serves
  for host in $hosts; do printf 'http://%s:%s ' "$host" "$PORT"; done
}
host_of() { local host=${1#*://}; echo "${host%%[:/]*}"; }
client_url() {  # the HTTP URL, or host:GRPC_PORT for --api triton-grpc
  if [ "$API" = triton-grpc ]; then echo "$(host_of "$1"):$GRPC_PORT"; else echo "$1"; fi
}
wait_ready() {  # URL TIMEOUT_S
  local deadline=$((SECONDS + $2))
  until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/v2/health/ready", timeout=5)' \
        "$1" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then echo "bench_job.sh: $1 not ready after $2 s" >&2; return 1; fi
    sleep 2
  done
}

prefix=()
if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "$IMAGE" ]; then  # as a Slurm job: the client runs in the container
  prefix=(srun --nodes=1 --ntasks=1 --overlap --container-image="$IMAGE")
  if [ -n "$MOUNTS" ]; then prefix+=(--container-mounts="$MOUNTS"); fi
fi
# flags win over a preset (dflash-bench), so API and CONCURRENCY go only where set, or where no preset is given
if [ -z "$PRESET" ] && [ -z "$CONCURRENCY" ]; then CONCURRENCY=$DEFAULT_CONCURRENCY; fi
sweep=(--model "$MODEL" --tokenizer "$ENGINE" --num-gpus "$GPUS_PER_SERVER")
if [ -n "$API" ]; then sweep+=(--api "$API"); fi
if [ -n "$CONCURRENCY" ]; then sweep+=(--concurrency "$CONCURRENCY"); fi
if [ -n "$PROMPTS_PER_POINT" ]; then sweep+=(--prompts-per-point "$PROMPTS_PER_POINT"); fi
if [ -n "$ISL" ]; then sweep+=(--isl "$ISL"); fi
if [ -n "$OSL" ]; then sweep+=(--osl "$OSL"); fi
if [ -n "$PRESET" ]; then sweep+=(--preset "$PRESET"); fi

urls_text=$(server_urls)
read -r -a urls <<<"$urls_text"
if [ "${#urls[@]}" = 0 ]; then echo "bench_job.sh: no server URL" >&2; exit 1; fi
run mkdir -p "$OUT/runs"
for url in "${urls[@]}"; do run wait_ready "$url" "$READY_TIMEOUT"; done
runs=()
if [ "${#urls[@]}" = 1 ]; then
  runs=("$OUT/runs/$LABEL")
  run "${prefix[@]}" dflash-bench sweep --url "$(client_url "${urls[0]}")" \
    --metrics-url "http://$(host_of "${urls[0]}"):$METRICS_PORT/metrics" "${sweep[@]}" --label "$LABEL" \
    --output "${runs[0]}"
else  # replicas: one sweep per server, at the same time; throughput adds up across them
  for i in "${!urls[@]}"; do
    runs+=("$OUT/runs/$LABEL-replica$i")
    run_bg "${prefix[@]}" dflash-bench sweep --url "$(client_url "${urls[$i]}")" \
      --metrics-url "http://$(host_of "${urls[$i]}"):$METRICS_PORT/metrics" "${sweep[@]}" \
      --label "$LABEL-replica$i" --output "${runs[$i]}"
  done
  wait_all
fi

report=()  # earlier runs in OUT (e.g. the plain baseline) and this one
for dir in "$OUT"/runs/*/; do if [ -d "$dir" ]; then report+=("${dir%/}"); fi; done
for run_dir in "${runs[@]}"; do
  case " ${report[*]} " in *" $run_dir "*) ;; *) report+=("$run_dir") ;; esac
done
baseline=()
for run_dir in "${report[@]}"; do
  if [ "$(basename "$run_dir")" = "$BASELINE" ]; then baseline=(--baseline "$BASELINE"); fi
done
run "${prefix[@]}" dflash-bench report "${report[@]}" "${baseline[@]}" --output "$OUT/report"
"""


def bench_script(spec: LaunchSpec, out: Path) -> str:
    per_server = spec.layout.gpus_per_node if spec.replicas > 1 else spec.tp_size
    what = ("benchmark sweep against the deployment, then the report. Run it where the servers are reachable: "
            "in the serving container, or `sbatch --dependency=after:JOB` with SERVE_JOB_ID=JOB exported.\n"
            "# Parameters (environment): URLS (space-separated; default from SERVE_JOB_ID, else this host), "
            "OUT, LABEL, BASELINE, API,\n# CONCURRENCY, PROMPTS_PER_POINT, ISL, OSL, PRESET, READY_TIMEOUT (s), "
            "IMAGE, MOUNTS")
    sbatch = ("--job-name=dflash-bench", "--nodes=1", "--ntasks=1")
    return (header(spec, what, sbatch) + BACKGROUND +
            f"MODEL={spec.model_name}\nENGINE={spec.engine_dir}\n"
            f"PORT={spec.http_port}\nGRPC_PORT={spec.grpc_port}\nMETRICS_PORT={spec.metrics_port}\n"
            f"REPLICAS={spec.replicas}\nGPUS_PER_SERVER={per_server}\n" + params(spec, out) +
            f'OUT="${{OUT:-{out / "bench"}}}"\nLABEL="${{LABEL:-{spec.decoding}}}"\nBASELINE="${{BASELINE:-plain}}"\n'
            f'API="${{API:-}}"\nCONCURRENCY="${{CONCURRENCY:-}}"\nDEFAULT_CONCURRENCY={BENCH_CONCURRENCY}\n'
            'PROMPTS_PER_POINT="${PROMPTS_PER_POINT:-}"\nISL="${ISL:-}"\nOSL="${OSL:-}"\nPRESET="${PRESET:-}"\n'
            f'READY_TIMEOUT="${{READY_TIMEOUT:-{READY_TIMEOUT_S}}}"\n' + BENCH_BODY)


def write_launch_scripts(spec: LaunchSpec, out: Path) -> list[Path]:
    """-> the scripts written into `out`: single node, Slurm, benchmark job (+ the llmapi copy helper)."""
    out = Path(out).absolute()
    check_safe("--print-launch", out)
    out.mkdir(parents=True, exist_ok=True)
    scripts = {"launch_single_node.sh": single_node_script(spec, out), "launch_slurm.sbatch": slurm_script(spec, out),
               "bench_job.sh": bench_script(spec, out)}
    if spec.backend == "trtllm":
        scripts["copy_llmapi_model.sh"] = copy_llmapi_script()
    paths = []
    for name, text in scripts.items():
        path = out / name
        path.write_text(text)
        path.chmod(0o755)
        paths.append(path)
    return paths
