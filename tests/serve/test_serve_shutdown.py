"""dflash-serve's stop against the real tritonserver: SIGTERM with streams in flight and an idle keep-alive
connection ends the streams with a final 'server shutting down' event and exits 0 within 10 s, leaving no
child process and no shared-memory region behind."""

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trtllm_dflash.engine.loader import free_port

from helpers.serve_cli import start_serve, wait_ready
from trtllm_dflash.serve.failures import SHUTTING_DOWN

pytest.importorskip("tritonclient")
pytestmark = pytest.mark.serve  # the real tritonserver

STOP_WITHIN_S = 10


def python_shm(pids: list[int]) -> set[str]:
    """The Python backend's shared-memory regions these processes map (/proc/PID/maps): this server's own, not
    those of a server another test worker runs beside it."""
    names = set()
    for pid in pids:
        with open(f"/proc/{pid}/maps") as maps:
            names |= {line.split("/dev/shm/", 1)[1].strip() for line in maps if "/dev/shm/" in line}
    return {name for name in names if "python_backend" in name}


def open_stream(port: int, events: list, done: threading.Event, started: threading.Event) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"text_input": "def main():", "sampling_param_max_tokens": 480, "sampling_param_ignore_eos": True,
            "streaming": True}
    conn.request("POST", "/v2/models/dflash/generate_stream", json.dumps(body))
    resp = conn.getresponse()
    for line in resp:
        if line.startswith(b"data:"):
            events.append(json.loads(line[5:]))
            started.set()
    done.set()


def check_start_log(path: Path) -> None:
    """'serving on' once the model is loaded, never before; no CUDA/NVML/DCGM failures on a machine without a GPU."""
    from trtllm_dflash.serve.server import has_gpu

    deadline = time.monotonic() + 10
    while "serving on" not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    text = path.read_text()
    assert text.index("successfully loaded 'dflash'") < text.index("serving on"), text[-3000:]
    if not has_gpu():
        for noise in ("CudaDriverHelper", "Failed to initialize NVML", "DCGM unable to start", "pinned system memory"):
            assert noise not in text, noise


def test_sigterm_cancels_streams_and_exits_cleanly(triton_server, tmp_path):
    serve, ports, log = start_serve(triton_server["engine"], tmp_path)
    port = ports[0]
    try:
        wait_ready(serve, port, tmp_path / "serve.log")
        check_start_log(tmp_path / "serve.log")
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(serve.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        assert len(children) == 1  # tritonserver
        shm = python_shm(children)
        assert shm  # the regions it shares with its model's process
        streams = [([], threading.Event(), threading.Event()) for _ in range(2)]
        for events, done, started in streams:
            threading.Thread(target=open_stream, args=(port, events, done, started), daemon=True).start()
        for _, _, started in streams:
            assert started.wait(60), (tmp_path / "serve.log").read_text()[-2000:]
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # an idle keep-alive connection
        idle.request("GET", "/v2/health/live")
        assert idle.getresponse().read() == b""
        stopped = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        for events, done, _ in streams:
            assert done.wait(STOP_WITHIN_S), "a stream was not ended by the stop"
            assert SHUTTING_DOWN in events[-1].get("error", ""), events[-1]
            assert "text_output" in events[0]
        assert serve.wait(STOP_WITHIN_S) == 0, (tmp_path / "serve.log").read_text()[-3000:]
        assert time.monotonic() - stopped < STOP_WITHIN_S
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert not {name for name in shm if os.path.exists(f"/dev/shm/{name}")}  # its regions went with it
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()


def test_a_port_in_use_is_one_line_and_a_quick_exit(triton_server, tmp_path):
    held = triton_server["ends"].http_port  # the session's server listens there
    command = [sys.executable, "-m", "trtllm_dflash.cli.serve", str(triton_server["engine"]), "--model-repo",
               str(tmp_path / "repo"), "--http-port", str(held)]
    started = time.monotonic()
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"dflash-serve: error: --http-port {held} on 127.0.0.1 is not available: " \
        "Address already in use"
    assert time.monotonic() - started < 8
    assert not (tmp_path / "repo").exists()  # nothing written before the refusal


def garble_weights(engine: Path) -> Path:
    """-> the first weight file of the engine's target, its safetensors header overwritten (a torn copy)."""
    weights = sorted((engine / "target").resolve().glob("*.safetensors"))[0]
    weights.write_bytes(b"\xff" * 16 + weights.read_bytes()[16:])
    return weights


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["garbled weights", "a bad parameter"])
def test_a_model_that_cannot_load_is_one_line_naming_the_cause(triton_server, tmp_path, fault):
    """A model-load failure inside Triton reaches the user as dflash-serve's own last line, naming the cause and
    tritonserver's log, which keeps the traceback; exit code 2 (an error), nothing left running."""
    from trtllm_dflash.serve.server import has_gpu

    engine = tmp_path / "engine"
    shutil.copytree(triton_server["engine"], engine)
    if fault == "garbled weights":
        cause, extra = f"corrupt safetensors file {garble_weights(engine)}: ", ()
    else:  # checked where the model loads: only the server knows its device
        if has_gpu():
            pytest.skip("cuda-graphs is a valid step mode on a GPU")
        cause, extra = "step mode cuda-graphs needs a CUDA device, got 'cpu'", ("--step-mode", "cuda-graphs")
    serve, _, log = start_serve(engine, tmp_path, "--draft-len", "3", *extra)
    try:
        code = serve.wait(240)
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()
    lines = (tmp_path / "serve.log").read_text().strip().splitlines()
    server_log = tmp_path / "repo.log"
    assert code == 2, lines[-20:]
    assert lines[-1].startswith(f"dflash-serve: error: the model did not load: {cause}"), lines[-20:]
    assert lines[-1].endswith(f" (tritonserver's log: {server_log})")
    assert "Traceback" in server_log.read_text() or "At:" in server_log.read_text()  # the detail stays there
    leftover = subprocess.run(["pgrep", "-f", "--", f"--model-repository {tmp_path / 'repo'}"], capture_output=True)
    assert leftover.stdout == b""


def test_a_cause_is_read_from_tritons_log_when_the_model_left_none(tmp_path):
    """A failure our model code does not see (here a model of no dflash code; also a missing backend, a bad
    config.pbtxt) is read from Triton's own `failed to load` log line: one line, the server's log named."""
    from trtllm_dflash.serve.locate import find_tritonserver
    from trtllm_dflash.serve.server import Endpoints, start_server, stop_server, wait_ready
    from trtllm_dflash.utils.errors import DFlashError

    model = tmp_path / "repo" / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\nmax_batch_size: 0\n'
                                        'input { name: "x" data_type: TYPE_FP32 dims: [1] }\n'
                                        'output { name: "y" data_type: TYPE_FP32 dims: [1] }\n')
    (model / "1" / "model.py").write_text("class TritonPythonModel:\n    def initialize(self, args):\n"
                                          "        raise ValueError('no weights here')\n")
    ends = Endpoints("127.0.0.1", free_port(), free_port(), free_port())
    with open(os.devnull, "w") as quiet:
        server = start_server(find_tritonserver(tmp_path / "triton"), tmp_path / "repo", ends, quiet,
                              tmp_path / "server.log")
        try:
            with pytest.raises(DFlashError) as err:
                wait_ready(server, timeout=120)
        finally:
            stop_server(server, grace=5)
    assert str(err.value) == ("the model did not load: 'broken': Internal: ValueError: no weights here "
                              f"(tritonserver's log: {tmp_path / 'server.log'})")
