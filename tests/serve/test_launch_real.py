"""The launch scripts run for real, not printed: a one-node Slurm cluster on localhost (tests/helpers/slurm.py) runs
launch_slurm.sbatch for a TP=2 torch engine on the CPU without a container, and bench_job.sh against it with
--dependency; Open MPI's mpirun runs the single-node script's rank layout. Each ends with the server ready, a
benchmark written, and scancel / SIGTERM leaving no process and no port behind.

`trtllm-llmapi-launch` runs only where TensorRT-LLM does: a stand-in on PATH records the rank each launcher gave it
and the command it was handed (the tritonserver line the DGX runs), so the lines before it and the launcher's own
rank layout run for real."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.slurm import missing, one_node_cluster

from trtllm_dflash.engine.loader import free_port

pytestmark = [pytest.mark.slow, pytest.mark.serve]

BIN = str(Path(sys.executable).parent)  # dflash-serve, dflash-bench
# a few short requests at two loads: enough for a sweep and its report
BENCH = {"CONCURRENCY": "1,2", "PROMPTS_PER_POINT": "4", "ISL": "16", "OSL": "16", "READY_TIMEOUT": "600"}
UNLOADED = "successfully unloaded 'dflash'"  # tritonserver's log line when dflash-serve stops it in order
STAND_IN = """#!/usr/bin/env bash
# Stand-in for TensorRT-LLM's trtllm-llmapi-launch: the rank and world size its launcher gave it, and its command.
# pmix: the PMIx rank (srun --mpi=pmix and Open MPI both start one PMIx world). With RANK0 set, rank 0 runs that
# script in its place and the other ranks wait until SIGTERM, as TensorRT-LLM's MPI workers wait for rank 0.
rank=${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-}} size=${OMPI_COMM_WORLD_SIZE:-${SLURM_STEP_NUM_TASKS:-}}
echo "rank=$rank size=${size} pmix=${PMIX_RANK:-none} $*" > "$RANKS_DIR/rank$rank"
if [ -z "${RANK0:-}" ]; then exit 0; fi
if [ "$rank" = 0 ]; then exec bash "$RANK0"; fi
trap 'exit 0' TERM
sleep 3600 & wait
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if missing():
        pytest.skip(f"no Slurm here: {', '.join(missing())} not installed (apt-get install slurm-wlm munge)")
    with one_node_cluster(tmp_path_factory.mktemp("slurm"), gpus=2) as running:
        yield running


@pytest.fixture(scope="module")
def engines(builtin, engine_factory):
    """TP=2 engines of the test pair; the torch one holds 4 requests at once, so that the server's step-cost
    calibration (--draft-len auto, cached in the engine by its first start) measures few batch sizes."""
    return {"torch": engine_factory.get(*builtin, backend="torch", tp=2, max_batch_size=4, max_seq_len=256),
            "trtllm": engine_factory.get(*builtin, backend="trtllm", tp=2)}


def print_launch(engine: Path, root: Path, ports: tuple[int, int, int]) -> Path:
    """dflash-serve --print-launch into root/launch (the repository into root/repo) -> the launch folder."""
    from trtllm_dflash.cli.serve import main

    http, grpc, metrics = ports
    assert main([str(engine), "--model-repo", str(root / "repo"), "--print-launch", str(root / "launch"),
                 "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]) == 0
    return root / "launch"


def stand_in(root: Path) -> dict[str, str]:
    """PATH with the trtllm-llmapi-launch stand-in first, and where it records the ranks."""
    bin_dir, ranks = root / "stand-in", root / "ranks"
    bin_dir.mkdir()
    ranks.mkdir()
    (bin_dir / "trtllm-llmapi-launch").write_text(STAND_IN)
    (bin_dir / "trtllm-llmapi-launch").chmod(0o755)
    return {"PATH": f"{bin_dir}:{BIN}:{os.environ['PATH']}", "RANKS_DIR": str(ranks)}


def ports() -> tuple[int, int, int]:
    return free_port(), free_port(), free_port()


def ready(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT socket is no listener
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
        return False


def processes_naming(*markers: Path) -> list[str]:
    """Command lines of the running processes that name any of these paths (servers, stubs, ranks, sruns)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if proc.name.isdigit() and int(proc.name) != os.getpid() and any(str(m) in cmd for m in markers):
            found.append(f"{proc.name}: {cmd}")
    return found


def assert_nothing_left(markers: tuple[Path, ...], used: tuple[int, ...], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (left := processes_naming(*markers)) or any(listening(p) for p in used):
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind: {left}, ports held: {[p for p in used if listening(p)]}")
        time.sleep(0.5)


def assert_benchmark_written(out: Path) -> None:
    summary = json.loads((out / "runs" / "dflash" / "summary.json").read_text())
    assert summary["status"] == "complete", summary
    assert [p["concurrency"] for p in summary["points"]] == [1, 2], summary
    assert all(p["completed"] == 4 and p["failed"] == 0 for p in summary["points"]), summary["points"]
    assert (out / "report" / "report.md").read_text().strip()


def test_slurm_serves_a_tp2_torch_engine_and_runs_the_bench_job_beside_it(cluster, engines, tmp_path):
    """sbatch launch_slurm.sbatch (bare metal: IMAGE empty) and, with --dependency=after on it, bench_job.sh; the
    serving job asks --exclusive, so it is submitted --exclusive=user for the bench job to share its node."""
    used = ports()
    launch = print_launch(engines["torch"], tmp_path, used)
    env = {"PATH": f"{BIN}:{os.environ['PATH']}", "IMAGE": ""}
    serve = cluster.sbatch("--exclusive=user", f"--output={tmp_path}/serve.out", str(launch / "launch_slurm.sbatch"),
                           **env)
    bench = cluster.sbatch(f"--dependency=after:{serve}", f"--output={tmp_path}/bench.out",
                           str(launch / "bench_job.sh"), SERVE_JOB_ID=serve, OUT=str(tmp_path / "bench"), **BENCH,
                           **env)
    state = cluster.wait_state(bench, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 900)
    assert state == "COMPLETED", ((tmp_path / "bench.out").read_text()[-3000:]
                                  + (tmp_path / "serve.out").read_text()[-3000:])
    assert cluster.state(serve) == "RUNNING" and ready(used[0])
    manifest = json.loads((tmp_path / "bench" / "runs" / "dflash" / "manifest.json").read_text())
    assert manifest["metrics_url"] == f"http://{cluster.node}:{used[2]}/metrics"  # the server's node, from squeue
    assert_benchmark_written(tmp_path / "bench")
    cluster.run("scancel", serve)
    cluster.wait_state(serve, {"CANCELLED", ""}, 120)
    assert_nothing_left((engines["torch"], tmp_path), used)
    assert UNLOADED in (tmp_path / "serve.out").read_text()  # stopped in order, before KillWait's SIGKILL


def test_slurm_runs_the_trtllm_script_up_to_trtllm_llmapi_launch(cluster, engines, tmp_path):
    """The repository rewrite and the llmapi copy run as job steps; the server line runs under srun --mpi=pmix with
    the stand-in: two ranks of one PMIx world, handed the tritonserver line."""
    used = ports()
    launch = print_launch(engines["trtllm"], tmp_path, used)
    llmapi = tmp_path / "llmapi"
    llmapi.mkdir()
    (llmapi / "model.py").write_text("# TensorRT-LLM's llmapi model (stand-in)\n")
    env = {**stand_in(tmp_path), "IMAGE": "", "LLMAPI_MODEL_DIR": str(llmapi)}
    shutil.rmtree(tmp_path / "repo" / "dflash")  # the job's first step writes it again
    job = cluster.sbatch(f"--output={tmp_path}/job.out", str(launch / "launch_slurm.sbatch"), **env)
    state = cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, 300)
    log = (tmp_path / "job.out").read_text()
    if "can not load PMIx library" in log:  # Slurm's mpi/pmix plugin opens libpmix.so, which libpmix-dev installs
        pytest.skip("srun --mpi=pmix: Slurm's mpi/pmix plugin cannot load libpmix.so (apt-get install libpmix-dev)")
    assert state == "COMPLETED", log[-3000:]
    repo = tmp_path / "repo"
    assert (repo / "dflash" / "1" / "model.py").read_text() == (llmapi / "model.py").read_text()
    assert str(engines["trtllm"]) in (repo / "dflash" / "1" / "model.yaml").read_text()
    assert (repo / "dflash" / "config.pbtxt").is_file()
    server = (f"/opt/tritonserver/bin/tritonserver --model-repository {repo} --http-port {used[0]} "
              f"--grpc-port {used[1]} --metrics-port {used[2]}")
    ranks = sorted((tmp_path / "ranks").iterdir())
    assert [r.read_text().strip() for r in ranks] == [f"rank={i} size=2 pmix={i} {server}" for i in range(2)]
    assert_nothing_left((tmp_path,), used)


def test_mpirun_runs_the_single_node_rank_layout_serving_the_torch_engine(engines, tmp_path):
    """The trtllm single-node script for real: repository rewrite, llmapi copy, then Open MPI's mpirun -n 2 of the
    stand-in; its rank 0 runs the torch engine's own single-node script (dflash-serve, TP=2) where TensorRT-LLM's
    server would be, rank 1 waits. bench_job.sh sweeps it from this host; SIGTERM to mpirun stops everything."""
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun here (apt-get install openmpi-bin)")
    used = ports()
    torch_launch = print_launch(engines["torch"], tmp_path / "torch", used)
    launch = print_launch(engines["trtllm"], tmp_path / "trtllm", used)
    llmapi = tmp_path / "llmapi"
    llmapi.mkdir()
    (llmapi / "model.py").write_text("# stand-in\n")
    env = {**os.environ, **stand_in(tmp_path), "LLMAPI_MODEL_DIR": str(llmapi),
           "RANK0": str(torch_launch / "launch_single_node.sh")}
    log = open(tmp_path / "mpirun.out", "w")
    proc = subprocess.Popen(["bash", str(launch / "launch_single_node.sh")], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        bench = subprocess.run(["bash", str(torch_launch / "bench_job.sh")], capture_output=True, text=True,
                               env={**env, "OUT": str(tmp_path / "bench"), **BENCH}, timeout=900)
        assert bench.returncode == 0, bench.stderr[-3000:] + (tmp_path / "mpirun.out").read_text()[-3000:]
        assert ready(used[0]) and proc.poll() is None
        assert_benchmark_written(tmp_path / "bench")
        repo = tmp_path / "trtllm" / "repo"
        server = (f"/opt/tritonserver/bin/tritonserver --model-repository {repo} --http-port {used[0]} "
                  f"--grpc-port {used[1]} --metrics-port {used[2]}")
        ranks = sorted((tmp_path / "ranks").iterdir())
        assert [r.read_text().strip() for r in ranks] == [f"rank={i} size=2 pmix={i} {server}" for i in range(2)]
        assert (repo / "dflash" / "1" / "model.py").read_text() == "# stand-in\n"
    finally:
        proc.send_signal(signal.SIGTERM)  # the script exec'd mpirun: it forwards the signal to its ranks
        code = proc.wait(120)
    assert_nothing_left((engines["torch"], tmp_path), used)
    assert UNLOADED in (tmp_path / "mpirun.out").read_text()  # dflash-serve stopped in order, not SIGKILLed
    print(f"mpirun after SIGTERM: exit code {code}")  # mpirun's own (1 after a SIGTERM)
