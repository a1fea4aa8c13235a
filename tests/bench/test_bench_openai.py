"""dflash-bench against a small OpenAI-compatible server (aiohttp, real HTTP on loopback, SSE streaming)."""

import asyncio
import json
import re

import pytest
from helpers.bench_fakes import LoopbackServer, byte_tokenizer, read_jsonl
from trtllm_dflash.engine.loader import free_port

from trtllm_dflash.bench.spec import SweepSpec
from trtllm_dflash.bench.sweep import run_sweep
from trtllm_dflash.cli.bench import main

pytest.importorskip("aiohttp")


class FakeOpenAI(LoopbackServer):
    """Streams `max_tokens` x's, `per_chunk` a chunk (one token each with a byte tokenizer), like trtllm-serve."""

    def __init__(self, ttft=0.05, gap=0.03, per_chunk=3, usage_extra=0, die_at=None, stall=False, reject=None):
        super().__init__()
        self.ttft, self.gap, self.per_chunk, self.usage_extra = ttft, gap, per_chunk, usage_extra
        self.die_at, self.stall, self.reject = die_at, stall, reject  # reject: answer every request HTTP 400 this

    def routes(self, app):
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)

    async def models(self, request):
        from aiohttp import web

        return web.json_response({"data": [{"id": "tiny", "object": "model"}]})

    async def health(self, request):
        from aiohttp import web

        return web.Response(text="ok")

    async def complete(self, request):
        from aiohttp import web

        body = await request.json()
        self.requests.append((request.path, body))
        self.auth = request.headers.get("Authorization")
        if body.get("model") != "tiny":
            return web.json_response({"error": {"message": f"model {body.get('model')} not found"}}, status=404)
        if self.reject:  # a message that names the request's own numbers, as real servers' do
            message = self.reject.format(length=len(body.get("prompt", "")))
            return web.json_response({"error": {"message": message}}, status=400)
        if self.die_at and len(self.requests) == self.die_at:  # the server goes away mid-point
            asyncio.get_running_loop().call_later(0.02, lambda: asyncio.ensure_future(self.runner.cleanup()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chat = request.path.endswith("/chat/completions")

        async def send(event):
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())

        if chat:  # a role-only first chunk carries no token
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(self.ttft)
        if self.stall:
            await asyncio.sleep(3600)
        left = body["max_tokens"]
        while left:
            k = min(self.per_chunk, left)
            left -= k
            choice = {"index": 0, "delta": {"content": "x" * k}} if chat else {"index": 0, "text": "x" * k}
            await send({"choices": [{**choice, "finish_reason": None if left else "length"}]})
            if left:
                await asyncio.sleep(self.gap)
        if body.get("stream_options", {}).get("include_usage"):
            prompt = sum(len(m["content"]) for m in body["messages"]) if chat else len(body["prompt"])
            dflash = {"drafted_tokens": 2 * body["max_tokens"], "accepted_tokens": body["max_tokens"]}
            await send({"choices": [], "usage": {"prompt_tokens": prompt, "dflash": dflash,
                                                 "completion_tokens": body["max_tokens"] + self.usage_extra}})
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return byte_tokenizer(tmp_path_factory.mktemp("tok") / "bytes")


def spec(server, tok_dir, out, **extra):
    settings = dict(url=server.url, model="tiny", api="openai", concurrency=(1, 2), prompts_per_point=4, warmup=1,
                    isl=16, osl=12, tokenizer=str(tok_dir), output=str(out))
    return SweepSpec(**{**settings, **extra})


def test_completions_sweep_measures_streamed_tokens(tok_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeOpenAI(ttft=0.05, gap=0.03, per_chunk=3) as server:
        result = run_sweep(spec(server, tok_dir, tmp_path / "run"), progress=False, log=lambda m: None)
    assert result.status == "complete" and [p["point"] for p in result.points] == ["c1", "c2"]
    assert server.auth == "Bearer sk-test"
    assert len(server.requests) == 2 * (1 + 4)  # a warm-up and four measured requests per point
    for path, body in server.requests:
        assert path == "/v1/completions" and body["stream"] is True and body["ignore_eos"] is True
        assert body["max_tokens"] == 12 and body["stream_options"] == {"include_usage": True}
        assert body["temperature"] == 0.0 and 13 <= len(body["prompt"]) <= 16  # ISL in [0.8 x 16, 16]
    rows = read_jsonl(tmp_path / "run" / "requests.jsonl")
    assert len(rows) == 8 and all(r["ok"] for r in rows)
    for r in rows:
        assert r["osl"] == r["osl_server"] == r["osl_tokenizer"] == 12 and not r["osl_mismatch"]
        assert r["chunks"] == 4 and r["ttft_s"] >= 0.05
        assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / 11)
        # three tokens a chunk: TPOT is about a third of a gap
        assert r["tpot_s"] < 0.5 * min(r["inter_chunk_latency_s"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "complete" and len(summary["points"]) == 2
    p = summary["points"][1]
    assert p["completed"] == 4 and p["output_tokens"] == 48 and p["tokens_per_chunk"] == 3
    assert p["total_throughput_per_gpu"] == pytest.approx((p["input_tokens"] + 48) / p["duration_s"])
    assert p["acceptance_length"] is None  # an OpenAI server without dflash counters: n/a, not zero
    assert p["acceptance_rate_responses"] == 0.5  # from usage.dflash (dflash-serve's OpenAI extension)
    assert all(r["isl_server"] == r["isl"] and not r["isl_mismatch"] for r in rows)  # usage.prompt_tokens
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["settings"]["api"] == "openai"
    assert manifest["versions"]["aiohttp"] and manifest["points"] == ["c1", "c2"]
    assert (tmp_path / "run" / "summary.csv").read_text().count("\n") == 3


def test_chat_dataset_uses_the_chat_endpoint_and_skips_role_chunks(tok_dir, tmp_path):
    from trtllm_dflash.bench.tokenizer import resolve_tokenizer

    tok = resolve_tokenizer(str(tok_dir)).tokenizer
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tok.save_pretrained(str(tmp_path / "chat-tok"))
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hello there"}], "category": "chat"})
                    + "\n" + json.dumps({"prompt": "plain text"}) + "\n")
    logs = []
    with FakeOpenAI(ttft=0.08, gap=0.01, per_chunk=2) as server:
        run_sweep(spec(server, tmp_path / "chat-tok", tmp_path / "run", dataset=str(data), concurrency=(1,),
                       warmup=0), progress=False, log=logs.append)
    assert any("the dataset has 2 prompts and the sweep sends 4: prompts repeat" in line for line in logs)
    paths = {path for path, _ in server.requests}
    assert paths == {"/v1/chat/completions", "/v1/completions"}
    chat_bodies = [b for p, b in server.requests if p.endswith("chat/completions")]
    assert chat_bodies[0]["messages"] == [{"role": "user", "content": "hello there"}]
    rows = read_jsonl(tmp_path / "run" / "requests.jsonl")
    assert all(r["ttft_s"] >= 0.08 for r in rows)  # the role chunk at t=0 is not the first token
    assert {r["category"] for r in rows} == {"chat", None}
    chat_isl = {r["isl"] for r in rows if r["category"] == "chat"}
    assert chat_isl == {len("user: hello there\n")}  # the chat template applied, one token a byte


def test_server_and_tokenizer_counts_disagreeing_is_flagged(tok_dir, tmp_path):
    logs = []
    with FakeOpenAI(usage_extra=1) as server:
        result = run_sweep(spec(server, tok_dir, tmp_path / "run", concurrency=(1,)), progress=False,
                           log=logs.append)
    p = result.points[0]
    assert p["osl_mismatches"] == 4 and p["output_tokens"] == 4 * 13  # the server's count is used
    assert any("output token count differs" in w for w in p["warnings"])
    assert any("warning: point c1" in line for line in logs)


def test_stuck_requests_time_out_and_are_reported(tok_dir, tmp_path, capsys):
    with FakeOpenAI(stall=True) as server:
        code = main(["sweep", "--url", server.url, "--model", "tiny", "--api", "openai", "--concurrency", "2",
                     "--prompts-per-point", "2", "--warmup", "0", "--isl", "8", "--osl", "4", "--timeout", "0.3",
                     "--tokenizer", str(tok_dir), "--output", str(tmp_path / "run"), "--no-progress"])
    assert code == 1  # the server is alive and the point completes, but it measured nothing (issue 13, item 11)
    p = json.loads((tmp_path / "run" / "summary.json").read_text())["points"][0]
    assert (p["requests"], p["completed"], p["failed"], p["timed_out"]) == (2, 0, 2, 2)
    assert p["ttft_ms_median"] is None and p["total_throughput_per_gpu"] == 0
    rows = read_jsonl(tmp_path / "run" / "requests.jsonl")
    assert {r["error_kind"] for r in rows} == {"timeout"} and "stuck" in rows[0]["error"]
    err = capsys.readouterr().err
    assert "2 of 2 requests failed (2 timed out)" in err
    assert err.strip().splitlines()[-1] == (
        "dflash-bench: error: no request succeeded at point c2; most common error (2 of 2 requests): no complete "
        f"answer after 0.3 s: stuck request, cancelled; results in {tmp_path / 'run'}")


def test_a_sweep_whose_every_request_fails_exits_1_naming_the_dominant_error(tok_dir, tmp_path, capsys):
    """Issue 13, item 11: a sweep of only failures used to exit 0."""
    with FakeOpenAI(reject="prompt length {length} is too long") as server:
        code = main(["sweep", "--url", server.url, "--model", "tiny", "--api", "openai", "--concurrency", "1,2",
                     "--prompts-per-point", "3", "--warmup", "0", "--isl", "40", "--isl-range", "0.5", "--osl", "4",
                     "--tokenizer", str(tok_dir), "--output", str(tmp_path / "run"), "--no-progress"])
    assert code == 1
    points = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    assert [(p["point"], p["completed"], p["top_error_count"]) for p in points] == [("c1", 0, 3), ("c2", 0, 3)]
    rows = read_jsonl(tmp_path / "run" / "requests.jsonl")
    assert len({r["error"] for r in rows}) > 1  # random prompt lengths: messages that differ in their numbers
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("dflash-bench: error: no request succeeded at point c1, c2; most common error (6 of 6 "
                       f"requests): {rows[0]['error']}; results in {tmp_path / 'run'}")
    assert re.fullmatch(r"HTTP 400: prompt length \d+ is too long", rows[0]["error"])
    assert "Traceback" not in "\n".join(err)


def test_server_dying_mid_point_keeps_partial_results(tok_dir, tmp_path, capsys):
    with FakeOpenAI(ttft=0.02, gap=0.05, per_chunk=1, die_at=6) as server:
        code = main(["sweep", "--url", server.url, "--model", "tiny", "--api", "openai", "--concurrency", "2,4",
                     "--prompts-per-point", "12", "--warmup", "0", "--isl", "8", "--osl", "6", "--tokenizer",
                     str(tok_dir), "--output", str(tmp_path / "run"), "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dflash-bench: error: sweep cut short: the server stopped answering")
    assert str(tmp_path / "run") in err[-1]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "aborted" and "during point c2" in manifest["error"]
    points = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    assert [p["point"] for p in points] == ["c2"] and points[0]["status"] == "aborted"
    rows = read_jsonl(tmp_path / "run" / "requests.jsonl")
    assert len(rows) == points[0]["requests"] < 12
    assert sum(r["ok"] for r in rows) == points[0]["completed"] >= 3
    assert {r["error_kind"] for r in rows if not r["ok"]} <= {"connection", "cancelled"} and points[0]["failed"]


@pytest.mark.parametrize("extra, needle", [
    (["--model", "nope"], "--model: 'nope' is not served at http://127.0.0.1:{port} (served: tiny)"),
    (["--concurrency", "1,two,4"], "--concurrency: 'two' is not a positive integer (in '1,two,4')"),
    (["--concurrency", "0"], "--concurrency: '0' is not a positive integer"),
    (["--concurrency", "1,,2"], "--concurrency: empty item in '1,,2'"),
    (["--api", "grpc"], "--api: unknown API 'grpc'"),
    (["--prompts-per-point", "3", "--duration", "5"], "--prompts-per-point and --duration exclude each other"),
    (["--isl-range", "1.5"], "--isl-range must be in (0, 1], got 1.5"),
    (["--osl", "many"], "argument --osl: invalid int value: 'many'"),
    (["--dataset", "{tmp}/missing.jsonl"], "--dataset: no such file"),
    (["--dataset", "{tmp}/bad.jsonl"], "bad.jsonl:2: not valid JSON"),
    (["--tokenizer", "{tmp}/nowhere"], "--tokenizer: no such model or engine directory"),
])
def test_bad_input_is_one_line_and_exit_2(tok_dir, tmp_path, capsys, extra, needle):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "fine"}\n{"prompt": \n')
    with FakeOpenAI() as server:
        argv = ["sweep", "--url", server.url, "--model", "tiny", "--api", "openai", "--tokenizer", str(tok_dir),
                "--output", str(tmp_path / "run"), "--no-progress", *[a.format(tmp=tmp_path) for a in extra]]
        assert main(argv) == 2
        assert server.requests == []  # nothing was sent
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dflash-bench: error: "), err
    assert needle.format(port=server.port) in err, err
    assert not (tmp_path / "run").exists()


def test_unreachable_url_is_one_line(tok_dir, tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    for api in ("openai", "triton-http", "triton-grpc"):
        target = url if api != "triton-grpc" else url.removeprefix("http://")
        code = main(["sweep", "--url", target, "--model", "m", "--api", api, "--tokenizer", str(tok_dir),
                     "--output", str(tmp_path / api)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith("dflash-bench: error: --url: no ") and "answers at" in err, err
        assert not (tmp_path / api).exists()


def test_poisson_and_duration_points(tok_dir, tmp_path):
    with FakeOpenAI(ttft=0.01, gap=0.01, per_chunk=2) as server:
        rate = run_sweep(spec(server, tok_dir, tmp_path / "rate", concurrency=(3,), request_rate=(40.0, 80.0),
                              prompts_per_point=6, osl=4), progress=False, log=lambda m: None)
        timed = run_sweep(spec(server, tok_dir, tmp_path / "timed", concurrency=(2,), prompts_per_point=None,
                               duration=0.4, osl=4), progress=False, log=lambda m: None)
    assert [(p["point"], p["request_rate"], p["concurrency"], p["completed"]) for p in rate.points] == [
        ("r40-c3", 40.0, 3, 6), ("r80-c3", 80.0, 3, 6)]
    [p] = timed.points
    rows = read_jsonl(tmp_path / "timed" / "requests.jsonl")
    assert p["completed"] == len(rows) >= 4 and all(r["start_s"] < 0.4 for r in rows)  # no send after 0.4 s
    assert all(r["ok"] for r in rows)  # requests in flight at the deadline finished and count
    prompts = sorted(r["prompt"] for r in rows)
    assert prompts == list(range(1, len(rows) + 1))  # unique prompts, after the one warm-up
