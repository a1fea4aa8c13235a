"""The FastAPI application: /v1/models, /v1/completions, /v1/chat/completions, /health.

Every request is authenticated (with --api-key: auth.py) and validated before anything reaches Triton
(a body over --max-request-bytes is a 413, unknown fields, unsupported options and prompts that do not
fit the engine are 400s, in OpenAI's error shape); a streamed response is started only after the model's first
response, so a request the model refuses still gets its proper status code. A client that goes away
ends its gRPC stream, which cancels the request in the engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from .auth import BearerAuth
from .backend import BackendError, Piece, TritonBackend
from .chat import ChatTemplate
from .limits import DEFAULT_MAX_REQUEST_BYTES, read_body
from .protocol import ChatRequest, CompletionRequest, Generation, InvalidRequest, parse_body
from .responses import Final, Shape, error_body


@dataclass
class Frontend:
    """What the routes share: the served name, the engine's limits, the tokenizer's chat template."""

    model: str
    triton_url: str
    tokenizer: object
    chat: ChatTemplate
    max_seq_len: int
    block_size: int
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    backend: TritonBackend | None = None  # made inside the server's event loop (lifespan)

    @property
    def room(self) -> int:
        """Prompt and output tokens one request may hold: Scheduler.validate keeps block + 1 positions free."""
        return self.max_seq_len - self.block_size - 1

    def generation(self, req, prompt: str, asked: int | None, prompt_param: str) -> Generation:
        """The request as the Triton model takes it, refused here (OpenAI's terms, naming the values) when its
        prompt and output do not fit the engine; `asked` None: as many output tokens as fit. (Tokenized on the
        event loop: a fast tokenizer shared by threads can fail with "Already borrowed".)"""
        used = len(self.tokenizer.encode(prompt, add_special_tokens=False))
        room, why = self.room, f"max_seq_len {self.max_seq_len} less {self.block_size + 1} positions for drafting"
        if used >= room:
            raise InvalidRequest(f"the prompt is {used} tokens: this engine holds at most {room} tokens of prompt and "
                                 f"output ({why}), so none are left to generate", prompt_param)
        if asked is not None and used + asked > room:
            param = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
            raise InvalidRequest(f"'{param}': at most {room - used} after this prompt of {used} tokens (this engine "
                                 f"holds {room} tokens of prompt and output: {why}), got {asked}", param)
        return Generation.of(req, prompt, asked if asked is not None else room - used)


def create_app(frontend: Frontend, api_key: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        frontend.backend = TritonBackend(frontend.triton_url, frontend.model)
        try:
            yield
        finally:
            await frontend.backend.close()

    app = FastAPI(title="trtllm-dflash OpenAI-compatible API", lifespan=lifespan, docs_url=None, redoc_url=None)
    if api_key is not None:
        app.add_middleware(BearerAuth, key=api_key)
    install_error_handlers(app)
    add_routes(app, frontend)
    return app


def error_response(message: str, status: int, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, code), status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidRequest)
    async def invalid(request: Request, exc: InvalidRequest):
        return error_response(exc.message, exc.status, exc.param, exc.code)

    @app.exception_handler(BackendError)
    async def backend_failed(request: Request, exc: BackendError):
        return error_response(exc.message, exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return error_response(f"{request.method} {request.url.path}: {exc.detail}", exc.status_code)


def add_routes(app: FastAPI, frontend: Frontend) -> None:
    @app.get("/health")
    async def health():
        ready = await frontend.backend.ready()
        return Response(status_code=200 if ready else 503)

    @app.get("/v1/models")
    async def models():
        card = {"id": frontend.model, "object": "model", "created": 0, "owned_by": "trtllm-dflash",
                "max_model_len": frontend.max_seq_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse_body(CompletionRequest, await read_body(request, frontend.max_request_bytes), frontend.model)
        generation = frontend.generation(body, body.prompt, body.max_tokens, "prompt")
        return await respond(request, frontend, generation, Shape(frontend.model, chat=False), body.include_usage)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = parse_body(ChatRequest, await read_body(request, frontend.max_request_bytes), frontend.model)
        prompt = frontend.chat.render([m.as_template_input() for m in body.messages], body.add_generation_prompt)
        generation = frontend.generation(body, prompt, body.output_limit, "messages")
        return await respond(request, frontend, generation, Shape(frontend.model, chat=True), body.include_usage)


async def respond(request: Request, frontend: Frontend, generation: Generation, shape: Shape, include_usage: bool):
    pieces = frontend.backend.generate(generation)
    if not generation.streaming:
        return await whole(request, pieces, shape)
    first = await anext(pieces)  # a refused request raises here, before any byte is sent: a proper status
    return StreamingResponse(sse(shape, first, pieces, include_usage), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def whole(request: Request, pieces: AsyncIterator[Piece], shape: Shape):
    """Collect the answer while watching the connection: a client that leaves cancels the request."""

    async def collect() -> tuple[str, Final]:
        text = []
        async for piece in pieces:
            text.append(piece.text)
            if piece.final is not None:
                return "".join(text), piece.final
        raise BackendError("the inference server sent no final response", 503)

    answer, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnected(request))
    await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not answer.done():
        answer.cancel()  # closes the stream: the engine frees the slot
        await asyncio.gather(answer, return_exceptions=True)
        return Response(status_code=499)  # nobody reads it
    text, final = answer.result()
    return shape.whole(text, final)


async def disconnected(request: Request) -> None:
    """Returns when the client closes its connection (the body has been read, so only that message is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def event(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def sse(shape: Shape, first: Piece, pieces: AsyncIterator[Piece], include_usage: bool) -> AsyncIterator[str]:
    """OpenAI's stream: (chat: a role chunk), text chunks, the finish reason, (the usage chunk), [DONE].
    An error after the first byte is sent as an `error` event before [DONE]."""

    def with_usage(chunk: dict) -> dict:
        return {**chunk, "usage": None} if include_usage else chunk  # OpenAI: null usage on every other chunk

    try:
        if shape.chat:
            yield event(with_usage(shape.chunk(None, role=True)))
        piece = first
        while True:
            if piece.text or piece.final is not None:
                reason = piece.final.finish_reason if piece.final else None
                yield event(with_usage(shape.chunk(piece.text if piece.text or not shape.chat else None, reason)))
            if piece.final is not None:
                break
            piece = await anext(pieces)
        if include_usage:
            yield event(shape.usage_chunk(piece.final))
    except BackendError as exc:
        yield event(error_body(exc.message, exc.status))
    finally:
        await pieces.aclose()  # the client left mid-stream: cancels the request in the engine
    yield event("[DONE]")
