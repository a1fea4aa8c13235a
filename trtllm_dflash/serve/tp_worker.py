"""One worker rank of a tensor-parallel torch engine served by Triton (started by the Triton model)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from ..distributed.rendezvous import join_local_group
from ..engine.loader import load_engine
from .lockstep import follow


def main(engine_dir: str, rank: int, world: int, port: int, decoding: str) -> None:
    torch.set_num_threads(1)
    join_local_group("gloo", rank, world, port)
    try:
        follow(load_engine(engine_dir, rank, decoding=decoding).generator)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
