"""Run tritonserver on a model repository in the foreground; forward SIGINT/SIGTERM; wait until ready."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import DFlashError
from .locate import TritonInstall

STOP_GRACE_S = 30


@dataclass(frozen=True)
class Endpoints:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


def server_command(install: TritonInstall, repo: Path, ends: Endpoints) -> list[str]:
    return [str(install.binary), "--model-repository", str(repo), "--backend-directory", str(install.backend_dir),
            "--http-address", ends.host, "--grpc-address", ends.host, "--metrics-address", ends.host,
            "--http-port", str(ends.http_port), "--grpc-port", str(ends.grpc_port),
            "--metrics-port", str(ends.metrics_port), "--exit-on-error", "true", "--log-verbose", "0"]


def start_server(install: TritonInstall, repo: Path, ends: Endpoints, log=None) -> subprocess.Popen:
    env = {**os.environ, **install.env}
    return subprocess.Popen(server_command(install, repo, ends), env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
                            start_new_session=True)


def wait_ready(proc: subprocess.Popen, ends: Endpoints, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DFlashError(f"tritonserver exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{ends.http_url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise DFlashError(f"tritonserver not ready after {timeout:.0f} s at {ends.http_url}")


def stop_server(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> int:
    """SIGTERM (Triton unloads models, which finishes or cancels requests), then SIGKILL the group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def run_foreground(install: TritonInstall, repo: Path, ends: Endpoints) -> int:
    """Serve until SIGINT/SIGTERM; -> 0 after a clean shutdown."""
    proc = start_server(install, repo, ends)
    stop = {"requested": False}

    def forward(signum, frame):
        stop["requested"] = True
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return 0 if stop["requested"] and code in (0, -signal.SIGTERM) else code
