"""dflash-build: turn a target + DFlash drafter into a verified engine directory.

spec.py (the validated settings) -> builder.py (plan_build checks the pair, build_engine writes a temporary
sibling and renames it) -> a backend behind backend.py's interface: torch.py, or trtllm/ (TensorRT-LLM's
PyTorch backend). plan.py is what a backend writer gets; verify.py re-checks an engine; compile_graphs.py stores
a torch engine's step graphs (`dflash-build compile`).
"""
