"""`dflash-serve` run as a user runs it (its own process, its log in a file), and waited on until ready."""

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from trtllm_dflash.engine.loader import free_port


def start_serve(engine: Path, root: Path, *extra: str):
    """-> (the process, its [http, grpc, metrics] ports, its open log file root/serve.log)."""
    ports = [free_port() for _ in range(3)]
    command = [sys.executable, "-m", "trtllm_dflash.cli.serve", str(engine), "--model-repo", str(root / "repo"),
               "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), *extra]
    log = open(root / "serve.log", "w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), ports, log


def wait_ready(serve, port: int, log_path: Path, timeout: float = 300) -> None:
    """Until its HTTP port answers ready; fails with the log's tail if it exits or `timeout` passes (seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        assert serve.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
