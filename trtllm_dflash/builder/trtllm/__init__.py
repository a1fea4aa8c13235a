"""The `trtllm` backend of dflash-build: a deployment directory for TensorRT-LLM's PyTorch backend.

backend.py is the backend (builder/backend.py's interface); engine.py writes the directory and verify.py
re-checks it; targets.py says which targets TensorRT-LLM's DFlash runs; options.py, fields.py and tables.py (the
tables/ folder: one JSON field table per release) check the LLM-API options; memory.py sizes the DFlash arena;
drafter.py writes the drafter in the published layout; reuse.py gates KV-block reuse; quantize.py runs Model
Optimizer for --quant. Only verify.py imports tensorrt_llm, inside a function, and reports a skip where it is absent.
"""
