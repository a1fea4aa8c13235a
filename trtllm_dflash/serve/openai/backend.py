"""The Triton side of the frontend: one gRPC bidirectional stream per request to the served model
(tritonclient's asyncio client), so the engine runs once, in tritonserver.

Cancellation: when a request ends before its final response (the HTTP client went away, the frontend
is shutting down), the gRPC call is cancelled; Triton then marks the request cancelled and the
Python-backend model frees its slot before its next step (serve/loop.py `drop_cancelled`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from ..failures import INTERNAL_ERROR, OVERLOADED, SHUTTING_DOWN
from .protocol import Generation
from .responses import Final

# The model's outputs this frontend reads (the last four only come with the final response).
OUTPUTS = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens", "num_draft_steps",
           "total_draft_tokens", "total_accepted_draft_tokens")
SERVER_SIDE = {OVERLOADED: 503, SHUTTING_DOWN: 503, INTERNAL_ERROR: 500}  # else the request's fault: 400


class BackendError(Exception):
    """The model or Triton refused or failed a request; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message, self.status = message, status

    @classmethod
    def from_model(cls, message: str) -> BackendError:
        return cls(message, next((s for prefix, s in SERVER_SIDE.items() if message.startswith(prefix)), 400))


@dataclass
class Piece:
    """New text from one response; `final` is set on the last one."""

    text: str
    final: Final | None = None


def tensor(name: str, values: list, dtype, triton_type: str):
    from tritonclient.grpc import InferInput

    array = np.array(values, dtype=dtype)
    t = InferInput(name, list(array.shape), triton_type)
    t.set_data_from_numpy(array)
    return t


def model_inputs(g: Generation) -> list:
    """The Triton model's inputs (TensorRT-LLM llmapi names, plus sampling_param_ignore_eos)."""
    inputs = [tensor("text_input", [g.text.encode("utf-8")], np.object_, "BYTES"),
              tensor("streaming", [g.streaming], bool, "BOOL"),
              tensor("sampling_param_max_tokens", [g.max_tokens], np.int32, "INT32"),
              tensor("sampling_param_temperature", [g.temperature], np.float32, "FP32"),
              tensor("sampling_param_top_p", [g.top_p], np.float32, "FP32"),
              tensor("sampling_param_top_k", [g.top_k], np.int32, "INT32"),
              tensor("sampling_param_exclude_input_from_output", [True], bool, "BOOL"),
              tensor("sampling_param_ignore_eos", [g.ignore_eos], bool, "BOOL")]
    if g.seed is not None:
        inputs.append(tensor("sampling_param_seed", [g.seed], np.uint64, "UINT64"))
    if g.stop:
        inputs.append(tensor("sampling_param_stop", [s.encode("utf-8") for s in g.stop], np.object_, "BYTES"))
    return inputs


def parse_result(result) -> Piece:
    def value(name):
        array = result.as_numpy(name)
        return None if array is None or not array.size else array.reshape(-1)[0]

    text = value("text_output")
    piece = Piece(text.decode("utf-8") if text is not None else "")
    if result.get_response().parameters["triton_final_response"].bool_param:
        reason = value("finish_reason")
        piece.final = Final(reason.decode("utf-8") if reason is not None else "stop",
                            *(int(value(n) or 0) for n in OUTPUTS[2:]))
    return piece


class TritonBackend:
    def __init__(self, url: str, model: str):
        from tritonclient.grpc.aio import InferenceServerClient

        self.client, self.model, self.url = InferenceServerClient(url), model, url
        self.stopping = asyncio.Event()  # set at shutdown: every stream in flight ends with SHUTTING_DOWN

    async def close(self) -> None:
        await self.client.close()

    async def ready(self) -> bool:
        from tritonclient.utils import InferenceServerException

        try:
            return await self.client.is_model_ready(self.model)
        except InferenceServerException:
            return False

    def stop(self) -> None:
        self.stopping.set()

    async def generate(self, g: Generation) -> AsyncIterator[Piece]:
        """The model's responses as new text, the last one with its `final` counts."""
        import grpc
        from tritonclient.grpc import InferRequestedOutput

        done = asyncio.Event()
        request = {"model_name": self.model, "inputs": model_inputs(g),
                   "outputs": [InferRequestedOutput(n) for n in OUTPUTS]}

        async def requests():
            yield request
            await done.wait()  # keep our half of the stream open until the final response

        stream, finished = self.client.stream_infer(requests()), False
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            while not finished:
                piece = await self.next_piece(stream, stop)
                finished = piece.final is not None
                yield piece
        except grpc.aio.AioRpcError as exc:
            raise BackendError(f"the inference server failed the request ({exc.code().name}: {exc.details()})",
                               503) from None
        finally:
            stop.cancel()
            done.set()
            if not finished:  # the client left, a failure, or shutdown: Triton cancels the request
                stream.cancel()

    async def next_piece(self, stream, stop: asyncio.Future) -> Piece:
        step = asyncio.ensure_future(stream.__anext__())
        try:
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the HTTP handler was cancelled (client gone): stop reading too
            step.cancel()
            raise
        if not step.done():
            step.cancel()
            raise BackendError(f"{SHUTTING_DOWN}: request cancelled", 503)
        try:
            result, error = step.result()
        except StopAsyncIteration:
            raise BackendError("the inference server ended the stream before the final response", 503) from None
        if error is not None:
            raise BackendError.from_model(error.message())
        return parse_result(result)
