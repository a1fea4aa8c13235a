"""OpenAI response objects: completions and chat, whole and as stream chunks, usage, errors.

`usage` carries the server's own token counts (the Triton model's `num_input_tokens` /
`num_output_tokens`) and, as an extension field `usage.dflash`, the request's speculative-decoding
statistics: verify steps that carried drafts, drafted and accepted tokens, and acceptance length
AL = 1 + accepted / draft steps (null for plain decoding).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class Final:
    """What the Triton model reports with its last response."""

    finish_reason: str
    input_tokens: int
    output_tokens: int
    draft_steps: int
    drafted_tokens: int
    accepted_tokens: int

    def usage(self) -> dict[str, Any]:
        length = 1 + self.accepted_tokens / self.draft_steps if self.draft_steps else None
        return {"prompt_tokens": self.input_tokens, "completion_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens,
                "dflash": {"draft_steps": self.draft_steps, "drafted_tokens": self.drafted_tokens,
                           "accepted_tokens": self.accepted_tokens, "acceptance_length": length}}


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Shape:
    """The objects of one endpoint; `chat` picks chat.completion(.chunk) over text_completion."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat = model, chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, text: str, final: Final) -> dict[str, Any]:
        body = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        choice = {"index": 0, **body, "logprobs": None, "finish_reason": final.finish_reason}
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self.envelope(obj, [choice]), "usage": final.usage()}

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self.envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self.envelope("text_completion", [choice])

    def usage_chunk(self, final: Final) -> dict[str, Any]:
        """The last chunk when stream_options.include_usage: no choices, the whole request's usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self.envelope(obj, []), "usage": final.usage()}
