"""Paged attention: each row's queries attend to its keys read in place from the paged pool through the block
table (no gather). `op.paged_attention` is the entry point (`torch.ops.trtllm_dflash.paged_attention`)."""

from .op import paged_attention, supported

__all__ = ["paged_attention", "supported"]
