"""A trial's torch process group on a local Ray that listens on 127.0.0.1 only.

A local Ray (:func:`isosweep.trial.job.ray_init`) binds its own servers to the loopback interface,
but Ray Train's torch backend then starts torch's rendezvous store (``TCPStore``) in rank 0, and
torch's store server listens on every interface whatever host it is given. :class:`LoopbackTorchConfig`
is Ray's ``TorchConfig`` with one change where Ray's node address is 127.0.0.1: rank 0 first opens a
socket bound to 127.0.0.1 and hands it to a multi-tenant ``TCPStore`` (``master_listen_fd``), which
the process group's own store at that port then shares; gloo's and NCCL's sockets are kept on the
loopback interface (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``). On a cluster (any other node
address) it is Ray's backend unchanged.

Imported only where a ``TorchTrainer`` is made: Ray's torch backend imports torch.
"""

from __future__ import annotations

import os
import socket

import ray
from ray.train.torch.config import (  # Ray's own steps of a process group's start, reused as they are
    TorchConfig,
    _set_torch_distributed_env_vars,
    _setup_torch_process_group,
    _TorchBackend,
)

from isosweep.trial.localhost import LOOPBACK

LOOPBACK_IFNAME = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
_STORES: list = []
"""Rank 0's loopback socket and store, kept for the life of the worker process."""


def serve_store_on_loopback() -> int:
    """In rank 0: a torch ``TCPStore`` server listening on 127.0.0.1 only; returns its port.

    The store is multi-tenant, so the process group's rendezvous at ``MASTER_ADDR:MASTER_PORT`` (rank 0
    asks for a multi-tenant store there too) shares this server instead of starting one on every
    interface.
    """
    import torch.distributed as dist  # reason: torch in the Train worker only

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, 0))
    listener.listen()
    port = listener.getsockname()[1]
    store = dist.TCPStore(LOOPBACK, port, None, True, wait_for_workers=False, multi_tenant=True,
                          master_listen_fd=listener.fileno(), use_libuv=True)
    _STORES.append((listener, store))
    return port


def _set_env(env: dict[str, str]) -> None:
    os.environ.update(env)


class _LoopbackTorchBackend(_TorchBackend):
    """Ray's torch backend; on a loopback-only Ray, the process group's sockets stay on 127.0.0.1."""

    def on_start(self, worker_group, backend_config: TorchConfig):
        if ray.util.get_node_ip_address() != LOOPBACK:
            return super().on_start(worker_group, backend_config)
        gpus = worker_group.get_resources_per_worker().get("GPU", 0)
        backend = backend_config.backend or ("nccl" if gpus > 0 else "gloo")
        port = worker_group.execute_single(0, serve_store_on_loopback)
        worker_group.execute(_set_env, {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)} | LOOPBACK_IFNAME)
        worker_group.execute(_set_torch_distributed_env_vars)
        ray.get([worker_group.execute_single_async(rank, _setup_torch_process_group, backend=backend,
                                                   world_rank=rank, world_size=len(worker_group),
                                                   init_method="env://", timeout_s=backend_config.timeout_s)
                 for rank in range(len(worker_group))])


class LoopbackTorchConfig(TorchConfig):
    """``TorchConfig`` whose process group listens on 127.0.0.1 only when Ray does (module docstring)."""

    @property
    def backend_cls(self):
        return _LoopbackTorchBackend
