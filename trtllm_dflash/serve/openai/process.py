"""The frontend as dflash-serve's second child process: its command, its start, its readiness."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from ...utils.errors import DFlashError
from ..orphans import ending_with_parent
from .auth import API_KEY_ENV
from .server import FrontendSettings


def frontend_command(settings: FrontendSettings) -> list[str]:
    command = [sys.executable, "-m", "trtllm_dflash.serve.openai", "--engine", str(settings.engine_dir),
               "--triton-grpc", settings.triton_grpc, "--model", settings.model, "--host", settings.host,
               "--port", str(settings.port), "--max-request-bytes", str(settings.max_request_bytes)]
    return command + (["--chat-template", str(settings.chat_template)] if settings.chat_template else [])


def frontend_env(settings: FrontendSettings) -> dict[str, str]:
    """This process's environment, with the API key (or without any: only --api-key's reaches the frontend)."""
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    return env if settings.api_key is None else {**env, API_KEY_ENV: settings.api_key}


def start_frontend(settings: FrontendSettings, log=None) -> subprocess.Popen:
    """Its own process group, like tritonserver's, so a stop reaches all of it. The API key travels in its
    environment (auth.py)."""
    return subprocess.Popen(ending_with_parent(frontend_command(settings)), env=frontend_env(settings), stdout=log,
                            stderr=subprocess.STDOUT if log else None, start_new_session=True)


def wait_frontend(proc: subprocess.Popen, settings: FrontendSettings, timeout: float = 120) -> None:
    """Until GET /health answers 200 (the frontend is up and Triton's model is ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DFlashError(f"the OpenAI frontend exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{settings.url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise DFlashError(f"the OpenAI frontend is not ready after {timeout:.0f} s at {settings.url}")
