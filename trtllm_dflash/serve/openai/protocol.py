"""OpenAI request bodies, validated: unknown fields are rejected, options this server cannot honour are
refused by name, never silently ignored.

Field names and defaults follow OpenAI's API reference (completions: max_tokens 16, temperature 1);
`top_k` and `ignore_eos` are vLLM's extensions (`top_k` 0 or -1: off), `add_generation_prompt` too.
A neutral value of an unsupported option (`n: 1`, `logprobs: null`, `presence_penalty: 0`, ...) is
accepted, because common clients send them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .limits import MAX_STOP, MAX_STOP_CHARS

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions


class InvalidRequest(Exception):
    """A request this server refuses: an OpenAI `invalid_request_error` naming the parameter."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingRequest(Strict):
    """What completions and chat share."""

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: Any = None  # a string or a list of strings
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = None  # an end-user id for abuse monitoring: accepted, not used
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("expected a string or a list of strings")
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop sequence is an empty string")
        longest = max(stops, key=len, default="")
        if len(longest) > MAX_STOP_CHARS:
            raise ValueError(f"a stop sequence is at most {MAX_STOP_CHARS} characters, got one of {len(longest)}")
        return value

    def unsupported(self) -> dict[str, Any]:
        """Options set to something this server cannot do: field -> what was asked."""
        asked = {"n": self.n != 1, "presence_penalty": self.presence_penalty != 0,
                 "frequency_penalty": self.frequency_penalty != 0, "logit_bias": bool(self.logit_bias)}
        return {name: getattr(self, name) for name, bad in asked.items() if bad}

    def check(self, served_model: str) -> None:
        if self.model != served_model:
            raise InvalidRequest(f"The model `{self.model}` does not exist (this server serves `{served_model}`)",
                                 "model", 404, "model_not_found")
        unsupported = self.unsupported()
        if unsupported:
            name, value = next(iter(unsupported.items()))
            raise InvalidRequest(f"{name}={value!r} is not supported by this server", name)
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("stream_options is only allowed with stream=true", "stream_options")

    @property
    def stop_list(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingRequest):
    prompt: Any
    max_tokens: int | None = Field(COMPLETIONS_DEFAULT_MAX_TOKENS, ge=1)
    echo: bool = False
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_text_prompt(cls, value):
        """One text prompt: a string, or a list holding one string (token-id prompts are not accepted)."""
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            value = value[0]
        if isinstance(value, str):
            if not value:
                raise ValueError("the prompt is an empty string")
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            raise ValueError(f"one prompt per request is supported, got a list of {len(value)}")
        if isinstance(value, list) and value and all(isinstance(v, (int, list)) for v in value):
            raise ValueError("token-id prompts are not supported: send the prompt as text")
        raise ValueError(f"expected a string, got {type(value).__name__}")

    def unsupported(self) -> dict[str, Any]:
        asked = {"echo": self.echo, "best_of": self.best_of not in (None, 1), "logprobs": bool(self.logprobs),
                 "suffix": bool(self.suffix)}
        return {**super().unsupported(), **{name: getattr(self, name) for name, bad in asked.items() if bad}}


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Any  # a string, or a list of {"type": "text", "text": ...} parts (joined)
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, value):
        if isinstance(value, str):
            return value
        parts = value if isinstance(value, list) else None
        if parts is None or not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                    and set(p) == {"type", "text"} for p in parts):
            raise ValueError('expected a string or a list of {"type": "text", "text": ...} parts (text only)')
        return "".join(p["text"] for p in parts)

    def as_template_input(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content, **({"name": self.name} if self.name else {})}


class ResponseFormat(Strict):
    type: Literal["text"]


class ChatRequest(SamplingRequest):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True

    def unsupported(self) -> dict[str, Any]:
        asked = {"logprobs": bool(self.logprobs), "top_logprobs": bool(self.top_logprobs), "tools": bool(self.tools)}
        return {**super().unsupported(), **{name: getattr(self, name) for name, bad in asked.items() if bad}}

    def check(self, served_model: str) -> None:
        super().check(served_model)
        both = (self.max_tokens, self.max_completion_tokens)
        if None not in both and both[0] != both[1]:
            raise InvalidRequest(f"max_tokens ({both[0]}) and max_completion_tokens ({both[1]}) disagree: send one",
                                 "max_completion_tokens")

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


@dataclass(frozen=True)
class Generation:
    """One request as the Triton model takes it (its `sampling_param_*` inputs)."""

    text: str
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    streaming: bool

    @classmethod
    def of(cls, req: SamplingRequest, text: str, max_tokens: int) -> Generation:
        return cls(text, max_tokens, req.temperature, req.top_p, max(req.top_k, 0), req.seed, req.stop_list,
                   req.ignore_eos, req.stream)


def parse_body(model: type[SamplingRequest], body: bytes, served_model: str) -> SamplingRequest:
    """The request body (JSON whatever the Content-Type says, as Triton's endpoints take it), validated."""
    if not body.strip():
        raise InvalidRequest("the body is empty: expected a JSON object")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidRequest("the body's JSON nests too deeply") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"the body must be a JSON object, got {type(data).__name__}")
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        raise describe_validation_error(exc.errors()) from None
    request.check(served_model)
    return request


def describe_validation_error(errors: list[dict[str, Any]]) -> InvalidRequest:
    """pydantic's errors as one line naming the first field (and how many more there are)."""
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ())]
    param = ".".join(loc) or None
    kind, msg = first.get("type", ""), str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = f"unknown field '{param}'"
    elif kind == "missing":
        message = f"'{param}' is required"
    elif kind == "value_error":  # our own validators' messages say what was wrong
        message = f"'{param}': {msg}"
    else:
        message = f"'{param}': {msg} (got {short_repr(first.get('input'))})"
    more = len(errors) - 1
    return InvalidRequest(message + (f"; and {more} more problem{'s' * (more > 1)}" if more else ""), param)


def short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
