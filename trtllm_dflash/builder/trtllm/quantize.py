"""Post-training quantization of the target with NVIDIA Model Optimizer, exported for TensorRT-LLM.

FP8 (per-tensor scales) or NVFP4 (block-16 FP4 with FP8 scales), calibrated on prompts; exported
with `modelopt.torch.export.export_hf_checkpoint` as a Hugging Face checkpoint plus
`hf_quant_config.json`, the format TensorRT-LLM's PyTorch backend loads.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import torch

from ...checkpoint.loader import DTYPES
from ...utils.errors import DFlashError
from ...utils.settings_file import utf8_lines

CONFIGS = {"fp8": "FP8_DEFAULT_CFG", "nvfp4": "NVFP4_DEFAULT_CFG"}
CALIB_MAX_TOKENS = 512
BUILTIN_CALIB = [
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    "Speculative decoding drafts several tokens and verifies them with the target model in one pass.",
    "Question: what is 17 times 23? Answer: 17 times 23 is 391.",
    "import numpy as np\nx = np.linspace(0, 1, 100)\nprint(x.mean())",
    "The capital of France is Paris, and the capital of Japan is Tokyo.",
    "Write a haiku about GPUs: silicon rivers / a thousand cores hum in sync / tokens bloom like rain",
    "SELECT name, count(*) FROM orders GROUP BY name ORDER BY 2 DESC LIMIT 10;",
]


def read_calibration(path: str | None) -> list[str]:
    """Prompts from a JSONL file ({"prompt": ...} or {"text": ...} per line), or the built-in set."""
    if path is None:
        return list(BUILTIN_CALIB)
    p = Path(path)
    if not p.is_file():
        raise DFlashError(f"no such calibration file: {path}")
    prompts = []
    for number, line in utf8_lines(p, str(path)):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DFlashError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
        text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
        if not isinstance(text, str) or not text:
            raise DFlashError(f"{path}: line {number} has no non-empty 'prompt' or 'text' string")
        prompts.append(text)
    if not prompts:
        raise DFlashError(f"{path}: no calibration prompts")
    return prompts


# MoE routers (gpt-oss `mlp.router`, Qwen-MoE `mlp.gate`) and Qwen's shared-expert gate choose
# and weigh experts; a quantized router would route tokens differently. Model Optimizer leaves them
# unquantized by default (nvidia-modelopt 0.47 modelopt_recipes/configs/ptq/units/
# default_disabled_quantizers.yaml: '*router*', '*mlp.gate.*', '*mlp.shared_expert_gate.*').
ROUTER_MODULES = ("mlp.router", "mlp.gate", "mlp.shared_expert_gate")


def check_routers_excluded(model: torch.nn.Module, quant_config: dict) -> None:
    """Every router module of the model is in the exported checkpoint's exclude_modules, or one clear error."""
    excluded = quant_config.get("exclude_modules") or []
    routers = [name for name, _ in model.named_modules() if name.endswith(ROUTER_MODULES)]
    quantized = [r for r in routers if not any(fnmatch.fnmatchcase(r, pattern) for pattern in excluded)]
    if quantized:
        raise DFlashError(f"Model Optimizer quantized the MoE router '{quantized[0]}' ({len(quantized)} routers in all; "
                          f"exclude_modules {excluded}): routing would change, refusing the checkpoint")


def quantize_target(target_dir: Path, out: Path, quant: str, dtype: str, calib: str | None) -> dict:
    """Write the quantized target checkpoint to `out`; -> manifest details."""
    try:
        import modelopt
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError as exc:
        raise DFlashError(f"--quant {quant} needs NVIDIA Model Optimizer: pip install nvidia-modelopt ({exc})") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = read_calibration(calib)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=DTYPES[dtype]).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))

    def calibrate(m) -> None:
        for text in prompts:
            ids = tokenizer(text, return_tensors="pt").input_ids[:, :CALIB_MAX_TOKENS].to(device)
            ids = ids.clamp_max(m.config.vocab_size - 1)
            with torch.no_grad():
                m(ids)

    try:
        mtq.quantize(model, getattr(mtq, CONFIGS[quant]), calibrate)
        export_hf_checkpoint(model, dtype=DTYPES[dtype], export_dir=str(out))
    except Exception as exc:  # a step Model Optimizer cannot do here (some need a GPU) is reported, not raised raw
        raise DFlashError(f"Model Optimizer {quant} quantization failed on {device}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    quant_config = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    check_routers_excluded(model, quant_config)
    return {"quantized_by": f"nvidia-modelopt {modelopt.__version__}", "quant_algo": quant_config.get("quant_algo"),
            "calibration": calib or f"built-in ({len(prompts)} prompts)"}
