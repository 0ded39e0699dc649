"""Randomness of an epoch as a function of ``(seed, epoch, purpose)`` alone.

Every stage that draws (target order, neighbour samples, negatives, micro-batch splits)
takes its own stream from here, so an epoch replays exactly whatever ran before it (the
trainers' ``--resume`` relies on it) and one stage's draws never shift another's.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["epoch_generator", "epoch_seed"]


def epoch_generator(seed: int, epoch: int, salt: int, *stream: int) -> torch.Generator:
    """A torch generator for one purpose (``salt``) of one epoch; ``stream`` keys a part
    of the epoch drawn on its own (a data-parallel round and rank), none the whole epoch."""
    mixed = np.random.SeedSequence([int(seed), int(epoch), salt, *map(int, stream)]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed) & ((1 << 63) - 1))


def epoch_seed(seed: int, epoch: int, salt: int = 0) -> int:
    """An integer seed per (run seed, epoch, purpose), for code that takes a seed rather
    than a generator (dropout through ``torch.manual_seed``, the micro-batch splitters).

    A different mix from `epoch_generator`'s: both predate this module and runs recorded
    with either must replay bit for bit."""
    entropy = [int(seed) & 0xFFFFFFFF, int(epoch), int(salt), 0x7261696E]
    state = np.random.SeedSequence(entropy).generate_state(1, np.uint64)
    return int(state[0]) & ((1 << 63) - 1)
