"""A sweep: for each load point, a warm-up, counters scraped, the measured requests, counters again,
the point's summary written. `run_sweep(spec)` is what `dflash-bench sweep` calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import counters
from .clients import Client, ClientSettings, ConnectionLost, http_get, http_session, make_client
from .load import LoadRunner, Phase
from .metrics import error_pattern, summarize_point
from .monitor import ClientMonitor
from .prompts import PromptSource, count_tokens, read_dataset
from .results import RunWriter, library_versions
from .spec import LoadPoint, SweepSpec
from .tokenizer import TokenizerSource, resolve_tokenizer

TRITON_METRICS_PORT = 8002


@dataclass
class SweepResult:
    run_dir: Path
    status: str  # complete | aborted
    points: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def empty_points(self) -> list[dict[str, Any]]:
        """Points at which no request succeeded: they measured nothing."""
        return [p for p in self.points if not p["completed"]]


def dominant_error(points: list[dict[str, Any]]) -> tuple[str, int, int]:
    """-> (the most common error message over `points`, requests that failed with it, requests in all)."""
    counts, example = Counter(), {}
    for p in points:
        if p["top_error"] is not None:
            kind = error_pattern(p["top_error"])
            counts[kind] += p["top_error_count"]
            example.setdefault(kind, p["top_error"])
    kind, count = counts.most_common(1)[0] if counts else (None, 0)
    return example.get(kind, "no request was sent"), count, sum(p["requests"] for p in points)


def stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_sweep(spec: SweepSpec, command: str | None = None, log: Callable[[str], None] = stderr,
              progress: bool = True, clock: Callable[[], float] = time.perf_counter) -> SweepResult:
    """Measure every load point of `spec`; results land in the run directory as they arrive."""
    source = resolve_tokenizer(spec.tokenizer)
    dataset = read_dataset(spec.dataset, source.tokenizer) if spec.dataset else None
    prompts = PromptSource(source.tokenizer, spec.isl, spec.isl_range, spec.seed, dataset)
    sweep = Sweep(spec, source, prompts, command, log, progress, clock)
    return asyncio.run(sweep.run())


def metrics_urls(spec: SweepSpec) -> list[str]:
    """Where to look for the dflash counters, in order: --metrics-url; else, for Triton, the metrics port as
    dflash-serve assigns its ports by default (HTTP, gRPC, metrics consecutive: 8000, 8001, 8002), counted from
    the URL's port; then Triton's default 8002. The first that serves the counters is kept."""
    if spec.metrics_url:
        return [] if spec.metrics_url == "none" else [spec.metrics_url]
    if not spec.api.startswith("triton"):
        return []
    url = spec.url.removeprefix("grpc://")
    parts = urlsplit(url if "://" in url else f"//{url}")
    host = parts.hostname or "127.0.0.1"
    try:
        port = parts.port
    except ValueError:
        port = None
    offset = 1 if spec.api == "triton-grpc" else 2
    ports = ([port + offset] if port else []) + [TRITON_METRICS_PORT]
    return [f"http://{host}:{p}/metrics" for p in dict.fromkeys(ports)]


def run_dir(spec: SweepSpec) -> Path:
    if spec.output:
        return Path(spec.output)
    label = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec.run_label)
    return Path("bench_runs") / f"{label}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


class Sweep:
    def __init__(self, spec: SweepSpec, source: TokenizerSource, prompts: PromptSource, command: str | None,
                 log: Callable[[str], None], progress: bool, clock: Callable[[], float]):
        self.spec, self.source, self.prompts, self.command = spec, source, prompts, command
        self.log, self.progress, self.clock = log, progress, clock
        engine_tp = source.engine["tp_size"] if source.engine else None
        self.num_gpus = spec.num_gpus or engine_tp or 1
        self.gpus_from = "--num-gpus" if spec.num_gpus else ("the engine's tp_size" if engine_tp else "default")
        self.metrics_candidates = metrics_urls(spec)
        self.metrics_url = self.metrics_candidates[0] if self.metrics_candidates else None  # until found
        self.next_prompt = 0
        self.warned_counters = False
        self.drafter_method: str | None = None  # as the server's metrics name it (counters.drafter_method)

    def warn(self, message: str) -> None:
        self.log(f"dflash-bench: warning: {message}")

    async def run(self) -> SweepResult:
        spec = self.spec
        settings = ClientSettings(spec.url, spec.model, spec.temperature)
        async with make_client(spec.api, settings) as client, http_session() as self.session:
            await client.check()
            for message in client.warnings + self.prompt_warnings():
                self.warn(message)
            await self.scrape()  # finds the metrics URL and the drafter method before the manifest is written
            writer = RunWriter(run_dir(spec), self.manifest(await self.server_info(client), client))
            runner = LoadRunner(client, self.prompts, spec.osl, spec.timeout,
                                lambda text: count_tokens(self.source.tokenizer, text), self.clock, spec.seed)
            result = SweepResult(writer.dir, "complete")
            try:
                for point in spec.points:
                    summary = await self.point(client, runner, writer, point)
                    if summary is not None:
                        result.points.append(summary)
                    if runner.dead:
                        result.status, result.error = "aborted", f"{runner.dead} during point {point.name}"
                        break
            except BaseException as exc:  # Ctrl-C, or an error: the run directory says so, the results stay
                stopped = isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError))
                writer.finish("interrupted" if stopped else "failed", str(exc) or type(exc).__name__)
                raise
            writer.finish(result.status, result.error)
            return result

    async def point(self, client: Client, runner: LoadRunner, writer: RunWriter, point: LoadPoint) -> dict | None:
        """Warm up, measure, summarize one point; None when the server was gone before measuring."""
        if not await client.healthy():
            runner.dead = "the server is not answering"
            return None
        warmup = await self.warmup(runner, point)
        if runner.dead:
            return None
        before = await self.scrape()
        records, monitor = await self.measure(runner, writer, point)
        delta = counters.difference(before, await self.scrape())
        summary = summarize_point(point, records, self.num_gpus, delta)
        summary.update(status="aborted" if runner.dead else "complete", warmup_requests=warmup[0],
                       warmup_failed=warmup[1], client_cpu=monitor.cpu, loop_lag_ms=monitor.lag_ms,
                       warnings=self.point_warnings(summary, monitor, len(records)))
        writer.point(summary)
        self.log(point_line(summary))
        return summary

    async def measure(self, runner: LoadRunner, writer: RunWriter, point: LoadPoint):
        """The measured requests, each appended to requests.jsonl as it finishes; -> (records, monitor)."""
        count = self.spec.requests_for(point)
        if count:
            self.prompts.prefetch(self.next_prompt, count)
        bar, failed = self.bar(point, count), [0]

        def on_record(rec):
            writer.record(rec.to_json())
            bar.update()
            if not rec.ok:
                failed[0] += 1
                bar.set_postfix(failed=failed[0])

        async with ClientMonitor() as monitor:
            records = await runner.run(Phase(point, count, self.spec.duration, self.next_prompt, point.name),
                                       on_record)
        bar.close()
        self.next_prompt += len(records)
        return records, monitor

    async def warmup(self, runner: LoadRunner, point: LoadPoint) -> tuple[int, int]:
        """-> (requests, failed); excluded from results."""
        n = self.spec.warmup_for(point)
        if not n:
            return 0, 0
        self.prompts.prefetch(self.next_prompt, n)
        records = await runner.run(Phase(point, n, None, self.next_prompt, "warmup"))
        self.next_prompt += n
        failed = sum(not r.ok for r in records)
        if failed:
            self.warn(f"{failed} of {n} warm-up requests of point {point.name} failed: {first_error(records)}")
        return n, failed

    def prompt_warnings(self) -> list[str]:
        spec, dataset = self.spec, self.prompts.dataset
        if not dataset or spec.duration is not None:
            return []
        needed = sum(spec.warmup_for(p) + spec.requests_for(p) for p in spec.points)
        if needed <= len(dataset):
            return []
        return [f"the dataset has {len(dataset)} prompts and the sweep sends {needed}: prompts repeat, and a "
                "server that caches prefixes will look faster than it is"]

    def point_warnings(self, summary: dict, monitor: ClientMonitor, sent: int) -> list[str]:
        warnings = []
        if summary["failed"]:
            warnings.append(f"{summary['failed']} of {summary['requests']} requests failed "
                            f"({summary['timed_out']} timed out)")
        for side in ("output", "input"):
            count = summary[f"{side[0]}sl_mismatches"]
            if count:
                warnings.append(f"{count} requests: the server's {side} token count differs from the tokenizer's "
                                "(the server's count is used)")
        if summary["tpot_undefined"]:
            warnings.append(f"{summary['tpot_undefined']} completed requests streamed their text in one chunk (or "
                            "one token): no TPOT, left out of TPOT and interactivity")
        admitted = (summary["counters"] or {}).get("requests")
        if admitted is not None and admitted > sent:
            warnings.append(f"the server admitted {admitted:g} requests during the point, this client sent {sent}: "
                            "another client shares the server, counter-based acceptance includes its traffic")
        if monitor.warning():
            warnings.append(monitor.warning())
        for message in warnings:
            self.warn(f"point {summary['point']}: {message}")
        return warnings

    async def scrape(self) -> dict[str, float] | None:
        """The dflash counters now; the first candidate URL that serves them becomes `metrics_url`."""
        tried = []
        for url in dict.fromkeys([self.metrics_url, *self.metrics_candidates] if self.metrics_url else []):
            try:
                status, body = await http_get(self.session, url)
            except ConnectionLost as exc:
                status, body = None, str(exc)
            found = counters.snapshot(counters.parse_prometheus(body)) if status == 200 else None
            if found is not None:
                self.metrics_url, self.metrics_candidates = url, [url]
                self.drafter_method = counters.drafter_method(body) or self.drafter_method
                return found
            tried.append(f"{url} (HTTP {status})")
        if tried and not self.warned_counters:
            self.warned_counters = True
            self.warn(f"no dflash counters at {' or '.join(tried)}: acceptance from counters is n/a "
                      "(--metrics-url sets where they are)")
        return None

    async def server_info(self, client: Client) -> dict[str, Any]:
        try:
            return await client.server_info()
        except Exception as exc:  # informative only
            return {"error": str(exc)}

    def bar(self, point: LoadPoint, count: int | None):
        from tqdm import tqdm

        return tqdm(total=count, desc=f"point {point.name}", unit="req", file=sys.stderr, dynamic_ncols=True,
                    disable=None if self.progress else True, leave=True)

    def manifest(self, server: dict[str, Any], client: Client) -> dict[str, Any]:
        settings = self.spec.to_dict()
        return {
            "label": self.spec.run_label, "command": self.command, "settings": settings,
            "settings_sha256": hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest(),
            "points": [p.name for p in self.spec.points], "num_gpus": self.num_gpus, "num_gpus_from": self.gpus_from,
            "metrics_url": self.metrics_url, "tokenizer": self.source.origin, "engine": self.source.engine,
            "server": server, "drafter_method": self.drafter_method, "client_warnings": client.warnings, "versions": library_versions(),
            "definitions": "shared/reference/benchmarking.md: TPOT = (E2E - TTFT) / (OSL - 1); interactivity = "
                           "1000 / TPOT(ms); percentiles linear; throughput per GPU = tokens/s / num_gpus",
        }


def first_error(records) -> str:
    return next((r.error for r in records if r.error), "")


def point_line(s: dict[str, Any]) -> str:
    def fmt(value, spec=".1f"):
        return "n/a" if value is None else format(value, spec)

    return (f"point {s['point']}: {s['completed']}/{s['requests']} ok, TTFT p50 {fmt(s['ttft_ms_median'])} ms, "
            f"TPOT (ITL) p50 {fmt(s['tpot_ms_median'], '.2f')} ms ({fmt(s['interactivity_median'])} tok/s/user), "
            f"inter-chunk p50 {fmt(s['inter_chunk_latency_ms_median'], '.2f')} ms, "
            f"total (input+output) {fmt(s['total_throughput_per_gpu'])} tok/s/GPU [headline], "
            f"output {fmt(s['output_throughput_per_gpu'])} tok/s/GPU, AL {fmt(s['acceptance_length'], '.2f')}")
