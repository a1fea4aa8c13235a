"""A DFlash2 drafter served for real: the shipped pair's target with its DFlash2 drafter (`builtin-dflash2`) in
tritonserver, through Triton's HTTP and gRPC endpoints, the OpenAI frontend and `dflash-bench`.

Oracle: transformers' greedy decoding of the target (helpers/oracle.py `hf_greedy`: full recomputation), decoded by
the target's tokenizer; the OpenAI frontend is compared with that too.
"""

import json

import pytest
import torch
from helpers.oracle import hf_greedy
from helpers.triton import grpc_stream, metrics, post, post_all, serving, stream

pytest.importorskip("tritonclient")
pytestmark = pytest.mark.serve  # the real tritonserver

MAX_NEW = 32


@pytest.fixture(scope="module")
def dflash2_pair():
    from trtllm_dflash.pairs import stdlib_pair

    return stdlib_pair("dflash2")


@pytest.fixture(scope="module")
def server(dflash2_pair, tmp_path_factory):
    """Always the whole block (--draft-len 15): `auto` may run a request plain on a busy machine, and these tests
    are about the drafter's steps."""
    yield from serving(dflash2_pair, tmp_path_factory.mktemp("dflash2"), draft_len="15")


@pytest.fixture(scope="module")
def expected(dflash2_pair) -> dict[str, str]:
    """Held-out prompt -> the target's greedy continuation (text), by transformers."""
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.checkpoint.loader import load_target
    from trtllm_dflash.pairs import held_out_texts

    hf = AutoModelForCausalLM.from_pretrained(str(dflash2_pair[0]), dtype=torch.float32).eval()
    tokenizer = load_target(dflash2_pair[0]).tokenizer
    with torch.inference_mode():
        return {text: tokenizer.decode(hf_greedy(hf, tokenizer(text, add_special_tokens=False)["input_ids"], MAX_NEW))
                for text in held_out_texts(3)}


def body(prompt: str, **extra) -> dict:
    return {"text_input": prompt, "sampling_param_max_tokens": MAX_NEW, "sampling_param_ignore_eos": True,
            "sampling_param_exclude_input_from_output": True, **extra}


def test_generate_is_the_targets_greedy_output_alone_and_batched(server, expected):
    prompts = list(expected)
    before = metrics(server)
    info = [name for name, value in before.items() if name.startswith("dflash_drafter_info") and value == 1]
    assert len(info) == 1 and 'method="dflash2"' in info[0], info  # what dflash-bench reads the method from
    alone = post(server, "generate", body(prompts[0]))
    assert alone["text_output"] == expected[prompts[0]] and alone["num_output_tokens"] == MAX_NEW
    assert alone["num_draft_steps"] > 0 and alone["total_accepted_draft_tokens"] > 0  # drafted, and accepted
    replies = post_all(server, [body(p) for p in prompts])
    assert [r["text_output"] for r in replies] == [expected[p] for p in prompts]
    delta = {k: v - before.get(k, 0.0) for k, v in metrics(server).items()}
    assert delta["dflash_generated_tokens_total"] == MAX_NEW * (1 + len(prompts))
    assert delta["dflash_accepted_tokens_total"] > 0 and delta["dflash_plain_steps_total"] == 0  # every step drafts


def test_http_and_grpc_streams_concatenate_to_the_greedy_text(server, expected):
    prompt = list(expected)[1]
    events = stream(server, body(prompt))
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == expected[prompt]
    chunks = grpc_stream(server['ends'].grpc_port, prompt, MAX_NEW, exclude_input=True)
    assert all(isinstance(c, str) for c in chunks), chunks
    assert len(chunks) > 1 and "".join(chunks) == expected[prompt]


def test_openai_completions_are_the_greedy_text(server, expected, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from trtllm_dflash.engine.loader import free_port
    from trtllm_dflash.serve.openai.process import start_frontend, wait_frontend
    from trtllm_dflash.serve.openai.server import FrontendSettings
    from trtllm_dflash.serve.server import stop_process

    settings = FrontendSettings(str(server["engine"]), f"127.0.0.1:{server['ends'].grpc_port}", "dflash",
                                port=free_port())
    with open(tmp_path / "frontend.log", "w") as log:
        proc = start_frontend(settings, log)
        try:
            wait_frontend(proc, settings, timeout=180)
            client = openai.OpenAI(base_url=f"{settings.url}/v1", api_key="unused", max_retries=0, timeout=120)
            prompt = list(expected)[2]
            whole = client.completions.create(model="dflash", prompt=prompt, max_tokens=MAX_NEW, temperature=0,
                                              extra_body={"ignore_eos": True})
            assert whole.choices[0].text == expected[prompt]
            assert whole.usage.completion_tokens == MAX_NEW and whole.usage.model_extra["dflash"]["draft_steps"] > 0
            streamed = client.completions.create(model="dflash", prompt=prompt, max_tokens=MAX_NEW, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
            assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == expected[prompt]
        finally:
            code = stop_process(proc, grace=15)
    assert code == 0, (tmp_path / "frontend.log").read_text()[-2000:]


def test_dflash_bench_records_the_served_method(server, tmp_path):
    from trtllm_dflash.cli.bench import main

    ends, run = server["ends"], tmp_path / "run"
    assert main(["sweep", "--url", ends.http_url, "--model", "dflash", "--tokenizer", str(server["engine"]),
                 "--metrics-url", ends.metrics_url, "--concurrency", "2", "--prompts-per-point", "2", "--isl", "24",
                 "--osl", "16", "--warmup", "1", "--output", str(run), "--no-progress"]) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["drafter_method"] == "dflash2"
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["ok"] and r["osl_server"] == 16 for r in rows)
    assert sum(r["server_accepted_draft_tokens"] for r in rows) > 0
