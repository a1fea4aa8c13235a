"""Is the client the bottleneck? CPU time of this process and event-loop lag during a point.

One asyncio loop drives every stream; when it is busy (or late waking up) chunk arrival times
include client delay, and the numbers understate the server.
"""

from __future__ import annotations

import asyncio
import time

BUSY_CPU = 0.8  # fraction of one core
LATE_LOOP_MS = 50.0  # event-loop wake-up lag
TICK_S = 0.02


class ClientMonitor:
    def __init__(self):
        self.cpu = 0.0  # fraction of one core over the point
        self.lag_ms = 0.0  # worst event-loop wake-up lag
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> ClientMonitor:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        self.due = self.wall0 + TICK_S  # when the watcher should wake next
        self.task = asyncio.create_task(self.watch())
        return self

    async def __aexit__(self, *exc) -> None:
        self.late(time.perf_counter())  # a wake-up still overdue (the loop blocked until now) counts too
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        wall = time.perf_counter() - self.wall0
        self.cpu = (time.process_time() - self.cpu0) / wall if wall > 0 else 0.0

    async def watch(self) -> None:
        while True:
            self.due = time.perf_counter() + TICK_S
            await asyncio.sleep(TICK_S)
            self.late(time.perf_counter())

    def late(self, now: float) -> None:
        self.lag_ms = max(self.lag_ms, (now - self.due) * 1000.0)

    def warning(self) -> str | None:
        if self.cpu < BUSY_CPU and self.lag_ms < LATE_LOOP_MS:
            return None
        return (f"the client may distort latencies: its CPU use {self.cpu:.0%} of a core, event-loop wake-ups up to "
                f"{self.lag_ms:.0f} ms late (a busy client, or a machine short of CPU); use fewer streams per "
                "client process or a less loaded client machine")
