"""Serving pieces that need no server: the loop with fake responders, repositories, launch scripts."""

import time

import pytest
import yaml
from helpers.serve_fakes import FakeResponder, wait_final
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from helpers.tiny_pair import held_out_prompts
from trtllm_dflash.serve.failures import CANCELLED
from trtllm_dflash.serve.loop import ServeRequest, ServingLoop, first_stop
from trtllm_dflash.serve.repository import ServeSettings, validate_pbtxt, write_repository
from trtllm_dflash.utils.errors import DFlashError


@pytest.fixture
def loop_factory(builtin):
    loops = []

    def make(**kw):
        pipe = load_pipeline(*builtin)
        loop = ServingLoop(pipe.generator, pipe.tokenizer, kw.get("batch", 2), 256, kw.get("queue", 8))
        loops.append(loop)
        return loop, pipe.tokenizer

    yield make
    for loop in loops:
        loop.stop()


def serve_request(tok, prompt, responder, stream=False, stops=(), max_new=16):
    ids = tuple(tok.encode(prompt, add_special_tokens=False))
    return ServeRequest(Request(ids, max_new, ignore_eos=True), prompt, stream, False, stops, responder)


def test_queue_limit_answers_overloaded_at_once(loop_factory):
    loop, tok = loop_factory(batch=1, queue=2)  # not started: nothing leaves the queue
    responders = [FakeResponder() for _ in range(3)]
    for r in responders:
        loop.submit(serve_request(tok, "abc", r))
    assert responders[2].errors and responders[2].errors[0].startswith("overloaded: 2 requests already waiting")
    assert not responders[0].final and not responders[1].final


def test_stop_string_truncates_and_finishes(loop_factory):
    loop, tok = loop_factory()
    loop.start()
    prompt = bytes(held_out_prompts(1)[0]).decode()
    free = FakeResponder()
    loop.submit(serve_request(tok, prompt, free, max_new=24))
    wait_final([free])
    generated = free.sent[-1]["text_output"][len(prompt):]
    stop = generated[5:7]
    cut = FakeResponder()
    loop.submit(serve_request(tok, prompt, cut, stops=(stop,), max_new=24))
    wait_final([cut])
    assert cut.sent[-1]["text_output"] == prompt + generated[: generated.find(stop)]
    assert cut.sent[-1]["finish_reason"] == "stop"


def test_cancelled_client_frees_its_slot_and_is_answered(loop_factory):
    loop, tok = loop_factory(batch=1)
    loop.start()
    gone, next_one = FakeResponder(cancel_after=2), FakeResponder()
    loop.submit(serve_request(tok, "abcdef", gone, stream=True, max_new=200))
    loop.submit(serve_request(tok, "ghijkl", next_one))  # waits for the only slot
    wait_final([gone, next_one])
    assert gone.errors == ["request cancelled by the client"]
    assert next_one.sent[-1]["num_output_tokens"] == 16 and loop.counters.failed == 1


def test_requests_without_the_drafters_context_are_counted(loop_factory):
    """dflash_plain_only_requests_total: a request admitted plain-only, and one that stops drafting alone, are
    counted when they finish; one that keeps its context to the end is not."""
    from trtllm_dflash.draft_length.policy import DraftLenPolicy

    class Scripted(DraftLenPolicy):
        def __init__(self):
            self.admit_plain, self.keep = False, True

        def choose(self, batch):
            return 0

        def drafts_for(self, batch):
            return not self.admit_plain

        def keeps_context(self, batch):
            return [self.keep] * len(batch.slots)

    loop, tok = loop_factory(batch=1)
    policy = loop.generator.policy = Scripted()
    loop.start()
    for admit_plain, keep, counted in ((False, True, 0), (True, True, 1), (False, False, 2)):
        policy.admit_plain, policy.keep = admit_plain, keep
        done = FakeResponder()
        loop.submit(serve_request(tok, "def f():", done, max_new=8))
        wait_final([done])
        assert done.sent[-1]["num_output_tokens"] == 8 and loop.counters.plain_only_requests == counted


def test_a_step_with_plain_only_rows_beside_drafting_ones_counts_as_drafting(loop_factory):
    """dflash_plain_steps_total and the draft-length histogram take the step's draft length, not the first row's:
    a plain-only request in slot 0 drafts nothing in a step where the request beside it drafts 4."""
    from trtllm_dflash.draft_length.policy import DraftLenPolicy

    class Scripted(DraftLenPolicy):
        plain_admissions = 1

        def choose(self, batch):
            return 4

        def drafts_for(self, batch):
            self.plain_admissions -= 1
            return self.plain_admissions < 0

    loop, tok = loop_factory(batch=2)
    loop.generator.policy = Scripted()
    lengths, step = [], loop.generator.step

    def recording():  # each step's draft length per slot
        ran = step()
        lengths.append({seq.slot: seq.result.draft_lengths[-1] for seq in ran})
        return ran

    loop.generator.step = recording
    seen = []
    loop.on_step = seen.append
    first, second = FakeResponder(), FakeResponder()
    loop.submit(serve_request(tok, "def f():", first, max_new=12))
    loop.iterate()  # admitted plain-only, alone: a plain step
    loop.submit(serve_request(tok, "import os", second, max_new=6))
    while not (first.final and second.final):
        loop.iterate()
    assert {0: 0, 1: 4} in lengths  # a mixed step ran
    assert seen == [max(step.values()) for step in lengths]
    assert loop.counters.plain_steps == sum(max(step.values()) == 0 for step in lengths) < len(lengths)


def test_metrics_reach_the_exporter_in_batches_and_before_each_final_answer(loop_factory):
    """Each exporter call is a round trip to Triton's server process: steps are not exported one by one, yet a
    client holding its final answer finds its request, tokens and every step so far exported."""
    loop, tok = loop_factory(batch=1)
    exported, steps, at_final, calls = {}, [], [], []

    def update(counters, delta):
        calls.append(delta)
        for key, value in delta.items():
            exported[key] = exported.get(key, 0) + value

    class Checking(FakeResponder):
        def send(self, outputs, final):
            if final:
                at_final.append((dict(exported), len(steps), loop.counters.decode_steps))
            super().send(outputs, final)

    loop.on_update, loop.on_step = update, steps.append
    responders = [Checking() for _ in range(2)]
    for r in responders:
        loop.submit(serve_request(tok, "def f():", r, max_new=32))
    while not all(r.final for r in responders):
        loop.iterate()
    assert [n for _, n, _ in at_final] == [s for _, _, s in at_final]  # every step's draft length exported
    first, second = at_final[0][0], at_final[1][0]
    assert first["requests"] == 1 and first["generated_tokens"] == 32 and second["generated_tokens"] == 64
    assert first["decode_steps"] == at_final[0][2] and second["decode_steps"] == at_final[1][2]
    assert len(calls) < loop.counters.decode_steps  # exporter round trips: not one per step


def test_a_refused_send_to_a_client_gone_between_polls_cancels_only_its_request(loop_factory):
    """Between two cancellation polls a client may go away and Triton refuse its next response: that request is
    cancelled and still ends with a final (error) response, which is what frees Triton's hold on it; the one beside
    it finishes untouched."""
    loop, tok = loop_factory(batch=2)

    class Gone(FakeResponder):
        def send(self, outputs, final):
            if self.sent:
                raise RuntimeError("stream closed")
            super().send(outputs, final)

        def cancelled(self):
            return bool(self.sent)

    loop.polled_s = time.monotonic() + 3600  # no poll during the test: only the refused send can find it
    gone, other = Gone(), FakeResponder()
    loop.submit(serve_request(tok, "abcdef", gone, stream=True, max_new=64))
    loop.submit(serve_request(tok, "ghijkl", other, max_new=16))
    while not other.final or loop.generator.slots.running:
        loop.iterate()
    assert other.sent[-1]["num_output_tokens"] == 16 and not other.errors
    assert len(gone.sent) == 1 and loop.counters.failed == 1
    assert gone.final and gone.errors == [CANCELLED]


def test_a_refused_final_answer_does_not_stop_the_loop_answering_the_others(builtin, tmp_path):
    """A client gone before the shutdown's final answer may have it refused (Triton raises): the loop must still
    answer every other request and keep running. A loop that died there left the others' requests held, and
    Triton then never unloads the model (the stop waits, and tritonserver exits 1)."""
    class Refusing(FakeResponder):
        def error(self, message):
            raise RuntimeError("Unable to send response: the stream is gone")

    pipe = load_pipeline(*builtin)
    stop_file = tmp_path / "stop"
    loop = ServingLoop(pipe.generator, pipe.tokenizer, 2, 256, 8, stop_file=str(stop_file))
    loop.start()
    try:
        gone, kept, queued = Refusing(), FakeResponder(), FakeResponder()
        for responder in (gone, kept, queued):  # the batch holds two: the third waits in the queue
            loop.submit(serve_request(pipe.tokenizer, "def f():", responder, stream=True, max_new=200))
        deadline = time.monotonic() + 120
        while not (gone.sent and kept.sent):
            assert time.monotonic() < deadline, "the requests did not start"
            time.sleep(0.01)
        stop_file.touch()
        wait_final([kept, queued])
        assert "shutting down" in kept.errors[0] and "shutting down" in queued.errors[0]
        assert not loop.running.done(), loop.running.exception()
    finally:
        loop.stop()


def test_cancellation_is_polled_not_asked_every_step(loop_factory):
    """Asking a client whether it left is a round trip too: at most one poll per CANCEL_POLL_S."""
    from trtllm_dflash.serve import loop as loop_module

    loop, tok = loop_factory(batch=1)
    asked = []

    class Counting(FakeResponder):
        def cancelled(self):
            asked.append(time.monotonic())
            return False

    done = Counting()
    loop.submit(serve_request(tok, "def f():", done, max_new=64))
    start = time.monotonic()
    while not done.final:
        loop.iterate()
    polls_allowed = (time.monotonic() - start) / loop_module.CANCEL_POLL_S + 1
    assert 1 <= len(asked) <= polls_allowed and len(asked) < loop.counters.decode_steps

def test_first_stop():
    assert first_stop("hello world", ("wor", "lo")) == 3
    assert first_stop("hello", ("x", "")) is None


def test_torch_repository_config_is_valid_triton_config(builtin, engine_factory, tmp_path):

    engine = engine_factory.get(*builtin)
    model = write_repository(engine, tmp_path / "repo", ServeSettings("m", 4, 10))
    config = validate_pbtxt((model / "config.pbtxt").read_text())
    assert config.backend == "python" and config.model_transaction_policy.decoupled
    assert {i.name for i in config.input} >= {"text_input", "streaming", "sampling_param_max_tokens",
                                              "sampling_param_ignore_eos", "sampling_param_stop"}
    assert config.parameters["max_batch_size"].string_value == "4"
    assert config.parameters["admission_wait_ms"].string_value == "50.0"  # serve/admission.py's default hold
    assert "trtllm_dflash.serve.triton_model" in (model / "1" / "model.py").read_text()


def test_trtllm_repository_and_launch_scripts(builtin, engine_factory, tmp_path):
    from trtllm_dflash.cli.serve import main as serve_main

    engine = engine_factory.get(*builtin, backend="trtllm", tp=2)
    repo = tmp_path / "repo"
    assert serve_main([str(engine), "--model-repo", str(repo), "--write-only", "--model-name", "llm"]) == 0
    config = validate_pbtxt((repo / "llm" / "config.pbtxt").read_text())
    assert [o.name for o in config.output][:2] == ["text_output", "finish_reason"]
    model_yaml = yaml.safe_load((repo / "llm" / "1" / "model.yaml").read_text())
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert model_yaml["speculative_config"]["decoding_type"] == "DFlash"
    assert model_yaml["model"] == str(engine / "target") and model_yaml["tensor_parallel_size"] == 2
    assert not (repo / "llm" / "1" / "model.py").exists()  # TensorRT-LLM's own, copied at launch
    # the launch scripts beside the repository: their contents are tested in tests/serve/test_launch.py
    assert {"launch_single_node.sh", "launch_slurm.sbatch", "bench_job.sh"} <= {p.name for p in repo.iterdir()}


def test_plain_decoding_repositories(builtin, engine_factory, tmp_path):
    """--decoding plain: the torch model gets the parameter, a trtllm model.yaml loses its speculative config."""

    engine = engine_factory.get(*builtin)
    model = write_repository(engine, tmp_path / "repo", ServeSettings("m", decoding="plain"))
    assert validate_pbtxt((model / "config.pbtxt").read_text()).parameters["decoding"].string_value == "plain"
    trt = engine_factory.get(*builtin, backend="trtllm")
    model = write_repository(trt, tmp_path / "repo2", ServeSettings("m", decoding="plain"))
    assert "speculative_config" not in yaml.safe_load((model / "1" / "model.yaml").read_text())
    with pytest.raises(DFlashError, match="--admission-wait-ms 10 applies to torch engines"):
        write_repository(trt, tmp_path / "repo3", ServeSettings("m", admission_wait_ms=10))
    with pytest.raises(DFlashError, match="--decoding must be one of dflash, plain, got 'eagle'"):
        ServeSettings("m", decoding="eagle")


def test_plain_engine_decodes_like_dflash_without_a_drafter(builtin, engine_factory, tmp_path):
    from trtllm_dflash.engine.loader import load_engine
    from trtllm_dflash.engine.request import Request

    from helpers.tiny_pair import held_out_prompts

    engine = engine_factory.get(*builtin)
    requests = [Request(tuple(p), 24, ignore_eos=True) for p in held_out_prompts()[:3]]
    plain, spec = load_engine(engine, decoding="plain"), load_engine(engine)
    assert plain.drafter is None
    plain_out, spec_out = plain.generator.generate(requests), spec.generator.generate(requests)
    assert [r.output_ids for r in plain_out] == [r.output_ids for r in spec_out]
    assert all(r.drafted_tokens == 0 for r in plain_out) and sum(r.drafted_tokens for r in spec_out) > 0


def test_serve_help_describes_every_option():
    from trtllm_dflash.cli.serve import parser

    assert [a.dest for a in parser()._actions if not a.help] == []


def test_step_mode_reaches_the_served_model_and_bad_ones_fail_early(builtin, engine_factory, tmp_path):
    """--step-mode is a model parameter (the Triton model loads the engine in it); an unknown mode, and a compiled
    one for a tensor-parallel torch engine (its served ranks run eager), fail when the repository is written."""

    engine = engine_factory.get(*builtin)
    model = write_repository(engine, tmp_path / "repo", ServeSettings("m", step_mode="compile"))
    assert validate_pbtxt((model / "config.pbtxt").read_text()).parameters["step_mode"].string_value == "compile"
    with pytest.raises(DFlashError, match="--step-mode must be one of auto, eager, compile, cuda-graphs, got 'fast'"):
        ServeSettings("m", step_mode="fast")
    tp2 = engine_factory.get(*builtin, tp=2)
    with pytest.raises(DFlashError, match="--step-mode compile: a served tensor-parallel torch engine .tp_size 2. "
                                          "runs eager"):
        write_repository(tp2, tmp_path / "repo2", ServeSettings("m", step_mode="compile"))
    assert write_repository(tp2, tmp_path / "repo3", ServeSettings("m", step_mode="eager")).is_dir()
