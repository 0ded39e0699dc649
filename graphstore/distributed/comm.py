"""The process group and the few collectives full-batch training needs, on torch.distributed.

Launch with ``torchrun --nproc-per-node N script.py``: `init_process_group` reads the
rank, world size and rendezvous address torchrun sets (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``) and picks gloo for CPU tensors and NCCL for CUDA ones.
Every collective and point-to-point message carries a timeout, so a rank that stops
answering turns into an error on the others instead of a hang.

A rank that raises: `fail_fast` prints the error as one line naming the rank and exits the
process with status 1; torchrun then stops the other ranks (SIGTERM) and exits non-zero, so
one rank's error ends the whole job within torchrun's monitoring interval. Without torchrun
the timeout above is the backstop.

The exchanges are a ring: at step ``k`` (1 .. N-1) rank ``r`` sends to ``(r + k) % N`` and
receives from ``(r - k) % N``, so every pair of ranks meets once per pass and each step's
messages have their own tag.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from graphstore.errors import ConfigError

__all__ = ["Exchange", "all_reduce_sum", "exchange_index_lists", "fail_fast", "init_process_group",
           "ring_peers"]

DEFAULT_TIMEOUT_S = 120.0
"""Seconds a collective may wait for the other ranks before it raises."""


def init_process_group(device: torch.device | str = "cpu", *, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
    """Join the job torchrun started (or a single-process group when no launcher set
    ``RANK``); returns ``(rank, world_size)``.

    gloo for a CPU device, NCCL for CUDA (each rank on ``cuda:LOCAL_RANK``).

    Raises
    ------
    ConfigError
        When ``MASTER_ADDR``/``MASTER_PORT`` are missing under a multi-process launch.
    """
    device = torch.device(device)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and "MASTER_ADDR" not in os.environ:
        # A plain `python trainers/full_batch.py`: a group of one on loopback.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise ConfigError(f"{key} is not set: start the ranks with torchrun --nproc-per-node N")
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    else:
        if os.environ["MASTER_ADDR"] in ("127.0.0.1", "localhost"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo otherwise picks the host's first interface
        backend = "gloo"
    dist.init_process_group(backend, rank=int(os.environ.get("RANK", "0")), world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail_fast(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a rank's entry point: an exception prints ``rank R: Type: message`` on one line
    and ends this process with status 1 at once (no interpreter shutdown that could wait
    on a collective), which makes torchrun stop every other rank."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except SystemExit:  # argparse's --help and usage errors: their own message and status
            raise
        except BaseException as e:  # noqa: BLE001 - every error must end the job, KeyboardInterrupt too
            rank = os.environ.get("RANK", "0")
            message = str(e).splitlines()[0] if str(e) else ""
            print(f"rank {rank}: {type(e).__name__}: {message}", file=sys.stderr, flush=True)
            if os.environ.get("TORCHELASTIC_ERROR_FILE"):
                # torchrun reports this file's message as the job's root cause.
                from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

                ErrorHandler().record_exception(e)
            if os.environ.get("GRAPHSTORE_TRACEBACK"):
                import traceback

                traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)

    return wrapper


def ring_peers(rank: int, world_size: int, step: int) -> tuple[int, int]:
    """``(send_to, receive_from)`` of ``rank`` at ring step ``step``."""
    return (rank + step) % world_size, (rank - step) % world_size


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over the ranks in place (nothing to do in a group of one); returns ``t``."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


class Exchange:
    """One ring step's messages in flight: `wait` returns what arrived.

    Sends ``payload`` to ``send_to`` and receives ``[rows, *shape]`` from ``receive_from``;
    an empty side posts nothing (both ends know the sizes, so they agree)."""

    def __init__(self, payload: torch.Tensor | None, send_to: int, receive: tuple[int, ...], receive_from: int,
                 *, dtype: torch.dtype, device: torch.device, tag: int) -> None:
        self.works = []
        self.payload = payload  # kept alive until the send completes
        self.buffer = torch.empty(receive, dtype=dtype, device=device)
        if payload is not None and payload.numel():
            self.works.append(dist.isend(payload.contiguous(), send_to, tag=tag))
        if self.buffer.numel():
            self.works.append(dist.irecv(self.buffer, receive_from, tag=tag))

    def wait(self) -> torch.Tensor:
        for w in self.works:
            w.wait()
        self.works, self.payload = [], None
        return self.buffer


def exchange_index_lists(wanted: Sequence[torch.Tensor], device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Every rank tells every other which of its rows it wants: ``wanted[s]`` (int64, rows
    of rank ``s``'s block) goes to rank ``s``; returns ``asked[t]``, the rows of this
    rank's block that rank ``t`` wants. Sizes first, then the lists, one ring step each."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(device)  # NCCL moves CUDA tensors only
    asked: list[torch.Tensor] = [torch.empty(0, dtype=torch.int64, device=device) for _ in range(world)]
    sizes = torch.tensor([w.numel() for w in wanted], dtype=torch.int64, device=device)
    got = torch.empty(world, dtype=torch.int64, device=device)
    if world > 1:
        dist.all_to_all_single(got, sizes)
    else:
        got.copy_(sizes)
    for step in range(1, world):
        # The rows this rank wants from `source` go to it; `to` sends the rows it wants.
        to, source = ring_peers(rank, world, step)
        ex = Exchange(wanted[to].to(device), to, (int(got[source]),), source, dtype=torch.int64, device=device,
                      tag=step)
        asked[source] = ex.wait()
    return asked
