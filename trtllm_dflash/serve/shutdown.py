"""A clean stop of a tritonserver serving torch engines: nothing in flight is left hanging.

Triton unloads a model (and runs its `finalize`) only once the model's requests are over, and on
SIGTERM it waits for them up to its exit timeout: a stream in flight would hold the server for that
long and then see it exit 1. So the stop runs in this order:
1. create the stop file (its path is in the server's environment, STOP_FILE_ENV): the serving loop
   ends every request in flight or queued with a final `server shutting down` response and refuses
   new ones;
2. unload every model through the repository API (explicit model control): `finalize` runs, which
   stops the loop's thread, tensor-parallel workers and their process group;
3. SIGTERM: with nothing in flight, Triton exits at once (idle keep-alive connections are closed
   after EXIT_TIMEOUT_S).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

STOP_FILE_ENV = "DFLASH_STOP_FILE"
EXIT_TIMEOUT_S = 3  # tritonserver --exit-timeout-secs: only idle connections can be left to wait for


def request_json(url: str, body: dict, timeout: float = 5.0):
    """POST `body` as JSON; -> the decoded answer (None when empty)."""
    with urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), method="POST"),
                                timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def loaded_models(http_url: str) -> list[str]:
    """Names of the models the server has READY (repository index)."""
    index = request_json(f"{http_url}/v2/repository/index", {"ready": True}) or []
    return [m["name"] for m in index if m.get("state", "READY") == "READY"]


def models_in_memory(http_url: str) -> list[str]:
    """Names of the models the server still holds: READY, or LOADING or UNLOADING (repository index). A model
    being unloaded is not READY, yet its `finalize` and process are still ending: a SIGTERM then makes Triton
    wait its exit timeout for it, and a compiled model's process takes about 3 s to end (`--step-mode compile`:
    the server exited 1)."""
    index = request_json(f"{http_url}/v2/repository/index", {}) or []
    return [m["name"] for m in index if m.get("state", "READY") in ("READY", "LOADING", "UNLOADING")]


def unload_all(http_url: str, timeout: float) -> str | None:
    """Ask the server to unload every model and wait until none is held any more (within `timeout` seconds);
    -> None once done, else why not (one line). A call that times out is asked again until the deadline: on a
    loaded machine one answer can take over the per-call 5 s while the unload goes on, and a SIGTERM sent then
    finds the model live (tritonserver exits 1). An error answer (a repeated unload of a model already being
    unloaded) is not the end either: the index is polled on until the model is gone."""
    deadline = time.monotonic() + timeout
    pending = None  # models still to ask to unload, once the index has answered
    held: list[str] = []
    while time.monotonic() < deadline:
        try:
            if pending is None:
                pending = loaded_models(http_url)
            while pending:
                try:
                    request_json(f"{http_url}/v2/repository/models/{pending[0]}/unload", {})
                except urllib.error.HTTPError:
                    pass  # answered: the model is unloading already, or gone; the index below tells which
                pending.pop(0)
            held = models_in_memory(http_url)
            if not held:
                return None
        except urllib.error.HTTPError:
            pass  # the index answered an error while models change state: ask again
        except (OSError, ValueError) as exc:  # a timeout is asked again; refused, reset or a bad answer: going away
            if not is_timeout(exc):
                return f"the server stopped answering ({exc})"
        time.sleep(0.1)
    return f"{', '.join(held) or 'the models'} still loaded after {timeout:g} s"


def is_timeout(exc: Exception) -> bool:
    """A socket timeout, raw (reading the answer) or wrapped by urllib (connecting)."""
    return isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)


def begin_drain(stop_file: Path) -> None:
    """Tell every serving loop of this server to end its requests (step 1 above)."""
    stop_file.parent.mkdir(parents=True, exist_ok=True)
    stop_file.touch()
