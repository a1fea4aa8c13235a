"""Re-check an engine directory: every file's checksum, then what its backend checks (the configs, the pair,
every weight file's names and shapes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config.manifest import Manifest
from ..utils.errors import DFlashError
from .backend import backend_for


def verify_engine(engine_dir: str | Path) -> tuple[bool, list[str]]:
    """-> (ok, report lines). Malformed pieces become report lines, not exceptions."""
    engine_dir = Path(engine_dir)
    manifest = Manifest.read(engine_dir)
    problems = manifest.check_files(engine_dir)
    lines = [f"checksums: {len(manifest.files)} files intact"] if not problems else [f"FAIL {p}" for p in problems]
    backend_lines, backend_problems = backend_for(manifest.backend).verify(engine_dir, manifest)
    lines, problems = lines + backend_lines, problems + backend_problems
    lines.append("engine OK" if not problems else f"engine BROKEN ({len(problems)} problem(s))")
    return not problems, lines


def checked(check: Callable[[], list[str]]) -> tuple[list[str], list[str]]:
    """-> (the check's report lines, no problems), or its DFlashError as (one FAIL line, the problem)."""
    try:
        return check(), []
    except DFlashError as exc:
        return [f"FAIL {exc}"], [str(exc)]
