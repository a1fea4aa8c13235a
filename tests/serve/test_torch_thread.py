"""The serving process's one torch thread: loading, calibration and steps all run on it."""

import threading

import pytest
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.draft_length.policy import FixedDraftLen
from trtllm_dflash.serve.loop import ServeRequest, ServingLoop
from trtllm_dflash.serve.torch_thread import TorchThread


def test_calls_run_in_order_on_one_thread_and_raise_where_they_wait():
    worker = TorchThread("t")
    seen = [worker.call(threading.current_thread) for _ in range(3)]
    assert seen == [worker.thread] * 3 and worker.thread is not threading.current_thread()
    order = []
    futures = [worker.submit(lambda i=i: order.append(i)) for i in range(5)]
    [f.result(10) for f in futures]
    assert order == [0, 1, 2, 3, 4]
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
    assert worker.call(lambda: worker.call(lambda: 7)) == 7  # a call from the thread itself runs inline
    assert worker.thread.is_alive()  # an exception does not end it


class RecordingPolicy(FixedDraftLen):
    """Notes the thread of `prepare` (where a policy sizes its state) and of every `choose` (a step)."""

    def __init__(self):
        super().__init__()
        self.threads = []

    def prepare(self, generator):
        self.threads.append(("prepare", threading.current_thread()))

    def choose(self, batch):
        self.threads.append(("choose", threading.current_thread()))
        return super().choose(batch)


class Responder:
    def __init__(self):
        self.done = threading.Event()
        self.outputs = None

    def send(self, outputs, final):
        if final:
            self.outputs = outputs
            self.done.set()

    def error(self, message):
        raise AssertionError(message)

    def cancelled(self):
        return False


def test_serving_loop_allocates_and_steps_on_the_thread_that_loaded(builtin):
    worker = TorchThread()
    pipe = worker.call(lambda: load_pipeline(*builtin))
    policy = pipe.generator.policy = RecordingPolicy()
    loop = ServingLoop(pipe.generator, pipe.tokenizer, 2, 128, 4, torch_thread=worker)
    loop.start()
    try:
        responder = Responder()
        ids = tuple(pipe.tokenizer.encode("def add(a, b):", add_special_tokens=False))
        loop.submit(ServeRequest(Request(ids, 8, ignore_eos=True), "def add(a, b):", False, True, (), responder))
        assert responder.done.wait(120)
    finally:
        loop.stop()
    assert responder.outputs["num_output_tokens"] == 8
    kinds = {kind for kind, _ in policy.threads}
    assert kinds == {"prepare", "choose"} and {t for _, t in policy.threads} == {worker.thread}
