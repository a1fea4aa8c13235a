"""TensorRT registration without TensorRT; the kernels compiled ahead of time for Hopper and Blackwell."""

import importlib.util
import os
import subprocess
import sys

import pytest

from trtllm_dflash.plugins import tensorrt_plugins as trtp_mod


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_register_reports_missing_tensorrt():
    assert "TensorRT is not installed" in trtp_mod.tensorrt_status()
    with pytest.raises(trtp_mod.PluginUnavailable, match="cannot register trtllm_dflash::context_kv: TensorRT"):
        trtp_mod.register()


def test_output_shape_and_its_checks():
    assert trtp_mod.output_shape(37, 5, 8, 128, kv_rows=5 * 2 * 8 * 128, hidden=4096, kv_cols=4096) == (37, 5, 8, 128)
    with pytest.raises(ValueError, match="kv has 100 rows, expected num_layers\\*2\\*num_kv_heads\\*head_dim = 10240"):
        trtp_mod.output_shape(1, 5, 8, 128, kv_rows=100)
    with pytest.raises(ValueError, match="kv has 4000 columns, y has hidden size 4096"):
        trtp_mod.output_shape(1, 5, 8, 128, hidden=4096, kv_cols=4000)
    with pytest.raises(ValueError, match="head_dim must be a power of two, got 96"):
        trtp_mod.output_shape(1, 5, 8, 96)


def test_signature_follows_tensorrt_argument_order():
    """AOT plugins pass input pointers, then extra scalars, then output pointers, in that order."""
    from trtllm_dflash.plugins.context_kv.triton_kernel import _dense_kernel

    sig = trtp_mod.kernel_signature("bfloat16")
    import inspect

    fn = _dense_kernel.fn
    runtime_args = [a for a in inspect.signature(fn).parameters if "constexpr" not in str(fn.__annotations__.get(a))]
    assert list(sig) == runtime_args
    assert list(sig) == ["y_ptr", "hn_ptr", "w_ptr", "kn_ptr", "freq_ptr", "pos_ptr", "N", "H", "k_ptr", "v_ptr"]


COMPILE = r"""
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import triton
from trtllm_dflash.plugins.tensorrt_plugins import compile_kernel
from trtllm_dflash.plugins.context_kv.triton_kernel import _cache_kernel
for arch in (90, 100):
    target = GPUTarget("cuda", arch, 32)
    for dtype in ("bfloat16", "float16", "float32"):
        c = compile_kernel(dtype, 4096, 5, 8, 128, 1e-6, 1e-6, target=target)
        assert ".visible .entry _dense_kernel(" in c.asm["ptx"] and c.metadata.global_scratch_size == 0
    consts = dict(HIDDEN_EPS=1e-6, K_EPS=1e-6, NUM_KV_HEADS=8, HALF=64, BLOCK_N=16, BLOCK_K=64, UPCAST=False,
                  PRECISION="tf32")
    sig = {"y_ptr": "*bf16", "hn_ptr": "*bf16", "w_ptr": "*bf16", "kn_ptr": "*bf16", "freq_ptr": "*fp32",
           "pos_ptr": "*i64", "blk_ptr": "*i64", "off_ptr": "*i64", "kc_ptr": "*bf16", "vc_ptr": "*bf16", "N": "i32",
           "H": "i32", "s_pl": "i64", "s_pb": "i64", "s_po": "i64", "s_ph": "i64", **{k: "constexpr" for k in consts}}
    c = triton.compile(ASTSource(fn=_cache_kernel, signature=sig, constexprs=consts), target=target)
    assert ".visible .entry _cache_kernel(" in c.asm["ptx"] and "cubin" in c.asm
    print(arch, "ok", c.metadata.num_warps, c.metadata.shared)
"""


def test_kernels_compile_for_hopper_and_blackwell():
    """Real ahead-of-time compilation (Triton's LLVM and ptxas) to sm_90a and sm_100a, no GPU needed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "90 ok" in proc.stdout and "100 ok" in proc.stdout


def test_gpu_benchmark_script_runs_end_to_end_in_smoke_mode():
    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "context_kv_gpu.py")
    proc = subprocess.run([sys.executable, script, "--smoke"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["tokens", "batch", "unfused"] and len(lines) == 4
