"""dflash-serve killed with SIGKILL during a burst (the OOM killer, a scheduler's hard kill): tritonserver, which
runs in a session of its own, ends with it (serve/orphans.py) and frees the ports; the engine directory is
byte for byte what it was and still verifies; a restart on it serves the same greedy text."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.serve_cli import start_serve, wait_ready

pytest.importorskip("tritonclient")
pytestmark = [pytest.mark.serve, pytest.mark.slow]

PROMPT = "def main():"
GONE_WITHIN_S = 60  # tritonserver's ordered exit: its models unload, its exit timeout bounds the rest


def files(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under `root` (links followed: an engine links its checkpoints)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def generate(port: int, tokens: int = 24) -> str:
    body = {"text_input": PROMPT, "sampling_param_max_tokens": tokens, "sampling_param_ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/dflash/generate", json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["text_output"]


def restarted_text(engine: Path, root: Path) -> str:
    """A fresh dflash-serve on `engine`: its greedy text for PROMPT; it then stops cleanly (exit 0)."""
    root.mkdir()
    serve, ports, log = start_serve(engine, root, "--draft-len", "3")
    try:
        wait_ready(serve, ports[0], root / "serve.log")
        return generate(ports[0])
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0, (root / "serve.log").read_text()[-3000:]
        log.close()


def alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def port_free(port: int) -> bool:
    """A server can listen there again (as servers bind: SO_REUSEADDR, so the ended connections' TIME_WAIT does
    not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_server_leaves_nothing_running_and_its_engine_whole(builtin, tmp_path):
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.cli.build import main as build_main

    engine = build_engine(BuildSpec(str(builtin[0]), str(builtin[1]), str(tmp_path / "engine"), dtype="float32",
                                    max_batch_size=4, max_seq_len=256), "test")
    before = files(engine)
    first = tmp_path / "first"
    first.mkdir()
    serve, ports, log = start_serve(engine, first, "--draft-len", "3")
    try:
        wait_ready(serve, ports[0], first / "serve.log")
        expected = generate(ports[0])
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(serve.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        assert children, "tritonserver is dflash-serve's child"
        ended = []  # the burst: requests in flight when the kill comes; each must end, not hang

        def client():
            try:
                generate(ports[0], tokens=200)
            except OSError:
                pass
            ended.append(True)

        burst = [threading.Thread(target=client, daemon=True) for _ in range(4)]
        for t in burst:
            t.start()
        time.sleep(1.0)
        os.kill(serve.pid, signal.SIGKILL)
        serve.wait(10)
        deadline = time.monotonic() + GONE_WITHIN_S
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in children), "tritonserver outlived dflash-serve"
        for t in burst:
            t.join(30)
        assert len(ended) == len(burst), "a request hung after the server was killed"
        assert all(port_free(p) for p in ports), "a port is still held"
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()
    assert files(engine) == before  # nothing in the engine was touched
    assert build_main(["verify", str(engine)]) == 0

    assert restarted_text(engine, tmp_path / "again") == expected


def stream(port: int, events: list, done: threading.Event) -> None:
    """A long streamed request; its events (the last one an error when the server fails it)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {"text_input": PROMPT, "sampling_param_max_tokens": 400, "sampling_param_ignore_eos": True,
            "streaming": True}
    try:
        conn.request("POST", "/v2/models/dflash/generate_stream", json.dumps(body))
        for line in conn.getresponse():
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))
    except OSError as exc:
        events.append({"error": f"connection: {exc}"})
    done.set()


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_a_dead_rank_fails_its_requests_and_stops_the_server(builtin, tmp_path):
    """SIGKILL of rank 1 of a TP=2 torch engine mid-request: the streams end with the rank's loss (none hangs),
    the server stops answering ready within 10 s, dflash-serve exits non-zero with that one line, nothing of it
    keeps running or holds a port; a restart on the same engine serves the same greedy text."""
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.serve.failures import RANK_LOST

    engine = build_engine(BuildSpec(str(builtin[0]), str(builtin[1]), str(tmp_path / "engine"), dtype="float32",
                                    max_batch_size=4, max_seq_len=512, tp=2), "test")
    first = tmp_path / "first"
    first.mkdir()
    serve, ports, log = start_serve(engine, first, "--draft-len", "3")
    try:
        wait_ready(serve, ports[0], first / "serve.log")
        expected = generate(ports[0])
        worker = subprocess.run(["pgrep", "-f", f"trtllm_dflash.serve.tp_worker {engine}"], capture_output=True,
                                text=True).stdout.split()
        assert len(worker) == 1, worker
        streams = [([], threading.Event()) for _ in range(2)]
        for events, done in streams:
            threading.Thread(target=stream, args=(ports[0], events, done), daemon=True).start()
        deadline = time.monotonic() + 60
        while not all(events for events, _ in streams) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(events for events, _ in streams), "the streams never started"
        os.kill(int(worker[0]), signal.SIGKILL)
        killed = time.monotonic()
        for events, done in streams:
            assert done.wait(30), "a stream hung after the rank died"
            assert RANK_LOST in events[-1].get("error", ""), events[-1]
        while ready(ports[0]) and time.monotonic() - killed < 10:
            time.sleep(0.2)
        assert not ready(ports[0]), "still ready 10 s after the rank died"
        code = serve.wait(60)
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()
    lines = (first / "serve.log").read_text().strip().splitlines()
    assert code != 0 and lines[-1].startswith(f"dflash-serve: error: {RANK_LOST} (rank 1 exited with code -9)"), \
        lines[-15:]
    for pattern in (str(engine), f"--model-repository {first / 'repo'}"):  # the ranks, tritonserver
        leftover = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout.split()
        assert leftover == [], (pattern, leftover)
    assert all(port_free(p) for p in ports)

    assert restarted_text(engine, tmp_path / "again") == expected
