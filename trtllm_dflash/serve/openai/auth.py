"""Bearer-key authentication of the OpenAI API (`dflash-serve --api-key KEY`, or DFLASH_API_KEY).

As vLLM's `AuthenticationMiddleware` (vllm/entrypoints/openai/server_utils.py @029329a8): a pure ASGI
middleware, so a refused request is answered before its body is read, and the key is compared as SHA-256
digests with `secrets.compare_digest` (constant time whatever the lengths). vLLM guards only paths under
/v1; here every path but GET /health does (an unknown path answers 401 too, so a scan learns nothing).

The key reaches the frontend process in its environment (readable by its own user only), never on its
command line, which `ps` shows to every user; it is never logged or echoed in an answer.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from ...utils.errors import DFlashError
from .responses import error_body

API_KEY_ENV = "DFLASH_API_KEY"
OPEN_PATHS = frozenset({"/health"})  # a load balancer's probe carries no key
KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # what an HTTP header carries unquoted: printable ASCII, no spaces


def check_key(key: str) -> str:
    """The key as given, or one line saying why it cannot be one (never the key itself)."""
    if not KEY_CHARS.fullmatch(key):
        raise DFlashError(f"--api-key (or {API_KEY_ENV}) must be printable ASCII without spaces (it is sent in an "
                          "HTTP header); the key given has a space, a control or a non-ASCII character")
    return key


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class BearerAuth:
    """401 with OpenAI's error body unless `Authorization: Bearer KEY`; OPEN_PATHS pass."""

    def __init__(self, app, key: str):
        self.app, self.key = app, digest(check_key(key))

    def refusal(self, headers: dict[bytes, bytes]) -> str | None:
        """Why the request is refused, or None when its key matches."""
        value = headers.get(b"authorization")
        if value is None:
            return "missing API key: send the header 'Authorization: Bearer KEY'"
        scheme, _, token = value.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return "the Authorization header must be 'Bearer KEY'"
        return None if secrets.compare_digest(digest(token.strip()), self.key) else "invalid API key"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        why = self.refusal(dict(scope["headers"]))
        if why is None:
            return await self.app(scope, receive, send)
        from fastapi.responses import JSONResponse

        response = JSONResponse(error_body(why, 401, code="invalid_api_key"), status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})  # RFC 6750's challenge
        await response(scope, receive, send)
