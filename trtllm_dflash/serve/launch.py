"""Launch scripts for trtllm engines inside NVIDIA's tritonserver trtllm container.

One node x N GPUs: `mpirun -n N trtllm-llmapi-launch tritonserver ...` (rank 0 serves, the other
ranks are TensorRT-LLM workers). Several nodes: an sbatch script running the same under
`srun --mpi=pmix` with the container image and mounts as parameters. Both first copy TensorRT-LLM's
own llmapi `model.py` into the repository (it is not shipped by this project). `DRY_RUN=1` prints
the commands instead of running them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

FIND_MODEL_PY = r'''find_llmapi_model_py() {
  if [ -n "${LLMAPI_MODEL_PY:-}" ]; then echo "$LLMAPI_MODEL_PY"; return; fi
  local pkg; pkg=$(python3 -c 'import os, tensorrt_llm; print(os.path.dirname(tensorrt_llm.__file__))' 2>/dev/null)
  for f in "$pkg/../triton_backend/all_models/llmapi/tensorrt_llm/1/model.py" \
           "$pkg/triton_backend/all_models/llmapi/tensorrt_llm/1/model.py" \
           /app/all_models/llmapi/tensorrt_llm/1/model.py \
           /opt/tritonserver/tensorrtllm_backend/all_models/llmapi/tensorrt_llm/1/model.py; do
    if [ -f "$f" ]; then echo "$f"; return; fi
  done
  echo "no TensorRT-LLM llmapi model.py found; set LLMAPI_MODEL_PY" >&2; return 1
}'''


@dataclass(frozen=True)
class LaunchSpec:
    repo: Path
    model_name: str
    gpus_per_node: int
    nodes: int = 1
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    image: str = "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"
    mounts: str = ""  # srun --container-mounts value, e.g. /models:/models

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def server_args(self) -> str:
        return (f"/opt/tritonserver/bin/tritonserver --model-repository {shlex.quote(str(self.repo))} "
                f"--http-port {self.http_port} --grpc-port {self.grpc_port} --metrics-port {self.metrics_port}")


PRELUDE = """#!/usr/bin/env bash
# Written by dflash-serve. DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail
run() { if [ "${DRY_RUN:-0}" = 1 ]; then echo "$*"; else "$@"; fi; }
"""


def single_node_script(spec: LaunchSpec) -> str:
    model_py = shlex.quote(str(spec.repo / spec.model_name / "1" / "model.py"))
    return (PRELUDE + FIND_MODEL_PY + "\n" +
            f"run cp \"$(find_llmapi_model_py)\" {model_py}\n"
            f"run mpirun --allow-run-as-root -n {spec.world_size} trtllm-llmapi-launch {spec.server_args()}\n")


def slurm_script(spec: LaunchSpec) -> str:
    model_py = shlex.quote(str(spec.repo / spec.model_name / "1" / "model.py"))
    mounts = f" --container-mounts={shlex.quote(spec.mounts)}" if spec.mounts else ""
    return (f"#!/usr/bin/env bash\n#SBATCH --nodes={spec.nodes}\n#SBATCH --ntasks-per-node={spec.gpus_per_node}\n"
            f"#SBATCH --gpus-per-node={spec.gpus_per_node}\n#SBATCH --job-name=dflash-serve\n" +
            PRELUDE.split("\n", 1)[1] + FIND_MODEL_PY + "\n" +
            f"run srun -N 1 -n 1 --container-image={shlex.quote(spec.image)}{mounts} "
            f"bash -c \"$(declare -f find_llmapi_model_py); cp \\\"\\$(find_llmapi_model_py)\\\" {model_py}\"\n"
            f"run srun -N {spec.nodes} --ntasks-per-node={spec.gpus_per_node} --mpi=pmix "
            f"--container-image={shlex.quote(spec.image)}{mounts} trtllm-llmapi-launch {spec.server_args()}\n")


def write_launch_scripts(spec: LaunchSpec, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "launch_single_node.sh", out / "launch_slurm.sbatch"]
    for path, text in zip(paths, (single_node_script(spec), slurm_script(spec))):
        path.write_text(text)
        path.chmod(0o755)
    return paths
