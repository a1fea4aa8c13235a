"""trtllm-dflash: DFlash speculative decoding from checkpoints to a served, benchmarked deployment."""

__version__ = "0.1.0"
