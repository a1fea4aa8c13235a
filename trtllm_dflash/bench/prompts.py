"""Prompts for a sweep: random text of exact token lengths, or real prompts from a JSONL dataset.

Token counts use the served model's tokenizer the way the server does (no special tokens added to
plain text; a chat's `messages` go through the chat template with the generation prompt).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import DFlashError
from ..utils.settings_file import utf8_lines

POOL_CANDIDATES = 32768  # vocabulary ids examined for the random-text pool (all of a small vocabulary)
FIX_ROUNDS = 32  # decode/re-encode rounds allowed to land on an exact token length


@dataclass(frozen=True)
class Prompt:
    text: str  # what a text endpoint receives (a chat already templated)
    isl: int  # input tokens
    messages: tuple[dict, ...] | None = None  # a chat endpoint receives these instead
    category: str | None = None
    source: int | None = None  # dataset line number (1-based); None for random prompts


class PromptSource:
    """Prompt i of a run, deterministic in (seed, i); points draw disjoint index ranges."""

    def __init__(self, tokenizer, isl: int = 1024, isl_range: float = 0.8, seed: int = 0,
                 dataset: list[Prompt] | None = None):
        self.tokenizer, self.isl, self.isl_range, self.seed = tokenizer, isl, isl_range, seed
        self.dataset = dataset
        self.order = list(range(len(dataset))) if dataset else []
        random.Random(seed).shuffle(self.order)
        self.pool = None if dataset else text_pool(tokenizer, seed)
        self.cache: dict[int, Prompt] = {}

    def get(self, i: int) -> Prompt:
        if i not in self.cache:
            self.cache[i] = self.dataset[self.order[i % len(self.order)]] if self.dataset else self.random(i)
        return self.cache[i]

    def prefetch(self, start: int, count: int) -> None:
        """Make prompts before a point starts, so the client does no tokenizer work while it measures."""
        for i in range(start, start + count):
            self.get(i)

    def random(self, i: int) -> Prompt:
        rng = random.Random(f"{self.seed}:{i}")
        low = max(1, math.ceil(self.isl_range * self.isl))
        length = rng.randint(low, self.isl)
        return Prompt(exact_length_text(self.tokenizer, self.pool, length, rng), length)


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def text_pool(tokenizer, seed: int) -> list[int]:
    """Ids that decode to printable text and re-encode to themselves alone (no special tokens)."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    if len(ids) > POOL_CANDIDATES:
        ids = sorted(random.Random(seed).sample(ids, POOL_CANDIDATES))
    texts = tokenizer.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)
    keep = [(i, t) for i, t in zip(ids, texts) if t.strip() and t.isprintable()]
    encoded = tokenizer([t for _, t in keep], add_special_tokens=False)["input_ids"]
    pool = [i for (i, _), enc in zip(keep, encoded) if enc == [i]]
    if not pool:
        raise DFlashError("the tokenizer has no printable single-token texts to build random prompts from")
    return pool


def exact_length_text(tokenizer, pool: list[int], length: int, rng: random.Random) -> str:
    """Random text whose re-encoding has exactly `length` tokens (merges at joins are corrected)."""
    ids = [rng.choice(pool) for _ in range(length)]
    for _ in range(FIX_ROUNDS):
        text = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        got = tokenizer.encode(text, add_special_tokens=False)
        if len(got) == length:
            return text
        ids = got[:length] if len(got) > length else got + [rng.choice(pool) for _ in range(length - len(got))]
    raise DFlashError(f"could not make a random prompt of exactly {length} tokens with this tokenizer")


def read_dataset(path: str | Path, tokenizer, flag: str = "--dataset") -> list[Prompt]:
    """One prompt per JSONL line: {"prompt": str} or {"messages": [{"role", "content"}, ...]}, optional
    "category". Errors name the file and the line; `flag` names the option the file came from."""
    prompts = []
    try:
        for number, line in utf8_lines(path, str(path)):
            if line.strip():
                prompts.append(parse_line(line, tokenizer, f"{path}:{number}", number))
    except OSError as exc:
        raise DFlashError(f"cannot read {flag} {path}: {exc.strerror}") from None
    if not prompts:
        raise DFlashError(f"{flag} {path} holds no prompts")
    return prompts


def parse_line(line: str, tokenizer, where: str, number: int) -> Prompt:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DFlashError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise DFlashError(f"{where}: expected a JSON object, got {type(row).__name__}")
    category = row.get("category")
    if category is not None and not isinstance(category, str):
        raise DFlashError(f"{where}: 'category' must be a string, got {category!r}")
    if isinstance(row.get("prompt"), str) and row["prompt"]:
        return Prompt(row["prompt"], count_tokens(tokenizer, row["prompt"]), None, category, number)
    if "messages" in row:
        messages = check_messages(row["messages"], where)
        text = chat_text(tokenizer, messages, where)
        return Prompt(text, count_tokens(tokenizer, text), messages, category, number)
    raise DFlashError(f"{where}: needs a non-empty 'prompt' string or a 'messages' list, got keys {sorted(row)}")


def check_messages(messages: Any, where: str) -> tuple[dict, ...]:
    if not isinstance(messages, list) or not messages:
        raise DFlashError(f"{where}: 'messages' must be a non-empty list")
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DFlashError(f"{where}: each message needs string 'role' and 'content', got {m!r}")
    return tuple(messages)


def chat_text(tokenizer, messages: tuple[dict, ...], where: str) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise DFlashError(f"{where}: chat 'messages' need a tokenizer with a chat template; this one has none")
    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise DFlashError(f"{where}: the chat template failed: {type(exc).__name__}: {exc}") from None
