"""Acceptance profiles from measured runs: what `dflash-bench acceptance` writes and `plan --acceptance` reads.

Two kinds of run, two kinds of profile:
- `dflash-generate --json` output (one JSON object a line; many runs may share a file) carries every verify
  step's draft length and acceptance length (`draft_lengths`, `acceptance_lengths`): the per-position rates
  are measured (acceptance.acceptance_from_steps). A request's last step is left out: it is cut at the stop
  token or the length limit (engine/request.py Result.acceptance_lengths), so its length is not the
  acceptance's.
- a `dflash-bench sweep` run directory holds, per request, only the server's totals of drafted and accepted
  tokens (requests.jsonl `server_draft_tokens`, `server_accepted_draft_tokens`): per-position rates are not in
  them. At one fixed draft length k the totals give the mean accepted drafts a step, k x accepted / drafted,
  and the profile is the constant rate that reproduces it over k positions: a geometric fit, named as such.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...utils.errors import DFlashError
from ..report import read_json
from ..results import MANIFEST, REQUESTS, SUMMARY_JSON
from .acceptance import AcceptanceProfile, acceptance_from_steps, constant_rate


def generate_steps(obj: dict, where: str) -> list[tuple[int, int]]:
    """(draft length, acceptance length) of every verify step but the last, from one dflash-generate --json
    object."""
    lengths, drafts = obj.get("acceptance_lengths"), obj.get("draft_lengths")
    if not isinstance(lengths, list) or not isinstance(drafts, list) or len(lengths) != len(drafts):
        raise DFlashError(f"{where}: not dflash-generate --json output (needs 'acceptance_lengths' and "
                          f"'draft_lengths' of equal length)")
    return list(zip(drafts, lengths))[:-1]


def read_generate_file(path: Path) -> list[tuple[int, int]]:
    steps: list[tuple[int, int]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise DFlashError(f"{path}:{number}: not a JSON object (one dflash-generate --json output a line)") from None
        if not isinstance(obj, dict):
            raise DFlashError(f"{path}:{number}: not a JSON object (one dflash-generate --json output a line)")
        steps += generate_steps(obj, f"{path}:{number}")
    return steps


def sweep_draft_len(run: Path) -> int:
    """The one draft length a sweep's points ran at, from the server's counters (summary.json)."""
    points = read_json(run / SUMMARY_JSON).get("points") or []
    means = {p.get("draft_len_mean") for p in points} - {None}
    shares = {p.get("plain_step_share") for p in points} - {None, 0, 0.0}
    if len(means) != 1 or shares or float(next(iter(means))) != int(next(iter(means))):
        raise DFlashError(f"{run}: a profile from a sweep needs one fixed draft length and no plain steps (its "
                          f"counters give mean draft lengths {sorted(means)}); give --draft-len K")
    return int(next(iter(means)))


def sweep_profile(run: Path, draft_len: int | None) -> AcceptanceProfile:
    k = draft_len or sweep_draft_len(run)
    drafted = accepted = 0
    if not (run / REQUESTS).is_file():
        raise DFlashError(f"missing {run / REQUESTS}")
    for number, line in enumerate((run / REQUESTS).read_text().splitlines(), 1):
        try:
            row = json.loads(line) if line.strip() else {}
        except ValueError:
            raise DFlashError(f"{run / REQUESTS}:{number}: not a JSON object") from None
        if row.get("ok") and row.get("server_draft_tokens") is not None:
            drafted += int(row["server_draft_tokens"])
            accepted += int(row.get("server_accepted_draft_tokens") or 0)
    if not drafted:
        raise DFlashError(f"{run}: no request reported drafted tokens (server_draft_tokens in {REQUESTS})")
    per_step = k * accepted / drafted  # accepted drafts a step at k drafts a step
    rate = constant_rate(1.0 + per_step, k)
    return AcceptanceProfile((rate,) * k, f"dflash-bench sweep {run}: geometric fit (a model: the server reports "
                             f"totals, not positions) to {accepted}/{drafted} drafts accepted at draft length {k}")


def profile_from_runs(sources: list[str], draft_len: int | None = None, note: str | None = None) -> AcceptanceProfile:
    """One profile from dflash-generate --json files (pooled) or from one sweep run directory."""
    paths = [Path(s) for s in sources]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise DFlashError(f"no such run file or directory: {missing[0]}")
    runs = [p for p in paths if p.is_dir()]
    if runs:
        if len(paths) > 1 or not (runs[0] / MANIFEST).is_file():
            raise DFlashError(f"{runs[0]}: give one dflash-bench sweep run directory, or dflash-generate --json files")
        profile = sweep_profile(runs[0], draft_len)
        return AcceptanceProfile(profile.per_position, note) if note else profile
    steps = [s for p in paths for s in read_generate_file(p)]
    source = note or f"dflash-generate --json: {len(steps)} steps from {', '.join(map(str, paths))}"
    return acceptance_from_steps(steps, source)
