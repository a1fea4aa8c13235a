"""One streamed request as measured by the client, and its per-request metrics.

Times are seconds on the client's monotonic clock: `start`/`end` since the point began, chunk
times since the request was sent. A chunk may carry several tokens (speculative decoding accepts
a block at once), so TPOT comes from the token count, never from the gaps between chunks:
TPOT = (E2E - TTFT) / (OSL - 1), which AIPerf, genai-perf and vLLM call inter-token latency (ITL).
It is undefined for one output token, and for a response whose text arrived in a single chunk
(E2E = TTFT says nothing about decode speed: a server holding back partial characters, or one that
does not stream). The gaps between chunks are the inter-chunk latencies (AIPerf's name), a diagnostic.
Token counts: the server's when it reports them (it saw the tokens), else the tokenizer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Fields a client may report from the server, under these names whatever the protocol calls them.
SERVER_FIELDS = ("output_tokens", "input_tokens", "accepted_draft_tokens", "draft_tokens", "finish_reason")
ERROR_KINDS = ("timeout", "connection", "server", "client", "cancelled")


@dataclass
class Chunk:
    """One streamed response: new text (may be empty) and any server fields it reported."""

    text: str = ""
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestRecord:
    point: str
    index: int  # request number within the point
    prompt: int  # prompt number within the run
    isl: int  # input tokens (tokenizer count; the server's, when it reports one, is `input_tokens`)
    osl_requested: int
    start: float  # s since the point began: the request was sent
    end: float | None = None  # s since the point began: the request finished (any outcome)
    chunk_times: list[float] = field(default_factory=list)  # s since sent, chunks that carried text
    text: list[str] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)  # SERVER_FIELDS the server reported
    osl_tokenizer: int | None = None
    category: str | None = None
    error: str | None = None
    error_kind: str | None = None  # one of ERROR_KINDS

    def fail(self, kind: str, message: str) -> None:
        self.error_kind, self.error = kind, message

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def e2e(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None

    @property
    def osl_server(self) -> int | None:
        value = self.server.get("output_tokens")
        return int(value) if value is not None else None

    @property
    def osl(self) -> int | None:
        """The server's count when it reports one (it saw the tokens), else the tokenizer's."""
        return self.osl_server if self.osl_server is not None else self.osl_tokenizer

    @property
    def osl_mismatch(self) -> bool:
        return None not in (self.osl_server, self.osl_tokenizer) and self.osl_server != self.osl_tokenizer

    @property
    def isl_server(self) -> int | None:
        value = self.server.get("input_tokens")
        return int(value) if value is not None else None

    @property
    def input_tokens(self) -> int:
        return self.isl_server if self.isl_server is not None else self.isl

    @property
    def isl_mismatch(self) -> bool:
        return self.isl_server is not None and self.isl_server != self.isl

    @property
    def tpot(self) -> float | None:
        """s per output token after the first."""
        if not self.ok or self.osl is None or self.osl < 2 or len(self.chunk_times) < 2:
            return None
        return (self.e2e - self.ttft) / (self.osl - 1)

    @property
    def interactivity(self) -> float | None:
        """tokens/s/user = 1000 / TPOT(ms)."""
        return 1.0 / self.tpot if self.tpot else None

    @property
    def inter_chunk_latencies(self) -> list[float]:
        """s between consecutive text chunks: a diagnostic, not TPOT."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.point, "index": self.index, "prompt": self.prompt, "category": self.category,
            "ok": self.ok, "error_kind": self.error_kind, "error": self.error,
            "start_s": self.start, "end_s": self.end, "isl": self.isl, "isl_server": self.isl_server,
            "isl_mismatch": self.isl_mismatch, "osl_requested": self.osl_requested,
            "osl": self.osl, "osl_tokenizer": self.osl_tokenizer, "osl_server": self.osl_server,
            "osl_mismatch": self.osl_mismatch, "ttft_s": self.ttft, "e2e_s": self.e2e, "tpot_s": self.tpot,
            "interactivity": self.interactivity, "chunks": len(self.chunk_times),
            "inter_chunk_latency_s": self.inter_chunk_latencies,
            **{f"server_{k}": self.server[k] for k in SERVER_FIELDS if k in self.server},
        }
