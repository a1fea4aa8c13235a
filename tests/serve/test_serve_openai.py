"""The OpenAI frontend in front of the real tritonserver, driven by the official `openai` client.

Oracles: Triton's own `generate` endpoint on the same server (the frontend must add nothing and lose
nothing), the byte tokenizer of the test pair (one token per UTF-8 byte, so token counts are byte
counts), and Jinja rendering the chat template directly.
"""

import http.client
import json
import time
from pathlib import Path

import pytest
from helpers.triton import grpc_stream, metrics, post, text_prompt
from trtllm_dflash.engine.loader import free_port

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytestmark = pytest.mark.serve  # the real tritonserver

MAX_NEW = 24
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def start(server, tmp_path, chat_template=None):
    from trtllm_dflash.serve.openai.process import start_frontend
    from trtllm_dflash.serve.openai.server import FrontendSettings

    settings = FrontendSettings(str(server["engine"]), f"127.0.0.1:{server['ends'].grpc_port}", "dflash",
                                port=free_port(), chat_template=chat_template)
    log = open(tmp_path / f"frontend-{settings.port}.log", "w")
    return settings, start_frontend(settings, log), log


@pytest.fixture(scope="module")
def frontends(triton_server, tmp_path_factory):
    """Two frontends started together: one with --chat-template, one with the tokenizer's (none)."""
    from trtllm_dflash.serve.openai.process import wait_frontend
    from trtllm_dflash.serve.server import stop_process

    tmp = tmp_path_factory.mktemp("openai")
    (tmp / "chat.jinja").write_text(TEMPLATE)
    started = [start(triton_server, tmp, str(tmp / "chat.jinja")), start(triton_server, tmp)]
    try:
        for settings, proc, log in started:
            wait_frontend(proc, settings, timeout=180)
        yield [settings for settings, _, _ in started]
    finally:
        codes = [stop_process(proc, grace=15) for _, proc, _ in started]
        for _, _, log in started:
            log.close()
    assert codes == [0, 0], [(tmp / f"frontend-{s.port}.log").read_text()[-2000:] for s, _, _ in started]


@pytest.fixture(scope="module")
def client(frontends):
    return openai.OpenAI(base_url=f"{frontends[0].url}/v1", api_key="unused", max_retries=0, timeout=120)


def triton_text(server, prompt: str, **extra) -> dict:
    return post(server, "generate", {"text_input": prompt, "sampling_param_max_tokens": MAX_NEW,
                                     "sampling_param_ignore_eos": True,
                                     "sampling_param_exclude_input_from_output": True, **extra})


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["dflash"]


def test_completions_equal_triton_generate_streaming_or_not(client, triton_server):
    prompt = text_prompt(1)  # its output is not all partial UTF-8, so it streams in several chunks
    expected = triton_text(triton_server, prompt)
    whole = client.completions.create(model="dflash", prompt=prompt, max_tokens=MAX_NEW, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text == expected["text_output"] and whole.choices[0].finish_reason == "length"
    usage = whole.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt.encode()), MAX_NEW)  # a token a byte
    assert usage.total_tokens == usage.prompt_tokens + MAX_NEW
    dflash = usage.model_extra["dflash"]
    # the server chooses each step's draft length (--draft-len auto, 1..7 per drafting step), so two requests'
    # counts need not agree; each is bounded by its own steps
    assert dflash["draft_steps"] <= dflash["drafted_tokens"] <= 7 * dflash["draft_steps"]
    assert dflash["accepted_tokens"] <= dflash["drafted_tokens"]
    if dflash["draft_steps"]:
        assert dflash["acceptance_length"] == pytest.approx(1 + dflash["accepted_tokens"] / dflash["draft_steps"])
    else:  # the policy judged drafting a loss for every step (a busy machine): no length to report
        assert dflash["acceptance_length"] is None and dflash["drafted_tokens"] == 0

    chunks = list(client.completions.create(model="dflash", prompt=prompt, max_tokens=MAX_NEW, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 1 and "".join(texts) == expected["text_output"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_NEW
    assert chunks[-1].usage.prompt_tokens == len(prompt.encode())
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_strings_and_sampling_reach_the_model(client, triton_server):
    prompt = text_prompt(3)  # the random target's output has ASCII runs here
    full = triton_text(triton_server, prompt)["text_output"]
    stop = next(full[i:i + 2] for i in range(4, len(full) - 2) if "\ufffd" not in full[i:i + 2])
    cut = client.completions.create(model="dflash", prompt=prompt, max_tokens=MAX_NEW, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model="dflash", prompt=prompt, max_tokens=MAX_NEW, temperature=1.0,
                                         top_p=0.9, seed=7, extra_body={"top_k": 20, "ignore_eos": True})
               for _ in range(2)]
    expected = triton_text(triton_server, prompt, sampling_param_temperature=1.0, sampling_param_top_p=0.9,
                           sampling_param_seed=7, sampling_param_top_k=20)["text_output"]
    # A seed reproduces a sample only at one draft length: the server's default --draft-len auto chooses
    # k per step from timings, so the three runs need not agree. Sampling reached the model: T = 1 text
    # of the random target differs from its greedy text.
    texts = [s.choices[0].text for s in sampled] + [expected]
    assert all(t and t != full for t in texts), texts


def test_chat_uses_the_template(client, triton_server):
    import jinja2

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text_prompt(2)}]
    rendered = jinja2.Template(TEMPLATE).render(messages=messages, add_generation_prompt=True)
    expected = triton_text(triton_server, rendered)
    reply = client.chat.completions.create(model="dflash", messages=messages, max_tokens=MAX_NEW, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].message.content == expected["text_output"]
    assert reply.choices[0].message.role == "assistant"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(rendered.encode()), MAX_NEW)
    stream = list(client.chat.completions.create(model="dflash", messages=messages, max_tokens=MAX_NEW,
                                                 temperature=0, stream=True, extra_body={"ignore_eos": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == expected["text_output"]


def test_chat_without_a_template_is_a_400_naming_it(frontends):
    plain = openai.OpenAI(base_url=f"{frontends[1].url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        plain.chat.completions.create(model="dflash", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert "no chat template" in err.value.body["message"] and "--chat-template" in err.value.body["message"]


@pytest.mark.parametrize("extra, needle", [
    ({"extra_body": {"frobnicate": 1}}, "unknown field 'frobnicate'"),
    ({"max_tokens": 0}, "'max_tokens': Input should be greater than or equal to 1"),
    ({"max_tokens": 100000}, "after this prompt of 5 tokens (this engine holds "),  # the wording: test_openai_offline
    ({"temperature": -1}, "'temperature': Input should be greater than or equal to 0"),
    ({"n": 2}, "n=2 is not supported by this server"),
    ({"logprobs": 2}, "logprobs=2 is not supported"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop sequences, got 5"),
    ({"prompt": [[1, 2, 3]]}, "token-id prompts are not supported"),
    ({"prompt": "x" * 600}, "the prompt is 600 tokens: this engine holds at most "),
    ({"stream_options": {"include_usage": True}}, "stream_options is only allowed with stream=true"),
])
def test_bad_requests_are_openai_400s_with_one_clear_message(client, extra, needle):
    kwargs = {"model": "dflash", "prompt": "hello", "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**kwargs)
    body = err.value.body
    assert err.value.status_code == 400 and needle in body["message"], body
    assert body["type"] == "invalid_request_error" and "\n" not in body["message"]


def test_unknown_model_is_a_404_and_bad_json_a_400(client, frontends):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=4)
    assert err.value.body["code"] == "model_not_found"
    conn = http.client.HTTPConnection("127.0.0.1", frontends[0].port, timeout=30)
    conn.request("POST", "/v1/completions", b'{"model": "dflash", "prompt": ')  # no Content-Type, cut short
    resp = conn.getresponse()
    assert resp.status == 400 and "not valid JSON" in json.loads(resp.read())["error"]["message"]


def wait_slot_freed(server, before: dict) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = metrics(server)
        failed = m["dflash_failed_requests_total"] - before["dflash_failed_requests_total"]
        if m["dflash_running_requests"] == 0 and failed > 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"slot not freed: {metrics(server)}")


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_frees_its_slot(frontends, triton_server, stream):
    before = metrics(triton_server)
    conn = http.client.HTTPConnection("127.0.0.1", frontends[0].port, timeout=60)
    body = {"model": "dflash", "prompt": text_prompt(3), "max_tokens": 400, "ignore_eos": True, "stream": stream}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    if stream:
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data:")
    else:
        deadline = time.monotonic() + 60
        while metrics(triton_server)["dflash_running_requests"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the request is decoding
    conn.close()  # the client goes away mid-request
    wait_slot_freed(triton_server, before)
    assert metrics(triton_server)["dflash_generated_tokens_total"] == before["dflash_generated_tokens_total"]


def test_dflash_serve_starts_and_stops_the_frontend_with_the_server(triton_server, tmp_path):
    """`dflash-serve --openai-port` with DFLASH_API_KEY: the frontend answers once Triton is ready, 401 without the
    key, which is on no command line and in no environment but the frontend's; SIGTERM ends a stream in flight
    with a shutdown error event and [DONE], and dflash-serve exits 0 leaving no child process."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    ports = [free_port() for _ in range(4)]
    command = [sys.executable, "-m", "trtllm_dflash.cli.serve", str(triton_server["engine"]), "--model-repo",
               str(tmp_path / "repo"), "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
               "--metrics-port", str(ports[2]), "--openai-port", str(ports[3])]
    key = "sk-serve-test-4f2a9c"
    log = open(tmp_path / "serve.log", "w")
    serve = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "DFLASH_API_KEY": key})
    try:
        deadline = time.monotonic() + 240
        while "OpenAI API on" not in (tmp_path / "serve.log").read_text():
            assert serve.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-2000:]
            time.sleep(0.5)
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(serve.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        assert len(children) == 2  # tritonserver and the frontend
        cmdlines = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children}
        frontend = next(pid for pid, line in cmdlines.items() if b"trtllm_dflash.serve.openai" in line)
        for pid in children:
            assert key.encode() not in cmdlines[pid]
            assert (key.encode() in Path(f"/proc/{pid}/environ").read_bytes()) == (pid == frontend)
        assert key not in (tmp_path / "serve.log").read_text()
        conn = http.client.HTTPConnection("127.0.0.1", ports[3], timeout=60)
        conn.request("GET", "/v1/models")
        assert conn.getresponse().status == 401
        conn = http.client.HTTPConnection("127.0.0.1", ports[3], timeout=60)
        body = {"model": "dflash", "prompt": text_prompt(3), "max_tokens": 450, "ignore_eos": True, "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data:")
        events, done = [], threading.Event()

        def read_rest():
            events.extend(line.strip() for line in resp if line.startswith(b"data:"))
            done.set()

        threading.Thread(target=read_rest, daemon=True).start()
        stopped = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        assert done.wait(15), "the stream was not ended by the shutdown"
        assert b"server shutting down" in events[-2] and events[-1] == b"data: [DONE]"
        assert serve.wait(60) == 0, (tmp_path / "serve.log").read_text()[-2000:]
        assert time.monotonic() - stopped < 45
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()


KEEP, DROP = 24, 440  # output tokens of a kept request, and of a dropped one: far more than it decodes before it goes


def read_sse(port: int, path: str, body: dict, headers: dict | None = None, keep: int | None = None) -> list[bytes]:
    """The `data:` lines of a server-sent-event stream; with `keep`, only that many, then the connection closes
    (the client goes away mid-stream)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    resp, lines = conn.getresponse(), []
    assert resp.status == 200, resp.read()
    for line in resp:
        if line.startswith(b"data:"):
            lines.append(line[5:].strip())
            if keep is not None and len(lines) == keep:
                break
    conn.close()
    return lines


def test_clients_that_go_away_free_everything_and_the_others_stay_exact(frontends, triton_server):
    """Four kept requests (Triton HTTP, its SSE, gRPC, OpenAI SSE) decode beside six that go away with far more to
    go: HTTP and OpenAI SSE streams closed after a few chunks, a gRPC stream cancelled through Triton's client, an
    OpenAI client that times out. The dropped requests are all counted failed and none of their tokens as generated
    (cancelled, not run to the end); running requests and KV blocks go back to idle within seconds of the last
    drop; every kept output equals its prompt's served alone (the oracle, before)."""
    import threading

    http_port, grpc_port, api = triton_server["ends"].http_port, triton_server["ends"].grpc_port, frontends[0].port
    prompts = [text_prompt(i) for i in range(10)]
    alone = [triton_text(triton_server, p, sampling_param_max_tokens=KEEP)["text_output"] for p in prompts[:4]]
    triton_body = lambda p, n: {"text_input": p, "sampling_param_max_tokens": n, "sampling_param_ignore_eos": True,  # noqa: E731
                                "sampling_param_exclude_input_from_output": True, "streaming": True}
    openai_body = lambda p, n: {"model": "dflash", "prompt": p, "max_tokens": n, "temperature": 0,  # noqa: E731
                                "ignore_eos": True, "stream": True}
    timed_out = openai.OpenAI(base_url=f"{frontends[0].url}/v1", api_key="unused", max_retries=0, timeout=0.5)

    def openai_timeout(p):
        with pytest.raises(openai.APITimeoutError):
            timed_out.completions.create(model="dflash", prompt=p, max_tokens=DROP, temperature=0,
                                         extra_body={"ignore_eos": True})

    kept = [lambda: post(triton_server, "generate", {**triton_body(prompts[0], KEEP), "streaming": False})["text_output"],
            lambda: "".join(json.loads(x)["text_output"] for x in
                            read_sse(http_port, "/v2/models/dflash/generate_stream", triton_body(prompts[1], KEEP))),
            lambda: "".join(grpc_stream(grpc_port, prompts[2], KEEP, exclude_input=True)),
            lambda: "".join(json.loads(x)["choices"][0]["text"] for x in
                            read_sse(api, "/v1/completions", openai_body(prompts[3], KEEP))[:-1])]
    dropped = [lambda: read_sse(http_port, "/v2/models/dflash/generate_stream", triton_body(prompts[4], DROP), keep=2),
               lambda: read_sse(http_port, "/v2/models/dflash/generate_stream", triton_body(prompts[5], DROP), keep=5),
               lambda: read_sse(api, "/v1/completions", openai_body(prompts[6], DROP), keep=3),
               lambda: read_sse(api, "/v1/completions", openai_body(prompts[7], DROP), keep=6),
               lambda: grpc_stream(grpc_port, prompts[8], DROP, exclude_input=True, cancel_after=3),
               lambda: openai_timeout(prompts[9])]
    results, gone, errors = [None] * 4, [], []

    def run(i, call):
        try:
            out = call()
            if i < 4:
                results[i] = out
            else:
                gone.append(time.monotonic())
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    before = metrics(triton_server)
    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(kept + dropped)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert results == alone
    deadline, m = time.monotonic() + 30, metrics(triton_server)
    while (m["dflash_running_requests"], m["dflash_queued_requests"], m["dflash_kv_cache_blocks_used"]) != (0, 0, 0):
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
        m = metrics(triton_server)
    idle_after = time.monotonic() - max(gone)
    print(f"idle {idle_after:.2f} s after the last client went away")
    assert idle_after < 10
    assert m["dflash_failed_requests_total"] - before["dflash_failed_requests_total"] == len(dropped)
    assert m["dflash_generated_tokens_total"] - before["dflash_generated_tokens_total"] == KEEP * len(kept)
