"""Served output tokens/s, DFlash / plain decoding, with the real tritonserver, on the built-in pair.

    python benchmarks/serve_dflash_vs_plain.py [--repeats 3] [--threads 2] [--draft-len auto[,15]] [--requests-per-slot 6]
                                               [--warmup 0] [--contexts short,1024] [--quick] [--output FILE]

A float32 torch engine of the built-in pair (trtllm_dflash/pairs/stdlib: 6-layer target, 2-layer
drafter, block 16) served twice by the real tritonserver on loopback: `--decoding plain` and DFlash with
`--draft-len` (default auto: chosen every step from the step times and acceptance the server measures). Both
servers run at once, started fresh for every repeat; each point runs on one and then on the other (the
idle one waits), the order alternating from point to point and between repeats, so the two measurements
of a point lie seconds apart (points run minutes apart carry the shared machine's drift into the ratio). Each server runs every point: prompts of two
context lengths (held-out stdlib code: short snippets of about 60-200 tokens, and 1024-token windows of
held-out files) x concurrency 1, 4, 16 (closed loop, N requests in flight, HTTP /generate, 128 new tokens,
EOS ignored; 6 requests per client by default), snippets first. Output tokens/s = tokens / wall time of the
point. Why 6: with equal output lengths, plain decoding admits and finishes each client's requests in
lockstep waves, while DFlash's requests finish apart (acceptance differs), so a point's last wave ends in
a tail where few requests run. The shorter the point, the more that tail weighs: a property of the finite
point, not of serving. The ratio DFlash / plain is taken per repeat and reported as median, min and max
over repeats. Nothing is calibrated: both servers start as a fresh install's do. Mean draft length and the share of plain
steps come from the server's counters. --warmup N: before any timed point, each server serves N untimed
requests of each context, one at a time (the last N prompts of each set, 128 new tokens), as load generators'
warm-up requests do: the timed points then measure a server that has met both prompt lengths (the DFlash
server's pooled acceptance and step times have data), not its first requests. 0 (the default) times a fresh server's first ones.
--contexts: which prompt sets run (default both; `--contexts 1024` runs only the 1024-token points, and warms
up on them only).
--draft-len auto,15: one DFlash server per value, every point on each, and each server's ratio over the best of
the others too ("over_best": auto against the better of plain and a fixed draft length, per repeat).
--control: the "dflash" server serves plain decoding too, so the ratio compares two equal servers: what this
machine's spread makes of parity. --control-pair: a second plain server ("plain-2") beside the others in the same
run, every point on it too: its ratio to "plain" is the parity spread of these very repeats (it is never the "best"
a DFlash server is compared with).
--load: a dedicated busy second process (one spinning Python thread) for the whole run.
Writes benchmarks/results/serve_dflash_vs_plain.json (or --output) and prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

OUT = Path(__file__).parent / "results" / "serve_dflash_vs_plain.json"
CONTROL = "plain-2"  # --control-pair's second plain server
NEW_TOKENS = 128
CONTEXTS = {"short": None, "1024": 1024}  # None: held-out snippets as they are


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.loads(r.read())


def scrape(metrics_url: str) -> dict:
    from trtllm_dflash.bench import counters

    with urllib.request.urlopen(metrics_url, timeout=30) as r:
        return counters.snapshot(counters.parse_prometheus(r.read().decode())) or {}


def run_point(url: str, metrics_url: str, prompts: list[str], concurrency: int, requests: int) -> dict:
    """Closed loop: `concurrency` clients, `requests` in all; -> output tok/s and the server's step counters."""
    from trtllm_dflash.bench import counters

    todo, lock, replies = list(range(requests)), threading.Lock(), []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            reply = post(url, {"text_input": prompts[i % len(prompts)], "sampling_param_max_tokens": NEW_TOKENS,
                               "sampling_param_ignore_eos": True, "sampling_param_exclude_input_from_output": True})
            with lock:
                replies.append(reply)

    before = scrape(metrics_url)
    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    delta = counters.difference(before, scrape(metrics_url)) or {}
    draft_len, plain_share = counters.draft_lengths(delta)
    accept_len, _ = counters.acceptance(delta)
    tokens = sum(r["num_output_tokens"] for r in replies)
    return {"concurrency": concurrency, "requests": len(replies), "seconds": wall, "output_tokens": tokens,
            "output_tokens_per_s": tokens / wall, "draft_len_mean": draft_len, "plain_step_share": plain_share,
            "acceptance_length": accept_len}


def prompt_sets(tokenizer, quick: bool) -> dict[str, list[str]]:
    """Held-out stdlib code (no stage of training saw these files)."""
    from trtllm_dflash.pairs import held_out_texts
    from trtllm_dflash.train.corpus import split, stdlib_sources

    short = held_out_texts(64)
    windows, files = [], [f.text for f in split(stdlib_sources())[1] if len(f.text) > 8000]
    for text in files:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= 1100:
            windows.append(tokenizer.decode(ids[50:50 + CONTEXTS["1024"]]))
        if len(windows) == 64:
            break
    sets = {"short": short[:16] if quick else short, "1024": windows[:16] if quick else windows}
    empty = [name for name, texts in sets.items() if not texts]
    if empty:
        raise SystemExit(f"no held-out prompts for context {empty[0]}")
    return sets


def served_engine(root: Path, max_batch: int, made_by: str):
    """The benchmark's engine (built-in pair, float32, max_seq_len 1280) under root/engine, nothing calibrated:
    `--draft-len auto` starts as a fresh install's does."""
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.pairs import stdlib_pair

    target, drafter = stdlib_pair()
    engine = build_engine(BuildSpec(str(target), str(drafter), str(root / "engine"), dtype="float32",
                                    max_batch_size=max_batch, max_seq_len=1280), made_by)
    return engine


def serve(engine: Path, root: Path, decoding: str, draft_len: str, threads: int, name: str | None = None,
          package: Path | None = None, **settings):
    """A tritonserver serving `engine` as model "m", ready; -> (process, endpoints). name: its repository and log
    under root (default: decoding); package: a directory put first on the model file's sys.path, to serve that
    copy of trtllm_dflash (the Python backend stub's interpreter ignores PYTHONPATH); settings: further
    `ServeSettings` fields (prefix_caching, max_num_tokens, ...)."""
    from trtllm_dflash.engine.loader import free_port

    from trtllm_dflash.serve.locate import find_tritonserver
    from trtllm_dflash.serve.repository import ServeSettings, write_repository
    from trtllm_dflash.serve.server import Endpoints, start_server, stop_server, wait_ready

    name = name or decoding
    repo = root / f"repo-{name}"
    write_repository(engine, repo, ServeSettings("m", decoding=decoding, draft_len=draft_len if decoding == "dflash"
                                                 else "auto", threads=threads, **settings))
    if package is not None:
        model_py = repo / "m" / "1" / "model.py"
        model_py.write_text(f"import sys\nsys.path.insert(0, {str(package)!r})\n" + model_py.read_text())
    ends = Endpoints("127.0.0.1", free_port(), free_port(), free_port())
    proc = start_server(find_tritonserver(root / "triton"), repo, ends, open(root / f"server-{name}.log", "a"))
    try:
        wait_ready(proc, timeout=900)
    except BaseException:  # not yet in the caller's list of servers to stop
        stop_server(proc)
        raise
    return proc, ends


def warm_up(url: str, prompts: dict, per_context: int) -> None:
    """One 8-token request, then --warmup's `per_context` requests of each context (its last prompts, 128 new
    tokens), untimed and one at a time."""
    post(url, {"text_input": next(iter(prompts.values()))[0], "sampling_param_max_tokens": 8})
    for context in prompts:
        for text in prompts[context][len(prompts[context]) - per_context:] if per_context else []:
            post(url, {"text_input": text, "sampling_param_max_tokens": NEW_TOKENS, "sampling_param_ignore_eos": True})


def server_names(draft_lens: list[str], control_pair: bool = False) -> list[str]:
    """"plain" (and CONTROL), then one DFlash server per --draft-len value ("dflash" alone when there is one)."""
    return ["plain"] + [CONTROL] * control_pair + (["dflash"] if len(draft_lens) == 1 else
                                                   [f"dflash-{k}" for k in draft_lens])


class BusyProcess:
    """A dedicated second process spinning one Python thread while the `with` block runs: one core of load
    (pinned to `core` when given, Linux)."""

    def __init__(self, core: int | None = None):
        self.core = core

    def __enter__(self):
        spin = [sys.executable, "-c", "while True: pass"]
        self.proc = subprocess.Popen(spin if self.core is None else ["taskset", "-c", str(self.core), *spin])
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def run_repeat(engine, root, args, prompts, rep: int) -> list[dict]:
    """Every server up (fresh), every point on each of them back to back, the order rotating from point to point
    and between repeats."""
    from trtllm_dflash.serve.server import stop_server

    names = server_names(args.draft_len, args.control_pair)
    lens = dict(zip([n for n in names if not n.startswith("plain")], args.draft_len))
    servers = {}
    try:
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            served = "plain" if args.control or name in ("plain", CONTROL) else "dflash"  # --control: all plain
            servers[name] = serve(engine, root, served, lens.get(name, "auto"), args.threads, name=name)
        for _, ends in servers.values():
            warm_up(f"{ends.http_url}/v2/models/m/generate", prompts, args.warmup)
        rows, points = [], [(context, c) for context in prompts for c in args.concurrency]
        for i, (context, c) in enumerate(points):
            shift = (i + rep) % len(names)
            order = names[shift:] + names[:shift]
            for name in order:
                ends = servers[name][1]
                row = run_point(f"{ends.http_url}/v2/models/m/generate", ends.metrics_url, prompts[context], c,
                                max(4, args.requests_per_slot * c))
                rows.append({"decoding": name, "context": context, **row, "repeat": rep,
                             "ran_first": name == order[0]})
                print(f"  {name:9} context {context:>5} c={c:<3} {row['output_tokens_per_s']:8.1f} tok/s "
                      f"draft len {row['draft_len_mean']}", file=sys.stderr, flush=True)
        return rows
    finally:
        for proc, _ in servers.values():
            stop_server(proc)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "each": values}


def summarize(rows: list[dict], repeats: int, names: list[str]) -> list[dict]:
    """Per point: each server's tokens/s over plain's per repeat (CONTROL's: the parity spread), and (several
    DFlash servers) over the best of the other servers but CONTROL in the same repeat ("over_best": never slower
    than plain nor than a fixed length)."""
    table = []
    keys = sorted({(r["context"], r["concurrency"]) for r in rows}, key=lambda k: (k[0] != "short", k[1]))
    for context, c in keys:
        def tps(name, rep):
            return next(r for r in rows if (r["decoding"], r["context"], r["concurrency"], r["repeat"]) ==
                        (name, context, c, rep))["output_tokens_per_s"]
        entry = {"context": context, "concurrency": c,
                 "tok_s_median": {n: statistics.median(tps(n, i) for i in range(repeats)) for n in names}}
        for name in names[1:]:
            mine = [r for r in rows if (r["decoding"], r["context"], r["concurrency"]) == (name, context, c)]
            entry[name] = {"over_plain": spread([tps(name, i) / tps("plain", i) for i in range(repeats)]),
                           "draft_len_mean": [r["draft_len_mean"] for r in mine],
                           "plain_step_share": [r["plain_step_share"] for r in mine]}
            rivals = [n for n in names if n not in (name, CONTROL)]
            if len(rivals) > 1 and name != CONTROL:
                entry[name]["over_best"] = spread([tps(name, i) / max(tps(n, i) for n in rivals)
                                                   for i in range(repeats)])
        table.append(entry)
    return table


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch threads of the servers (dflash-serve --threads)")
    p.add_argument("--draft-len", default="auto",
                   help="the DFlash server's --draft-len; several, comma-separated (auto,15): one DFlash server each")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--requests-per-slot", type=int, default=6, help="requests per point = this x concurrency (>= 4)")
    p.add_argument("--warmup", type=int, default=0, help="untimed requests of each context per server before timing")
    p.add_argument("--contexts", default=",".join(CONTEXTS), help="prompt sets to run, of " + ",".join(CONTEXTS))
    p.add_argument("--quick", action="store_true", help="16 prompts per context (a smoke run)")
    p.add_argument("--control", action="store_true",
                   help="serve plain decoding in the 'dflash' server too: what the ratio reads between equal servers")
    p.add_argument("--control-pair", action="store_true", help=f"a second plain server ({CONTROL!r}) beside the others")
    p.add_argument("--load", action="store_true", help="a dedicated busy second process for the whole run")
    p.add_argument("--output", default=str(OUT))
    args = p.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.contexts = args.contexts.split(",")
    args.draft_len = args.draft_len.split(",")
    unknown = [c for c in args.contexts if c not in CONTEXTS]
    if unknown:
        raise SystemExit(f"--contexts: unknown context {unknown[0]!r} (known: {', '.join(CONTEXTS)})")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from trtllm_dflash.pairs import stdlib_pair

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        engine = served_engine(root, max(args.concurrency), "benchmarks/serve_dflash_vs_plain.py")
        prompts = prompt_sets(AutoTokenizer.from_pretrained(stdlib_pair()[0]), args.quick)
        prompts = {context: prompts[context] for context in args.contexts}
        rows, load_start = [], os.getloadavg()
        with BusyProcess() if args.load else contextlib.nullcontext():
            for rep in range(args.repeats):
                print(f"repeat {rep + 1}/{args.repeats}, load average {os.getloadavg()[0]:.1f}", file=sys.stderr,
                      flush=True)
                rows += run_repeat(engine, root, args, prompts, rep)
        names = server_names(args.draft_len, args.control_pair)
        logs = {d: (root / f"server-{d}.log").read_text()[-4000:] for d in names}
    table = summarize(rows, args.repeats, names)
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads,
                          "python": platform.python_version(), "torch": torch.__version__,
                          "load_average_at_start": load_start,
                          "load_average_at_end": os.getloadavg()},
              "background_load": "a dedicated busy python process for the whole run" if args.load else None,
              "engine": "built-in stdlib pair, torch backend, float32, TP 1, block 16, max_batch_size "
                        f"{max(args.concurrency)}", "new_tokens": NEW_TOKENS, "draft_len": args.draft_len,
              "control": args.control,
              "table": table, "rows": rows, "server_log_tails": logs}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    for t in table:
        cells = [f"{n} {t['tok_s_median'][n]:.1f} tok/s" for n in names]
        for n in names[1:]:
            for what in ("over_plain", "over_best"):
                if what in t[n]:
                    r = t[n][what]
                    cells.append(f"{n} {what} {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
        print(f"{t['context']:>5} c={t['concurrency']:<3} " + "; ".join(cells))
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
