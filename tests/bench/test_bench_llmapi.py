"""dflash-bench's Triton HTTP client against a stand-in for TensorRT-LLM's llmapi model (real HTTP on loopback).

That model streams the whole text so far in each response, declares no `sampling_param_ignore_eos`
and no `num_output_tokens`, and sends its speculative-decoding metrics as strings when asked for
perf metrics: the client must send only declared inputs and count tokens of the new text only.
"""

import asyncio
import json

from helpers.bench_fakes import LoopbackServer, byte_tokenizer, read_jsonl

from trtllm_dflash.bench.spec import SweepSpec
from trtllm_dflash.bench.sweep import run_sweep

INPUTS = ["text_input", "streaming", "sampling_param_max_tokens", "sampling_param_temperature",
          "sampling_param_exclude_input_from_output", "sampling_param_return_perf_metrics", "return_finish_reason"]
OUTPUTS = ["text_output", "finish_reason", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"]


class FakeLlmapi(LoopbackServer):
    model = "tensorrt_llm"

    def routes(self, app):
        from aiohttp import web

        meta = {"name": self.model, "versions": ["1"], "platform": "python",
                "inputs": [{"name": n, "datatype": "BYTES", "shape": [-1]} for n in INPUTS],
                "outputs": [{"name": n, "datatype": "BYTES", "shape": [-1]} for n in OUTPUTS]}

        async def ok(request):
            return web.Response()

        async def metadata(request):
            return web.json_response(meta)

        app.router.add_get("/v2/health/ready", ok)
        app.router.add_get(f"/v2/models/{self.model}", metadata)
        app.router.add_get(f"/v2/models/{self.model}/ready", ok)
        app.router.add_post(f"/v2/models/{self.model}/generate_stream", self.generate)

    async def generate(self, request):
        from aiohttp import web

        body = await request.json()
        self.requests.append((request.path, body))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        text, n = "", body["sampling_param_max_tokens"]
        for step in range(0, n, 3):  # three tokens a step, the whole text so far in every response
            await asyncio.sleep(0.01)
            text += "y" * min(3, n - step)
            event = {"model_name": self.model, "model_version": "1", "text_output": text}
            if len(text) == n:
                event.update(finish_reason="length")
                if body.get("sampling_param_return_perf_metrics"):
                    event.update(acceptance_rate="0.5", total_accepted_draft_tokens="4", total_draft_tokens="8")
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        return resp


def test_llmapi_model_streams_whole_texts_and_string_metrics(tmp_path):
    tok = byte_tokenizer(tmp_path / "tok")
    logs = []
    with FakeLlmapi() as server:
        spec = SweepSpec(url=server.url, model="tensorrt_llm", concurrency=(2,), prompts_per_point=4, warmup=0,
                         isl=10, osl=12, tokenizer=str(tok), output=str(tmp_path / "run"), metrics_url="none")
        result = run_sweep(spec, progress=False, log=logs.append)
    for _, body in server.requests:
        assert set(body) <= set(INPUTS)  # nothing it does not declare (no ignore_eos)
        assert body["sampling_param_return_perf_metrics"] is True and body["streaming"] is True
        assert body["sampling_param_exclude_input_from_output"] is True
    assert any("declares no input 'sampling_param_ignore_eos'" in line for line in logs)
    rows = read_jsonl(tmp_path / "run" / "requests.jsonl")
    for r in rows:
        assert r["ok"] and r["chunks"] == 4
        assert r["osl_tokenizer"] == r["osl"] == 12 and r["osl_server"] is None  # not 3 + 6 + 9 + 12
        assert (r["server_accepted_draft_tokens"], r["server_draft_tokens"]) == (4, 8)
    point = result.points[0]
    assert point["acceptance_rate_responses"] == 0.5 and point["acceptance_rate"] is None  # no counters scraped
    assert point["output_tokens"] == 48


def test_new_text_from_whole_or_new_text_streams():
    from trtllm_dflash.bench.triton_client import NewText

    whole = NewText(cumulative=True)
    assert [whole(t) for t in ("ab", "abcd", "abcd", "abcX", "abcXYZ")] == ["ab", "cd", "", "X", "YZ"]
    new = NewText(cumulative=False)
    assert [new(t) for t in ("ab", "ab", "c")] == ["ab", "ab", "c"]
