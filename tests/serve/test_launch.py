"""Launch scripts: valid bash, the right world size / ranks / ports / mounts for 1x8 and 2x8 layouts, and, with
DRY_RUN=1, exactly the commands they would run. Plus dflash-serve --print-launch and its bad-input matrix."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtllm_dflash.serve.launch import LaunchSpec, Layout, write_launch_scripts
from trtllm_dflash.utils.errors import DFlashError

ENGINE, REPO = Path("/data/engines/qwen3-8b"), Path("/data/repo")
SERVER = ("/opt/tritonserver/bin/tritonserver --model-repository /data/repo "
          "--http-port 8000 --grpc-port 8001 --metrics-port 8002")
TORCH_SERVE = ("dflash-serve /data/engines/qwen3-8b --model-repo {repo} --model-name dflash --decoding dflash "
               "--max-queue 256 --host 0.0.0.0 --http-port 8000 --grpc-port 8001 --metrics-port 8002")
PATH = f"{Path(sys.executable).parent}:/usr/bin:/bin"
MPIRUN = "mpirun --allow-run-as-root --mca odls_base_sigkill_timeout 30"  # 30 s from SIGTERM to SIGKILL
# trtllm scripts first rewrite the repository where they run, for the engine at $ENGINE_DIR
REGEN = ("dflash-serve /data/engines/qwen3-8b --model-repo /data/repo --model-name dflash --decoding dflash "
         "--repository-only")


def scripts(tmp_path, backend, layout, tp, **kw) -> Path:
    spec = LaunchSpec(ENGINE, backend, tp, REPO, Layout.parse(layout), **kw)
    out = tmp_path / "launch"
    write_launch_scripts(spec, out)
    return out


def dry(script: Path, *args: str, **env) -> list[str]:
    proc = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          env={"PATH": PATH, "DRY_RUN": "1", **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def sbatch_lines(script: Path) -> list[str]:
    return [line for line in script.read_text().splitlines() if line.startswith("#SBATCH")]


def default_mounts(out: Path) -> str:
    return f"/data/repo:/data/repo,/data/engines/qwen3-8b:/data/engines/qwen3-8b,{out}:{out}"


@pytest.mark.parametrize("backend,layout,tp", [("trtllm", "1x8", 8), ("trtllm", "2x8", 8), ("trtllm", "2x8", 16),
                                               ("torch", "1x8", 8), ("torch", "2x8", 8)])
def test_every_script_is_valid_bash(tmp_path, backend, layout, tp):
    out = scripts(tmp_path, backend, layout, tp)
    names = {p.name for p in out.iterdir()}
    assert names == {"launch_single_node.sh", "launch_slurm.sbatch", "bench_job.sh"} | (
        {"copy_llmapi_model.sh"} if backend == "trtllm" else set())
    for name in names:
        text = (out / name).read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
        assert os.access(out / name, os.X_OK)
        check = subprocess.run(["bash", "-n", str(out / name)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_trtllm_one_node_8_gpus(tmp_path):
    out = scripts(tmp_path, "trtllm", "1x8", 8)
    assert dry(out / "launch_single_node.sh") == [
        REGEN, f"bash {out}/copy_llmapi_model.sh /data/repo/dflash/1",
        f"{MPIRUN} -n 8 trtllm-llmapi-launch {SERVER}"]
    assert dry(out / "launch_single_node.sh", ENGINE_DIR="/mnt/moved")[0] == REGEN.replace(str(ENGINE), "/mnt/moved")
    container = f"--container-image=trtllm-dflash:trtllm --container-mounts={default_mounts(out)}"
    assert sbatch_lines(out / "launch_slurm.sbatch") == [
        "#SBATCH --job-name=dflash-serve", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive"]
    assert dry(out / "launch_slurm.sbatch") == [
        f"srun --nodes=1 --ntasks=1 {container} {REGEN}",
        f"srun --nodes=1 --ntasks=1 {container} bash {out}/copy_llmapi_model.sh /data/repo/dflash/1",
        f"srun --nodes=1 --ntasks-per-node=8 --mpi=pmix {container} trtllm-llmapi-launch {SERVER}"]


def test_trtllm_two_nodes_one_tp16_group(tmp_path):
    """2x8 with a tp_size-16 engine: one MPI world of 16 ranks across both nodes; rank 0 serves."""
    out = scripts(tmp_path, "trtllm", "2x8", 16)
    assert sbatch_lines(out / "launch_slurm.sbatch")[1:4] == [
        "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8"]
    container = f"--container-image=trtllm-dflash:trtllm --container-mounts={default_mounts(out)}"
    assert dry(out / "launch_slurm.sbatch")[2] == (
        f"srun --nodes=2 --ntasks-per-node=8 --mpi=pmix {container} trtllm-llmapi-launch {SERVER}")
    assert dry(out / "launch_single_node.sh")[2] == f"{MPIRUN} -n 16 trtllm-llmapi-launch {SERVER}"


def test_trtllm_two_nodes_two_replicas(tmp_path):
    """2x8 with a tp_size-8 engine: two independent 8-rank servers, one per node, started together."""
    out = scripts(tmp_path, "trtllm", "2x8", 8)
    container = "--container-image=/shared/trtllm.sqsh --container-mounts=/lustre:/lustre"
    assert dry(out / "launch_slurm.sbatch", IMAGE="/shared/trtllm.sqsh", MOUNTS="/lustre:/lustre") == [
        f"srun --nodes=1 --ntasks=1 {container} {REGEN}",
        f"srun --nodes=1 --ntasks=1 {container} bash {out}/copy_llmapi_model.sh /data/repo/dflash/1",
        f"srun --nodes=1 --ntasks=8 --relative=0 --mpi=pmix {container} trtllm-llmapi-launch {SERVER} &",
        f"srun --nodes=1 --ntasks=8 --relative=1 --mpi=pmix {container} trtllm-llmapi-launch {SERVER} &"]


def test_torch_one_node_and_two_replicas(tmp_path):
    out = scripts(tmp_path / "a", "torch", "1x8", 8)
    assert dry(out / "launch_single_node.sh") == [TORCH_SERVE.format(repo=REPO)]
    assert sbatch_lines(out / "launch_slurm.sbatch")[1:4] == [
        "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8"]
    assert dry(out / "launch_slurm.sbatch", MOUNTS="") == [
        f"srun --nodes=1 --ntasks-per-node=1 --container-image=trtllm-dflash:torch {TORCH_SERVE.format(repo=REPO)}"]
    out = scripts(tmp_path / "b", "torch", "2x8", 8)
    assert sbatch_lines(out / "launch_slurm.sbatch")[1:4] == [
        "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8"]
    # one server per node, each writing its own repository inside its container
    assert dry(out / "launch_slurm.sbatch") == [
        f"srun --nodes=2 --ntasks-per-node=1 --container-image=trtllm-dflash:torch "
        f"--container-mounts={default_mounts(out)} {TORCH_SERVE.format(repo='/tmp/dflash-triton-repo')}"]


def test_an_empty_image_runs_on_the_nodes_without_a_container(tmp_path):
    """IMAGE="" (bare metal, as tests/serve/test_launch_real.py runs them): no pyxis flag in any srun, and the
    bench job's client runs in the job itself; an unset IMAGE keeps the default image."""
    out = scripts(tmp_path / "a", "torch", "1x8", 8)
    assert dry(out / "launch_slurm.sbatch", IMAGE="") == [
        f"srun --nodes=1 --ntasks-per-node=1 {TORCH_SERVE.format(repo=REPO)}"]
    out = scripts(tmp_path / "b", "trtllm", "1x8", 8)
    assert dry(out / "launch_slurm.sbatch", IMAGE="") == [
        f"srun --nodes=1 --ntasks=1 {REGEN}", f"srun --nodes=1 --ntasks=1 bash {out}/copy_llmapi_model.sh "
        "/data/repo/dflash/1", f"srun --nodes=1 --ntasks-per-node=8 --mpi=pmix trtllm-llmapi-launch {SERVER}"]
    bench = dry(out / "bench_job.sh", IMAGE="", SLURM_JOB_ID="7", URLS="http://node7:8000")
    assert bench[2].startswith("dflash-bench sweep --url http://node7:8000 ")
    assert dry(out / "launch_slurm.sbatch")[0].startswith("srun --nodes=1 --ntasks=1 "
                                                          "--container-image=trtllm-dflash:trtllm ")


def test_ports_model_name_and_settings_reach_the_commands(tmp_path):
    out = scripts(tmp_path, "torch", "1x2", 2, model_name="qwen", decoding="plain", max_batch_size=32,
                  max_queue=64, http_port=9000, grpc_port=9001, metrics_port=9002)
    assert dry(out / "launch_single_node.sh") == [
        "dflash-serve /data/engines/qwen3-8b --model-repo /data/repo --model-name qwen --decoding plain "
        "--max-batch-size 32 --max-queue 64 --host 0.0.0.0 --http-port 9000 --grpc-port 9001 --metrics-port 9002"]
    bench = dry(out / "bench_job.sh")
    assert bench[1] == "wait_ready http://127.0.0.1:9000 1800"
    assert bench[2].startswith("dflash-bench sweep --url http://127.0.0.1:9000 --metrics-url "
                               "http://127.0.0.1:9002/metrics --model qwen ")
    assert "--num-gpus 2" in bench[2] and "--label plain" in bench[2]


def test_bench_job_commands_parse_with_dflash_bench(tmp_path):
    """Every flag the job passes is one dflash-bench takes, with the values it means."""
    from trtllm_dflash.cli.bench import parser

    out = scripts(tmp_path, "trtllm", "2x8", 8)
    (tmp_path / "o" / "runs" / "plain").mkdir(parents=True)
    lines = dry(out / "bench_job.sh", OUT=str(tmp_path / "o"), API="triton-grpc", CONCURRENCY="1,2", ISL="8",
                OSL="4", PROMPTS_PER_POINT="3", PRESET="/p.yaml", URLS="http://a:8000 http://b:8000")
    commands = [line.removesuffix(" &").split() for line in lines if line.startswith("dflash-bench")]
    sweeps = [parser().parse_args(words[1:]) for words in commands if words[1] == "sweep"]
    assert [(a.url, a.metrics_url, a.label, a.num_gpus) for a in sweeps] == [
        ("a:8001", "http://a:8002/metrics", "dflash-replica0", 8), ("b:8001", "http://b:8002/metrics",
                                                                    "dflash-replica1", 8)]
    assert (sweeps[0].api, sweeps[0].concurrency, sweeps[0].isl, sweeps[0].osl, sweeps[0].prompts_per_point,
            sweeps[0].preset, sweeps[0].tokenizer) == ("triton-grpc", "1,2", 8, 4, 3, "/p.yaml", str(ENGINE))
    report = parser().parse_args(commands[-1][1:])
    assert report.command == "report" and report.baseline == "plain"
    assert report.runs == [f"{tmp_path}/o/runs/{label}" for label in ("plain", "dflash-replica0", "dflash-replica1")]


def fake_llmapi_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    for name in ("model.py", "helpers.py", "model.yaml"):
        (root / name).write_text(f"# {name}\n")
    return root


def test_copy_llmapi_model_copies_every_python_file(tmp_path):
    out = scripts(tmp_path, "trtllm", "1x8", 8)
    src, dest = fake_llmapi_dir(tmp_path / "llmapi" / "1"), tmp_path / "dest"
    dest.mkdir()
    assert dry(out / "copy_llmapi_model.sh", str(dest), LLMAPI_MODEL_DIR=str(src)) == [
        f"cp {src}/helpers.py {src}/model.py {dest}/"]
    proc = subprocess.run(["bash", str(out / "copy_llmapi_model.sh"), str(dest)], capture_output=True, text=True,
                          env={"PATH": PATH, "LLMAPI_MODEL_DIR": str(src)})
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["helpers.py", "model.py"]  # model.yaml is ours
    # the variable of earlier scripts still works: the model.py path names the folder
    assert dry(out / "copy_llmapi_model.sh", str(dest), LLMAPI_MODEL_PY=f"{src}/model.py") == [
        f"cp {src}/helpers.py {src}/model.py {dest}/"]


def test_copy_llmapi_model_finds_the_files_beside_tensorrt_llm(tmp_path):
    """Without LLMAPI_MODEL_DIR: the triton_backend folder next to the tensorrt_llm package (located, not imported)."""
    out = scripts(tmp_path, "trtllm", "1x8", 8)
    site = tmp_path / "site"
    (site / "tensorrt_llm").mkdir(parents=True)
    (site / "tensorrt_llm" / "__init__.py").write_text("raise ImportError('needs a GPU driver')\n")
    src = fake_llmapi_dir(site / "triton_backend" / "all_models" / "llmapi" / "tensorrt_llm" / "1")
    found = f"{site}/tensorrt_llm/../triton_backend/all_models/llmapi/tensorrt_llm/1"
    assert dry(out / "copy_llmapi_model.sh", "/dest", PYTHONPATH=str(site)) == [
        f"cp {found}/helpers.py {found}/model.py /dest/"]
    assert Path(found).resolve() == src.resolve()


def test_copy_llmapi_model_says_what_is_missing(tmp_path):
    out = scripts(tmp_path, "trtllm", "1x8", 8)
    proc = subprocess.run(["bash", str(out / "copy_llmapi_model.sh"), str(tmp_path)], capture_output=True,
                          text=True, env={"PATH": PATH, "PYTHONPATH": str(tmp_path / "nothing")})
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("copy_llmapi_model.sh: no TensorRT-LLM llmapi model.py found; "
                                   "set LLMAPI_MODEL_DIR")


def sweep(url: str, label: str, out: Path, gpus: int = 8) -> str:
    host = url.split("//")[1].split(":")[0]
    return (f"dflash-bench sweep --url {url} --metrics-url http://{host}:8002/metrics --model dflash "
            f"--tokenizer /data/engines/qwen3-8b --num-gpus {gpus} --concurrency 1,2,4,8,16,32,64,128 "
            f"--label {label} --output {out}/runs/{label}")


def test_bench_job_on_this_host(tmp_path):
    out = scripts(tmp_path, "trtllm", "1x8", 8)
    bench = out / "bench"
    assert dry(out / "bench_job.sh") == [
        f"mkdir -p {bench}/runs",
        "wait_ready http://127.0.0.1:8000 1800",
        sweep("http://127.0.0.1:8000", "dflash", bench),
        f"dflash-bench report {bench}/runs/dflash --output {bench}/report"]


def test_bench_job_parameters_and_baseline(tmp_path):
    """An earlier `plain` run in OUT joins the report as its baseline; every parameter reaches the sweep;
    the gRPC client gets host:grpc-port while readiness is asked over HTTP."""
    out = scripts(tmp_path, "trtllm", "1x8", 8)
    results = tmp_path / "results"
    (results / "runs" / "plain").mkdir(parents=True)
    lines = dry(out / "bench_job.sh", OUT=str(results), API="triton-grpc", CONCURRENCY="1,2", PROMPTS_PER_POINT="40",
                ISL="1024", OSL="1024", PRESET="/presets/1k1k.yaml", READY_TIMEOUT="60", URLS="http://node7:8000")
    assert lines == [
        f"mkdir -p {results}/runs",
        "wait_ready http://node7:8000 60",
        "dflash-bench sweep --url node7:8001 --metrics-url http://node7:8002/metrics --model dflash "
        "--tokenizer /data/engines/qwen3-8b --num-gpus 8 "
        "--api triton-grpc --concurrency 1,2 --prompts-per-point 40 --isl 1024 --osl 1024 "
        f"--preset /presets/1k1k.yaml --label dflash --output {results}/runs/dflash",
        f"dflash-bench report {results}/runs/plain {results}/runs/dflash --baseline plain --output {results}/report"]


def test_bench_job_leaves_a_preset_its_load_points(tmp_path):
    """dflash-bench lets flags win over a preset: without CONCURRENCY or API the preset's own apply."""
    out = scripts(tmp_path, "trtllm", "1x8", 8)
    assert dry(out / "bench_job.sh", PRESET="/presets/1k1k.yaml")[2] == (
        "dflash-bench sweep --url http://127.0.0.1:8000 --metrics-url http://127.0.0.1:8002/metrics --model dflash "
        f"--tokenizer /data/engines/qwen3-8b --num-gpus 8 --preset /presets/1k1k.yaml --label dflash "
        f"--output {out}/bench/runs/dflash")


def fake_slurm(tmp_path: Path) -> str:
    """squeue/scontrol stand-ins: the serving job runs on gpu[01-02]."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text('#!/bin/sh\n[ "$3" = 4242 ] && echo "gpu[01-02]"\n')
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$3" = "gpu[01-02]" ] && printf "gpu01\\ngpu02\\n"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return f"{bin_dir}:{PATH}"


def test_bench_job_against_two_replicas_as_a_slurm_job(tmp_path):
    out = scripts(tmp_path, "trtllm", "2x8", 8)
    bench = out / "bench"
    client = ("srun --nodes=1 --ntasks=1 --overlap --container-image=/shared/trtllm.sqsh "
              f"--container-mounts={default_mounts(out)} ")
    lines = dry(out / "bench_job.sh", PATH=fake_slurm(tmp_path), SERVE_JOB_ID="4242", SLURM_JOB_ID="4243",
                IMAGE="/shared/trtllm.sqsh")
    assert lines == [
        f"mkdir -p {bench}/runs",
        "wait_ready http://gpu01:8000 1800",
        "wait_ready http://gpu02:8000 1800",
        client + sweep("http://gpu01:8000", "dflash-replica0", bench) + " &",
        client + sweep("http://gpu02:8000", "dflash-replica1", bench) + " &",
        client + f"dflash-bench report {bench}/runs/dflash-replica0 {bench}/runs/dflash-replica1 "
                 f"--output {bench}/report"]


def test_bench_job_against_one_group_across_nodes(tmp_path):
    """tp 16 over 2x8: one server (rank 0's node), 16 GPUs behind it."""
    out = scripts(tmp_path, "trtllm", "2x8", 16)
    lines = dry(out / "bench_job.sh", PATH=fake_slurm(tmp_path), SERVE_JOB_ID="4242")
    assert lines[1:3] == ["wait_ready http://gpu01:8000 1800", sweep("http://gpu01:8000", "dflash", out / "bench", 16)]


def test_bench_job_reports_a_serving_job_that_is_gone(tmp_path):
    out = scripts(tmp_path, "trtllm", "1x8", 8)
    proc = subprocess.run(["bash", str(out / "bench_job.sh")], capture_output=True, text=True,
                          env={"PATH": fake_slurm(tmp_path), "DRY_RUN": "1", "SERVE_JOB_ID": "77"})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == "bench_job.sh: serving job 77 has no nodes (not running?)"


@pytest.mark.parametrize("layout,backend,tp,message", [
    ("2by8", "trtllm", 8, "--layout must be NODESxGPUS with positive integers (e.g. 1x8, 2x8), got '2by8'"),
    ("0x8", "trtllm", 8, "--layout must be NODESxGPUS with positive integers (e.g. 1x8, 2x8), got '0x8'"),
    ("1x4", "trtllm", 8, "--layout 1x4 does not fit the engine's tp_size 8: use 1x8 (one node), Nx8 (N replicas, "
                         "one per node) or NxG with N*G = 8 (one group across nodes)"),
    ("2x4", "torch", 8, "--layout 2x4: a torch engine's 8 tensor-parallel ranks run in one Triton process on one "
                        "node; use 1x8 (one server) or Nx8 (N replicas, one per node)"),
])
def test_layouts_that_do_not_fit_are_refused(layout, backend, tp, message):
    with pytest.raises(DFlashError) as err:
        LaunchSpec(ENGINE, backend, tp, REPO, Layout.parse(layout))
    assert str(err.value) == message


@pytest.mark.parametrize("kw,message", [
    ({"mounts": "data:/data"}, "--mounts entries must be SRC:DST[:FLAGS] with absolute paths, got 'data:/data'"),
    ({"repo": Path("/my repo")}, "--model-repo '/my repo' has characters the launch scripts cannot carry"),
    ({"image": "img$(x)"}, "--image 'img$(x)' has characters the launch scripts cannot carry"),
    ({"grpc_port": 8000}, "ports must be three different numbers in 1..65535, got (8000, 8000, 8002)"),
])
def test_bad_launch_settings_are_refused(kw, message):
    args = {"engine_dir": ENGINE, "backend": "trtllm", "tp_size": 8, "repo": REPO, "layout": Layout(1, 8), **kw}
    with pytest.raises(DFlashError) as err:
        LaunchSpec(**args)
    assert str(err.value).startswith(message)


@pytest.fixture(scope="module")
def engines(builtin, engine_factory):
    """tp_size-2 engines of the built-in pair, one per backend."""
    return {backend: engine_factory.get(*builtin, backend=backend, tp=2) for backend in ("torch", "trtllm")}


def serve_cli(capsys, *argv) -> tuple[int, str, str]:
    from trtllm_dflash.cli.serve import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_print_launch_torch_replicas(engines, tmp_path, capsys):
    launch, repo = tmp_path / "launch", tmp_path / "repo"
    code, out, err = serve_cli(capsys, engines["torch"], "--model-repo", repo, "--print-launch", launch,
                               "--layout", "2x2", "--model-name", "llm")
    assert code == 0, err
    assert out.splitlines() == [
        "# torch engine, tp_size 2; Slurm layout 2x2 (2 servers). DRY_RUN=1 prints each script's commands.",
        f"bash {launch}/launch_single_node.sh",
        f"IMAGE=trtllm-dflash:torch sbatch {launch}/launch_slurm.sbatch",
        f"bash {launch}/bench_job.sh    # or: SERVE_JOB_ID=JOB sbatch --dependency=after:JOB {launch}/bench_job.sh"]
    assert (repo / "llm" / "config.pbtxt").is_file()  # the repository is written too
    assert dry(launch / "launch_slurm.sbatch", MOUNTS="") == [
        f"srun --nodes=2 --ntasks-per-node=1 --container-image=trtllm-dflash:torch dflash-serve {engines['torch']} "
        "--model-repo /tmp/dflash-triton-repo --model-name llm --decoding dflash --max-queue 256 --host 0.0.0.0 "
        "--http-port 8000 --grpc-port 8001 --metrics-port 8002"]


def test_print_launch_trtllm_group_across_nodes(engines, tmp_path, capsys):
    launch, repo = tmp_path / "launch", tmp_path / "repo"
    code, _, err = serve_cli(capsys, engines["trtllm"], "--model-repo", repo, "--print-launch", launch,
                             "--layout", "2x1", "--image", "/shared/t.sqsh", "--mounts", "/shared:/shared",
                             "--http-port", "9000")
    assert code == 0, err
    server = (f"/opt/tritonserver/bin/tritonserver --model-repository {repo} --http-port 9000 --grpc-port 8001 "
              "--metrics-port 8002")
    container = "--container-image=/shared/t.sqsh --container-mounts=/shared:/shared"
    regen = (f"dflash-serve {engines['trtllm']} --model-repo {repo} --model-name dflash --decoding dflash "
             "--repository-only")
    assert dry(launch / "launch_slurm.sbatch") == [
        f"srun --nodes=1 --ntasks=1 {container} {regen}",
        f"srun --nodes=1 --ntasks=1 {container} bash {launch}/copy_llmapi_model.sh {repo}/dflash/1",
        f"srun --nodes=2 --ntasks-per-node=1 --mpi=pmix {container} trtllm-llmapi-launch {server}"]
    assert dry(launch / "launch_single_node.sh")[2] == f"{MPIRUN} -n 2 trtllm-llmapi-launch {server}"


def test_trtllm_repository_carries_scripts_for_nodes(engines, tmp_path, capsys):
    """Without --print-launch a trtllm repository still gets its scripts; --nodes N sets the Slurm layout."""
    repo = tmp_path / "repo"
    code, _, err = serve_cli(capsys, engines["trtllm"], "--model-repo", repo, "--write-only", "--nodes", "2")
    assert code == 0, err
    assert sbatch_lines(repo / "launch_slurm.sbatch")[1:4] == [
        "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=1"]
    assert dry(repo / "launch_single_node.sh") == [
        f"dflash-serve {engines['trtllm']} --model-repo {repo} --model-name dflash --decoding dflash --repository-only",
        f"bash {repo}/copy_llmapi_model.sh {repo}/dflash/1",
        f"{MPIRUN} -n 2 trtllm-llmapi-launch /opt/tritonserver/bin/tritonserver "
        f"--model-repository {repo} --http-port 8000 --grpc-port 8001 --metrics-port 8002"]


@pytest.mark.parametrize("backend,args,message", [
    ("torch", ["--layout", "3by8"], "--layout must be NODESxGPUS with positive integers (e.g. 1x8, 2x8), got '3by8'"),
    ("torch", ["--layout", "2x1"], "--layout 2x1: a torch engine's 2 tensor-parallel ranks run in one Triton "
                                   "process on one node; use 1x2 (one server) or Nx2 (N replicas, one per node)"),
    ("trtllm", ["--layout", "1x4"], "--layout 1x4 does not fit the engine's tp_size 2: use 1x2 (one node), "
                                    "Nx2 (N replicas, one per node) or NxG with N*G = 2 (one group across nodes)"),
    ("trtllm", ["--nodes", "3"], "--nodes 3 does not divide the engine's tp_size 2"),
    ("torch", ["--nodes", "0"], "--nodes 0 does not divide the engine's tp_size 2"),
    ("trtllm", ["--nodes", "2", "--layout", "1x2"], "--nodes 2 contradicts --layout 1x2"),
    ("torch", ["--mounts", "data:/data"], "--mounts entries must be SRC:DST[:FLAGS] with absolute paths, "
                                          "got 'data:/data'"),
])
def test_print_launch_bad_input_is_one_line_and_writes_nothing(engines, tmp_path, capsys, backend, args, message):
    launch, repo = tmp_path / "launch", tmp_path / "repo"
    code, out, err = serve_cli(capsys, engines[backend], "--model-repo", repo, "--print-launch", launch, *args)
    assert code == 2 and out == ""
    assert err.splitlines() == [f"dflash-serve: error: {message}"]
    assert not launch.exists() and not repo.exists()


def test_print_launch_into_a_path_the_scripts_cannot_carry(engines, tmp_path, capsys):
    code, _, err = serve_cli(capsys, engines["torch"], "--model-repo", tmp_path / "repo", "--print-launch",
                             tmp_path / "my launch")
    assert code == 2
    assert err.splitlines() == [f"dflash-serve: error: --print-launch '{tmp_path}/my launch' has characters the "
                                "launch scripts cannot carry (spaces, quotes, $, ...): use a plain path or name"]


def test_resolve_layout_from_nodes_or_layout():
    from trtllm_dflash.serve.launch import resolve_layout

    assert resolve_layout(8) == Layout(1, 8)
    assert resolve_layout(16, nodes=2) == Layout(2, 8)
    assert resolve_layout(8, layout="2x8") == Layout(2, 8) and resolve_layout(8, 2, "2x8") == Layout(2, 8)
    for args, message in [((8, 3), "--nodes 3 does not divide the engine's tp_size 8"),
                          ((8, 2, "3x8"), "--nodes 2 contradicts --layout 3x8")]:
        with pytest.raises(DFlashError) as err:
            resolve_layout(*args)
        assert str(err.value) == message
