"""Build-time check of a trtllm-dflash image: fail the build, naming what is missing, rather than the server later.

    python3 docker/check_image.py trtllm|torch

Both: tritonserver and its Python backend with every shared library resolvable (the driver's own libraries
excepted: the NVIDIA container runtime mounts them when the container starts), this project importable and its
CLIs on PATH. trtllm: TensorRT-LLM >= MIN_TENSORRT_LLM whose llmapi defines DFlashDecodingConfig (read from
its sources: importing tensorrt_llm needs a GPU driver, absent at build time), trtllm-llmapi-launch, and
TensorRT-LLM's Triton llmapi model files where the launch scripts look for them. torch: a CUDA build of torch.
TRITON_ROOT (default /opt/tritonserver) moves the Triton checks, for tests.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

DRIVER_LIBS = ("libcuda.so", "libnvidia-", "libnvcuvid.so")  # provided by the host driver at run time


class CheckFailed(Exception):
    pass


def require(ok: bool, message: str) -> None:
    if not ok:
        raise CheckFailed(message)


def missing_libraries(binary: Path) -> list[str]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
    return [lib for lib in missing if not lib.startswith(DRIVER_LIBS)]


def check_triton() -> str:
    root = Path(os.environ.get("TRITON_ROOT", "/opt/tritonserver"))
    server, stub = root / "bin" / "tritonserver", root / "backends" / "python" / "triton_python_backend_stub"
    for binary in (server, stub):
        require(binary.is_file() and os.access(binary, os.X_OK), f"{binary} is missing or not executable")
        missing = missing_libraries(binary)
        require(not missing, f"{binary} cannot load {', '.join(missing)}")
    return f"tritonserver and the Python backend in {root}"


def check_project() -> str:
    import trtllm_dflash  # noqa: F401
    import tritonclient.grpc  # noqa: F401
    import tritonclient.http  # noqa: F401

    for tool in ("dflash-build", "dflash-serve", "dflash-bench"):
        require(shutil.which(tool) is not None, f"{tool} is not on PATH")
    return f"trtllm-dflash {importlib.metadata.version('trtllm-dflash')} and its CLIs"


def version_at_least(found: str, minimum: str) -> bool:
    try:
        from packaging.version import Version
    except ImportError:  # pip vendors it
        from pip._vendor.packaging.version import Version
    return Version(found) >= Version(minimum)


def tensorrt_llm_dir() -> Path:
    spec = importlib.util.find_spec("tensorrt_llm")  # located, not imported
    require(spec is not None and bool(spec.submodule_search_locations), "tensorrt_llm is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def check_tensorrt_llm() -> str:
    from trtllm_dflash.builder.trtllm.fields import MIN_TENSORRT_LLM

    pkg = tensorrt_llm_dir()
    try:
        version = importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        raise CheckFailed(f"tensorrt_llm at {pkg} has no package metadata (no version to check)") from None
    require(version_at_least(version, MIN_TENSORRT_LLM),
            f"TensorRT-LLM {version} is older than {MIN_TENSORRT_LLM}, the first release with DFlash")
    llmapi = pkg / "llmapi"
    defined = any("class DFlashDecodingConfig(" in f.read_text(errors="replace") for f in llmapi.glob("*.py"))
    exported = (llmapi / "__init__.py").is_file() and "DFlashDecodingConfig" in (llmapi / "__init__.py").read_text()
    require(defined and exported, f"TensorRT-LLM {version} at {pkg} has no tensorrt_llm.llmapi.DFlashDecodingConfig")
    require(shutil.which("trtllm-llmapi-launch") is not None, "trtllm-llmapi-launch is not on PATH")
    return f"TensorRT-LLM {version} with DFlashDecodingConfig"


def check_llmapi_model() -> str:
    from trtllm_dflash.serve.launch import LLMAPI_DIRS

    pkg = str(tensorrt_llm_dir())
    dirs = [Path(d.replace("$pkg", pkg)).resolve() for d in LLMAPI_DIRS]
    found = [d for d in dirs if (d / "model.py").is_file()]
    require(bool(found), "no TensorRT-LLM llmapi model.py in " + ", ".join(map(str, dirs)))
    return f"llmapi model files in {found[0]}"


def check_torch() -> str:
    import torch

    require(torch.version.cuda is not None, f"torch {torch.__version__} is not a CUDA build")
    return f"torch {torch.__version__} (CUDA {torch.version.cuda})"


CHECKS = {"trtllm": (check_triton, check_project, check_tensorrt_llm, check_llmapi_model),
          "torch": (check_triton, check_project, check_torch)}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: check_image.py {'|'.join(CHECKS)}", file=sys.stderr)
        return 2
    try:
        for check in CHECKS[argv[0]]:
            print(f"check_image: ok: {check()}")
    except (CheckFailed, ImportError, importlib.metadata.PackageNotFoundError) as exc:
        print(f"check_image: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
