"""Invariants every loader scheme keeps, checkable on any store.

Whoever registers a scheme in `graphstore.loaders.SCHEMES` (or writes a new stage) runs
these on a small store; the project's own tests run them for every registered scheme::

    from graphstore.testing.schemes import check_node_scheme, check_link_scheme
    check_node_scheme(store, "my_scheme")          # raises AssertionError naming the invariant

Node classification: every batch's sampled nodes are resident, its rows and labels are the
store's, every training target trains equally often (at least once) an epoch, the batch
count is what ``num_batches`` says, the buffer reads what it planned, an epoch replays from
``(seed, epoch)``, and the settings survive ``to_dict``/``from_dict``. Link prediction: every
store edge trains exactly once an epoch, negatives are resident nodes, the batch count and
replay as above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["check_link_scheme", "check_node_scheme"]


def _fail(scheme: str, what: str) -> AssertionError:
    return AssertionError(f"scheme {scheme!r}: {what}")


def check_node_scheme(store, scheme: str, *, fanouts: Sequence[int] = (3, 2), batch_size: int = 17,
                      epochs: int = 2, seed: int = 0, **loader_options: Any) -> None:
    """Run ``epochs`` epochs of a `NodeLoader` with ``scheme`` on ``store`` (with labels and
    features) and check the node invariants of the module docstring.

    Raises
    ------
    AssertionError
        Naming the scheme, the epoch and the broken invariant.
    """
    from graphstore.buffer.slots import host_array
    from graphstore.loaders import NodeLoader, NodeLoaderSettings

    def make() -> NodeLoader:
        return NodeLoader(store, split="train", fanouts=fanouts, batch_size=batch_size, scheme=scheme,
                          seed=seed, **loader_options)

    loader = make()
    settings = loader.settings
    if NodeLoaderSettings.from_dict(settings.to_dict()) != settings:
        raise _fail(scheme, f"settings do not survive to_dict/from_dict: {settings.to_dict()}")
    features, labels = store.features[...], store.labels[...]
    train = [int(v) for v in store.read_node_split("train")]
    for epoch in range(epochs):
        batches, seen = [], Counter()
        for batch in loader.epoch(epoch, lookahead=False):
            ids = batch.store_ids
            if not bool((ids >= 0).all()):
                raise _fail(scheme, f"epoch {epoch}: a batch sampled a node that is not resident")
            targets = ids[batch.dense.node_id_offsets[-1]:].numpy()
            if len(targets) > batch_size:
                raise _fail(scheme, f"epoch {epoch}: a batch of {len(targets)} targets (batch_size {batch_size})")
            if not np.array_equal(host_array(batch.features), features[ids.numpy()]):  # stored bytes, any dtype
                raise _fail(scheme, f"epoch {epoch}: a batch's feature rows differ from the store's")
            if not np.array_equal(batch.labels.numpy(), labels[targets]):
                raise _fail(scheme, f"epoch {epoch}: a batch's labels differ from the store's")
            batches.append((targets.copy(), ids.numpy().copy()))
            seen.update(targets.tolist())
        counts = {seen.get(v, 0) for v in train}
        if min(counts, default=1) < 1:
            missing = next(v for v in train if seen.get(v, 0) == 0)
            raise _fail(scheme, f"epoch {epoch}: training target {missing} never trained")
        if len(counts) > 1:
            raise _fail(scheme, f"epoch {epoch}: training targets train unequally often ({sorted(counts)} times)")
        if set(seen) - set(train):
            raise _fail(scheme, f"epoch {epoch}: a node outside the train split was a target")
        if len(batches) != loader.num_batches(epoch):
            raise _fail(scheme, f"epoch {epoch}: {len(batches)} batches, num_batches says "
                                f"{loader.num_batches(epoch)}")
        stats = loader.last_stats
        # The epoch's reads include macro-batching's rows, which no buffer plan covers.
        fetched = getattr(loader, "fetch_stats", None)
        buffer_read = stats.bytes_read - (fetched.bytes_read if fetched is not None else 0)
        if buffer_read != stats.planned_bytes:
            raise _fail(scheme, f"epoch {epoch}: the buffer read {buffer_read} bytes, planned "
                                f"{stats.planned_bytes}")
        replay = [(t.copy(), i.copy()) for t, i in
                  ((b.store_ids[b.dense.node_id_offsets[-1]:].numpy(), b.store_ids.numpy())
                   for b in make().epoch(epoch, lookahead=False))]
        if len(replay) != len(batches) or any(not (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))
                                              for a, b in zip(batches, replay)):
            raise _fail(scheme, f"epoch {epoch} does not replay: a fresh loader with the same seed drew "
                                "other batches")


def check_link_scheme(store, scheme: str, *, batch_size: int = 64, negatives: int = 4, epochs: int = 2,
                      seed: int = 0, **loader_options: Any) -> None:
    """Run ``epochs`` epochs of an `EdgeLoader` with ``scheme`` on ``store`` and check the link
    invariants of the module docstring.

    Raises
    ------
    AssertionError
        Naming the scheme, the epoch and the broken invariant.
    """
    from graphstore.loaders import EdgeLoader, EdgeLoaderSettings

    def make() -> EdgeLoader:
        return EdgeLoader(store, batch_size=batch_size, negatives=negatives, scheme=scheme, seed=seed,
                          **loader_options)

    loader = make()
    if EdgeLoaderSettings.from_dict(loader.settings.to_dict()) != loader.settings:
        raise _fail(scheme, f"settings do not survive to_dict/from_dict: {loader.settings.to_dict()}")
    src, dst = _all_edges(store)
    expected = Counter(zip(src.tolist(), dst.tolist()))
    for epoch in range(epochs):
        seen: Counter = Counter()
        count = 0
        first = []
        for batch in loader.epoch(epoch, lookahead=False):
            ids = batch.graph.node_ids
            s, d = ids[batch.src], ids[batch.dst]
            if not bool((s >= 0).all() and (d >= 0).all()):
                raise _fail(scheme, f"epoch {epoch}: a positive edge has an end that is not resident")
            neg = ids[batch.negatives.nodes]
            if not bool((neg >= 0).all()):
                raise _fail(scheme, f"epoch {epoch}: a negative is not a resident node")
            seen.update(zip(s.tolist(), d.tolist()))
            count += 1
            if count <= 3:
                first.append(torch.stack([s, d]).clone())
        if seen != expected:
            extra = next(iter(seen - expected), None)
            missing = next(iter(expected - seen), None)
            raise _fail(scheme, f"epoch {epoch}: the training edges are not every store edge exactly once "
                                f"(e.g. extra {extra}, missing {missing})")
        if count != loader.num_batches(epoch):
            raise _fail(scheme, f"epoch {epoch}: {count} batches, num_batches says {loader.num_batches(epoch)}")
        again = []
        for batch in make().epoch(epoch, lookahead=False):
            ids = batch.graph.node_ids
            again.append(torch.stack([ids[batch.src], ids[batch.dst]]).clone())
            if len(again) == len(first):
                break
        if any(not torch.equal(a, b) for a, b in zip(first, again)):
            raise _fail(scheme, f"epoch {epoch} does not replay: a fresh loader with the same seed drew "
                                "other batches")


def _all_edges(store) -> tuple[np.ndarray, np.ndarray]:
    """Every stored edge as (src, dst) store ids, bucket by bucket."""
    srcs, dsts = [], []
    p = store.num_partitions
    for j in range(p):
        for i in range(p):
            src, dst, _ = store.read_bucket(i, j)
            srcs.append(np.asarray(src, dtype=np.int64))
            dsts.append(np.asarray(dst, dtype=np.int64))
    return np.concatenate(srcs), np.concatenate(dsts)
