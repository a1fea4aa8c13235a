"""Rendezvous of the tensor-parallel ranks of one machine, on loopback only.

torch's `tcp://HOST:PORT` init listens with its TCPStore on every interface (`*:PORT` in `ss -ltn`,
torch 2.13: the host only says where to connect), and gloo's pairs listen on the address the machine's
hostname resolves to, which on a cluster node is its network address. Single-node ranks need neither:
the store listens on a socket we bind to 127.0.0.1 (TCPStore's `master_listen_fd`), and gloo/NCCL
bootstrap on the loopback interface (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME unless already set).
Multi-node groups come through torchrun, whose MASTER_ADDR the operator gives explicitly.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch.distributed as dist

STORE_TIMEOUT = datetime.timedelta(minutes=5)  # ranks load their shards before joining


def loopback_interface() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return "lo" if "lo" in names else next((n for n in names if n.startswith("lo")), "lo")


def listen_loopback(port: int = 0) -> socket.socket:
    """The store's listening socket on 127.0.0.1 (`port` 0: any free port; read it with getsockname)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    return sock


def join_local_group(backend: str, rank: int, world: int, port: int, listener: socket.socket | None = None) -> None:
    """Join `world` ranks of this machine; rank 0 serves the store on `listener` (or binds `port` itself)."""
    interface = loopback_interface()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    if rank == 0:
        listener = listener or listen_loopback(port)
        # detach: the store owns the descriptor now (a collected socket object would close it under it)
        store = dist.TCPStore("127.0.0.1", port, world, True, timeout=STORE_TIMEOUT,
                              master_listen_fd=listener.detach(), wait_for_workers=False)
    else:
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=STORE_TIMEOUT)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
