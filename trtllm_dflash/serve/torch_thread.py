"""One thread for all of a serving process's torch work: loading, warm-up, calibration and every step.

Why one: torch's CPU wheels run intra-op parallelism on GNU OpenMP, which gives every thread that
opens a parallel region its own pool of worker threads. A server that loads the engine on one thread
(Triton's `initialize`) and steps it on another (the serving loop) owns two pools; once libgomp
manages more threads than the process has cores it throttles its spin-waiting (GOMP_SPINCOUNT's
"throttled" value), and every small op's fork/join then sleeps and wakes its workers (consistent with
what we see: OMP_WAIT_POLICY=passive makes one pool as slow as two). Measured on
the built-in pair (2 cores, 2 threads, batch 16; benchmarks/results/torch_thread_steps.json): a plain
step 9.1 ms instead of 5.3 ms (1.63x, 1.60-1.90 over 3 repeats) and a drafting step (k = 8) 40.5 ms
instead of 18.8 ms (2.09x); the step-cost model calibrated on the loading thread (5.4 and 20.5 ms) then
mispredicted the serving thread's steps, unevenly in k, and the policy drafted where it lost. Doing
everything on this thread keeps one pool. Requests still arrive on Triton's threads; they only queue work for this one.
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
