"""dflash-bench metric math: a scripted clock and synthetic streams through the real load runner."""

import asyncio

import numpy as np
import pytest

from trtllm_dflash.bench import counters
from trtllm_dflash.bench.clients import Client, ClientSettings, ConnectionLost
from trtllm_dflash.bench.load import LoadRunner, Phase
from trtllm_dflash.bench.metrics import latency_stats, percentile, summarize_point
from trtllm_dflash.bench.prompts import Prompt
from trtllm_dflash.bench.records import Chunk, RequestRecord
from trtllm_dflash.bench.spec import LoadPoint


class ScriptedClock:
    """Seconds that move only when a fake stream says so."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Prompts:
    def __init__(self, isl: int = 10):
        self.isl = isl

    def get(self, i: int) -> Prompt:
        return Prompt(f"prompt {i}", self.isl)


class ScriptedClient(Client):
    """Each request streams `script`: (seconds since the previous chunk, text, server fields)."""

    def __init__(self, clock, script, alive=True):
        super().__init__(ClientSettings("http://fake", "m"))
        self.clock, self.script, self.alive = clock, script, alive

    async def healthy(self):
        return self.alive

    async def stream(self, prompt, max_tokens):
        for dt, text, fields in self.script:
            self.clock.now += dt
            await asyncio.sleep(0)
            if isinstance(text, Exception):
                raise text
            yield Chunk(text, fields)


def chars(text: str) -> int:
    """The fake tokenizer: one token per character."""
    return len(text)


def run_phase(client, clock, count=1, point=None, timeout=60.0, isl=10):
    point = point or LoadPoint(1)
    runner = LoadRunner(client, Prompts(isl), 16, timeout, chars, clock)
    return runner, asyncio.run(runner.run(Phase(point, count, None, 0, point.name)))


def test_tpot_is_e2e_minus_ttft_over_osl_minus_one():
    clock = ScriptedClock()
    # first token after 0.5 s, then 9 single-token chunks 0.1 s apart: E2E 1.4 s, OSL 10
    script = [(0.5, "a", {})] + [(0.1, "b", {})] * 9
    _, [rec] = run_phase(ScriptedClient(clock, script), clock)
    assert rec.ok and rec.osl == 10 and rec.osl_tokenizer == 10
    assert rec.ttft == pytest.approx(0.5) and rec.e2e == pytest.approx(1.4)
    assert rec.tpot == pytest.approx((1.4 - 0.5) / 9)
    assert rec.interactivity == pytest.approx(1000 / (rec.tpot * 1000))


def test_multi_token_chunks_are_not_mistaken_for_single_tokens():
    """Speculative decoding streams 4 tokens per chunk: TPOT is a quarter of the chunk gap, not the gap."""
    clock = ScriptedClock()
    script = [(0.2, "abcd", {})] + [(0.4, "efgh", {})] * 3 + [(0.0, "", {"output_tokens": 16})]
    _, [rec] = run_phase(ScriptedClient(clock, script), clock)
    assert rec.osl == 16 and len(rec.chunk_times) == 4  # the empty final chunk carries no text
    assert rec.inter_chunk_latencies == pytest.approx([0.4, 0.4, 0.4])
    assert rec.tpot == pytest.approx(1.2 / 15)  # 0.08 s, while every chunk gap is 0.4 s
    summary = summarize_point(LoadPoint(1), [rec], 1, None)
    assert summary["inter_chunk_latency_ms_median"] == pytest.approx(400)
    assert summary["tpot_ms_median"] == pytest.approx(80)
    assert summary["interactivity_median"] == pytest.approx(12.5)
    assert summary["tokens_per_chunk"] == 4


def test_server_count_wins_and_a_mismatch_is_flagged():
    clock = ScriptedClock()
    script = [(0.1, "ab", {}), (0.1, "cd", {"output_tokens": 5, "finish_reason": "length"})]
    _, [rec] = run_phase(ScriptedClient(clock, script), clock)
    assert (rec.osl_tokenizer, rec.osl_server, rec.osl, rec.osl_mismatch) == (4, 5, 5, True)
    assert rec.tpot == pytest.approx(0.1 / 4)
    assert summarize_point(LoadPoint(1), [rec], 1, None)["osl_mismatches"] == 1
    row = rec.to_json()
    assert row["osl_mismatch"] is True and row["server_finish_reason"] == "length"


def test_server_input_count_is_used_for_throughput_and_a_mismatch_is_flagged():
    """AIPerf --use-server-token-count and `usage.prompt_tokens`: the server saw the prompt's tokens."""
    recs = [record(0.0, 0.1, 1.0, 10, isl=100, input_tokens=103), record(0.0, 0.1, 1.0, 10, isl=100)]
    s = summarize_point(LoadPoint(2), recs, 1, None)
    assert s["input_tokens"] == 203 and s["isl_mismatches"] == 1
    assert s["total_throughput"] == pytest.approx((203 + 20) / 1.0)
    row = recs[0].to_json()
    assert (row["isl"], row["isl_server"], row["isl_mismatch"]) == (100, 103, True)


def test_one_token_or_one_chunk_outputs_have_no_tpot():
    clock = ScriptedClock()
    _, [one_token] = run_phase(ScriptedClient(clock, [(0.3, "a", {})]), clock)
    assert one_token.ok and one_token.ttft == pytest.approx(0.3) and one_token.tpot is None
    # 16 tokens in one chunk (a server holding text back, or not streaming): E2E = TTFT, TPOT is not 0
    _, [one_chunk] = run_phase(ScriptedClient(clock, [(0.3, "a" * 16, {})]), clock)
    assert one_chunk.osl == 16 and one_chunk.e2e == one_chunk.ttft and one_chunk.tpot is None
    s = summarize_point(LoadPoint(1), [one_token, one_chunk], 1, None)
    assert s["completed"] == 2 and s["tpot_undefined"] == 2 and s["tpot_ms_median"] is None
    assert s["interactivity_median"] is None and s["output_tokens"] == 17


def test_percentiles_are_linear_between_order_statistics():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([], 50) is None
    stats = latency_stats("ttft", [0.001 * v for v in values])  # seconds in, ms out
    assert stats == pytest.approx({"ttft_ms_median": 50.5, "ttft_ms_p90": 90.1, "ttft_ms_p99": 99.01})
    rng = np.random.default_rng(0)
    sample = rng.exponential(size=37)
    assert percentile(sample, 99) == pytest.approx(np.quantile(sample, 0.99))


def record(start, ttft, e2e, osl, isl=100, ok=True, **server):
    rec = RequestRecord("c2", 0, 0, isl, osl, start, start + e2e, [ttft, e2e], server=server, osl_tokenizer=osl)
    if not ok:
        rec.fail("server", "boom")
    return rec


def test_throughput_per_gpu_divides_total_tokens_by_gpus():
    recs = [record(0.0, 0.1, 1.0, 10), record(0.5, 0.2, 1.5, 30), record(0.2, 0.1, 0.3, 50, ok=False)]
    s = summarize_point(LoadPoint(2), recs, 4, None)
    assert s["duration_s"] == pytest.approx(2.0)  # first send 0.0, last finish 0.5 + 1.5
    assert (s["completed"], s["failed"], s["input_tokens"], s["output_tokens"]) == (2, 1, 200, 40)
    assert s["output_throughput"] == pytest.approx(40 / 2.0)
    assert s["total_throughput"] == pytest.approx(240 / 2.0)
    assert s["total_throughput_per_gpu"] == pytest.approx(240 / 2.0 / 4)
    assert s["output_throughput_per_gpu"] == pytest.approx(40 / 2.0 / 4)
    assert s["request_throughput"] == pytest.approx(1.0)
    tpots = sorted([(1.0 - 0.1) / 9, (1.5 - 0.2) / 29])
    assert s["tpot_ms_median"] == pytest.approx(1000 * sum(tpots) / 2)
    assert s["interactivity_median"] == pytest.approx(1000 / s["tpot_ms_median"])
    assert s["interactivity_p99"] == pytest.approx(1000 / s["tpot_ms_p99"])
    assert s["interactivity_p99"] < s["interactivity_median"]  # p99 is the slow tail


PROM = """# HELP dflash_accepted_tokens_total draft tokens the target accepted
# TYPE dflash_accepted_tokens_total counter
dflash_requests_total {requests}
dflash_draft_steps_total {steps}
dflash_drafted_tokens_total{{model="a"}} {drafted_a}
dflash_drafted_tokens_total{{model="b"}} {drafted_b}
dflash_accepted_tokens_total {accepted}
nv_inference_count{{model="dflash",version="1"}} 7
dflash_running_requests 3
"""


def scrape(**values):
    return counters.snapshot(counters.parse_prometheus(PROM.format(**values)))


def test_counters_are_differenced_per_point():
    s0 = scrape(requests=5, steps=100, drafted_a=600, drafted_b=100, accepted=300)
    s1 = scrape(requests=9, steps=110, drafted_a=660, drafted_b=110, accepted=330)  # after point 1
    s2 = scrape(requests=13, steps=130, drafted_a=760, drafted_b=150, accepted=340)  # after point 2
    assert s1["drafted_tokens"] == 770  # summed over label sets
    d1, d2 = counters.difference(s0, s1), counters.difference(s1, s2)
    assert d1 == {"requests": 4, "draft_steps": 10, "drafted_tokens": 70, "accepted_tokens": 30}
    assert counters.acceptance(d1) == pytest.approx((1 + 30 / 10, 30 / 70))
    assert counters.acceptance(d2) == pytest.approx((1 + 10 / 20, 10 / 140))
    cumulative = counters.acceptance(counters.difference({k: 0.0 for k in s2}, s2))
    assert cumulative[0] != pytest.approx(counters.acceptance(d2)[0])  # totals would have been wrong


def test_counter_reset_or_missing_scrape_gives_no_acceptance():
    s0 = scrape(requests=5, steps=100, drafted_a=600, drafted_b=100, accepted=300)
    restarted = scrape(requests=1, steps=3, drafted_a=21, drafted_b=0, accepted=2)
    assert counters.difference(s0, restarted) is None
    assert counters.difference(None, s0) is None
    assert counters.acceptance(None) == (None, None)
    assert counters.acceptance({"draft_steps": 0, "drafted_tokens": 0, "accepted_tokens": 0}) == (None, None)
    assert counters.snapshot(counters.parse_prometheus("nv_inference_count 3\n")) is None


def test_draft_lengths_from_the_step_counters_and_histogram():
    text = ("dflash_decode_steps_total 140\ndflash_plain_steps_total 40\n"
            "# TYPE dflash_step_draft_length histogram\n"
            'dflash_step_draft_length_bucket{le="0"} 40\ndflash_step_draft_length_bucket{le="15"} 140\n'
            "dflash_step_draft_length_sum 700\ndflash_step_draft_length_count 140\n")
    before = counters.snapshot(counters.parse_prometheus(text.replace("140", "40").replace(" 700", " 100")
                                                       .replace("plain_steps_total 40", "plain_steps_total 10")))
    delta = counters.difference(before, counters.snapshot(counters.parse_prometheus(text)))
    assert delta == {"decode_steps": 100, "plain_steps": 30, "draft_len_sum": 600}
    assert counters.draft_lengths(delta) == pytest.approx((6.0, 0.3))
    assert counters.draft_lengths({"draft_steps": 3}) == (None, None)  # a server without the step counters
    assert counters.draft_lengths({"decode_steps": 0, "plain_steps": 0, "draft_len_sum": 0}) == (None, None)


def test_point_acceptance_from_counters_and_responses():
    recs = [record(0, 0.1, 1, 10, accepted_draft_tokens=6, draft_tokens=14),
            record(0, 0.1, 1, 10, accepted_draft_tokens=1, draft_tokens=21)]
    s = summarize_point(LoadPoint(2), recs, 1, {"draft_steps": 5, "drafted_tokens": 35, "accepted_tokens": 7})
    assert s["acceptance_length"] == pytest.approx(1 + 7 / 5)
    assert s["acceptance_rate"] == pytest.approx(7 / 35)
    assert s["acceptance_rate_responses"] == pytest.approx(7 / 35)


def test_stuck_request_times_out_and_is_counted():
    class Stuck(ScriptedClient):
        async def stream(self, prompt, max_tokens):
            yield Chunk("a")
            await asyncio.sleep(30)

    clock = ScriptedClock()
    _, recs = run_phase(Stuck(clock, []), clock, count=2, point=LoadPoint(2), timeout=0.05)
    assert [r.error_kind for r in recs] == ["timeout", "timeout"]
    assert summarize_point(LoadPoint(2), recs, 1, None)["timed_out"] == 2


def test_dead_server_stops_the_point():
    clock = ScriptedClock()
    client = ScriptedClient(clock, [(0.1, ConnectionLost("connection refused"), {})], alive=False)
    runner, recs = run_phase(client, clock, count=20, point=LoadPoint(2))
    assert runner.dead and "connection refused" in runner.dead
    assert 1 <= len(recs) < 20 and all(r.error_kind == "connection" for r in recs)


def test_transient_connection_error_with_a_live_server_goes_on():
    clock = ScriptedClock()
    client = ScriptedClient(clock, [(0.1, ConnectionLost("reset"), {})], alive=True)
    runner, recs = run_phase(client, clock, count=5, point=LoadPoint(1))
    assert runner.dead is None and len(recs) == 5


def test_fixed_concurrency_keeps_n_in_flight():
    class Counting(ScriptedClient):
        now = peak = 0

        async def stream(self, prompt, max_tokens):
            Counting.now += 1
            Counting.peak = max(Counting.peak, Counting.now)
            await asyncio.sleep(0.01)
            Counting.now -= 1
            yield Chunk("ab")

    clock = ScriptedClock()
    _, recs = run_phase(Counting(clock, []), clock, count=12, point=LoadPoint(3))
    assert len(recs) == 12 and Counting.peak == 3 and all(r.ok for r in recs)


def test_poisson_arrivals_are_seeded_and_capped():
    class Slow(ScriptedClient):
        now = peak = 0

        async def stream(self, prompt, max_tokens):
            Slow.now += 1
            Slow.peak = max(Slow.peak, Slow.now)
            await asyncio.sleep(0.02)
            Slow.now -= 1
            yield Chunk("ab")

    import time

    from trtllm_dflash.bench.load import arrival_stream

    runner = LoadRunner(Slow(ScriptedClock(), []), Prompts(), 16, 60, chars, time.perf_counter, seed=3)
    recs = asyncio.run(runner.run(Phase(LoadPoint(2, rate=200.0), 10, None, 0, "r")))
    assert len(recs) == 10 and Slow.peak <= 2
    # request i is sent no earlier than the sum of the first i+1 exponential gaps of the seeded stream
    gaps = arrival_stream(3, "r")
    due = np.cumsum([gaps.expovariate(200.0) for _ in range(10)])
    starts = {r.index: r.start for r in recs}
    assert all(starts[i] >= due[i] - 1e-6 for i in range(10))
    assert due[-1] > 0.01  # the gaps are real waits (mean 5 ms each)


def test_client_monitor_flags_a_blocked_event_loop():
    import time

    from trtllm_dflash.bench.monitor import ClientMonitor

    async def blocked():
        async with ClientMonitor() as monitor:
            await asyncio.sleep(0.05)
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:  # client work that never yields: every timestamp is late
                pass
        return monitor

    async def idle():
        async with ClientMonitor() as monitor:
            await asyncio.sleep(0.2)
        return monitor

    busy = asyncio.run(blocked())
    assert busy.lag_ms >= 250 and "the client may distort latencies" in busy.warning()
    assert asyncio.run(idle()).cpu < 0.5


def test_a_prompt_that_cannot_be_made_ends_the_phase_with_its_error():
    from trtllm_dflash.utils.errors import DFlashError

    class Failing(Prompts):
        def get(self, i):
            if i == 3:
                raise DFlashError("could not make a random prompt of exactly 7 tokens")
            return super().get(i)

    clock = ScriptedClock()
    runner = LoadRunner(ScriptedClient(clock, [(0.1, "ab", {})]), Failing(), 16, 60, chars, clock)
    seen = []
    with pytest.raises(DFlashError, match="exactly 7 tokens"):
        asyncio.run(runner.run(Phase(LoadPoint(1), 10, None, 0, "c1"), seen.append))
    assert [r.index for r in seen] == [0, 1, 2]  # the requests before it were measured and handed over


def test_the_drafter_method_is_read_from_the_info_gauge():
    """The label of the gauge at 1, whatever the other labels and their order; none when the server names none."""
    text = ('# HELP dflash_drafter_info the drafting method this server runs\n# TYPE dflash_drafter_info gauge\n'
            'dflash_drafter_info{model="dflash",method="dflash2",version="1"} 1\n'
            'dflash_requests_total{model="dflash",version="1"} 3\n')
    assert counters.drafter_method(text) == "dflash2"
    assert counters.drafter_method(text.replace("} 1\n", "} 0\n", 1)) is None
    assert counters.drafter_method("dflash_requests_total 3\n") is None
