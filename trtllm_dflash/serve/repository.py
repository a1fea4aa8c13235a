"""Write a Triton model repository for an engine; every config.pbtxt is built and re-parsed with
Triton's own `ModelConfig` protobuf (shipped in tritonclient), so it is valid by construction.

torch engines: <repo>/<model>/config.pbtxt + 1/model.py (a one-line import of our Python model).
trtllm engines: TensorRT-LLM's `llmapi` layout: config.pbtxt + 1/model.yaml (the engine's LLM API
options plus `triton_config`); 1/model.py is TensorRT-LLM's own, copied in by the launch script. The
config.pbtxt declares upstream's whole request/response set and leaves batching and decoupled mode to
model.yaml's `triton_config`, which upstream's model.py applies in auto_complete_config
(triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @0a710573 and 1/model.py @044a90d2). model.yaml
names the engine's target and drafter by absolute paths valid where this runs, so a moved engine serves.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import yaml

from ..config.manifest import Manifest
from ..config.runtime import AUTO, RuntimeConfig, param
from ..engine.draft_len import make_policy
from ..utils.errors import DFlashError
from ..utils.threads import resolve_threads
from .admission import MAX_WAIT_S, AdmissionSettings

# (name, Triton type, dims, optional) of TensorRT-LLM's llmapi model, plus our extensions
INPUTS = [
    ("text_input", "TYPE_STRING", [-1], False), ("streaming", "TYPE_BOOL", [1], True),
    ("sampling_param_max_tokens", "TYPE_INT32", [1], True), ("sampling_param_temperature", "TYPE_FP32", [1], True),
    ("sampling_param_top_k", "TYPE_INT32", [1], True), ("sampling_param_top_p", "TYPE_FP32", [1], True),
    ("sampling_param_seed", "TYPE_UINT64", [1], True), ("sampling_param_stop", "TYPE_STRING", [-1], True),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", [1], True),
    ("sampling_param_return_perf_metrics", "TYPE_BOOL", [1], True), ("return_finish_reason", "TYPE_BOOL", [1], True),
]
OUTPUTS = [
    ("text_output", "TYPE_STRING", [-1]), ("finish_reason", "TYPE_STRING", [-1]),
    ("acceptance_rate", "TYPE_FP32", [1]), ("total_accepted_draft_tokens", "TYPE_INT32", [1]),
    ("total_draft_tokens", "TYPE_INT32", [1]), ("arrival_time_ns", "TYPE_INT64", [1]),
    ("first_token_time_ns", "TYPE_INT64", [1]), ("last_token_time_ns", "TYPE_INT64", [1]),
]
# the rest of upstream's llmapi config.pbtxt (@0a710573): a request using them must not be rejected
LLMAPI_EXTRA_INPUTS = [
    ("image_url", "TYPE_STRING", [-1], True), ("sampling_param_best_of", "TYPE_INT32", [1], True),
    ("sampling_param_frequency_penalty", "TYPE_FP32", [1], True),
    ("sampling_param_presence_penalty", "TYPE_FP32", [1], True), ("return_stop_reason", "TYPE_BOOL", [1], True),
    ("return_cumulative_logprob", "TYPE_BOOL", [1], True), ("stop", "TYPE_BOOL", [1], True),
    ("lora_id", "TYPE_UINT64", [1], True), ("lora_name", "TYPE_STRING", [1], True),
    ("lora_path", "TYPE_STRING", [1], True), ("lora_ckpt_source", "TYPE_STRING", [1], True),
]
LLMAPI_EXTRA_OUTPUTS = [
    ("stop_reason", "TYPE_STRING", [-1]), ("cumulative_logprob", "TYPE_FP32", [-1]),
    ("kv_cache_reused_block", "TYPE_INT32", [-1]), ("kv_cache_missed_block", "TYPE_INT32", [-1]),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", [-1]), ("kv_cache_alloc_total_blocks", "TYPE_INT32", [-1]),
    ("kv_cache_hit_rate", "TYPE_FP32", [-1]), ("first_scheduled_time_ns", "TYPE_INT64", [1]),
]
TORCH_EXTRA_INPUTS = [("sampling_param_ignore_eos", "TYPE_BOOL", [1], True)]
# the server's own token counts (the OpenAI frontend's `usage`) and verify steps that carried drafts
TORCH_EXTRA_OUTPUTS = [("num_output_tokens", "TYPE_INT32", [1]), ("num_input_tokens", "TYPE_INT32", [1]),
                       ("num_draft_steps", "TYPE_INT32", [1])]
MODEL_PY = "# Written by dflash-serve.\nfrom trtllm_dflash.serve.triton_model import TritonPythonModel  # noqa: F401\n"


@dataclass(frozen=True)
class ServeSettings:
    model_name: str = "dflash"
    max_batch_size: int | None = None  # default: the engine's
    max_queue: int = 256
    decoding: str = "dflash"  # "plain": serve the target alone (torch engines), the benchmark baseline
    draft_len: str = AUTO  # torch engines: auto | N | a draft_len_schedule file (engine/draft_len.py)
    threads: int | None = None  # torch engines: torch threads of the model (default: threads.default_threads)
    step_mode: str = AUTO  # torch engines: eager | compile | cuda-graphs | auto (step_mode.py)
    admission_wait_ms: float = MAX_WAIT_S * 1e3  # torch engines: longest hold of a request to group admissions
    kv_cache_gib: float | None = None  # torch engines: the paged KV pool (None: kv_pool_default)
    prefix_caching: bool = True  # torch engines: reuse cached prompt prefixes
    max_num_tokens: int | None = None  # torch engines: longer prompts are prefilled in chunks of this many tokens

    def __post_init__(self):
        self.runtime()  # validates the runtime's fields, errors named as their flags
        if not self.model_name or "/" in self.model_name:
            raise DFlashError(f"invalid model name {self.model_name!r}")
        AdmissionSettings(self.admission_wait_ms / 1e3)  # a bad --admission-wait-ms fails here, not at model load
        for name in ("max_batch_size", "max_queue"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise DFlashError(f"--{name.replace('_', '-')} must be at least 1, got {value}")

    def runtime(self) -> RuntimeConfig:
        """The fields a torch engine's runtime takes (RuntimeConfig's, by name)."""
        return RuntimeConfig(**{f.name: getattr(self, f.name) for f in fields(RuntimeConfig)})


@dataclass(frozen=True)
class ModelParameters:
    """What a torch model's config.pbtxt parameters say (`write_repository` writes them, the Triton model reads
    them with `parse`): the engine, the serving loop's limits and the runtime."""

    engine_dir: str
    tp_size: int
    max_batch_size: int
    max_seq_len: int
    max_queue: int
    admission: AdmissionSettings
    runtime: RuntimeConfig

    @classmethod
    def parse(cls, params: dict[str, str]) -> ModelParameters:
        """Errors name the parameter and its value, one line."""
        missing = [name for name in ("engine_dir", "tp_size", "max_batch_size", "max_seq_len", "max_queue")
                   if name not in params]
        if missing:
            raise DFlashError(f"model parameter '{missing[0]}' is missing (dflash-serve writes it)")
        wait_ms = param(params, "admission_wait_ms", float, MAX_WAIT_S * 1e3)
        try:
            admission = AdmissionSettings(wait_ms / 1e3)
        except DFlashError:
            raise DFlashError(f"model parameter 'admission_wait_ms' must be a number of milliseconds >= 0, got "
                              f"{params['admission_wait_ms']!r}") from None
        limits = {name: param(params, name, int) for name in ("tp_size", "max_batch_size", "max_seq_len", "max_queue")}
        return cls(params["engine_dir"], admission=admission, runtime=RuntimeConfig.from_triton_params(params),
                   **limits)


def model_config(name: str, inputs, outputs, parameters: dict[str, str], decoupled: bool = True):
    """decoupled=False leaves the transaction policy (and batching) unset, for model.yaml to supply."""
    from tritonclient.grpc import model_config_pb2 as mc

    config = mc.ModelConfig(name=name, backend="python", max_batch_size=0)
    if decoupled:
        config.model_transaction_policy.decoupled = True
    for n, t, dims, optional in inputs:
        config.input.add(name=n, data_type=mc.DataType.Value(t), dims=dims, optional=optional)
    for n, t, dims in outputs:
        config.output.add(name=n, data_type=mc.DataType.Value(t), dims=dims)
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    for key, value in parameters.items():
        config.parameters[key].string_value = str(value)
    return config


def validate_pbtxt(text: str):
    """Parse with Triton's ModelConfig schema; -> the message. Unknown fields or types raise."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    return text_format.Parse(text, mc.ModelConfig())


def write_pbtxt(path: Path, config) -> None:
    from google.protobuf import text_format

    text = text_format.MessageToString(config)
    validate_pbtxt(text)
    path.write_text(text)


def draft_len_param(settings: ServeSettings, manifest: Manifest) -> str:
    """The --draft-len value checked against the engine (a bad one fails here, not at model load);
    a schedule file as an absolute path, since the server runs elsewhere."""
    max_draft_len = manifest.block_size - 1 if settings.decoding == "dflash" else 0
    make_policy(settings.draft_len, max_draft_len)
    value = settings.draft_len
    return str(Path(value).absolute()) if Path(value).is_file() else value


def step_mode_param(settings: ServeSettings, manifest: Manifest) -> str:
    """Served tensor-parallel torch engines run eager: their ranks are gloo CPU processes driven in lockstep."""
    if manifest.tp_size > 1 and settings.step_mode not in (AUTO, "eager"):
        raise DFlashError(f"--step-mode {settings.step_mode}: a served tensor-parallel torch engine (tp_size "
                          f"{manifest.tp_size}) runs eager")
    return settings.step_mode


def write_repository(engine_dir: Path, repo: Path, settings: ServeSettings) -> Path:
    """-> the model directory inside `repo`."""
    engine_dir = Path(engine_dir).absolute()
    manifest = Manifest.read(engine_dir)
    model_dir = Path(repo) / settings.model_name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    batch = settings.max_batch_size or manifest.limits["max_batch_size"]
    if manifest.backend == "torch":
        runtime = replace(settings.runtime(), draft_len=draft_len_param(settings, manifest),
                          threads=resolve_threads(settings.threads, manifest.tp_size),
                          step_mode=step_mode_param(settings, manifest))
        params = {"engine_dir": engine_dir, "max_batch_size": batch, "max_queue": settings.max_queue,
                  "max_seq_len": manifest.limits["max_seq_len"], "tp_size": manifest.tp_size,
                  "admission_wait_ms": settings.admission_wait_ms, **runtime.triton_params()}
        write_pbtxt(model_dir / "config.pbtxt", model_config(settings.model_name, INPUTS + TORCH_EXTRA_INPUTS,
                                                             OUTPUTS + TORCH_EXTRA_OUTPUTS, params))
        (model_dir / "1" / "model.py").write_text(MODEL_PY)
    else:
        if settings.admission_wait_ms != MAX_WAIT_S * 1e3:
            raise DFlashError(f"--admission-wait-ms {settings.admission_wait_ms:g} applies to torch engines; "
                              f"TensorRT-LLM's executor schedules a trtllm engine's admissions")
        if settings.draft_len != AUTO:
            raise DFlashError("--draft-len applies to torch engines; a trtllm engine's draft lengths come from its "
                              "build (dflash-build --backend trtllm --draft-len-schedule FILE)")
        write_pbtxt(model_dir / "config.pbtxt", model_config(settings.model_name, INPUTS + LLMAPI_EXTRA_INPUTS,
                                                             OUTPUTS + LLMAPI_EXTRA_OUTPUTS, {}, decoupled=False))
        options = llmapi_options(engine_dir, manifest, settings)
        (model_dir / "1" / "model.yaml").write_text(yaml.safe_dump(options, sort_keys=False))
    return model_dir


def llmapi_options(engine_dir: Path, manifest: Manifest, settings: ServeSettings) -> dict:
    """model.yaml: the engine's options at absolute paths, the running batch (never above the one the engine's
    memory was planned for; CUDA graphs kept within it), and Triton's side."""
    from ..builder.trtllm.engine import read_options_at

    options = read_options_at(engine_dir)
    built = manifest.limits["max_batch_size"]
    batch = settings.max_batch_size or built
    if batch > built:
        raise DFlashError(f"--max-batch-size {batch} exceeds the engine's max_batch_size {built}, which its DFlash "
                          "memory plan was made for: rebuild with a larger --max-batch-size")
    options["cuda_graph_config"] = cuda_graphs_within(options.get("cuda_graph_config"), batch)
    if settings.decoding == "plain":  # TensorRT-LLM decodes autoregressively without a speculative config
        options.pop("speculative_config", None)
    return {"model": str(engine_dir / "target"), **options, "max_batch_size": batch,
            "triton_config": {"max_batch_size": 0, "decoupled": True}}


def cuda_graphs_within(graphs: dict | None, batch: int) -> dict | None:
    """cuda_graph_config for a running batch of `batch`: graph batch sizes above it would never be used
    (TensorRT-LLM requires max_batch_size == max(batch_sizes) when both are given)."""
    if graphs is None:
        return None
    graphs = dict(graphs)
    if graphs.get("batch_sizes"):
        graphs["batch_sizes"] = [b for b in graphs["batch_sizes"] if b <= batch] or [batch]
        graphs.pop("max_batch_size", None)
    else:
        graphs["max_batch_size"] = min(graphs.get("max_batch_size") or batch, batch)
    return graphs
