"""Run the OpenAI frontend (uvicorn) in front of a running tritonserver, until SIGTERM/SIGINT.

On a signal: stop accepting connections, end every stream in flight with a `server shutting down`
error (their gRPC calls are cancelled, so the engine frees the slots), close idle connections, exit 0.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

from ...utils.errors import DFlashError
from .limits import DEFAULT_MAX_REQUEST_BYTES

GRACEFUL_S = 5.0  # after SIGTERM, what is still running after this long is cancelled outright


@dataclass(frozen=True)
class FrontendSettings:
    engine_dir: str
    triton_grpc: str  # host:port of tritonserver's gRPC endpoint
    model: str  # the Triton model name, served under the same name
    host: str = "127.0.0.1"
    port: int = 8003
    chat_template: str | None = None  # a Jinja file overriding the tokenizer's template
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    api_key: str | None = field(default=None, repr=False)  # None: no authentication; never printed

    def __post_init__(self):
        from .auth import check_key

        if not 0 < self.port < 65536:
            raise DFlashError(f"--openai-port must be in 1..65535, got {self.port}")
        if self.max_request_bytes < 1024:
            raise DFlashError(f"--max-request-bytes must be at least 1024, got {self.max_request_bytes}")
        if self.api_key is not None:
            check_key(self.api_key)
        if self.chat_template is not None:
            from .chat import read_template

            read_template(self.chat_template)  # a missing, empty or invalid file is one line, before any start

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def listen(host: str, port: int) -> socket.socket:
    """Bind before loading anything, so a taken port is one line at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise DFlashError(f"--openai-port {port}: cannot listen on {host}:{port} ({why})") from None
    sock.listen(2048)
    return sock


def load_frontend(settings: FrontendSettings):
    from ...checkpoint.hf import load_tokenizer
    from ...config.manifest import Manifest
    from .app import Frontend
    from .chat import ChatTemplate, read_template

    engine = Path(settings.engine_dir)
    manifest = Manifest.read(engine)
    if manifest.backend != "torch":
        raise DFlashError(f"{engine} is a {manifest.backend} engine: its OpenAI API is trtllm-serve's")
    tokenizer = load_tokenizer(engine / manifest.tokenizer) if manifest.tokenizer else None
    if tokenizer is None:
        raise DFlashError(f"the engine {engine} ships no tokenizer: the OpenAI API needs one")
    override = read_template(settings.chat_template) if settings.chat_template else None
    return Frontend(settings.model, settings.triton_grpc, tokenizer, ChatTemplate(tokenizer, override),
                    manifest.limits["max_seq_len"], manifest.block_size, settings.max_request_bytes)


def make_server(settings: FrontendSettings, frontend):
    import uvicorn

    from .app import create_app

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if frontend.backend is not None and self.loop is not None:
                self.loop.call_soon_threadsafe(frontend.backend.stop)  # end the streams in flight now
            super().handle_exit(sig, frame)

        async def serve(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

    config = uvicorn.Config(create_app(frontend, settings.api_key), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=GRACEFUL_S, timeout_keep_alive=5)
    server = Server(config)
    server.loop = None
    return server


def run_frontend(settings: FrontendSettings) -> int:
    sock = listen(settings.host, settings.port)
    server = make_server(settings, load_frontend(settings))
    # uvicorn re-raises the signal it shut down on after restoring the previous handlers: make that a
    # no-op, so a SIGTERM'd frontend exits 0 after its clean shutdown
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=[sock])
    return 0 if server.started else 1  # uvicorn logged why it did not start
