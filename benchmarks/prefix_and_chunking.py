"""The paged KV cache's serving claims (docs/paged-kv.md).

memory: the pool's own accounting at Qwen3-8B shapes with a 5-layer DFlash drafter (bf16) on an 80 GB GPU, on
the meta device (no memory is touched): the generator sizes its pool from the memory left after both models'
weights, and requests of 2,048 positions are admitted by `Generator.admissible` and grown to their full length by
the pool, one after another, until it is full. Compared with today's slot layout, which held max_seq_len positions per slot.

    python benchmarks/prefix_and_chunking.py memory --out benchmarks/results/prefix_and_chunking/memory.json

prefix and chunking: served by the real tritonserver (CPU here), the built-in pair in float32 (max_seq_len 2048),
two servers started side by side from one engine, every repeat running on one
server and then the other (the order alternating), streaming over HTTP generate_stream.

prefix: `--requests` requests (default 32) share a system prompt of `--system-tokens` held-out tokens (a new one
each repeat, so no repeat hits what an earlier one cached) followed by a distinct held-out snippet, 32 new tokens,
`--concurrency` in flight. Servers: prefix caching on and off (`--no-prefix-caching`). Reported per server: time to
first token (client side, request sent to first streamed chunk), median and p90 over the repeat's requests, output
tokens/s over the repeat, and whether every output equals the other server's.

    python benchmarks/prefix_and_chunking.py prefix --out benchmarks/results/prefix_and_chunking/prefix.json

chunking: `--streams` requests (short snippets, 160 new tokens) stream while, once each has its first token, a
prompt of `--long-tokens` held-out tokens arrives. Servers: whole-prompt prefill and `--max-num-tokens
--chunk`. Reported per server: the running streams' gaps between streamed chunks (one chunk per step) from the
long prompt's arrival until they end, median / p99 / max, and the long prompt's time to first token. Prefix
caching is off on both (each repeat's long prompt is new anyway).

    python benchmarks/prefix_and_chunking.py chunking --out benchmarks/results/prefix_and_chunking/chunking.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from serve_dflash_vs_plain import serve  # noqa: E402  (a sibling script, not a package)

from trtllm_dflash.bench.metrics import percentile  # noqa: E402

QWEN3_8B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "tie_word_embeddings": False}
DRAFTER_5 = {**QWEN3_8B, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5,
             "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33], "block_size": 16}}


def meta_generator():
    from trtllm_dflash.models.registry import parse_drafter_config, parse_target_config
    from trtllm_dflash.engine.generator import Generator

    from trtllm_dflash.models.drafter import DFlashDrafter
    from trtllm_dflash.models.target import TargetModel
    from trtllm_dflash.speculative.dflash import DFlashProposer

    with torch.device("meta"):
        target = TargetModel(parse_target_config(QWEN3_8B, "qwen3-8b")).to(torch.bfloat16)
        drafter = DFlashDrafter(parse_drafter_config(DRAFTER_5, "dflash-5")).to(torch.bfloat16)
    weights = sum(p.numel() * p.element_size() for m in (target, drafter) for p in m.parameters())
    return Generator(target, DFlashProposer(drafter, target, context_kv="unfused")), weights


def memory(gpu_bytes: float, tokens: int, max_seq_len: int, rows: int) -> dict:
    from trtllm_dflash.engine.request import Request

    from trtllm_dflash.cache.kv_cache import blocks_for

    gen, weights = meta_generator()
    gen.kv_cache_bytes = int(gpu_bytes - weights)
    gen.allocate(rows, max_seq_len, 16)
    request = Request(tuple(range(tokens // 2)), tokens // 2, ignore_eos=True)  # prompt + output = tokens
    admitted = 0  # requests admitted one by one, each then grown to its full length: concurrent at full length
    while admitted < rows and gen.admissible([request]):
        gen.pool.admit(admitted, list(request.prompt_ids), gen.first_positions(len(request.prompt_ids)))
        if not gen.pool.grow(admitted, tokens + gen.block + 1):
            gen.pool.release(admitted)
            break
        admitted += 1
    slot_bytes = gen.bytes_per_block * max_seq_len / 16
    return {"gpu_bytes": gpu_bytes, "weights_bytes": weights, "kv_bytes_per_token": gen.bytes_per_block / 16,
            "pool_blocks": gen.pool.num_blocks, "pool_tokens": gen.pool.num_blocks * 16,
            "request_positions": tokens + gen.block + 1, "blocks_per_request": blocks_for(tokens + gen.block + 1),
            "concurrent_requests_at_full_length": admitted,
            "slot_layout_requests": {str(n): int((gpu_bytes - weights) // (gen.bytes_per_block * n / 16))
                                     for n in (max_seq_len, 8192)}, "slot_bytes_at_max_seq_len": slot_bytes}


# -- served: the real tritonserver on the built-in pair
MAX_SEQ_LEN = 2048


def stream(ends, text: str, max_tokens: int) -> dict:
    """One streaming request -> its send time, each chunk's arrival time (perf_counter s) and the whole text."""
    body = json.dumps({"text_input": text, "streaming": True, "sampling_param_max_tokens": max_tokens,
                       "sampling_param_ignore_eos": True, "sampling_param_exclude_input_from_output": True})
    conn = http.client.HTTPConnection(ends.host, ends.http_port, timeout=1800)
    sent = time.perf_counter()
    conn.request("POST", "/v2/models/m/generate_stream", body, {"Content-Type": "application/json"})
    response, chunks, parts = conn.getresponse(), [], []
    for line in response:
        if line.startswith(b"data:"):
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(f"server error: {event['error']}")
            chunks.append(time.perf_counter())
            parts.append(event.get("text_output") or "")
    conn.close()
    return {"sent": sent, "chunks": chunks, "text": "".join(parts)}


def engine_and_texts(root: Path, count: int, tokens: int):
    """The float32 built-in engine and `count` held-out windows of `tokens`."""
    from transformers import AutoTokenizer

    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.train.corpus import split, stdlib_sources

    target, drafter = stdlib_pair()
    engine = build_engine(BuildSpec(str(target), str(drafter), str(root / "engine"), dtype="float32",
                                    max_batch_size=16, max_seq_len=MAX_SEQ_LEN), "benchmarks/prefix_and_chunking.py")
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    windows = []
    for f in split(stdlib_sources())[1]:
        ids = tokenizer(f.text, add_special_tokens=False)["input_ids"]
        if len(ids) >= tokens + 50:
            windows.append(tokenizer.decode(ids[50:50 + tokens]))
        if len(windows) == count:
            return engine, windows
    raise SystemExit(f"only {len(windows)} held-out files hold {tokens} tokens")


def start(engine: Path, root: Path, name: str, threads: int, **settings):
    """A DFlash server (`--draft-len auto`) with these `ServeSettings`, ready and past its first request."""
    proc, ends = serve(engine, root, "dflash", "auto", threads, name=name, **settings)
    stream(ends, "def main():", 4)  # first request: loads nothing later
    return proc, ends


def closed_loop(ends, texts: list[str], concurrency: int, max_tokens: int) -> list[dict]:
    todo, lock, replies = list(range(len(texts))), threading.Lock(), {}

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            reply = stream(ends, texts[i], max_tokens)
            with lock:
                replies[i] = reply

    workers = [threading.Thread(target=worker) for _ in range(concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return [replies[i] for i in range(len(texts))]


def prefix_repeat(ends, system: str, questions: list[str], concurrency: int) -> dict:
    start = time.perf_counter()
    replies = closed_loop(ends, [system + q for q in questions], concurrency, 32)
    wall = time.perf_counter() - start
    ttft = [r["chunks"][0] - r["sent"] for r in replies]
    return {"ttft_ms_median": 1e3 * statistics.median(ttft), "ttft_ms_p90": 1e3 * percentile(ttft, 90),
            "ttft_ms_first": 1e3 * ttft[0], "seconds": wall, "texts": [r["text"] for r in replies]}


def chunking_repeat(ends, shorts: list[str], long_text: str) -> dict:
    """The streams start; once each has streamed a chunk the long prompt is sent; -> the streams' chunk gaps after
    it arrived and its time to first token."""
    results, threads, long_reply = [None] * len(shorts), [], {}

    def run(i):
        results[i] = stream(ends, shorts[i], 160)

    for i in range(len(shorts)):
        threads.append(threading.Thread(target=run, args=(i,)))
        threads[-1].start()
    time.sleep(0.5)  # all admitted and decoding (checked below from their chunk times)
    arrival = time.perf_counter()
    long_reply.update(stream(ends, long_text, 8))
    for t in threads:
        t.join()
    gaps = [b - a for r in results for a, b in zip(r["chunks"], r["chunks"][1:]) if b > arrival]
    return {"streams_started_before_long_prompt": sum(r["chunks"][0] < arrival for r in results),
            "gap_ms_median": 1e3 * statistics.median(gaps), "gap_ms_p99": 1e3 * percentile(gaps, 99),
            "gap_ms_max": 1e3 * max(gaps), "long_prompt_ttft_ms": 1e3 * (long_reply["chunks"][0] - long_reply["sent"])}


def served(args) -> dict:
    from trtllm_dflash.pairs import held_out_texts
    from trtllm_dflash.serve.server import stop_server

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    root = Path(tempfile.mkdtemp(prefix="prefix-and-chunking-"))
    long_tokens = args.system_tokens if args.mode == "prefix" else args.long_tokens
    engine, windows = engine_and_texts(root, args.repeats, long_tokens)
    snippets = held_out_texts(64)
    configs = ({"cached": {"prefix_caching": True}, "uncached": {"prefix_caching": False}} if args.mode == "prefix"
               else {"whole": {"prefix_caching": False}, "chunked": {"prefix_caching": False,
                                                                     "max_num_tokens": args.chunk}})
    servers = {}
    try:
        for name, settings in configs.items():
            servers[name] = start(engine, root, name, args.threads, **settings)
        rows = []
        for rep in range(args.repeats):
            order = list(configs) if rep % 2 == 0 else list(reversed(configs))
            row = {"repeat": rep, "order": order}
            for name in order:
                ends = servers[name][1]
                if args.mode == "prefix":
                    questions = snippets[:args.requests]
                    row[name] = prefix_repeat(ends, windows[rep], questions, args.concurrency)
                else:
                    row[name] = chunking_repeat(ends, snippets[:args.streams], windows[rep])
            rows.append(row)
            print(json.dumps({k: ({m: v for m, v in r.items() if m != "texts"} if isinstance(r, dict) else r)
                              for k, r in row.items()}), flush=True)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    return summarize_served(args.mode, rows)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize_served(mode: str, rows: list[dict]) -> dict:
    if mode == "prefix":
        for row in rows:
            row["outputs_identical"] = row["cached"].pop("texts") == row["uncached"].pop("texts")
        return {"repeats": rows, "outputs_identical_every_repeat": all(r["outputs_identical"] for r in rows),
                "ttft_median_uncached_over_cached": spread([r["uncached"]["ttft_ms_median"] / r["cached"]["ttft_ms_median"]
                                                            for r in rows]),
                "throughput_cached_over_uncached": spread([r["uncached"]["seconds"] / r["cached"]["seconds"]
                                                           for r in rows])}
    return {"repeats": rows,
            **{f"{name}_gap_p99_over_median": spread([r[name]["gap_ms_p99"] / r[name]["gap_ms_median"] for r in rows])
               for name in ("whole", "chunked")},
            **{f"{name}_gap_max_ms": spread([r[name]["gap_ms_max"] for r in rows]) for name in ("whole", "chunked")}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["memory", "prefix", "chunking"])
    p.add_argument("--out", type=Path)
    p.add_argument("--gpu-gb", type=float, default=80.0)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--max-seq-len", type=int, default=40960)
    p.add_argument("--rows", type=int, default=256, help="max_batch_size (rows bound the step, not memory)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per server (two servers run at once)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=1536)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--long-tokens", type=int, default=1800)
    p.add_argument("--chunk", type=int, default=128, help="--max-num-tokens of the chunked server")
    args = p.parse_args(argv)
    result = {"command": " ".join(["python", *sys.argv]), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "load_average_before": list(os.getloadavg())}
    if args.mode == "memory":
        result.update({"device": f"meta (accounting only), {platform.machine()}",
                       "memory": memory(args.gpu_gb * 1e9, args.tokens, args.max_seq_len, args.rows)})
    else:
        result.update({"device": f"cpu: {platform.processor() or platform.machine()}, {args.threads} thread(s) per server",
                       args.mode: served(args), "load_average_after": list(os.getloadavg())})
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
