"""The real tritonserver (nvidia-pytriton's build) on loopback, serving a tiny torch engine."""

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.triton import grpc_stream, metrics, post, post_all, serving, stream, text_prompt

pytest.importorskip("tritonclient")
pytestmark = pytest.mark.serve  # the real tritonserver

MAX_NEW = 24


@pytest.fixture(scope="module")
def server(triton_server):
    return triton_server


def body(prompt: str, **extra) -> dict:
    return {"text_input": prompt, "sampling_param_max_tokens": MAX_NEW, "sampling_param_ignore_eos": True, **extra}


def test_generate_equals_dflash_generate(server):
    prompt = text_prompt(0)
    out = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", "--engine", str(server["engine"]),
                          "--prompt", prompt, "--max-new-tokens", str(MAX_NEW), "--ignore-eos", "--json"],
                         capture_output=True, text=True, check=True)
    expected = json.loads(out.stdout)
    reply = post(server, "generate", body(prompt))
    assert reply["text_output"] == prompt + expected["text"]  # the prompt is included by default
    assert reply["num_output_tokens"] == MAX_NEW and reply["finish_reason"] == "length"
    assert reply["num_input_tokens"] == len(prompt.encode())  # the byte tokenizer: a token a byte
    # the draft length of each step is the server's own choice (--draft-len auto): 1..7 drafts per drafting step
    steps, drafted = reply["num_draft_steps"], reply["total_draft_tokens"]
    assert steps <= MAX_NEW - 1 and steps <= drafted <= 7 * steps
    assert reply["total_accepted_draft_tokens"] <= drafted
    excluded = post(server, "generate", body(prompt, sampling_param_exclude_input_from_output=True))
    assert excluded["text_output"] == expected["text"]
    assert reply["arrival_time_ns"] <= reply["first_token_time_ns"] <= reply["last_token_time_ns"]


def test_http_stream_concatenates_to_the_full_text(server):
    prompt = text_prompt(1)
    full = post(server, "generate", body(prompt))["text_output"]
    events = stream(server, body(prompt))
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == full
    assert events[-1]["finish_reason"] == "length" and "finish_reason" not in events[0]


def test_grpc_stream_concatenates_to_the_full_text(server):
    prompt = text_prompt(2)
    full = post(server, "generate", body(prompt))["text_output"]
    chunks = grpc_stream(server['ends'].grpc_port, prompt, MAX_NEW)
    assert all(isinstance(c, str) for c in chunks), chunks
    assert len(chunks) > 1 and "".join(chunks) == full


def test_sixteen_concurrent_streams_decode_together(server):
    """96 tokens each: a request of 40 lasted about as long as the 16 clients' arrivals spread on a loaded 2-core
    machine (up to ~70 ms alone), and a CI run once saw only 5 of them overlap; a server decoding one request at
    a time keeps the count at 1, whatever their length."""
    prompts = [text_prompt(i % 8)[: 6 + i] for i in range(16)]
    expected = [post(server, "generate", body(p, sampling_param_max_tokens=96))["text_output"] for p in prompts]
    results = [None] * 16

    def client(i):
        results[i] = stream(server, body(prompts[i], sampling_param_max_tokens=96))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for events, want in zip(results, expected):
        assert "".join(e["text_output"] for e in events) == want
    finals = [events[-1] for events in results]
    # decoded together: some instant lies inside many requests' [first token, last token] intervals
    starts = sorted(f["first_token_time_ns"] for f in finals)
    overlap = max(sum(f["first_token_time_ns"] <= t <= f["last_token_time_ns"] for f in finals) for t in starts)
    assert overlap >= 8, overlap


@pytest.mark.parametrize("bad, needle", [
    ({"sampling_param_max_tokens": 4}, "text_input"),
    ({"text_input": ""}, "empty prompt"),
    ({"text_input": "x" * 600}, "exceeds this engine's sequence capacity"),
    ({"text_input": "hi", "sampling_param_max_tokens": 0}, "sampling_param_max_tokens must be in 1..512, got 0"),
    ({"text_input": "hi", "sampling_param_max_tokens": 100000}, "sampling_param_max_tokens must be in 1..512"),
    ({"text_input": "hi", "sampling_param_temperature": -1.0}, "temperature must be >= 0, got -1.0"),
    ({"text_input": "hi", "sampling_param_top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ({"text_input": "hi", "sampling_param_max_tokens": "many"}, "Unable to parse"),  # Triton checks types
    ({"text_input": ["hi", "there"]}, "'text_input' takes one value per request, got 2"),  # never truncated
    ({"text_input": "hi", "sampling_param_max_tokens": [4, 8]}, "can not convert input 'sampling_param_max_tokens'"),
])
def test_bad_requests_get_errors_while_others_are_served(server, bad, needle):
    good = {}
    t = threading.Thread(target=lambda: good.update(post(server, "generate", body(text_prompt(3)))))
    t.start()
    reply = post(server, "generate", bad)
    t.join(120)
    assert needle in reply.get("error", ""), reply
    assert good.get("num_output_tokens") == MAX_NEW, good


def test_non_utf8_prompt_bytes_are_one_line(server):
    """Bytes that are not UTF-8 (gRPC carries raw BYTES; JSON cannot) get one line naming the input and byte."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server['ends'].grpc_port}")
    replies, done = [], threading.Event()

    def callback(result, error):
        replies.append(error if error is not None else result)
        done.set()

    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"def f():\xff\xfe"], dtype=np.object_))
    client.start_stream(callback=callback)
    client.async_stream_infer("dflash", [text], enable_empty_final_response=False)
    assert done.wait(60)
    client.stop_stream()
    message = str(replies[0])
    assert "'text_input' is not UTF-8 text: byte 0xff at offset 8" in message, message
    assert "Traceback" not in message and "\n" not in message.strip()
    assert post(server, "generate", body("def f():"))["num_output_tokens"] == MAX_NEW  # still serving


def test_malformed_json_is_one_line_and_the_server_keeps_serving(server):
    """Triton's own HTTP frontend parses a /generate body before the model sees it and answers a body that is not
    JSON with 500, not 400 (src/http_server.cc, r24.10: TRITONJSON_STATUSRETURN makes every TritonJson error
    TRITONSERVER_ERROR_INTERNAL); the OpenAI frontend answers 400 (test_serve_openai.py). Pinned, so that a Triton
    that answers 400 shows here; docs/troubleshooting.md says so."""
    req = urllib.request.Request(f"{server['ends'].http_url}/v2/models/dflash/generate", b"{not json")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(req, timeout=60)
    reply = json.loads(raised.value.read())
    assert raised.value.code in (400, 500) and reply["error"].strip() and "\n" not in reply["error"].strip(), reply
    print(f"malformed JSON: HTTP {raised.value.code} {reply['error']!r}")
    assert post(server, "generate", body("def f():"))["num_output_tokens"] == MAX_NEW  # still serving


def test_disconnect_mid_stream_frees_the_slot(server):
    import http.client

    before = metrics(server)
    conn = http.client.HTTPConnection("127.0.0.1", server["ends"].http_port, timeout=60)
    conn.request("POST", "/v2/models/dflash/generate_stream",
                 json.dumps(body(text_prompt(4), sampling_param_max_tokens=400, streaming=True)))
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data:")
    conn.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = metrics(server)
        if m["dflash_running_requests"] == 0 and m["dflash_failed_requests_total"] > before["dflash_failed_requests_total"]:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"slot not freed: {metrics(server)}")
    assert post(server, "generate", body(text_prompt(5)))["num_output_tokens"] == MAX_NEW


def test_counters_agree_with_responses(server):
    before = metrics(server)
    replies = [post(server, "generate", body(text_prompt(i), sampling_param_max_tokens=30)) for i in range(4)]
    after = metrics(server)
    delta = {k: after[k] - before[k] for k in after}
    assert delta["dflash_requests_total"] == 4
    assert delta["dflash_generated_tokens_total"] == sum(r["num_output_tokens"] for r in replies)
    assert delta["dflash_accepted_tokens_total"] == sum(r["total_accepted_draft_tokens"] for r in replies)
    assert delta["dflash_drafted_tokens_total"] == sum(r["total_draft_tokens"] for r in replies)
    assert delta["dflash_draft_steps_total"] == sum(r["num_draft_steps"] for r in replies)
    # one request at a time: every batch step carried one request, so the step counters add up per request
    steps = delta["dflash_decode_steps_total"]
    assert delta["dflash_draft_steps_total"] <= steps <= sum(r["num_output_tokens"] - 1 for r in replies)
    assert delta["dflash_plain_steps_total"] == steps - delta["dflash_draft_steps_total"]
    assert delta["dflash_step_draft_length_count"] == steps
    assert delta["dflash_step_draft_length_sum"] == delta["dflash_drafted_tokens_total"]
    plain_bucket = next(k for k in after if k.startswith("dflash_step_draft_length_bucket") and 'le="0' in k)
    assert delta[plain_bucket] == delta["dflash_plain_steps_total"]
    assert delta["dflash_plain_only_requests_total"] in range(5)  # exported (its count: test_serve_offline.py)


def test_tensor_parallel_engine_inside_triton(builtin, tmp_path):
    """TP=2: the model drives a second rank process in lockstep; output equals dflash-generate --engine."""
    served = serving(builtin, tmp_path, tp=2)
    srv = next(served)
    prompts = [text_prompt(i) for i in range(3)]
    replies = [None] * 3
    threads = [threading.Thread(target=lambda i=i: replies.__setitem__(i, post(srv, "generate", body(prompts[i]))))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    events = stream(srv, body(prompts[0]))
    for prompt, reply in zip(prompts, replies):
        out = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", "--engine", str(srv["engine"]),
                              "--prompt", prompt, "--max-new-tokens", str(MAX_NEW), "--ignore-eos", "--json"],
                             capture_output=True, text=True, check=True)
        assert reply["text_output"] == prompt + json.loads(out.stdout)["text"]
    assert "".join(e["text_output"] for e in events) == replies[0]["text_output"]
    with pytest.raises(StopIteration):
        next(served)  # clean shutdown: exit code 0
    leftover = subprocess.run(["pgrep", "-f", f"tp_worker {srv['engine']}"], capture_output=True, text=True)
    assert leftover.stdout == ""


def test_tensor_parallel_paged_pool_preempts_chunks_and_reuses_prefixes(builtin, tmp_path):
    """TP=2 with a KV pool smaller than three requests at once, prompts prefilled 16 tokens a step and prefix
    caching: both ranks admit, preempt, stage and reuse alike (lockstep), and every text equals
    dflash-generate --engine's, which runs each rank with a pool for every request at full length."""
    from transformers import AutoTokenizer

    from trtllm_dflash.cache.kv_cache import BLOCK, blocks_for

    prompts = [text_prompt(i) + text_prompt(i + 3) + text_prompt(i + 6) for i in range(3)]  # 3 x 16 bytes each
    tokens = [len(AutoTokenizer.from_pretrained(builtin[0])(p)["input_ids"]) for p in prompts]
    need = [blocks_for(n + MAX_NEW + 16 + 1) for n in tokens]  # prompt, output, the anchor and a block of 16
    pool = max(need) + 2  # blocks: the longest request fits alone, never all three
    t, d = (json.loads((Path(path) / "config.json").read_text()) for path in builtin)
    head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    # per rank, float32: target and drafter layers x K,V x half the KV heads x head_dim x BLOCK positions x 4 B
    block_bytes = (t["num_hidden_layers"] + d["num_hidden_layers"]) * 2 * t["num_key_value_heads"] // 2 * head_dim \
        * BLOCK * 4
    # --draft-len auto: nothing measured at start-up, so a pool this small starts
    served = serving(builtin, tmp_path, tp=2, kv_cache_gib=pool * block_bytes / 2**30, max_num_tokens=16)
    srv = next(served)
    order = [0, 1, 2, 0, 0]  # the last, alone after the first again: its full blocks come from the prefix cache
    replies = [None] * len(order)

    def ask(i):
        replies[i] = post(srv, "generate", body(prompts[order[i]]))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    ask(3)
    ask(4)
    counts = metrics(srv)
    assert counts["dflash_kv_cache_blocks"] == pool and sum(need) > pool
    assert tokens[0] > 2 * BLOCK  # two full blocks and more: the last re-send reuses both
    assert counts["dflash_prefix_cache_hit_requests_total"] >= 1
    assert counts["dflash_prefix_cache_hit_tokens_total"] >= 2 * BLOCK
    for i, reply in zip(order, replies):
        out = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", "--engine", str(srv["engine"]),
                              "--prompt", prompts[i], "--max-new-tokens", str(MAX_NEW), "--ignore-eos", "--json"],
                             capture_output=True, text=True, check=True)
        assert reply["text_output"] == prompts[i] + json.loads(out.stdout)["text"]
    with pytest.raises(StopIteration):
        next(served)


def test_plain_decoding_serves_the_same_text_without_drafts(builtin, tmp_path):
    """--decoding plain (the benchmark baseline): same greedy text, no draft steps counted."""
    served = serving(builtin, tmp_path, decoding="plain")
    srv = next(served)
    before = metrics(srv)
    reply = post(srv, "generate", body(text_prompt(0)))
    delta = {k: v - before[k] for k, v in metrics(srv).items()}
    out = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", "--engine", str(srv["engine"]),
                          "--prompt", text_prompt(0), "--max-new-tokens", str(MAX_NEW), "--ignore-eos", "--json"],
                         capture_output=True, text=True, check=True)
    assert reply["text_output"] == text_prompt(0) + json.loads(out.stdout)["text"]
    assert reply["total_draft_tokens"] == 0 and delta["dflash_draft_steps_total"] == 0
    assert delta["dflash_generated_tokens_total"] == MAX_NEW
    with pytest.raises(StopIteration):
        next(served)


def test_compiled_steps_serve_the_same_text(builtin, server, tmp_path):
    """--step-mode compile inside the real server: the passes compile in the Python backend's process (its stub
    leaves the C locale, whose ASCII default failed inductor's UTF-8 templates), greedy text equals the eager
    server's at several batch sizes, and the server still stops cleanly within its exit timeout (inductor's
    compile workers, left running, had made the unload outlast it)."""
    prompts = [text_prompt(i) for i in range(3)]
    eager = [post(server, "generate", body(p))["text_output"] for p in prompts]
    served = serving(builtin, tmp_path, step_mode="compile")
    srv = next(served)
    replies = post_all(srv, [body(p) for p in prompts])
    assert [r["text_output"] for r in replies] == eager
    assert post(srv, "generate", body(prompts[0]))["text_output"] == eager[0]  # alone, after the batch
    assert "does not compile" not in srv["log"].read_text()
    with pytest.raises(StopIteration):  # asserts the clean stop (exit code 0)
        next(served)
