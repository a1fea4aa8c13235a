"""The `trtllm` backend of dflash-build: a deployment directory for TensorRT-LLM's PyTorch backend.

engine.py writes it; targets.py says which targets TensorRT-LLM's DFlash runs; options.py, fields.py and tables/
check the LLM-API options against the chosen release; memory.py sizes the DFlash arena; drafter.py writes the
drafter in the published layout; reuse.py gates KV-block reuse. Nothing here imports tensorrt_llm at module level.
"""
