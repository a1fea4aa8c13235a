"""Streaming endpoint clients: one small interface, a registry by API name, shared SSE reading.

A client checks the server once (`check`), streams one request as `Chunk`s (`stream`), and says
whether the server still answers (`healthy`). Request-level failures raise `RequestError`; a
failed or dropped connection raises `ConnectionLost` (the server may be dead).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..utils.errors import DFlashError
from .prompts import Prompt
from .records import Chunk

REGISTRY = {  # --api -> module:class
    "triton-http": "trtllm_dflash.bench.triton_client:TritonHttpClient",
    "triton-grpc": "trtllm_dflash.bench.triton_client:TritonGrpcClient",
    "openai": "trtllm_dflash.bench.openai_client:OpenAIClient",
}
HEALTH_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 10.0


class RequestError(Exception):
    """The server answered this request with an error."""


class ConnectionLost(Exception):
    """No connection, or it dropped mid-stream."""


@dataclass(frozen=True)
class ClientSettings:
    url: str
    model: str
    temperature: float = 0.0
    ignore_eos: bool = True  # load tests: every request produces its full output length


class Client:
    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self.warnings: list[str] = []  # found by check(): settings the server cannot honour

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        pass

    async def check(self) -> None:
        """Raise DFlashError (one line) when the server is unreachable or does not serve the model."""
        raise NotImplementedError

    async def healthy(self) -> bool:
        raise NotImplementedError

    async def server_info(self) -> dict[str, Any]:
        return {}

    def stream(self, prompt: Prompt, max_tokens: int) -> AsyncIterator[Chunk]:
        raise NotImplementedError


def make_client(api: str, settings: ClientSettings) -> Client:
    if api not in REGISTRY:
        raise DFlashError(f"--api: unknown API {api!r} (choose from {', '.join(REGISTRY)})")
    module, cls = REGISTRY[api].split(":")
    return getattr(importlib.import_module(module), cls)(settings)


def http_session(headers: dict[str, str] | None = None):
    """An aiohttp session without a connection cap (the load generator is the cap) or a total timeout
    (the runner times requests out itself)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0), headers=headers)


async def sse_events(response) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent-events body, as they arrive (any chunking, any line length)."""
    buffer = b""
    async for piece in response.content.iter_any():
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip().decode("utf-8")
    if buffer.startswith(b"data:"):
        yield buffer[5:].strip().decode("utf-8")


def json_object(text: str) -> dict[str, Any] | None:
    """`text` parsed as a JSON object, or None when it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def json_event(data: str) -> dict[str, Any]:
    """One SSE payload as a JSON object; RequestError when the server sent something else."""
    event = json_object(data)
    if event is None:
        raise RequestError(f"malformed stream event: {data[:200]!r}")
    return event


def json_body(body: str, what: str) -> dict[str, Any]:
    """A check's JSON answer; DFlashError naming `what` when the server sent something else."""
    data = json_object(body)
    if data is None:
        raise DFlashError(f"{what} did not answer with a JSON object: {body[:200]!r}")
    return data


def error_text(body: str) -> str:
    """The message inside a JSON error body ({"error": str | {"message"}}, {"message"}, {"detail"}; bare or as an
    SSE `data:` line, as Triton's generate_stream answers), else the body."""
    text = body.strip()
    try:
        data = json.loads(text[5:] if text.startswith("data:") else text)
    except ValueError:
        return body.strip()[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            err = err.get("message") or err.get("detail") or json.dumps(err)
        return str(err)[:500]
    return body.strip()[:500]


async def http_get(session, url: str, timeout: float = HEALTH_TIMEOUT_S) -> tuple[int, str]:
    """-> (status, body); ConnectionLost when nothing answers."""
    import aiohttp

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise ConnectionLost(f"cannot reach {url}: {describe(exc)}") from None


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
