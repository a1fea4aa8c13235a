"""The real tritonserver on loopback serving a tiny torch engine, and the HTTP calls the serving tests make."""

import json
import threading
import urllib.request

from trtllm_dflash.engine.loader import free_port

from helpers.tiny_pair import held_out_prompts


def serving(builtin, root, tp=1, decoding="dflash", step_mode="auto", **settings):
    """Build a tiny torch engine, serve it; yields the server's description; asserts a clean stop.
    settings: more ServeSettings fields (the KV pool's)."""
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.serve.locate import find_tritonserver
    from trtllm_dflash.serve.repository import ServeSettings, write_repository
    from trtllm_dflash.serve.server import Endpoints, start_server, stop_server, wait_ready

    engine = build_engine(BuildSpec(str(builtin[0]), str(builtin[1]), str(root / "engine"), dtype="float32",
                                    max_batch_size=16, max_seq_len=512, tp=tp), "test")
    write_repository(engine, root / "repo", ServeSettings("dflash", max_queue=64, decoding=decoding, step_mode=step_mode,
                                                           **settings))
    ends = Endpoints("127.0.0.1", free_port(), free_port(), free_port())
    log = open(root / "server.log", "w")
    proc = start_server(find_tritonserver(root / "triton"), root / "repo", ends, log)
    try:
        wait_ready(proc, timeout=600)  # a liveness bound: --step-mode compile compiles while loading
    except Exception:
        stop_server(proc, grace=5)
        raise AssertionError((root / "server.log").read_text()[-3000:])
    yield {"proc": proc, "ends": ends, "engine": engine, "log": root / "server.log",
           "block": json.loads((engine / "manifest.json").read_text())["block_size"]}
    code = stop_server(proc)
    assert code == 0, (root / "server.log").read_text()[-2000:]


def post(server, path: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(f"{server['ends'].http_url}/v2/models/dflash/{path}", json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(server["ends"].metrics_url, timeout=10) as r:
        rows = [line.split() for line in r.read().decode().splitlines() if line.startswith("dflash_")]
    return {name: float(value) for name, value in rows}


def text_prompt(i: int) -> str:
    return bytes(held_out_prompts(i + 1)[i]).decode()


def stream(server, body: dict, timeout: float = 120) -> list[dict]:
    """Triton's HTTP generate_stream: the server-sent events of one request, in order."""
    req = urllib.request.Request(f"{server['ends'].http_url}/v2/models/dflash/generate_stream",
                                 json.dumps({**body, "streaming": True}).encode())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]


def grpc_stream(port: int, prompt: str, max_tokens: int, exclude_input: bool = False, cancel_after: int | None = None,
                timeout: float = 120) -> list:
    """One streaming request over Triton's gRPC stream: each response's text_output in order (an error as the
    exception the client reports); with `cancel_after`, cancelled through Triton's client after that many."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    texts, done, enough = [], threading.Event(), threading.Event()

    def callback(result, error):
        if error is not None:
            texts.append(error)
            return done.set()
        texts.append(result.as_numpy("text_output")[0].decode())
        if cancel_after is not None and len(texts) >= cancel_after:
            enough.set()
        if result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    def tensor(name, value, dtype, triton_type):
        t = grpcclient.InferInput(name, [1], triton_type)
        t.set_data_from_numpy(np.array([value], dtype=dtype))
        return t

    inputs = [tensor("text_input", prompt.encode(), np.object_, "BYTES"), tensor("streaming", True, bool, "BOOL"),
              tensor("sampling_param_max_tokens", max_tokens, np.int32, "INT32"),
              tensor("sampling_param_ignore_eos", True, bool, "BOOL"),
              tensor("sampling_param_exclude_input_from_output", exclude_input, bool, "BOOL")]
    client.start_stream(callback=callback)
    try:
        client.async_stream_infer("dflash", inputs, enable_empty_final_response=False)
        if cancel_after is None:
            assert done.wait(timeout), texts
        else:
            assert enough.wait(timeout) and not done.is_set(), texts
    finally:
        client.stop_stream(cancel_requests=cancel_after is not None)
        client.close()
    return texts


def post_all(server, bodies: list[dict]) -> list[dict]:
    """The bodies posted to `generate` at once, one thread each: their replies in order."""
    replies = [None] * len(bodies)
    threads = [threading.Thread(target=lambda i=i: replies.__setitem__(i, post(server, "generate", bodies[i])))
               for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return replies
