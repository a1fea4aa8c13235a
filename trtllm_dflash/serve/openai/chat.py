"""Chat messages to prompt text with the tokenizer's chat template (or `--chat-template FILE`).

The template is rendered by transformers' `apply_chat_template` (a sandboxed Jinja environment), to
text; the Triton model tokenizes that text as it tokenizes any prompt (special tokens in the text
are recognised, none are added).
"""

from __future__ import annotations

from pathlib import Path

from ...utils.errors import DFlashError
from .protocol import InvalidRequest


def read_template(path: str | Path) -> str:
    """A Jinja chat template file, checked to compile; DFlashError naming the file otherwise."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    path = Path(path)
    if not path.is_file():
        raise DFlashError(f"--chat-template {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DFlashError(f"--chat-template {path}: cannot read it ({type(exc).__name__}: {exc})") from None
    if not text.strip():
        raise DFlashError(f"--chat-template {path}: the file is empty")
    try:
        ImmutableSandboxedEnvironment().parse(text)
    except TemplateSyntaxError as exc:
        raise DFlashError(f"--chat-template {path}: not a valid Jinja template (line {exc.lineno}: {exc.message})") \
            from None
    return text


class ChatTemplate:
    def __init__(self, tokenizer, override: str | None = None):
        self.tokenizer = tokenizer
        self.template = override or getattr(tokenizer, "chat_template", None)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.template:
            raise InvalidRequest("this model has no chat template, so /v1/chat/completions cannot build a prompt: "
                                 "start dflash-serve with --chat-template FILE (or use /v1/completions)", "messages")
        try:
            return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # the template's own checks raise (e.g. "roles must alternate")
            raise InvalidRequest(f"the chat template cannot render these messages: {exc}", "messages") from None
