"""Load generation for one point: N requests in flight, or Poisson arrivals (optionally capped at N).

Every request is timed on the runner's clock (monotonic seconds; a test passes a scripted one) and
handed to `on_record` the moment it finishes. A request that fails to connect makes the runner ask
the server whether it is still alive; when it is not, the point stops: no new requests, in-flight
ones get a short grace, then are cancelled and recorded as such.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from .clients import Client, ConnectionLost, RequestError, describe
from .prompts import Prompt, PromptSource
from .records import RequestRecord
from .spec import LoadPoint

ABORT_GRACE_S = 5.0  # in-flight requests may finish this long after the server was found dead


@dataclass
class Phase:
    """What to run: `count` requests, or arrivals for `duration` seconds, from prompt `first_prompt` on."""

    point: LoadPoint
    count: int | None
    duration: float | None
    first_prompt: int
    name: str  # the point's name, or 'warmup'


def arrival_stream(seed: int, phase: str) -> random.Random:
    """The random stream of a phase's Poisson gaps: the same arrivals for the same seed."""
    return random.Random(f"{seed}:{phase}:arrivals")


class LoadRunner:
    def __init__(self, client: Client, prompts: PromptSource, osl: int, timeout: float,
                 count_tokens: Callable[[str], int], clock: Callable[[], float] = time.perf_counter, seed: int = 0):
        self.client, self.prompts, self.osl, self.timeout = client, prompts, osl, timeout
        self.count_tokens, self.clock, self.seed = count_tokens, clock, seed
        self.dead: str | None = None  # why the server is considered gone (sticky across phases)

    async def run(self, phase: Phase, on_record: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
        """Run one phase; -> its records in finishing order."""
        self.phase, self.on_record, self.records = phase, on_record, []
        self.tasks: set[asyncio.Task] = set()
        self.stopped = asyncio.Event()
        self.t0 = self.clock()
        launcher = asyncio.create_task(self.launch())
        stop = asyncio.create_task(self.stopped.wait())
        await asyncio.wait({launcher, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not launcher.done():
            launcher.cancel()
        await asyncio.gather(launcher, return_exceptions=True)
        await self.drain(stop)
        if not launcher.cancelled() and launcher.exception() is not None:
            raise launcher.exception()  # e.g. a prompt that could not be made: after the in-flight ones finished
        return self.records

    async def launch(self) -> None:
        phase, n = self.phase, 0
        rate, cap = phase.point.rate, phase.point.concurrency
        slots = asyncio.Semaphore(cap) if cap else None
        arrivals, due = arrival_stream(self.seed, phase.name), self.clock()
        while self.more(n):
            if rate is not None:  # Poisson: exponential gaps (mean 1/rate s) on an absolute schedule, no drift
                due += arrivals.expovariate(rate)
                await asyncio.sleep(max(0.0, due - self.clock()))
            if slots is not None:
                await slots.acquire()
            if not self.more(n):
                break
            task = asyncio.create_task(self.one(n, self.prompts.get(phase.first_prompt + n)))
            self.tasks.add(task)
            if slots is not None:
                task.add_done_callback(lambda _: slots.release())
            n += 1

    def more(self, n: int) -> bool:
        phase = self.phase
        if self.dead:
            return False
        if phase.count is not None:
            return n < phase.count
        return self.clock() - self.t0 < phase.duration

    async def drain(self, stop: asyncio.Task) -> None:
        """Wait for in-flight requests (each bounded by the timeout); once the server is dead, for the grace only."""
        pending = set(self.tasks)
        while pending and not self.dead:
            _, pending = await asyncio.wait(pending | {stop}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stop)
        stop.cancel()
        if pending:
            _, pending = await asyncio.wait(pending, timeout=ABORT_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def one(self, n: int, prompt: Prompt) -> None:
        rec = RequestRecord(self.phase.name, n, self.phase.first_prompt + n, prompt.isl, self.osl,
                            self.clock() - self.t0, category=prompt.category)
        sent = self.clock()
        try:
            await asyncio.wait_for(self.consume(rec, prompt, sent), self.timeout)
        except asyncio.TimeoutError:
            rec.fail("timeout", f"no complete answer after {self.timeout:g} s: stuck request, cancelled")
        except ConnectionLost as exc:
            rec.fail("connection", str(exc))
        except RequestError as exc:
            rec.fail("server", str(exc))
        except asyncio.CancelledError:
            rec.fail("cancelled", f"cancelled: the point was stopped ({self.dead or 'interrupted'})")
            self.finish(rec)
            raise
        except Exception as exc:  # a client bug must not end the sweep: record it with the request
            rec.fail("client", describe(exc))
        self.finish(rec)
        if rec.error_kind == "connection" and not self.dead and not await self.client.healthy():
            self.dead = f"the server stopped answering ({rec.error})"
            self.stopped.set()

    async def consume(self, rec: RequestRecord, prompt: Prompt, sent: float) -> None:
        async for chunk in self.client.stream(prompt, self.osl):
            if chunk.text:
                rec.chunk_times.append(self.clock() - sent)
                rec.text.append(chunk.text)
            rec.server.update(chunk.fields)
        if not rec.chunk_times:
            raise RequestError("the stream ended without any output text")

    def finish(self, rec: RequestRecord) -> None:
        rec.end = self.clock() - self.t0
        if rec.ok:
            rec.osl_tokenizer = self.count_tokens("".join(rec.text))
        rec.text = []  # counted; not kept
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)
