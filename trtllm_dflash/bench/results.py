"""A run directory, written as results arrive so that a crash or a dead server keeps what was measured.

    manifest.json    every setting, label, versions, engine digest, status (running, complete, aborted, failed,
                     interrupted)
    requests.jsonl   one line per measured request, appended (and flushed) as each finishes
    summary.json     one entry per finished point, rewritten after each point
    summary.csv      the same, one row per point
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..utils.errors import DFlashError

MANIFEST, REQUESTS, SUMMARY_JSON, SUMMARY_CSV = "manifest.json", "requests.jsonl", "summary.json", "summary.csv"
LIBRARIES = ("trtllm-dflash", "numpy", "aiohttp", "tritonclient", "grpcio", "transformers", "tokenizers", "scipy",
             "matplotlib", "tqdm")


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def csv_text(rows: list[dict[str, Any]]) -> str:
    """Scalar columns only (nested values such as counter deltas stay in the JSON); None -> empty."""
    columns = [k for k, v in rows[0].items() if not isinstance(v, (dict, list))] if rows else []
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in columns})
    return out.getvalue()


class RunWriter:
    def __init__(self, run_dir: Path, manifest: dict[str, Any]):
        self.dir = Path(run_dir)
        if (self.dir / MANIFEST).exists():
            raise DFlashError(f"--output: {self.dir} already holds a run (choose another directory)")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.manifest = {**manifest, "status": "running", "started_utc": utc_now(), "finished_utc": None,
                         "error": None}
        self.points: list[dict[str, Any]] = []
        self.requests = open(self.dir / REQUESTS, "a", encoding="utf-8")
        self.write_manifest()
        self.write_summary()

    def write_manifest(self) -> None:
        write_atomic(self.dir / MANIFEST, json.dumps(self.manifest, indent=2, default=str) + "\n")

    def write_summary(self) -> None:
        data = {"label": self.manifest["label"], "status": self.manifest["status"], "points": self.points}
        write_atomic(self.dir / SUMMARY_JSON, json.dumps(data, indent=2) + "\n")
        write_atomic(self.dir / SUMMARY_CSV, csv_text(self.points))

    def record(self, row: dict[str, Any]) -> None:
        self.requests.write(json.dumps(row) + "\n")
        self.requests.flush()

    def point(self, summary: dict[str, Any]) -> None:
        self.points.append(summary)
        self.write_summary()

    def finish(self, status: str, error: str | None = None) -> None:
        self.manifest.update(status=status, finished_utc=utc_now(), error=error)
        self.requests.close()
        self.write_manifest()
        self.write_summary()

