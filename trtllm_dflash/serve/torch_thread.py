"""One thread for all of a serving process's torch work: loading, warm-up, calibration and every step.

Why one: torch's CPU wheels run intra-op parallelism on GNU OpenMP, which gives every thread that opens a parallel
region its own pool of worker threads. A server that loads the engine on one thread (Triton's `initialize`) and
steps it on another (the serving loop) owns two pools; once libgomp manages more threads than the process has
cores it throttles its spin-waiting (GOMP_SPINCOUNT's "throttled" value), and every small op's fork/join sleeps
and wakes its workers. Steps then run far slower than calibrated on the loading thread, unevenly in k, and the
policy drafts where it loses (benchmarks/results/torch_thread_steps.json). Requests still arrive on Triton's
threads; they only queue work for this one.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

T = TypeVar("T")


class TorchThread:
    """A daemon thread that runs submitted callables one after another (the serving loop last: it runs
    until told to stop)."""

    def __init__(self, name: str = "dflash-torch"):
        self.tasks: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.work, name=name, daemon=True)
        self.thread.start()

    def work(self) -> None:
        while True:
            fn, future = self.tasks.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, who re-raises it where it waits
                future.set_exception(exc)

    def submit(self, fn: Callable[[], T]) -> Future:
        """Queue fn; -> its future."""
        future: Future = Future()
        self.tasks.put((fn, future))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on this thread and wait for it; its exception is raised here. On this thread itself, at once."""
        if threading.current_thread() is self.thread:
            return fn()
        return self.submit(fn).result()
