"""Run tritonserver on a model repository in the foreground; stop it in order on SIGINT/SIGTERM; wait until ready."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..utils.errors import DFlashError
from .failures import FATAL_FILE_ENV
from .load_failure import LOAD_ERROR_ENV, load_failure
from .locate import TritonInstall
from .orphans import ending_with_parent
from .shutdown import EXIT_TIMEOUT_S, STOP_FILE_ENV, begin_drain, unload_all

STOP_GRACE_S = 30
LOG_DRAIN_S = 2.0  # the Python backend's stub, still exiting, may hold the log pipe open a little longer


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


# On a machine without a GPU: no GPU metrics (NVML, DCGM), no pinned or CUDA memory pools (tritonserver --help,
# 2.51); each logs a failure otherwise. Triton's core still logs CPU_NOISE at start whatever the flags (server.cc),
# so dflash-serve drops that line from the log.
CPU_ONLY_FLAGS = ["--allow-gpu-metrics", "false", "--pinned-memory-pool-byte-size", "0",
                  "--cuda-memory-pool-byte-size", "0:0"]
CPU_NOISE = ("CudaDriverHelper has not been initialized",)


def has_gpu() -> bool:
    """An NVIDIA device node: the check needs neither torch nor the driver's libraries."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def server_command(install: TritonInstall, repo: Path, ends: Endpoints) -> list[str]:
    """Explicit model control, every model loaded at start: a stop can unload them (serve/shutdown.py)."""
    return [str(install.binary), "--model-repository", str(repo), "--backend-directory", str(install.backend_dir),
            "--http-address", ends.host, "--grpc-address", ends.host, "--metrics-address", ends.host,
            "--http-port", str(ends.http_port), "--grpc-port", str(ends.grpc_port),
            "--metrics-port", str(ends.metrics_port), "--model-control-mode", "explicit", "--load-model", "*",
            "--exit-timeout-secs", str(EXIT_TIMEOUT_S), "--exit-on-error", "true", "--log-verbose", "0",
            *([] if has_gpu() else CPU_ONLY_FLAGS)]


@dataclass
class TritonServer:
    """A running tritonserver: its process, where it listens, its private folder (the stop file, the model's
    load error) and the file its log goes to (None: a stream only)."""

    proc: subprocess.Popen
    ends: Endpoints
    workdir: Path
    log_path: Path | None = None
    forwarder: threading.Thread | None = None  # copies the log (forward_log); ends at the pipe's end

    @property
    def stop_file(self) -> Path:
        return self.workdir / "stop"

    @property
    def load_error_file(self) -> Path:
        return self.workdir / "load_error"

    @property
    def fatal_file(self) -> Path:
        return self.workdir / "fatal"

    def fatal(self) -> str | None:
        """Why the model can no longer serve (a tensor-parallel rank died), once it has said so."""
        if not self.fatal_file.is_file():
            return None
        where = f" (tritonserver's log: {self.log_path})" if self.log_path else ""
        return self.fatal_file.read_text().strip() + where

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def exit_error(self) -> DFlashError:
        """The one line of a server that exited before it was ready: the model's cause when one is known."""
        if self.forwarder is not None:
            self.forwarder.join(LOG_DRAIN_S)  # the log's last lines, written as the server exited
        cause = load_failure(self.load_error_file, self.log_path)
        where = f" (tritonserver's log: {self.log_path})" if self.log_path else ""
        if cause is None:
            return DFlashError(f"tritonserver exited with code {self.proc.returncode} before it was ready{where}")
        return DFlashError(f"the model did not load: {cause}{where}")


def start_server(install: TritonInstall, repo: Path, ends: Endpoints, log=None, log_file: Path | None = None
                 ) -> TritonServer:
    """Its own process group (a terminal's Ctrl-C reaches dflash-serve, which stops it in order). Its log goes to
    `log` (a stream; default stderr) and, when given, to `log_file` too."""
    from .openai.auth import API_KEY_ENV

    workdir = Path(tempfile.mkdtemp(prefix="dflash-serve-"))
    env = {**{k: v for k, v in os.environ.items() if k != API_KEY_ENV}, **install.env,  # the key is the frontend's
           STOP_FILE_ENV: str(workdir / "stop"), LOAD_ERROR_ENV: str(workdir / "load_error"),
           FATAL_FILE_ENV: str(workdir / "fatal")}
    proc = subprocess.Popen(ending_with_parent(server_command(install, repo, ends)), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    opened = []
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        opened.append(open(log_file, "w"))
    forwarder = threading.Thread(target=forward_log, args=(proc.stdout, [log or sys.stderr, *opened],
                                                           () if has_gpu() else CPU_NOISE, opened), daemon=True)
    forwarder.start()
    named = getattr(log, "name", None)  # a log file the caller opened
    path = log_file or (Path(named) if isinstance(named, str) and Path(named).is_file() else None)
    return TritonServer(proc, ends, workdir, path, forwarder)


def forward_log(lines, outs: list, noise: tuple[str, ...], opened: list) -> None:
    """tritonserver's log to every stream of `outs`, line by line, less the lines it prints on every CPU-only start
    (`noise`); a stream closed by its owner is dropped, the files in `opened` are closed at the log's end."""
    try:
        for line in lines:
            if any(n in line for n in noise):
                continue
            for out in list(outs):
                try:
                    out.write(line)
                    out.flush()
                except (OSError, ValueError):  # closed by its owner: nothing left to tell it
                    outs.remove(out)
    finally:
        for out in opened:
            out.close()


def check_ports_free(ends: Endpoints, openai_port: int | None = None, openai_host: str | None = None) -> None:
    """One line naming a port another process holds, before tritonserver would fail on it much later."""
    ports = [("--http-port", ends.host, ends.http_port), ("--grpc-port", ends.host, ends.grpc_port),
             ("--metrics-port", ends.host, ends.metrics_port)]
    if openai_port is not None:
        ports.append(("--openai-port", openai_host or ends.host, openai_port))
    for flag, host, port in ports:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free (to Triton too)
            try:
                s.bind((host, port))
            except OSError as exc:
                raise DFlashError(f"{flag} {port} on {host} is not available: {exc.strerror}") from None


def wait_ready(server: TritonServer, timeout: float = 300, stopped=lambda: False) -> None:
    """Until the server answers ready (or `stopped()` turns true: a stop while loading is not a failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopped():
        if server.poll() is not None:
            raise server.exit_error()
        try:
            with urllib.request.urlopen(f"{server.ends.http_url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    if stopped():
        return
    raise DFlashError(f"tritonserver not ready after {timeout:.0f} s at {server.ends.http_url}")


def stop_server(server: TritonServer, grace: float = STOP_GRACE_S) -> int:
    """End requests in flight, unload the models, SIGTERM; SIGKILL the group after `grace` seconds."""
    if server.poll() is None:
        begin_drain(server.stop_file)
        if (failed := unload_all(server.ends.http_url, grace)) is not None:
            print(f"warning: unloading before the stop: {failed}", file=sys.stderr, flush=True)
    stop_process(server.proc, grace)
    shutil.rmtree(server.workdir, ignore_errors=True)
    return server.proc.returncode


def stop_process(proc: subprocess.Popen, grace: float) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def run_foreground(install: TritonInstall, repo: Path, ends: Endpoints, frontend=None, ready_line: str = "",
                   log_file: Path | None = None) -> int:
    """Serve until SIGINT/SIGTERM; -> 0 after a clean shutdown. `ready_line` goes to stderr once Triton answers
    ready (the model loaded its weights and graphs, recorded them and calibrated: triton_model.py), not before,
    with the seconds since start. With `frontend` (FrontendSettings), the OpenAI frontend runs beside
    tritonserver, started once Triton is ready and stopped first (it ends its streams while Triton still
    answers); when either child dies, the other is stopped too. When the model reports it can no longer serve (a
    tensor-parallel rank died: the fatal file, triton_model.py), both are stopped and its cause is raised."""
    server = start_server(install, repo, ends, log_file=log_file)
    children: list[subprocess.Popen] = []  # the frontend, once started
    stop = {"requested": False}

    def request_stop(signum, frame):  # the main loop below does the stopping, in order
        stop["requested"] = True

    old = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    start = time.perf_counter()
    try:
        wait_ready(server, timeout=float("inf"), stopped=lambda: stop["requested"])  # loading has no time limit
        if not stop["requested"]:
            print(f"ready: {ends.http_url}/v2/health/ready answers, {time.perf_counter() - start:.1f} s after start",
                  file=sys.stderr, flush=True)
            if ready_line:
                print(ready_line, file=sys.stderr, flush=True)
        if frontend is not None:
            start_openai(server, children, frontend, stop)
        while (not stop["requested"] and server.poll() is None and all(c.poll() is None for c in children)
               and server.fatal() is None):
            time.sleep(0.2)
    except DFlashError:
        if not stop["requested"]:  # a signal while starting is a stop, not a failure
            raise
    finally:  # frontend first, then Triton; an error above must not leave a child behind
        fatal = server.fatal()  # read before the stop removes the server's folder
        codes = [stop_process(child, STOP_GRACE_S) for child in children] + [stop_server(server)]
        for s, handler in old.items():
            signal.signal(s, handler)
    if not stop["requested"] and fatal is not None:  # stopped above; the cause is the one line
        raise DFlashError(fatal)
    if stop["requested"] and all(code in (0, -signal.SIGTERM) for code in codes):
        return 0
    return next((code for code in codes if code not in (0, -signal.SIGTERM)), 1)


def start_openai(server: TritonServer, children: list[subprocess.Popen], settings, stop: dict) -> None:
    """The OpenAI frontend (appended to `children` at once, so a stop reaches it), once Triton is ready."""
    from .openai.process import start_frontend, wait_frontend

    wait_ready(server, stopped=lambda: stop["requested"])
    if stop["requested"]:
        return
    children.append(start_frontend(settings))
    wait_frontend(children[-1], settings)
    key = ", 'Authorization: Bearer KEY' required" if settings.api_key is not None else ""
    print(f"OpenAI API on {settings.url}/v1 (model '{settings.model}'{key})", file=sys.stderr, flush=True)
