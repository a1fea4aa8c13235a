"""The decoupled Triton Python-backend model for `torch` engines (imported by the repository's model.py).

Request/response tensors carry the names of TensorRT-LLM's Triton `llmapi` model, so one client
serves both kinds of deployment. Extensions: `sampling_param_ignore_eos` (BOOL, load tests) and
the `num_output_tokens`, `num_input_tokens`, `num_draft_steps` outputs (the server's own counts).
"""

from __future__ import annotations

import json
import locale
import os
import sys
import time
from concurrent.futures import wait
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by the Triton Python backend

from ..cache.kv_cache import BLOCK
from ..config.runtime import RuntimeConfig
from ..engine.draft_len import make_policy
from ..engine.loader import load_engine
from ..engine.request import Request
from ..sample.sampling import SamplingParams
from ..utils.errors import DFlashError
from ..utils.threads import set_threads
from .failures import FATAL_FILE_ENV
from .load_failure import record_load_error
from .loop import Counters, ServeRequest, ServingLoop
from .repository import ModelParameters
from .shutdown import STOP_FILE_ENV
from .torch_thread import TorchThread

DEFAULT_MAX_TOKENS = 32  # TensorRT-LLM's SamplingParams default
OUTPUT_TYPES = {
    "text_output": np.object_, "finish_reason": np.object_, "num_output_tokens": np.int32,
    "num_input_tokens": np.int32, "num_draft_steps": np.int32,
    "total_accepted_draft_tokens": np.int32, "total_draft_tokens": np.int32, "acceptance_rate": np.float32,
    "arrival_time_ns": np.int64, "first_token_time_ns": np.int64, "last_token_time_ns": np.int64,
}
COUNTERS = {  # Counters field -> (metric name, description)
    "requests": ("dflash_requests_total", "requests admitted"),
    "failed": ("dflash_failed_requests_total", "requests rejected, cancelled or failed"),
    "generated_tokens": ("dflash_generated_tokens_total", "output tokens of finished requests"),
    "draft_steps": ("dflash_draft_steps_total", "verify steps that carried drafts"),
    "drafted_tokens": ("dflash_drafted_tokens_total", "draft tokens proposed to the target"),
    "accepted_tokens": ("dflash_accepted_tokens_total", "draft tokens the target accepted"),
    "decode_steps": ("dflash_decode_steps_total", "batch decode steps"),
    "plain_steps": ("dflash_plain_steps_total", "batch decode steps that drafted nothing (draft length 0)"),
    "plain_only_requests": ("dflash_plain_only_requests_total",
                            "finished requests that ended without the drafter's context (admitted plain-only, or "
                            "stopped drafting)"),
}
DRAFT_LENGTH = ("dflash_step_draft_length", "draft tokens per request chosen for each batch step")
COUNTERS.update({
    "prefix_hit_tokens": ("dflash_prefix_cache_hit_tokens_total", "prompt tokens whose KV came from the prefix cache"),
    "prefix_tokens": ("dflash_prefix_cache_queried_tokens_total", "prompt tokens looked up in the prefix cache"),
    "prefix_hit_requests": ("dflash_prefix_cache_hit_requests_total", "admissions that reused a cached prefix"),
    "prefix_requests": ("dflash_prefix_cache_queried_requests_total", "admissions looked up in the prefix cache"),
    "preemptions": ("dflash_preemptions_total", "running requests preempted for KV blocks (recomputed later)"),
})
# an info gauge: 1 under the label method = the drafting method this server runs (dflash, dflash2; none: plain)
DRAFTER_INFO = ("dflash_drafter_info", "the drafting method this server runs, as the label 'method'")
GAUGES = {"running": ("dflash_running_requests", "requests in the running batch"),
          "queued": ("dflash_queued_requests", "requests waiting for a slot"),
          "kv_blocks_used": ("dflash_kv_cache_blocks_used", "KV pool blocks held by requests"),
          "kv_blocks": ("dflash_kv_cache_blocks", f"KV pool blocks in all ({BLOCK} tokens each)")}


def kv_pool_bytes(runtime: RuntimeConfig, device) -> int | None:
    """--kv-cache-gib, or on a GPU 90 % of the memory free once the model is loaded (vLLM's
    gpu_memory_utilization default); None on a CPU: the generator's default, every slot at max_seq_len."""
    import torch

    if runtime.kv_cache_bytes is not None:
        return runtime.kv_cache_bytes
    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0] * KV_FREE_FRACTION)
    return None


KV_FREE_FRACTION = 0.9


def drafter_method(generator) -> str:
    """dflash or dflash2 (the drafter's config, DrafterConfig.method); none when the engine has no drafter."""
    drafter = getattr(generator.proposer, "drafter", None)
    return drafter.config.method if drafter is not None else "none"


class TritonResponder:
    def __init__(self, sender, wanted: set[str] | None):
        self.sender, self.wanted = sender, wanted

    def send(self, outputs: dict, final: bool) -> None:
        tensors = [pb_utils.Tensor(name, np.array([value], dtype=OUTPUT_TYPES[name]))
                   for name, value in outputs.items() if self.wanted is None or name in self.wanted]
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)

    def error(self, message: str) -> None:
        self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                         flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def cancelled(self) -> bool:
        return self.sender.is_cancelled()


def values(request, name: str):
    """The input's elements as a flat numpy array, or None when the request does not carry it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


def decoded(name: str, value):
    """A string element as text: bytes must be UTF-8 (one line naming the input and the byte otherwise)."""
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DFlashError(f"'{name}' is not UTF-8 text: byte 0x{value[exc.start]:02x} at offset {exc.start}") from None


def scalar(request, name: str, default=None):
    """A one-element input; more than one element is refused (never silently truncated)."""
    items = values(request, name)
    if items is None or items.size == 0:
        return default
    if items.size > 1:
        raise DFlashError(f"'{name}' takes one value per request, got {items.size}")
    value = items[0]
    return decoded(name, value) if isinstance(value, (bytes, str)) else value.item()


def strings(request, name: str) -> tuple[str, ...]:
    items = values(request, name)
    return () if items is None else tuple(decoded(name, v) for v in items)


def utf8_text_locale() -> None:
    """The Python backend's stub embeds an interpreter that leaves the C library's LC_CTYPE at "C", so text files
    open as ASCII by default; torch.compile (inductor) reads its UTF-8 kernel templates that way and failed
    (`--step-mode compile` ran eager). C.UTF-8 ships with glibc >= 2.35 and Debian/Ubuntu images."""
    try:
        locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
    except locale.Error:
        print(f"dflash: warning: no C.UTF-8 locale; text files open as {locale.getpreferredencoding(False)}",
              file=sys.stderr, flush=True)


def startup_line(startup: dict) -> str:
    """Seconds per part of the model's start (engine.load_engine's `startup`, plus calibration)."""
    return (f"dflash: start-up: weights {startup['weights_s']:.1f} s, graphs {startup['graphs_s']:.1f} s "
            f"({startup['graphs']}), CUDA-graph recording {startup['cuda_graphs_s']:.1f} s, calibration "
            f"{startup['calibration_s']:.1f} s")


class TritonPythonModel:
    def initialize(self, args):
        try:
            self.start(args)
        except BaseException as exc:  # Triton logs it with a traceback; dflash-serve reports this line
            record_load_error(exc)
            raise

    def start(self, args):
        utf8_text_locale()
        config = json.loads(args["model_config"])
        params = ModelParameters.parse({k: v["string_value"] for k, v in config.get("parameters", {}).items()})
        runtime = params.runtime
        # every torch call of this process (load, warm-up, calibration, steps) runs on this one thread
        self.torch_thread = TorchThread()
        self.torch_thread.call(lambda: set_threads(runtime.threads, params.tp_size))
        generator, self.tokenizer = self.torch_thread.call(lambda: self.load(params.engine_dir, params.tp_size, runtime))
        start = time.perf_counter()
        policy = make_policy(runtime.draft_len, generator.block - 1, Path(params.engine_dir))
        print(startup_line({**self.startup, "calibration_s": time.perf_counter() - start}), file=sys.stderr,
              flush=True)
        self.max_tokens_limit = params.max_seq_len
        kv_cache_bytes = self.torch_thread.call(lambda: kv_pool_bytes(runtime, generator.device))
        generator.configure(runtime, policy, kv_cache_bytes)
        self.metrics = self.make_metrics(generator.block - 1, drafter_method(generator))
        self.loop = ServingLoop(generator, self.tokenizer, params.max_batch_size, params.max_seq_len,
                                params.max_queue, self.update_metrics, self.metrics["draft_length"].observe,
                                os.environ.get(STOP_FILE_ENV), self.torch_thread, params.admission,
                                **self.rank_watch(generator))
        pool = generator.pool
        print(f"dflash: KV pool: {pool.num_blocks} blocks of {BLOCK} = {pool.num_blocks * BLOCK} tokens "
              f"({pool.num_blocks * generator.bytes_per_block / 2**30:.2f} GiB), prefix caching "
              f"{'on' if pool.prefix_caching else 'off'}, prefill chunks of "
              f"{runtime.max_num_tokens or 'whole prompts'}", file=sys.stderr, flush=True)
        print(f"dflash: admissions: fixed cost {self.loop.gate.fixed_s * 1e3:.2f} ms a call, held up to "
              f"{self.loop.gate.settings.max_wait_s * 1e3:g} ms to group them", file=sys.stderr, flush=True)
        self.loop.start()

    def load(self, engine_dir: str, tp: int, runtime: RuntimeConfig):
        """Rank 0 in this process; with tp > 1 the other ranks are spawned and driven in lockstep (eager)."""
        self.workers, decoding = [], runtime.decoding
        if tp == 1:  # on the GPU when the server has one (ranks of TP > 1 engines stay on gloo CPUs)
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
            pipeline = load_engine(engine_dir, device=device, decoding=decoding, step_mode=runtime.step_mode)
            self.startup = pipeline.startup
            return pipeline.generator, pipeline.tokenizer
        from ..distributed.rendezvous import join_local_group, listen_loopback
        from .lockstep import LockstepGenerator, spawn_workers

        listener = listen_loopback()  # bound before the workers start: they connect to its port
        port = listener.getsockname()[1]
        self.workers = spawn_workers(engine_dir, tp, port, decoding)
        join_local_group("gloo", 0, tp, port, listener)
        pipeline = load_engine(engine_dir, rank=0, decoding=decoding)
        self.startup = pipeline.startup
        g = pipeline.generator
        return LockstepGenerator(g.target, g.proposer, g.default_stop_ids, self.workers), pipeline.tokenizer

    def rank_watch(self, generator) -> dict:
        """A tensor-parallel engine's loop learns when a rank has died, and dflash-serve learns it from the file
        FATAL_FILE_ENV names (it stops the server and exits with that line)."""
        if not self.workers:
            return {}

        def on_lost(why: str) -> None:
            print(f"dflash: {why}: failing every request; the server must be restarted", file=sys.stderr, flush=True)
            path = os.environ.get(FATAL_FILE_ENV)
            if path:
                Path(path).write_text(why + "\n")

        return {"ranks_lost": generator.check_ranks, "on_lost": on_lost}

    def make_metrics(self, max_draft_len: int, method: str) -> dict:
        metrics, self.families = {}, []  # a family must outlive its metrics
        self.gauges = {}  # gauge -> the value last set
        for table, kind in ((COUNTERS, pb_utils.MetricFamily.COUNTER), (GAUGES, pb_utils.MetricFamily.GAUGE)):
            for field, (name, text) in table.items():
                family = pb_utils.MetricFamily(name=name, description=text, kind=kind)
                self.families.append(family)
                metrics[field] = family.Metric(labels={})
        family = pb_utils.MetricFamily(name=DRAFT_LENGTH[0], description=DRAFT_LENGTH[1],
                                       kind=pb_utils.MetricFamily.HISTOGRAM)
        self.families.append(family)
        metrics["draft_length"] = family.Metric(labels={}, buckets=[float(k) for k in range(max_draft_len + 1)])
        family = pb_utils.MetricFamily(name=DRAFTER_INFO[0], description=DRAFTER_INFO[1],
                                       kind=pb_utils.MetricFamily.GAUGE)
        self.families.append(family)
        metrics["drafter_info"] = family.Metric(labels={"method": method})  # kept: a dropped metric leaves the server
        metrics["drafter_info"].set(1)
        return metrics

    def update_metrics(self, counters: Counters, delta: dict) -> None:
        """Each call to a metric is a round trip to the server process: only counts that grew, gauges that moved."""
        for field, amount in delta.items():
            if amount:
                self.metrics[field].increment(amount)
        for field in GAUGES:
            value = getattr(counters, field)
            if self.gauges.get(field) != value:
                self.metrics[field].set(value)
                self.gauges[field] = value

    def execute(self, requests):
        for request in requests:
            responder = TritonResponder(request.get_response_sender(), set(request.requested_output_names()) or None)
            try:
                self.loop.submit(self.parse(request, responder))
            except DFlashError as exc:
                self.loop.reject(responder, str(exc))
            except Exception as exc:  # a bad request must get one line, never a traceback, and the server stays
                self.loop.reject(responder, f"bad request: {type(exc).__name__}: {exc}")
        return None

    def parse(self, request, responder) -> ServeRequest:
        text = scalar(request, "text_input")
        if text is None:
            raise DFlashError("missing input 'text_input'")
        if not text:
            raise DFlashError("empty prompt: 'text_input' is an empty string")
        max_tokens = scalar(request, "sampling_param_max_tokens", DEFAULT_MAX_TOKENS)
        if not 0 < max_tokens <= self.max_tokens_limit:
            raise DFlashError(f"sampling_param_max_tokens must be in 1..{self.max_tokens_limit}, got {max_tokens}")
        sampling = SamplingParams(temperature=float(scalar(request, "sampling_param_temperature", 0.0)),
                                  top_p=float(scalar(request, "sampling_param_top_p", 1.0)),
                                  top_k=int(scalar(request, "sampling_param_top_k", 0)),
                                  seed=scalar(request, "sampling_param_seed"))
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        req = Request(ids, int(max_tokens), sampling, ignore_eos=bool(scalar(request, "sampling_param_ignore_eos", False)))
        return ServeRequest(req, text, bool(scalar(request, "streaming", False)),
                            bool(scalar(request, "sampling_param_exclude_input_from_output", False)),
                            strings(request, "sampling_param_stop"), responder)

    def finalize(self):
        self.loop.stop()
        if self.workers:
            import torch.distributed as dist

            wait([self.torch_thread.submit(self.loop.generator.close)], 30)  # queued behind the ended loop
            for worker in self.workers:
                worker.wait(timeout=30)
            dist.destroy_process_group()
