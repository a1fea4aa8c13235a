"""Run tritonserver on a model repository in the foreground; forward SIGINT/SIGTERM; wait until ready."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def run_foreground(install: TritonInstall, repo: Path, ends: Endpoints, frontend=None) -> int:
    """Serve until SIGINT/SIGTERM; -> 0 after a clean shutdown. With `frontend` (FrontendSettings), the
    OpenAI frontend runs beside tritonserver, started once Triton is ready and stopped first (it ends its
    streams while Triton still answers); when either child dies, the other is stopped too."""
    children = [start_server(install, repo, ends)]
    stop = {"requested": False}

    def forward(signum, frame):
        stop["requested"] = True
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if frontend is not None:
            try:
                start_openai(children, ends, frontend, stop)
            except DFlashError:
                if not stop["requested"]:  # a signal while starting is a stop, not a failure
                    raise
        while all(child.poll() is None for child in children):
            time.sleep(0.2)
        codes = [stop_server(child) for child in reversed(children)]
    finally:
        for child in reversed(children):  # an error above must not leave a child behind
            stop_server(child)
        for s, handler in old.items():
            signal.signal(s, handler)
    if stop["requested"] and all(code in (0, -signal.SIGTERM) for code in codes):
        return 0
    return next((code for code in codes if code not in (0, -signal.SIGTERM)), 1)


def start_openai(children: list[subprocess.Popen], ends: Endpoints, settings, stop: dict) -> None:
    """The OpenAI frontend (appended to `children` at once, so a signal reaches it), once Triton is ready."""
    from .openai.process import start_frontend, wait_frontend

    wait_ready(children[0], ends)
    if stop["requested"]:
        return
    children.append(start_frontend(settings))
    wait_frontend(children[-1], settings)
    print(f"OpenAI API on {settings.url}/v1 (model '{settings.model}')", file=sys.stderr, flush=True)
