"""OpenAI-compatible streaming client (what `trtllm-serve`, vLLM and SGLang offer).

Text prompts go to /v1/completions, chat prompts (`messages`) to /v1/chat/completions, both with
stream=true (SSE, ending in `data: [DONE]`). `ignore_eos` is the servers' extension for fixed
output lengths; `stream_options.include_usage` asks for the server's token counts (its `usage`: input
and output tokens; dflash-serve adds drafted/accepted tokens as `usage.dflash`). A server started with
an API key gets it from $OPENAI_API_KEY.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from ..utils.errors import DFlashError
from .clients import (
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

USAGE = {"completion_tokens": "output_tokens", "prompt_tokens": "input_tokens"}
DFLASH_USAGE = {"drafted_tokens": "draft_tokens", "accepted_tokens": "accepted_draft_tokens"}  # usage.dflash


def payload(settings: ClientSettings, prompt: Prompt, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """-> (path, JSON body)."""
    body = {"model": settings.model, "max_tokens": max_tokens, "stream": True, "temperature": settings.temperature,
            "stream_options": {"include_usage": True}}
    if settings.ignore_eos:
        body["ignore_eos"] = True
    if prompt.messages is not None:
        return "/v1/chat/completions", {**body, "messages": list(prompt.messages)}
    return "/v1/completions", {**body, "prompt": prompt.text}


def parse_event(event: dict[str, Any]) -> Chunk:
    fields: dict[str, Any] = {}
    usage = event.get("usage") or {}
    fields.update({USAGE[k]: v for k, v in usage.items() if k in USAGE and v is not None})
    extension = usage.get("dflash") if isinstance(usage.get("dflash"), dict) else {}
    fields.update({DFLASH_USAGE[k]: v for k, v in extension.items() if k in DFLASH_USAGE and v is not None})
    text = ""
    for choice in event.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        if choice.get("finish_reason"):
            fields["finish_reason"] = choice["finish_reason"]
    return Chunk(text, fields)


class OpenAIClient(Client):
    def __init__(self, settings: ClientSettings):
        super().__init__(settings)
        url = settings.url if "://" in settings.url else f"http://{settings.url}"
        self.base = url.rstrip("/").removesuffix("/v1")
        key = os.environ.get("OPENAI_API_KEY")
        self.session = http_session(headers={"Authorization": f"Bearer {key}"} if key else None)

    async def close(self) -> None:
        await self.session.close()

    async def check(self) -> None:
        try:
            status, body = await http_get(self.session, f"{self.base}/v1/models")
        except ConnectionLost as exc:
            raise DFlashError(f"--url: no server answers at {self.base} ({exc})") from None
        if status == 404:
            self.warnings.append(f"{self.base}/v1/models is absent: the model name was not checked")
            return
        if status != 200:
            raise DFlashError(f"--url: {self.base}/v1/models answered HTTP {status}: {error_text(body)}")
        served = [m.get("id") for m in json_body(body, f"{self.base}/v1/models").get("data", []) if isinstance(m, dict)]
        if self.settings.model not in served:
            raise DFlashError(f"--model: {self.settings.model!r} is not served at {self.base} "
                              f"(served: {', '.join(map(str, served)) or 'none'})")

    async def healthy(self) -> bool:
        """Alive when it answers HTTP at all (/health where offered, else /v1/models)."""
        for path in ("/health", "/v1/models"):
            try:
                status, _ = await http_get(self.session, f"{self.base}{path}")
            except ConnectionLost:
                return False
            if status < 500 and status != 404:
                return True
        return False

    async def stream(self, prompt: Prompt, max_tokens: int) -> AsyncIterator[Chunk]:
        import aiohttp

        path, body = payload(self.settings, prompt, max_tokens)
        try:
            async with self.session.post(f"{self.base}{path}", json=body) as r:
                if r.status != 200:
                    raise RequestError(f"HTTP {r.status}: {error_text(await r.text())}")
                async for data in sse_events(r):
                    if data == "[DONE]":
                        return
                    event = json_event(data)
                    if "error" in event:
                        raise RequestError(error_text(data))
                    yield parse_event(event)
            raise ConnectionLost("the stream ended without 'data: [DONE]'")
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectionLost(describe(exc)) from None
