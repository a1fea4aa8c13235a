"""What one OpenAI request may carry, checked before anything reaches Triton; each refusal names the value
and the limit. The body first: over `--max-request-bytes` it is a 413, refused by its Content-Length
before a byte of it is read, else as soon as the bytes read pass the limit (chunked uploads). The other
limits (prompt and output tokens, n, stop sequences, logprobs) are 400s (app.py, protocol.py)."""

from __future__ import annotations

DEFAULT_MAX_REQUEST_BYTES = 2 * 2**20  # a 128k-token prompt of escaped non-ASCII JSON is about 0.8 MB
MAX_STOP = 4  # OpenAI: up to 4 stop sequences
MAX_STOP_CHARS = 256  # each is searched for in the whole text after every step (serve/loop.py `first_stop`)


def too_large(size: str, limit: int):
    from .protocol import InvalidRequest  # pydantic: not needed by the constants dflash-serve's --help shows

    return InvalidRequest(f"the request body is {size} bytes: this server accepts at most {limit} "
                          "(dflash-serve --max-request-bytes)", None, 413, "request_too_large")


def declared_length(headers) -> int | None:
    value = headers.get("content-length")
    return int(value) if value is not None and value.strip().isdigit() else None


async def read_body(request, limit: int) -> bytes:
    """The request's body, at most `limit` bytes (InvalidRequest 413 past it)."""
    declared = declared_length(request.headers)
    if declared is not None and declared > limit:
        raise too_large(str(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}", limit)
        chunks.append(chunk)
    return b"".join(chunks)
