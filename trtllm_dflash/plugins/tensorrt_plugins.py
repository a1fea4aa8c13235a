"""TensorRT registrations of the context-KV op (quickly deployable plugins, ahead-of-time).

`register()` defines `trtllm_dflash::context_kv` with `tensorrt.plugin`: a descriptor (output shapes
and types) and an AOT implementation that embeds the Triton `_dense_kernel` compiled to PTX, so an
engine runs it without Python. Importing this module never needs TensorRT; `register()` says
clearly when TensorRT (>= 10.9, for AOT plugins) is unavailable. TensorRT-LLM does not load this plugin:
its DFlash runs only on the PyTorch backend (no TensorRT engine; NVIDIA/TensorRT-LLM@58ae162a,
DFlashDecodingConfig.supports_backend is "pytorch" only), so `dflash-build --backend trtllm` never uses it.

Plugin contract (the cache write belongs to TensorRT-LLM's own KV-cache manager, so outputs are dense):
  inputs  y [N, H] (the fc output), hidden_norm [H], kv [L*2*H_kv*D, H], k_norm [L, D],
          inv_freq [D/2] fp32, positions [N] int32
  attrs   num_layers, num_kv_heads, head_dim (int), hidden_eps, k_eps (float)
  outputs k, v [N, L, H_kv, D] in y's dtype (k normed and rotated)
Kernel arguments follow TensorRT's AOT order: input pointers, then N and H, then output pointers.
"""

from __future__ import annotations

import importlib.util

PLUGIN_ID = "trtllm_dflash::context_kv"
BLOCK_N = 16
TRITON_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


class PluginUnavailable(RuntimeError):
    pass


def output_shape(n, num_layers: int, num_kv_heads: int, head_dim: int, kv_rows: int | None = None,
                 hidden: int | None = None, kv_cols: int | None = None) -> tuple:
    """The shape of each output, [N, L, H_kv, D]; checks the stacked weight when sizes are known."""
    if kv_rows is not None and kv_rows != num_layers * 2 * num_kv_heads * head_dim:
        raise ValueError(f"kv has {kv_rows} rows, expected num_layers*2*num_kv_heads*head_dim = "
                         f"{num_layers * 2 * num_kv_heads * head_dim}")
    if hidden is not None and kv_cols is not None and hidden != kv_cols:
        raise ValueError(f"kv has {kv_cols} columns, y has hidden size {hidden}")
    if head_dim % 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
    return (n, num_layers, num_kv_heads, head_dim)


def kernel_signature(dtype: str) -> dict[str, str]:
    """Triton signature of `_dense_kernel` for y/weights/outputs of `dtype` (torch name)."""
    t = TRITON_DTYPES[dtype]
    pointers = {"y_ptr": t, "hn_ptr": t, "w_ptr": t, "kn_ptr": t, "freq_ptr": "fp32", "pos_ptr": "i32"}
    sig = {name: "*" + kind for name, kind in pointers.items()}
    sig.update(N="i32", H="i32", k_ptr="*" + t, v_ptr="*" + t)
    return sig


def compile_kernel(dtype: str, hidden: int, num_layers: int, num_kv_heads: int, head_dim: int,
                   hidden_eps: float, k_eps: float, target=None):
    """Compile `_dense_kernel` ahead of time -> triton's compiled kernel (`.asm["ptx"]`, `.metadata`)."""
    import triton
    from triton.compiler import ASTSource

    from .context_kv.triton_kernel import _dense_kernel, kernel_constants

    constants = kernel_constants(hidden_eps, k_eps, num_kv_heads, head_dim, hidden, dtype == "float32",
                                 interpreted=False, block_n=BLOCK_N)
    constants["NUM_LAYERS"] = num_layers
    signature = {**kernel_signature(dtype), **{name: "constexpr" for name in constants}}
    src = ASTSource(fn=_dense_kernel, signature=signature, constexprs=constants)
    return triton.compile(src, target=target)


def tensorrt_status() -> str | None:
    """None when AOT plugins can be registered here, else the reason."""
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT is not installed (pip install tensorrt needs NVIDIA's package index)"
    try:
        import tensorrt as trt
    except Exception as exc:  # the PyPI stub installs bindings without the libraries
        return f"TensorRT is installed but cannot load: {type(exc).__name__}: {exc}"
    if not hasattr(trt, "QuickPluginCreationRequest"):
        return f"TensorRT {trt.__version__} has no ahead-of-time quick plugins (needs >= 10.9)"
    return None


_registered = False


def register() -> None:
    """Register `trtllm_dflash::context_kv` with TensorRT (idempotent)."""
    global _registered
    reason = tensorrt_status()
    if reason:
        raise PluginUnavailable(f"cannot register {PLUGIN_ID}: {reason}")
    if not _registered:
        _define()
        _registered = True


def _define() -> None:
    from typing import Tuple, Union

    import tensorrt as trt
    import tensorrt.plugin as trtp

    dtype_names = {trt.float32: "float32", trt.float16: "float16", trt.bfloat16: "bfloat16"}

    @trtp.register(PLUGIN_ID)
    def describe(y: trtp.TensorDesc, hidden_norm: trtp.TensorDesc, kv: trtp.TensorDesc, k_norm: trtp.TensorDesc,
                 inv_freq: trtp.TensorDesc, positions: trtp.TensorDesc, num_layers: int, num_kv_heads: int,
                 head_dim: int, hidden_eps: float, k_eps: float) -> Tuple[trtp.TensorDesc, trtp.TensorDesc]:
        shape = output_shape(y.shape_expr[0], num_layers, num_kv_heads, head_dim)
        k = trtp.from_shape_expr(shape, dtype=y.dtype)
        return k, trtp.from_shape_expr(shape, dtype=y.dtype)

    @trtp.aot_impl(PLUGIN_ID)
    def aot(y: trtp.TensorDesc, hidden_norm: trtp.TensorDesc, kv: trtp.TensorDesc, k_norm: trtp.TensorDesc,
            inv_freq: trtp.TensorDesc, positions: trtp.TensorDesc, num_layers: int, num_kv_heads: int,
            head_dim: int, hidden_eps: float, k_eps: float, outputs: Tuple[trtp.TensorDesc], tactic: int
            ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymExprs]:
        hidden = int(kv.shape_expr[1])  # weights have static shapes
        compiled = compile_kernel(dtype_names[y.dtype], hidden, num_layers, num_kv_heads, head_dim,
                                  hidden_eps, k_eps)
        n = y.shape_expr[0]
        params = trtp.KernelLaunchParams()
        params.grid_x = trtp.cdiv(n, BLOCK_N)
        params.grid_y = num_layers * 2 * num_kv_heads
        params.block_x = compiled.metadata.num_warps * 32
        params.shared_mem = compiled.metadata.shared
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(n), trtp.SymInt32(hidden)])
        return compiled.metadata.name, compiled.asm["ptx"], params, extra
