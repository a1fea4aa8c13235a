"""The serving loop behind the Triton model: a queue, inflight batching, streamed text, counters.

Free of Triton so it can be tested with fake responders. One background thread owns the
generator (the process's torch thread, torch_thread.py: the engine should be loaded on it too):
between steps it admits queued requests into free slots, after each step it sends every request
its new text (streaming) or its whole answer (when finished).
"""

from __future__ import annotations

import faulthandler
import os
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Protocol

from ..engine.generator import Generator
from ..engine.request import Request
from ..engine.sequence import Sequence
from ..utils.errors import DFlashError
from .admission import AdmissionGate, AdmissionSettings, fixed_cost
from .failures import CANCELLED, INTERNAL_ERROR, OVERLOADED, SHUTTING_DOWN
from .lockstep import RankLost
from .torch_thread import TorchThread

STEP_IDLE_S = 0.005  # how long the loop sleeps when nothing is queued or running
# Host work between steps is kept off the per-step path: every metric update and cancellation check is a
# round trip to the Triton server process, so counts reach the exporter in batches, clients are polled, and a
# non-streaming request without stop strings is decoded once, at its end.
METRICS_FLUSH_S = 0.25  # counts of running steps are exported at least this often (and before every final answer)
CANCEL_POLL_S = 0.05  # a client that went away is noticed within this long (its slot freed)


class Responder(Protocol):
    """Where one request's responses go (a Triton response sender, or a test fake)."""

    def send(self, outputs: dict, final: bool) -> None: ...
    def error(self, message: str) -> None: ...
    def cancelled(self) -> bool: ...


@dataclass
class ServeRequest:
    request: Request
    prompt_text: str
    streaming: bool
    exclude_input: bool
    stop_strings: tuple[str, ...]
    responder: Responder
    arrival_ns: int = field(default_factory=time.time_ns)
    sent_text: str = ""  # streamed so far (generated text only)
    first_token_ns: int = 0
    admissible_s: float | None = None  # time.monotonic() when the loop first had a free slot for it


@dataclass
class Counters:
    """Monotonic totals and current gauges, exported as Prometheus metrics by the Triton model."""

    requests: int = 0
    failed: int = 0
    generated_tokens: int = 0
    draft_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int = 0  # batch steps of the generator
    plain_steps: int = 0  # ... of which drafted nothing (the policy's k = 0)
    plain_only_requests: int = 0  # finished requests that ended without the drafter's context
    running: int = 0
    queued: int = 0
    # the KV pool (Generator.pool_stats): totals, and gauges
    prefix_hit_tokens: int = 0
    prefix_tokens: int = 0
    prefix_hit_requests: int = 0
    prefix_requests: int = 0
    preemptions: int = 0
    kv_blocks_used: int = 0
    kv_blocks: int = 0


POOL_TOTALS = {"prefix_hit_tokens": "hit_tokens", "prefix_tokens": "queried_tokens",
               "prefix_hit_requests": "hit_requests", "prefix_requests": "queried_requests", "preemptions": "preemptions"}


class ServingLoop:
    def __init__(self, generator: Generator, tokenizer, max_batch_size: int, max_seq_len: int, max_queue: int,
                 on_update=None, on_step=None, stop_file: str | None = None, torch_thread: TorchThread | None = None,
                 admission: AdmissionSettings = AdmissionSettings(), ranks_lost=None, on_lost=None):
        self.generator, self.tokenizer = generator, tokenizer
        # a tensor-parallel engine: `ranks_lost()` -> why its ranks can no longer step together, else None (checked
        # while idle; a step meets the loss itself); `on_lost(why)` once, after everything in flight has failed
        self.ranks_lost = ranks_lost or (lambda: None)
        self.on_lost = on_lost or (lambda why: None)
        self.lost: str | None = None
        # dflash-serve creates this file to begin a shutdown: Triton unloads a model only once its requests
        # are over, so the loop must end them first (each gets a final SHUTTING_DOWN response)
        self.stop_file = stop_file
        self.draining = False
        self.max_queue = max_queue
        self.pending: queue.Queue[ServeRequest] = queue.Queue()
        self.waiting: list[ServeRequest] = []  # taken from `pending` (the loop's own), each with a free slot for it
        self.counters = Counters()
        self.counting = threading.Lock()  # count() runs on Triton's threads too (rejections)
        self.unexported: dict[str, int] = {}  # counts since the last export
        self.unexported_steps: list[int] = []  # the draft length of each step since the last export
        self.exported_s = self.polled_s = 0.0  # time.monotonic() of the last export, of the last cancellation poll
        self.on_update = on_update or (lambda counters, delta: None)
        self.on_step = on_step or (lambda draft_len: None)  # the draft length of every batch step
        self.torch_thread = torch_thread or TorchThread("dflash-serving-loop")
        # on the thread that steps, as every torch call of the serving process (torch_thread.py)
        self.torch_thread.call(lambda: generator.allocate(max_batch_size, max_seq_len, generator.block))
        fixed = self.torch_thread.call(lambda: fixed_cost(generator)) if admission.max_wait_s > 0 else 0.0
        self.gate = AdmissionGate(fixed, admission)
        self.stopping = threading.Event()
        self.running: Future | None = None

    def start(self) -> None:
        self.running = self.torch_thread.submit(self.run)

    def submit(self, req: ServeRequest) -> None:
        """Queue a validated request, or answer at once when it cannot be served."""
        if self.draining:
            return self.reject(req.responder, f"{SHUTTING_DOWN}: not accepting requests")
        if self.lost is not None:
            return self.reject(req.responder, self.lost)
        try:
            self.generator.validate(req.request)
        except DFlashError as exc:
            return self.reject(req.responder, str(exc))
        waiting = self.queued()
        if waiting >= self.max_queue:
            return self.reject(req.responder, f"{OVERLOADED}: {waiting} requests already waiting "
                                    f"(max queue {self.max_queue}); retry later")
        self.pending.put(req)

    def reject(self, responder: Responder, message: str) -> None:
        self.count(failed=1)
        self.export()  # a client that got its answer sees it counted
        end_with_error(responder, message)

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel everything in flight and queued, then end the thread."""
        self.stopping.set()
        if self.running is not None and wait([self.running], timeout).not_done:  # started and still running
            print(f"warning: the serving loop did not end within {timeout:g} s of the stop; where its threads are:",
                  file=sys.stderr, flush=True)
            try:
                faulthandler.dump_traceback(sys.stderr, all_threads=True)  # the model's stderr: the server's log
            except (AttributeError, ValueError, OSError):  # a stderr without a file descriptor
                pass
        elif self.running is not None and self.running.exception() is not None:  # ended early: requests were left
            print("warning: the serving loop had ended with an error:", file=sys.stderr, flush=True)
            traceback.print_exception(self.running.exception(), file=sys.stderr)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.turn()
            except RankLost as exc:
                self.lose(str(exc))
            except Exception as exc:  # keep serving: fail the requests in flight, not the server
                self.fail_running(f"{INTERNAL_ERROR}: {type(exc).__name__}: {exc}")
        self.shutdown()

    def turn(self) -> None:
        """One pass of the loop: a step (with admissions), or, once stopping or a rank is lost, the ending of
        whatever is in flight or queued."""
        if self.draining or self.stop_requested():
            return self.drain()
        if self.lost is not None:  # nothing can step: end what arrives until dflash-serve stops the server
            self.shutdown(self.lost)
            return time.sleep(STEP_IDLE_S)
        self.iterate()

    def lose(self, why: str) -> None:
        """A rank died: every request in flight or queued fails with `why`, then the model says so (on_lost)."""
        self.lost = why
        self.shutdown(why)
        self.publish()
        self.on_lost(why)

    def stop_requested(self) -> bool:
        return self.stop_file is not None and os.path.exists(self.stop_file)  # one stat() per step

    def drain(self) -> None:
        """Shutdown has begun: end what runs and waits (also what `submit` raced into the queue)."""
        self.draining = True
        self.shutdown()
        self.publish()
        time.sleep(STEP_IDLE_S)

    def iterate(self) -> None:
        self.admit()
        if not self.generator.live():
            why = self.ranks_lost()
            if why is not None:
                raise RankLost(why)
            time.sleep(STEP_IDLE_S)
            return
        self.drop_cancelled()
        ran = self.generator.step()
        if ran:
            k = max(seq.result.draft_lengths[-1] for seq in ran)  # the step's: plain-only rows draft 0 in it
            self.count(decode_steps=1, plain_steps=int(k == 0), draft_len=k)
        for seq in ran:
            self.respond(seq)
        self.publish()

    def fail_running(self, message: str) -> None:
        for seq in self.generator.live():
            self.fail(seq, "error")
            self.export()
            end_with_error(seq.tag.responder, message)

    def fail(self, seq: Sequence, reason: str) -> None:
        """End `seq` unfinished, counted as failed (through count(), so the Prometheus counter sees it too)."""
        self.generator.cancel(seq, reason)
        self.count(failed=1)

    def queued(self) -> int:
        """Requests not yet admitted (read from Triton's threads too: a list's length is one atomic read)."""
        return self.pending.qsize() + len(self.waiting)

    def admit(self) -> None:
        """Admit the requests that have free slots and KV blocks, when the gate says so (admission.py)."""
        free, now = self.generator.num_free(), time.monotonic()
        while len(self.waiting) < free:
            try:
                self.waiting.append(self.pending.get_nowait())
            except queue.Empty:
                break
        batch = self.waiting[: self.generator.admissible([r.request for r in self.waiting[:free]])]
        if not batch:
            return self.publish()
        for r in batch:
            if r.admissible_s is None:
                r.admissible_s = now
                self.gate.arrived(now)
        if not self.gate.ready(self.generator.num_running(), [now - r.admissible_s for r in batch]):
            return self.publish()
        del self.waiting[: len(batch)]
        try:
            sequences = self.generator.admit([r.request for r in batch], tags=batch)
        except DFlashError as exc:  # validated at submit; only a changed engine state gets here
            for r in batch:
                self.reject(r.responder, str(exc))
            return
        self.count(requests=len(batch))
        for seq in sequences:
            seq.tag.first_token_ns = time.time_ns()
            self.respond(seq)
        self.publish()

    def drop_cancelled(self) -> None:
        """A client that went away frees its slot (checked every CANCEL_POLL_S); its request still gets a final
        response, which is what tells Triton the request is over."""
        now = time.monotonic()
        if now - self.polled_s < CANCEL_POLL_S:
            return
        self.polled_s = now
        for seq in self.generator.live():
            if seq.tag.responder.cancelled():
                self.fail(seq, "cancelled")
                self.export()
                end_with_error(seq.tag.responder, CANCELLED)

    def respond(self, seq: Sequence) -> None:
        req: ServeRequest = seq.tag
        if not (seq.done or req.streaming or req.stop_strings):  # nothing to send or look for before the end
            return
        text = self.tokenizer.decode(seq.result.output_ids)  # whole: a token's text depends on its neighbours
        cut = first_stop(text, req.stop_strings)
        if cut is not None and not seq.done:
            self.generator.cancel(seq, "stop")
        if cut is not None:
            text = text[:cut]
        if seq.done:
            self.finished(seq, text)
        elif req.streaming:
            stable = text[: len(text.rstrip("\ufffd"))]  # hold back a partial UTF-8 character
            if len(stable) > len(req.sent_text):
                delta = stable[len(req.sent_text):]
                self.send(seq, {"text_output": self.with_prompt(req, delta)}, final=False)
                req.sent_text = stable

    def send(self, seq: Sequence, outputs: dict, final: bool) -> None:
        """A client that went away since the last poll (CANCEL_POLL_S) may have its responses refused: its request
        is then cancelled like one found by the poll, instead of failing every request in flight."""
        try:
            seq.tag.responder.send(outputs, final=final)
        except Exception:
            if not seq.tag.responder.cancelled():
                raise
            if not seq.done:
                self.fail(seq, "cancelled")
            if not final:
                end_with_error(seq.tag.responder, CANCELLED)  # the final flag frees Triton's hold on the request

    def with_prompt(self, req: ServeRequest, text: str) -> str:
        """TensorRT-LLM's llmapi model includes the prompt unless told not to (once, when streaming)."""
        first = not req.streaming or not req.sent_text
        return req.prompt_text + text if first and not req.exclude_input else text

    def finished(self, seq: Sequence, text: str) -> None:
        req, result = seq.tag, seq.result
        body = text[len(req.sent_text):] if req.streaming else text
        draft_steps = sum(k > 0 for k in result.draft_lengths)  # steps that carried drafts (k = 0: a plain step)
        outputs = {
            "text_output": self.with_prompt(req, body),
            "finish_reason": result.finish_reason,
            "num_output_tokens": len(result.output_ids),
            "num_input_tokens": len(req.request.prompt_ids),
            "num_draft_steps": draft_steps,
            "total_accepted_draft_tokens": result.accepted_tokens,
            "total_draft_tokens": result.drafted_tokens,
            "acceptance_rate": result.accepted_tokens / result.drafted_tokens if result.drafted_tokens else 0.0,
            "arrival_time_ns": req.arrival_ns,
            "first_token_time_ns": req.first_token_ns,
            "last_token_time_ns": time.time_ns(),
        }
        self.count(generated_tokens=len(result.output_ids), draft_steps=draft_steps,
                    drafted_tokens=result.drafted_tokens, accepted_tokens=result.accepted_tokens,
                    plain_only_requests=int(not seq.drafting))
        self.export()  # before the answer: a client that has it sees its request and steps counted
        self.send(seq, outputs, final=True)

    def count(self, draft_len: int | None = None, **delta: int) -> None:
        """Add to the counters now (draft_len: a batch step's); the exporter gets them at the next `export` (see
        METRICS_FLUSH_S)."""
        with self.counting:
            for key, value in delta.items():
                setattr(self.counters, key, getattr(self.counters, key) + value)
                self.unexported[key] = self.unexported.get(key, 0) + value
            if draft_len is not None:
                self.unexported_steps.append(draft_len)

    def export(self) -> None:
        """Hand the counts since the last export, the steps' draft lengths and the gauges (refreshed) to the
        exporter."""
        with self.counting:
            self.running_gauges()
            delta, self.unexported = self.unexported, {}
            steps, self.unexported_steps = self.unexported_steps, []
            self.exported_s = time.monotonic()
            self.on_update(self.counters, delta)
            for k in steps:
                self.on_step(k)

    def running_gauges(self) -> bool:
        """Refresh the gauges from the batch, the queue and the KV pool (its totals counted as they grew); -> whether
        they changed. Under `counting`, or on the loop's thread while no other thread counts these."""
        running, queued, pool = self.generator.num_running(), self.queued(), self.generator.pool_stats()
        for field, key in POOL_TOTALS.items():
            grown = pool.get(key, 0) - getattr(self.counters, field)
            if grown > 0:
                setattr(self.counters, field, pool[key])
                self.unexported[field] = self.unexported.get(field, 0) + grown
        gauges = (running, queued, pool.get("used", 0), pool.get("blocks", 0))
        if gauges == (self.counters.running, self.counters.queued, self.counters.kv_blocks_used, self.counters.kv_blocks):
            return False
        self.counters.running, self.counters.queued, self.counters.kv_blocks_used, self.counters.kv_blocks = gauges
        return True

    def publish(self) -> None:
        """Export when the gauges changed or counts are METRICS_FLUSH_S old (the idle loop calls this every few
        ms, a busy one after every step)."""
        with self.counting:
            changed = self.running_gauges()
        if changed or ((self.unexported or self.unexported_steps) and
                       time.monotonic() - self.exported_s >= METRICS_FLUSH_S):
            self.export()

    def shutdown(self, message: str = f"{SHUTTING_DOWN}: request cancelled") -> None:
        """End everything in flight and queued with `message`."""
        self.fail_running(message)
        waiting, self.waiting = self.waiting, []
        for r in waiting:
            self.reject(r.responder, message)
        while not self.pending.empty():
            self.reject(self.pending.get_nowait().responder, message)


def end_with_error(responder: Responder, message: str) -> None:
    """A request's final response, an error. A client already gone may have it refused: its request is over
    either way, and the loop must go on to answer the others (one that stopped here would leave their requests
    held, and Triton cannot unload a model while it holds a request's response factory)."""
    try:
        responder.error(message)
    except Exception:
        pass


def first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None
