"""Custom kernels (DFlash's KV injection, paged attention), installed as `trtllm_dflash.plugins`.

- `context_kv.reference`: the plain PyTorch definition of the op (also the CPU path);
- `context_kv.triton_kernel`: the fused Triton kernel (CUDA, or the CPU interpreter in tests);
- `context_kv.op`: the `torch.ops.trtllm_dflash.context_kv` custom op the runtime calls;
- `paged_attention`: attention reading the paged pool in place (`torch.ops.trtllm_dflash.paged_attention`: a Triton
  kernel on CUDA, its PyTorch reference elsewhere);
- `tensorrt_plugins`: TensorRT registrations, imported only where `tensorrt` is installed.
"""
