"""Soak: `dflash-serve` of the built-in engine under minutes of mixed, partly hostile traffic.

    python benchmarks/soak.py [--minutes 15] [--clients 4] [--threads 1] [--output FILE]

One `dflash-serve` (the built-in pair, float32 torch engine, max batch 4, queue limit 4, prompts chunked at
128 tokens, prefix caching on, `--draft-len auto`, Triton HTTP and the OpenAI API with an API key) serves
`--clients` client threads for `--minutes`: greedy requests over Triton `generate` and `generate_stream` and
OpenAI `/v1/completions` (whole and streamed), of held-out snippets, of prompts sharing a 300-token prefix and of
600-token prompts (prefilled in chunks); streams the client drops after 2 chunks (cancellations); one thread of
bad requests (malformed JSON to both APIs, max_tokens over the engine's length, a wrong API key); and a burst of
12 requests at once every 20 s, over the queue limit. Every greedy output is compared with the reference: the
same prompts decoded once, before the server starts, in this process by the runtime's plain greedy decoding (the
target alone; a DFlash greedy output equals it token for token). Every few seconds the server processes'
resident memory (dflash-serve and its descendants: tritonserver, the Python backend stub, the OpenAI frontend,
from /proc) and the KV pool gauges of the metrics endpoint are sampled.

Goals (exit 1 when one fails, after writing the record): no wrong output; no errors but the intended ones (the
bad requests' refusals, the dropped streams, `overloaded` refusals over the queue limit, which must occur);
resident memory of the last minute within 2 % of the first minute's (windows of a third of the run when it is
shorter than 3 minutes); the pool idle (no running or queued request, no block held) once traffic stops; p99
latency of the last 5 minutes (last third for runs under 15 minutes) at most twice the first's; a clean stop.
Writes benchmarks/results/soak.json (or --output) and prints the goals last.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import closing
from pathlib import Path

OUT = Path(__file__).parent / "results" / "soak.json"
NEW_TOKENS = 32  # greedy requests, EOS ignored: exactly this many tokens
DROPPED_TOKENS = 400  # a dropped stream's request: far more than it reads before the client goes away
MAX_BATCH, MAX_QUEUE, CHUNK, MAX_SEQ_LEN = 4, 4, 128, 1024
PREFIX_TOKENS, LONG_TOKENS = 300, 600
BURST, BURST_EVERY_S, SAMPLE_EVERY_S = 12, 20.0, 3.0
API_KEY = "soak-key"
RSS_GROWTH_LIMIT, P99_RATIO_LIMIT = 0.02, 2.0
GREEDY = ("triton", "triton_stream", "openai", "openai_stream")
ROLES = {b"trtllm_dflash.cli.serve": "dflash-serve", b"trtllm_dflash.serve.openai": "openai-frontend"}  # python -m
BAD = {"bad_json_triton": (400, 500), "bad_json_openai": (400,), "over_max_tokens": (400,), "wrong_key": (401,)}


# --- prompts and the reference ------------------------------------------------------------------------------------

def soak_prompts(tokenizer) -> list[str]:
    """8 held-out snippets, 4 of them again after one shared 300-token prefix, 4 held-out 600-token windows."""
    from trtllm_dflash.pairs import held_out_texts
    from trtllm_dflash.train.corpus import split, stdlib_sources

    snippets = held_out_texts(8)
    files = [f.text for f in split(stdlib_sources())[1] if len(f.text) > 8000]
    windows = []
    for text in files:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= LONG_TOKENS + 100:
            windows.append(tokenizer.decode(ids[50:50 + LONG_TOKENS]))
        if len(windows) == 5:
            break
    if len(windows) < 5:
        raise SystemExit(f"only {len(windows)} held-out files of over {LONG_TOKENS + 100} tokens (5 needed)")
    prefix = tokenizer.decode(tokenizer(windows[4], add_special_tokens=False)["input_ids"][:PREFIX_TOKENS])
    return snippets + [prefix + s for s in snippets[:4]] + windows[:4]


def reference_texts(prompts: list[str]) -> list[str]:
    """Each prompt's greedy continuation by plain decoding (the target alone), one at a time, as the server
    tokenizes and detokenizes it (trtllm_dflash/serve/triton_model.py, serve/loop.py)."""
    from transformers import AutoTokenizer

    from trtllm_dflash.draft_length.interface import FixedDraftLen
    from trtllm_dflash.engine.pipeline import load_pipeline
    from trtllm_dflash.engine.request import Request
    from trtllm_dflash.pairs import stdlib_pair

    target = stdlib_pair()[0]
    tokenizer = AutoTokenizer.from_pretrained(target)
    generator = load_pipeline(target, None, step_mode="eager").generator
    generator.policy = FixedDraftLen(0)
    out = []
    for text in prompts:
        request = Request(tuple(tokenizer.encode(text, add_special_tokens=False)), NEW_TOKENS, ignore_eos=True)
        out.append(tokenizer.decode(generator.generate([request])[0].output_ids))
    return out


# --- the server -------------------------------------------------------------------------------------------------

class Server:
    """`dflash-serve` as a user runs it, in its own process with its log in a file."""

    def __init__(self, engine: Path, root: Path, threads: int):
        from trtllm_dflash.engine.loader import free_port

        self.http, self.grpc, self.metrics, self.openai = (free_port() for _ in range(4))
        self.log_path = root / "serve.log"
        command = [sys.executable, "-m", "trtllm_dflash.cli.serve", str(engine), "--model-repo", str(root / "repo"),
                   "--http-port", str(self.http), "--grpc-port", str(self.grpc), "--metrics-port",
                   str(self.metrics), "--openai-port", str(self.openai), "--max-batch-size", str(MAX_BATCH),
                   "--max-queue", str(MAX_QUEUE), "--max-num-tokens", str(CHUNK), "--threads", str(threads)]
        env = {**os.environ, "DFLASH_API_KEY": API_KEY}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 900) -> None:
        """Until Triton answers ready and the OpenAI frontend answers /health (seconds)."""
        deadline = time.monotonic() + timeout
        for url in (f"http://127.0.0.1:{self.http}/v2/health/ready", f"http://127.0.0.1:{self.openai}/health"):
            while True:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"dflash-serve not ready (exit code {self.proc.poll()}); log "
                                     f"{self.log_path}: {self.log_path.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)

    def gauges(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10) as r:
            rows = [line.split() for line in r.read().decode().splitlines() if line.startswith("dflash_")]
        return {name: float(value) for name, value in rows}

    def rss_mib(self) -> dict[str, float]:
        """Resident MiB of dflash-serve and each descendant (from /proc), by process name."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        out: dict[str, float] = {}
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            try:
                status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            name = next((role for module, role in ROLES.items() if module in command), status["Name"].strip())
            out[name] = out.get(name, 0.0) + int(status.get("VmRSS", "0 kB").split()[0]) / 1024
        return out

    def stop(self) -> int:
        """SIGTERM, as Ctrl-C or a scheduler stops it; -> its exit code (0: a clean stop)."""
        self.proc.terminate()
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


# --- one request of each kind -----------------------------------------------------------------------------------

def triton_body(prompt: str, tokens: int, stream: bool) -> bytes:
    return json.dumps({"text_input": prompt, "sampling_param_max_tokens": tokens, "sampling_param_ignore_eos": True,
                       "sampling_param_exclude_input_from_output": True, "streaming": stream}).encode()


def openai_body(prompt: str, tokens: int, stream: bool) -> bytes:
    return json.dumps({"model": "dflash", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "ignore_eos": True, "stream": stream}).encode()


def open_request(port: int, path: str, body: bytes, key: str | None = API_KEY):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    conn.request("POST", path, body, headers)
    return conn, conn.getresponse()


def events(resp):
    """The JSON payloads of a server-sent event stream, until its end ([DONE] or the connection closing)."""
    for line in resp:
        line = line.strip()
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            yield json.loads(line[5:])


def error_payload(body: bytes):
    """A refused request's body: JSON, or (Triton's generate_stream refusing before its first response) one event."""
    text = body.strip()
    if text.startswith(b"data:"):
        text = text.splitlines()[0][5:]
    try:
        return json.loads(text)
    except ValueError:
        return body[:160].decode("utf-8", "replace")


def refusal(status: int, payload) -> str:
    """The error kind of a refused request: overloaded (the queue limit) or unexpected (status: message)."""
    message = payload.get("error", payload) if isinstance(payload, dict) else payload
    message = message.get("message", message) if isinstance(message, dict) else message
    return "overloaded" if "overloaded" in str(message) else f"unexpected: {status} {str(message)[:160]}"


def greedy(server: Server, kind: str, prompt: str) -> tuple[str, str | None]:
    """-> (outcome: "text" or an error kind, the output text when it is "text")."""
    stream = kind.endswith("_stream")
    if kind.startswith("triton"):
        conn, resp = open_request(server.http, f"/v2/models/dflash/generate{'_stream' if stream else ''}",
                                  triton_body(prompt, NEW_TOKENS, stream))
    else:
        conn, resp = open_request(server.openai, "/v1/completions", openai_body(prompt, NEW_TOKENS, stream))
    with closing(conn):
        if resp.status != 200:
            return refusal(resp.status, error_payload(resp.read())), None
        payloads = list(events(resp)) if stream else [json.loads(resp.read())]
    errors = [p for p in payloads if "error" in p]
    if errors:
        return refusal(resp.status, errors[0]), None
    if kind.startswith("triton"):
        return "text", "".join(p["text_output"] for p in payloads)
    return "text", "".join(c["text"] for p in payloads for c in p.get("choices", []))


def dropped(server: Server, kind: str, prompt: str) -> str:
    """A stream the client closes after 2 chunks of a long request: "dropped", or the error that came first."""
    if kind == "drop_triton":
        conn, resp = open_request(server.http, "/v2/models/dflash/generate_stream",
                                  triton_body(prompt, DROPPED_TOKENS, True))
    else:
        conn, resp = open_request(server.openai, "/v1/completions", openai_body(prompt, DROPPED_TOKENS, True))
    with closing(conn):
        if resp.status != 200:
            return refusal(resp.status, error_payload(resp.read()))
        for payload in itertools.islice(events(resp), 2):
            if "error" in payload:
                return refusal(resp.status, payload)
    return "dropped"


def bad(server: Server, kind: str, prompt: str) -> str:
    """"refused" when the server answers a bad request with its intended status and a one-line message."""
    if kind == "bad_json_triton":
        conn, resp = open_request(server.http, "/v2/models/dflash/generate", b'{"text_input": ')
    elif kind == "bad_json_openai":
        conn, resp = open_request(server.openai, "/v1/completions", b'{"model": "dflash", "prompt": ')
    elif kind == "over_max_tokens":
        conn, resp = open_request(server.openai, "/v1/completions", openai_body(prompt, 100 * MAX_SEQ_LEN, False))
    else:
        conn, resp = open_request(server.openai, "/v1/completions", openai_body(prompt, 4, False), key="wrong")
    with closing(conn):
        body = resp.read()
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"unexpected: {resp.status} {body[:160]!r}"
    message = error.get("message", "") if isinstance(error, dict) else error
    if resp.status in BAD[kind] and message.strip() and "\n" not in message.strip():
        return "refused"
    return f"unexpected: {resp.status} {str(message)[:160]}"


# --- traffic ----------------------------------------------------------------------------------------------------

class Soak:
    """Client threads until `seconds` pass; every request's outcome and latency, and the samples."""

    def __init__(self, server: Server, prompts: list[str], reference: list[str], seconds: float, clients: int):
        self.server, self.prompts, self.reference = server, prompts, reference
        self.seconds, self.clients = seconds, clients
        self.lock, self.records, self.samples, self.wrong = threading.Lock(), [], [], []
        self.start = 0.0

    def over(self) -> bool:
        return time.monotonic() - self.start >= self.seconds

    def one(self, kind: str, index: int, source: str) -> None:
        began = time.monotonic()
        try:
            if kind in GREEDY:
                outcome, text = greedy(self.server, kind, self.prompts[index])
                if outcome == "text":
                    outcome = "exact" if text == self.reference[index] else "wrong"
                    if outcome == "wrong":
                        with self.lock:
                            self.wrong.append({"kind": kind, "prompt": index, "got": text,
                                               "expected": self.reference[index]})
            elif kind.startswith("drop_"):
                outcome = dropped(self.server, kind, self.prompts[index])
            else:
                outcome = bad(self.server, kind, self.prompts[index])
        except (OSError, http.client.HTTPException, ValueError) as exc:
            outcome = f"unexpected: {type(exc).__name__} {exc}"[:200]
        with self.lock:
            self.records.append({"t_s": began - self.start, "latency_s": time.monotonic() - began, "kind": kind,
                                 "prompt": index, "outcome": outcome, "source": source})

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        kinds = GREEDY * 4 + ("drop_triton", "drop_openai")
        while not self.over():
            self.one(rng.choice(kinds), rng.randrange(len(self.prompts)), "client")

    def hostile(self) -> None:
        for kind in itertools.cycle(BAD):
            if self.over():
                return
            self.one(kind, 0, "hostile")
            time.sleep(2.0)

    def bursts(self) -> None:
        """BURST short Triton requests at once every BURST_EVERY_S: more than the batch and the queue hold."""
        while not self.over():
            time.sleep(BURST_EVERY_S / 2)
            if self.over():
                return
            burst = [threading.Thread(target=self.one, args=("triton", i % 8, "burst")) for i in range(BURST)]
            for t in burst:
                t.start()
            for t in burst:
                t.join()
            time.sleep(BURST_EVERY_S / 2)

    def sampler(self) -> None:
        while True:
            self.sample()
            if self.over():
                return
            time.sleep(SAMPLE_EVERY_S)

    def sample(self) -> dict:
        rss, gauges = self.server.rss_mib(), self.server.gauges()
        row = {"t_s": time.monotonic() - self.start, "rss_mib": rss, "rss_total_mib": sum(rss.values()),
               "running": gauges.get("dflash_running_requests"), "queued": gauges.get("dflash_queued_requests"),
               "kv_blocks_used": gauges.get("dflash_kv_cache_blocks_used"),
               "kv_blocks": gauges.get("dflash_kv_cache_blocks"), "load_average": os.getloadavg()}
        with self.lock:
            self.samples.append(row)
        return row

    def run(self) -> None:
        self.start = time.monotonic()
        threads = [threading.Thread(target=self.client, args=(i,)) for i in range(self.clients)]
        threads += [threading.Thread(target=f) for f in (self.hostile, self.bursts, self.sampler)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def wait_idle(self, timeout: float = 60) -> dict:
        """The last sample, taken once the pool is idle or `timeout` (seconds) after traffic ended."""
        deadline = time.monotonic() + timeout
        while True:
            row = self.sample()
            if (row["running"], row["queued"], row["kv_blocks_used"]) == (0, 0, 0) or time.monotonic() > deadline:
                return row
            time.sleep(0.5)


def warm_up(server: Server, prompts: list[str]) -> None:
    """Every prompt once through Triton and the OpenAI API, untimed: the soak's first minute then meets a server
    that has allocated what serving these prompts needs."""
    for kind in ("triton", "openai_stream"):
        for prompt in prompts:
            greedy(server, kind, prompt)


# --- the record -------------------------------------------------------------------------------------------------

def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    n = len(points)
    mean_t, mean_v = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return 60 * sum((t - mean_t) * (v - mean_v) for t, v in points) / var if var else 0.0


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def summarize(soak: Soak, idle: dict, stop_code: int) -> dict:
    """The goals and the numbers behind them."""
    seconds, records, samples = soak.seconds, soak.records, soak.samples
    rss_window = 60.0 if seconds >= 180 else seconds / 3  # first / last minute (a third of a short run)
    lat_window = 300.0 if seconds >= 900 else seconds / 3  # first / last 5 minutes (a third of a short run)
    first = [s["rss_total_mib"] for s in samples if s["t_s"] <= rss_window]
    last = [s["rss_total_mib"] for s in samples if s["t_s"] >= seconds - rss_window]
    growth = statistics.mean(last) / statistics.mean(first) - 1
    exact = [r for r in records if r["outcome"] == "exact"]
    lat_first = [r["latency_s"] for r in exact if r["t_s"] <= lat_window]
    lat_last = [r["latency_s"] for r in exact if r["t_s"] >= seconds - lat_window]
    p99_first, p99_last = percentile(lat_first, 99), percentile(lat_last, 99)
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[f"{r['source']} {r['kind']}: {r['outcome']}"] = outcomes.get(f"{r['source']} {r['kind']}: "
                                                                              f"{r['outcome']}", 0) + 1
    unexpected = [r for r in records if r["outcome"].startswith("unexpected")]
    goals = {
        "no_wrong_output": {"value": len(soak.wrong), "limit": 0, "ok": not soak.wrong},
        "only_intended_errors": {"value": len(unexpected), "limit": 0, "ok": not unexpected},
        "queue_limit_reached": {"value": sum(r["outcome"] == "overloaded" for r in records), "limit": ">= 1",
                                "ok": any(r["outcome"] == "overloaded" for r in records)},
        "rss_growth": {"value": growth, "limit": RSS_GROWTH_LIMIT, "ok": growth <= RSS_GROWTH_LIMIT},
        "pool_idle_at_end": {"value": {k: idle[k] for k in ("running", "queued", "kv_blocks_used")}, "limit": 0,
                             "ok": (idle["running"], idle["queued"], idle["kv_blocks_used"]) == (0, 0, 0)},
        "p99_stable": {"value": p99_last / p99_first if p99_first and p99_last else None, "limit": P99_RATIO_LIMIT,
                       "ok": bool(p99_first and p99_last and p99_last <= P99_RATIO_LIMIT * p99_first)},
        "clean_stop": {"value": stop_code, "limit": 0, "ok": stop_code == 0},
    }
    return {
        "goals": goals,
        "requests": len(records), "exact_outputs": len(exact), "outcomes": dict(sorted(outcomes.items())),
        "unexpected": unexpected[:20], "wrong": soak.wrong[:20],
        "rss": {"window_s": rss_window, "first_window_mib": statistics.mean(first),
                "last_window_mib": statistics.mean(last), "min_mib": min(s["rss_total_mib"] for s in samples),
                "max_mib": max(s["rss_total_mib"] for s in samples), "growth": growth,
                "slope_mib_per_min": slope_per_min([(s["t_s"], s["rss_total_mib"]) for s in samples])},
        "kv_blocks_used": {"slope_per_min": slope_per_min([(s["t_s"], s["kv_blocks_used"]) for s in samples]),
                           "max": max(s["kv_blocks_used"] for s in samples), "at_end": idle["kv_blocks_used"],
                           "pool": idle["kv_blocks"]},
        "load_average_1min": {"min": min(s["load_average"][0] for s in samples),
                              "median": statistics.median(s["load_average"][0] for s in samples),
                              "max": max(s["load_average"][0] for s in samples)},
        "latency_s": {"window_s": lat_window,
                      "first": {"p50": percentile(lat_first, 50), "p99": p99_first, "n": len(lat_first)},
                      "last": {"p50": percentile(lat_last, 50), "p99": p99_last, "n": len(lat_last)}},
    }


def run(minutes: float, clients: int, threads: int, root: Path) -> dict:
    """Reference, engine, server, warm-up, soak, idle wait, stop: -> the record (without the command)."""
    from transformers import AutoTokenizer

    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.pairs import stdlib_pair

    target, drafter = stdlib_pair()
    prompts = soak_prompts(AutoTokenizer.from_pretrained(target))
    reference = reference_texts(prompts)
    engine = build_engine(BuildSpec(str(target), str(drafter), str(root / "engine"), dtype="float32",
                                    max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ_LEN), "benchmarks/soak.py")
    server = Server(engine, root, threads)
    try:
        server.wait_ready()
        warm_up(server, prompts)
        soak = Soak(server, prompts, reference, 60 * minutes, clients)
        load_before = os.getloadavg()
        soak.run()
        idle = soak.wait_idle()
    finally:
        stop_code = server.stop()
    record = summarize(soak, idle, stop_code)
    return {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": threads,
                        "python": platform.python_version(), "load_average_before": load_before,
                        "load_average_after": os.getloadavg()},
            "server": {"engine": "built-in stdlib pair, torch backend, float32, TP 1", "max_batch_size": MAX_BATCH,
                       "max_queue": MAX_QUEUE, "max_num_tokens": CHUNK, "max_seq_len": MAX_SEQ_LEN,
                       "draft_len": "auto", "prefix_caching": True},
            "traffic": {"minutes": minutes, "clients": clients, "new_tokens": NEW_TOKENS, "prompts": len(prompts),
                        "burst": BURST, "burst_every_s": BURST_EVERY_S},
            **record, "samples": soak.samples, "server_log_tail": server.log_path.read_text()[-3000:]}


def failed_goals(record: dict) -> list[str]:
    return [f"{name}: {goal['value']} (limit {goal['limit']})" for name, goal in record["goals"].items()
            if not goal["ok"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Soak dflash-serve of the built-in engine under mixed traffic.")
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--clients", type=int, default=4, help="client threads of greedy and dropped requests")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the reference and dflash-serve --threads)")
    p.add_argument("--output", default=str(OUT))
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.clients < 1 or args.threads < 1:
        p.error(f"--minutes must be > 0, --clients and --threads >= 1 (got {args.minutes}, {args.clients}, "
                f"{args.threads})")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        command = ["python", "benchmarks/soak.py", *(argv if argv is not None else sys.argv[1:])]
        record = {"command": " ".join(command),
                  **run(args.minutes, args.clients, args.threads, Path(tmp))}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    for name, goal in record["goals"].items():
        print(f"{'ok  ' if goal['ok'] else 'FAIL'} {name}: {goal['value']} (limit {goal['limit']})")
    print(f"written: {args.output}")
    return 1 if failed_goals(record) else 0


if __name__ == "__main__":
    sys.exit(main())
