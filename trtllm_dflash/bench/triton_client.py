"""Triton clients for the llmapi-compatible model: HTTP `generate_stream` (SSE) and gRPC streaming.

Requests carry only the inputs the model declares (read from its metadata), so one client drives
both the dflash torch model and TensorRT-LLM's llmapi model; a missing `sampling_param_ignore_eos`
is a warning (outputs may stop at EOS before OSL).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..utils.errors import DFlashError
from .clients import (
    HEALTH_TIMEOUT_S,
    Client,
    ClientSettings,
    ConnectionLost,
    RequestError,
    describe,
    error_text,
    http_get,
    http_session,
    json_body,
    json_event,
    sse_events,
)
from .prompts import Prompt
from .records import Chunk

# Triton output tensor -> the record's server field
FIELDS = {"num_output_tokens": "output_tokens", "num_input_tokens": "input_tokens",
          "total_accepted_draft_tokens": "accepted_draft_tokens",
          "total_draft_tokens": "draft_tokens", "finish_reason": "finish_reason"}
REQUIRED = ("text_input", "sampling_param_max_tokens")
WANTED = ("sampling_param_ignore_eos", "sampling_param_exclude_input_from_output", "streaming")


@dataclass
class ModelInterface:
    """The tensors the served model declares (from its metadata), and so what to send and how it streams."""

    inputs: set[str] = field(default_factory=lambda: set(REQUIRED))
    outputs: set[str] = field(default_factory=set)

    @property
    def cumulative(self) -> bool:
        """TensorRT-LLM's llmapi model streams the whole text so far in each response; dflash's model (which
        declares its `num_output_tokens` extension) streams only the new text."""
        return "num_output_tokens" not in self.outputs

    def request(self, settings: ClientSettings, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
        """Input name -> value, restricted to what the model declares."""
        values = {"text_input": prompt.text, "streaming": True, "sampling_param_max_tokens": max_tokens,
                  "sampling_param_ignore_eos": settings.ignore_eos, "sampling_param_exclude_input_from_output": True,
                  "sampling_param_temperature": float(settings.temperature), "return_finish_reason": True,
                  "sampling_param_return_perf_metrics": True}  # llmapi: acceptance comes with the perf metrics
        return {k: v for k, v in values.items() if k in self.inputs}

    def check(self, model: str, warnings: list[str]) -> None:
        missing = [name for name in REQUIRED if name not in self.inputs]
        if missing:
            raise DFlashError(f"model {model!r} has no input {missing[0]!r}: not an llmapi-compatible text model "
                              f"(inputs: {', '.join(sorted(self.inputs))})")
        for name in WANTED:
            if name not in self.inputs:
                warnings.append(f"model {model!r} declares no input {name!r}: " + (
                    "outputs may stop at EOS before OSL" if "eos" in name else "token counts may be off"))


class NewText:
    """One request's stream as new text only, whichever way the model streams."""

    def __init__(self, cumulative: bool):
        self.cumulative, self.so_far = cumulative, ""

    def __call__(self, text: str) -> str:
        if not self.cumulative:
            return text
        keep = len(os.path.commonprefix([self.so_far, text]))  # the detokenizer may revise a held-back tail
        self.so_far = text
        return text[keep:]


def server_fields(values: dict[str, Any]) -> dict[str, Any]:
    """Record fields from output tensors (TensorRT-LLM sends its perf metrics as strings)."""
    out = {}
    for name, value in values.items():
        if name in FIELDS and value is not None:
            out[FIELDS[name]] = value if name == "finish_reason" else int(float(value))
    return out


class TritonHttpClient(Client):
    def __init__(self, settings: ClientSettings):
        super().__init__(settings)
        url = settings.url if "://" in settings.url else f"http://{settings.url}"
        self.base = url.rstrip("/")
        self.session = http_session()
        self.model = ModelInterface()

    async def close(self) -> None:
        await self.session.close()

    async def check(self) -> None:
        model = self.settings.model
        try:
            status, body = await http_get(self.session, f"{self.base}/v2/health/ready")
        except ConnectionLost as exc:
            raise DFlashError(f"--url: no Triton server answers at {self.base} ({exc})") from None
        if status != 200:
            raise DFlashError(f"--url: the Triton server at {self.base} is not ready (HTTP {status})")
        status, body = await http_get(self.session, f"{self.base}/v2/models/{model}")
        if status != 200:
            raise DFlashError(f"--model: {model!r} is not served at {self.base} ({error_text(body)})")
        metadata = json_body(body, f"{self.base}/v2/models/{model}")
        self.model = ModelInterface(*({t.get("name") for t in metadata.get(kind, []) if isinstance(t, dict)}
                                      for kind in ("inputs", "outputs")))
        status, _ = await http_get(self.session, f"{self.base}/v2/models/{model}/ready")
        if status != 200:
            raise DFlashError(f"--model: {model!r} at {self.base} is not ready")
        self.model.check(model, self.warnings)

    async def healthy(self) -> bool:
        try:
            return (await http_get(self.session, f"{self.base}/v2/health/ready", HEALTH_TIMEOUT_S))[0] == 200
        except ConnectionLost:
            return False

    async def server_info(self) -> dict[str, Any]:
        status, body = await http_get(self.session, f"{self.base}/v2")
        return json.loads(body) if status == 200 else {}

    async def stream(self, prompt: Prompt, max_tokens: int) -> AsyncIterator[Chunk]:
        import aiohttp

        url = f"{self.base}/v2/models/{self.settings.model}/generate_stream"
        body, new_text = self.model.request(self.settings, prompt, max_tokens), NewText(self.model.cumulative)
        try:
            async with self.session.post(url, json=body) as r:
                if r.status != 200:
                    raise RequestError(f"HTTP {r.status}: {error_text(await r.text())}")
                async for data in sse_events(r):
                    event = json_event(data)
                    if "error" in event:
                        raise RequestError(str(event["error"]))
                    yield Chunk(new_text(event.get("text_output") or ""), server_fields(event))
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectionLost(describe(exc)) from None


class TritonGrpcClient(Client):
    def __init__(self, settings: ClientSettings):
        super().__init__(settings)
        url = settings.url.removeprefix("grpc://").rstrip("/")
        if "://" in url or not urlsplit(f"//{url}").port:
            raise DFlashError(f"--url for triton-grpc is host:port (or grpc://host:port), got {settings.url!r}")
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.target = url
        self.channel = grpc.aio.insecure_channel(url)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.model = ModelInterface()

    async def close(self) -> None:
        await self.channel.close()

    async def check(self) -> None:
        import grpc
        from tritonclient.grpc import service_pb2 as pb

        model = self.settings.model
        try:
            ready = await self.stub.ServerReady(pb.ServerReadyRequest(), timeout=HEALTH_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise DFlashError(f"--url: no Triton gRPC server answers at {self.target} ({exc.code().name}: "
                              f"{exc.details()})") from None
        if not ready.ready:
            raise DFlashError(f"--url: the Triton server at {self.target} is not ready")
        try:
            meta = await self.stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=HEALTH_TIMEOUT_S)
            ready = await self.stub.ModelReady(pb.ModelReadyRequest(name=model), timeout=HEALTH_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise DFlashError(f"--model: {model!r} is not served at {self.target} ({exc.details()})") from None
        if not ready.ready:
            raise DFlashError(f"--model: {model!r} at {self.target} is not ready")
        self.model = ModelInterface({t.name for t in meta.inputs}, {t.name for t in meta.outputs})
        self.model.check(model, self.warnings)

    async def healthy(self) -> bool:
        import grpc
        from tritonclient.grpc import service_pb2 as pb

        try:
            return (await self.stub.ServerReady(pb.ServerReadyRequest(), timeout=HEALTH_TIMEOUT_S)).ready
        except grpc.aio.AioRpcError:
            return False

    async def server_info(self) -> dict[str, Any]:
        from tritonclient.grpc import service_pb2 as pb

        meta = await self.stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=HEALTH_TIMEOUT_S)
        return {"name": meta.name, "version": meta.version}

    def infer_request(self, prompt: Prompt, max_tokens: int):
        from tritonclient.grpc import service_pb2 as pb

        req = pb.ModelInferRequest(model_name=self.settings.model)
        for name, value in self.model.request(self.settings, prompt, max_tokens).items():
            tensor = req.inputs.add(name=name, shape=[1])
            if isinstance(value, bool):
                tensor.datatype = "BOOL"
                tensor.contents.bool_contents.append(value)
            elif isinstance(value, str):
                tensor.datatype = "BYTES"
                tensor.contents.bytes_contents.append(value.encode("utf-8"))
            elif isinstance(value, float):
                tensor.datatype = "FP32"
                tensor.contents.fp32_contents.append(value)
            else:
                tensor.datatype = "INT32"
                tensor.contents.int_contents.append(value)
        # a decoupled model may end with an empty response; ask Triton to deliver it (it marks the end)
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        return req

    async def stream(self, prompt: Prompt, max_tokens: int) -> AsyncIterator[Chunk]:
        import grpc

        done, new_text = asyncio.Event(), NewText(self.model.cumulative)
        request = self.infer_request(prompt, max_tokens)

        async def requests():
            yield request
            await done.wait()  # keep our side of the stream open until the final response

        call = self.stub.ModelStreamInfer(requests())
        final = False
        try:
            async for response in call:
                if response.error_message:
                    raise RequestError(response.error_message)
                chunk, final = parse_response(response.infer_response)
                if chunk is not None:
                    yield Chunk(new_text(chunk.text), chunk.fields)
                if final:
                    return
            raise ConnectionLost("the gRPC stream ended before the final response")
        except grpc.aio.AioRpcError as exc:
            kind = ConnectionLost if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) \
                else RequestError
            raise kind(f"{exc.code().name}: {exc.details()}") from None
        finally:
            done.set()  # half-close: after the final response the server ends the call normally
            if not final:  # an error, a timeout or the caller stopped early: Triton cancels the request
                call.cancel()


def parse_response(infer_response) -> tuple[Chunk | None, bool]:
    """-> (the chunk, or None for an empty final response; whether it is the last)."""
    from tritonclient.grpc import InferResult

    params = infer_response.parameters
    final = params["triton_final_response"].bool_param if "triton_final_response" in params else False
    if not infer_response.outputs:
        return None, final
    result = InferResult(infer_response)
    values = {}
    for output in infer_response.outputs:
        array = result.as_numpy(output.name)
        if array is not None and array.size:
            item = array.reshape(-1)[0]
            values[output.name] = item.decode("utf-8", "replace") if isinstance(item, bytes) else item.item()
    return Chunk(values.get("text_output") or "", server_fields(values)), final
