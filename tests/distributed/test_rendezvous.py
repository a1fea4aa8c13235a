"""Tensor-parallel ranks of one machine listen on loopback only (issue 13 item 7): torch's tcp:// init
listened on every interface (`*:PORT`)."""

import ipaddress
import os

import torch.distributed as dist
import torch.multiprocessing as mp
from trtllm_dflash.engine.loader import free_port

from trtllm_dflash.distributed.rendezvous import join_local_group


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on, from /proc (no tools needed)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/net/{table}") as f:
            for row in f.readlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # state LISTEN
                    addr, port = cols[1].split(":")
                    raw = bytes.fromhex(addr)
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))  # host-order words
                    found.add((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def rank_main(rank: int, world: int, port: int, out) -> None:
    join_local_group("gloo", rank, world, port)
    dist.barrier()
    out.put((rank, listening(os.getpid())))
    dist.barrier()
    dist.destroy_process_group()


def test_ranks_listen_on_loopback_only():
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    found = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert ("127.0.0.1", port) in found[0]  # the store, served by rank 0
    for rank, sockets in found.items():
        assert sockets and all(ipaddress.ip_address(addr).is_loopback for addr, _ in sockets), (rank, sockets)
