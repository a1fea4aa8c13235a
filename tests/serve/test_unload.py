"""The ordered stop's unload wait (serve/shutdown.py `unload_all`) against an HTTP endpoint scripted as Triton's
repository API answers under load: an unload call answered with an error (a repeat of one already in progress)
is not the end of the wait; the index is polled until the model is gone, or the deadline names what is held."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trtllm_dflash.serve.shutdown import unload_all


class Repository:
    """Index answers in turn (the last one repeats); every unload call is answered 400."""

    def __init__(self, states: list[str]):
        self.states, self.unloads = states, 0

    def handler(self):
        repo = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.endswith("/unload"):
                    repo.unloads += 1
                    self.send_response(400)
                    body = b'{"error":"failed to unload: model is being unloaded"}'
                else:
                    state = repo.states.pop(0) if len(repo.states) > 1 else repo.states[0]
                    self.send_response(200)
                    body = json.dumps([{"name": "dflash", "version": "1", "state": state}]).encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return Handler


@pytest.fixture
def repository(request):
    repo = Repository(request.param)
    server = ThreadingHTTPServer(("127.0.0.1", 0), repo.handler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield repo, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("repository", [["READY", "UNLOADING", "UNLOADING", "UNLOADING", "UNAVAILABLE"]],
                         indirect=True)
def test_an_error_answer_to_the_unload_waits_for_the_model_to_go(repository):
    repo, url = repository
    assert unload_all(url, timeout=10) is None
    assert repo.unloads == 1 and repo.states == ["UNAVAILABLE"]  # every UNLOADING answer was waited through


@pytest.mark.parametrize("repository", [["READY"]], indirect=True)
def test_a_model_that_stays_loaded_is_named_at_the_deadline(repository):
    _, url = repository
    assert unload_all(url, timeout=0.5) == "dflash still loaded after 0.5 s"


def test_a_server_that_is_gone_ends_the_wait_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    failed = unload_all(f"http://127.0.0.1:{port}", timeout=10)
    assert failed is not None and failed.startswith("the server stopped answering")
