"""Find a `tritonserver` and the environment it needs: the NGC container, PATH, or the nvidia-pytriton wheel."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.errors import DFlashError

NGC = Path("/opt/tritonserver")
HOW_TO_GET = ("no tritonserver found: run inside NVIDIA's tritonserver container (/opt/tritonserver), put "
              "tritonserver on PATH, or pip install --no-deps nvidia-pytriton==0.7.0 (CPU-capable, numpy<2)")


@dataclass
class TritonInstall:
    binary: Path
    backend_dir: Path
    origin: str
    env: dict[str, str] = field(default_factory=dict)


def find_tritonserver(work_dir: Path) -> TritonInstall:
    if (NGC / "bin" / "tritonserver").is_file():
        return TritonInstall(NGC / "bin" / "tritonserver", NGC / "backends", f"NGC container ({NGC})")
    on_path = shutil.which("tritonserver")
    if on_path:
        binary = Path(on_path).resolve()
        return TritonInstall(binary, binary.parent.parent / "backends", f"PATH ({binary})")
    return from_pytriton(work_dir)


def from_pytriton(work_dir: Path) -> TritonInstall:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")  # located, not imported: installed with --no-deps
    if spec is None or not spec.submodule_search_locations:
        raise DFlashError(HOW_TO_GET)
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    libs = root.parent.parent / "nvidia_pytriton.libs"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise DFlashError(f"the nvidia-pytriton wheel has no Python backend stub for Python {version}")
    backends = work_dir / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    for src in [*(root / "backends" / "python").iterdir(), stub]:
        link = python / src.name
        if not link.exists():
            link.symlink_to(src)
    # The stub loads libpython of *this* interpreter and must see this environment's packages.
    lib_path = [str(libs), sysconfig.get_config_var("LIBDIR") or "", os.environ.get("LD_LIBRARY_PATH", "")]
    env = {"LD_LIBRARY_PATH": ":".join(p for p in lib_path if p),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return TritonInstall(root / "bin" / "tritonserver", backends, "nvidia-pytriton wheel", env)
