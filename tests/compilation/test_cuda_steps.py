"""The step modes on a CUDA GPU: skipped without one (this project's CI has none; run it where a GPU is lent:
`pytest tests/compilation/test_cuda_steps.py`).

- Greedy output on the GPU equals transformers' greedy output on the same GPU, in every step mode, while
  requests join and leave and draft lengths change (a float32 pair, so both sides compute alike); compiled
  modes' prefill and cached passes really compiled (none fell back to eager).
- cuda-graphs mode really runs CUDA graphs: inductor skipped cudagraphs for no graph (it skips them silently,
  with a log line, for e.g. mutated inputs without static addresses), and a warmed-up engine compiles nothing
  more.
- A decode step synchronises with the host once: reading the emitted tokens (the issue's
  `torch.cuda.set_sync_debug_mode` check; "warn" counts them where "error" would stop at the first).
"""

import warnings

import pytest
import torch
from helpers.scripted import Cycle
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.draft_length.policy import FixedDraftLen

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MODES = ("eager", "compile", "cuda-graphs")


@pytest.fixture(scope="module")
def oracle_outputs(pair, prompts):
    """transformers' greedy continuation of each prompt on the GPU, by full recomputation."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(pair[0]).eval().to("cuda")
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids, out = torch.tensor([prompt], device="cuda"), []
            for _ in range(24):
                nxt = model(ids).logits[0, -1].argmax().view(1, 1)
                out.append(int(nxt))
                ids = torch.cat([ids, nxt], dim=1)
            outputs.append(out)
    return outputs


@pytest.fixture(scope="module")
def pipelines(pair):
    """One pipeline per step mode for the module: each mode's graphs compiled (or loaded) once per run."""
    loaded = {}

    def get(mode: str):
        if mode not in loaded:
            loaded[mode] = load_pipeline(*pair, device="cuda", step_mode=mode)
        return loaded[mode]

    return get


def cudagraph_skips() -> int:
    return torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


@pytest.mark.parametrize("mode", MODES)
def test_greedy_output_on_the_gpu_is_the_targets_in_every_step_mode(pipelines, prompts, oracle_outputs, mode):
    skips = cudagraph_skips()
    generator = pipelines(mode).generator
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    generator.policy = Cycle()
    generator.allocate(3, 128, generator.block)
    pending = [Request(tuple(p), 24, ignore_eos=True) for p in prompts]
    done = []
    while pending or generator.slots.running:  # 5 requests through 3 slots: joins, leaves, moves
        room = min(len(generator.slots.free()), len(pending))
        if room:
            done += generator.admit(pending[:room])
            del pending[:room]
        generator.step()
    by_prompt = {s.request.prompt_ids: s.result.output_ids for s in done}
    assert [by_prompt[tuple(p)] for p in prompts] == oracle_outputs
    assert cudagraph_skips() == skips  # every compiled graph ran as a CUDA graph (or there were none)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs  # nothing compiled after load
    assert mode == "eager" or not (generator.prefill_pass.failed or generator.verify_pass.failed)  # none fell back


@pytest.mark.parametrize("mode", ("eager", "cuda-graphs"))
def test_a_decode_step_synchronises_once(pipelines, prompts, mode):
    generator = pipelines(mode).generator
    generator.allocate(2, 128, generator.block)
    generator.admit([Request(tuple(p), 40, ignore_eos=True) for p in prompts[1:3]])
    for k in (0, 15, 3):  # each kind of step once before counting (first calls may allocate)
        generator.policy = FixedDraftLen(k)
        generator.step()
    counts = []
    for k in (0, 15, 3, 0):
        generator.policy = FixedDraftLen(k)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                generator.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    assert counts == [1, 1, 1, 1]
