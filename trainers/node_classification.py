"""Train a GNN node classifier on a graphstore store, in memory or out of core.

    python trainers/node_classification.py --store S.gs          # everything else from the data
        [--model sage|gcn|gat|gin] [--scheme minibatch|megabatch|disk|microbatch|macrobatch]
        [--policy sequential|dispersed|hierbatching]
        [--micro-batches K | --micro-batch-budget BYTES] [--micro-strategy reg|metis|random|range]
        [--buffer-partitions C | --buffer-bytes B] [--reuse P] [--static-cache R]
        [--fanouts 15,10] [--batch-size B] [--epochs 200] [--patience 20] [--eval-every N]
        [--lr 0.01] [--hidden 64] [--dropout 0.5] [--seed 0] [--device cpu] [--metrics-out M.json]
        [--checkpoint-dir D [--resume]] [--config C.toml] [--eval-fanouts -1,-1] [--eval-scheme S]
        [--eval-batch-size B] [--weight-decay 5e-4] [--heads 4] [--balance-labels auto|on|off]
        [--normalize-features auto|none|row] [--lr-schedule none|cosine]

Schemes (`graphstore.loaders`): ``minibatch`` holds the whole graph (the in-memory
reference), ``megabatch`` HierBatching's mega-batches (a quarter of the partitions, a
static cache of 1 % of nodes, each mega-batch once: HierBatching's two passes are
``--reuse 2``), ``disk`` MariusGNN's node policies (half the partitions). The loader's
choices are printed at the start and recorded in the metrics.
``microbatch`` (Betty) is the minibatch data path with every batch split into micro-batches
by the loader (its ``MicroBatchSplit`` stage)
(`graphstore.sample.split_dense`), K fixed or the fewest whose estimated training-step
memory fits ``--micro-batch-budget`` (`graphstore.nn.estimate_step_memory`); their
gradients accumulate, weighted by each micro-batch's share of the labelled targets, into the
batch's update. ``--micro-batches`` with ``megabatch`` or ``disk`` splits those batches too.

Evaluation is exact by default, whatever the scheme (``--eval-scheme exact``, layer-wise
inference, `graphstore.inference.infer_layerwise`): every layer over the whole graph, all
neighbours, out of core, within the training buffer's share of the features and at most the
buffer's byte budget (`exact_eval_budget`). ``--eval-fanouts`` or ``--aggregation-cache``
evaluate with the training scheme's loaders instead.

Defaults from the data (`resolve_defaults`, `graphstore.loaders.defaults`; each rule printed
and recorded in the metrics' ``config.derived``): ``--normalize-features auto`` row-normalises
non-negative, mostly-zero rows; the batch is min(1000, max(64, train split / 8)); without
``--buffer-bytes``/``--buffer-partitions`` an out-of-core scheme's buffer is half the memory the
process may still use (a resumed run keeps its checkpoint's), and without
``--macro-batch-bytes`` a round of macro-batching holds at most a third of that (three rounds
are alive with the prefetch thread). ``--balance-labels auto|on``
weighs a buffer state's classes when its targets' labels cluster
(`graphstore.loaders.node.label_skew`); off by default (docs/benchmarks.md, "Out of core
converges like in memory").

Selection: up to ``--epochs`` (200), stopping once neither validation accuracy nor loss has
improved for ``--patience`` (20) epochs; validation only during training (after an epoch
when evaluation so far plus one more fits within the training time so far, or every ``--eval-every N``);
the best-validation-accuracy model is restored and scored once on valid and test (``final``
and ``best`` in the metrics JSON, with ``selection``).

Sampled evaluation (``--eval-scheme`` a scheme, or ``--eval-fanouts``) runs the model in eval mode over
`NodeLoader` batches of the same scheme (or ``--eval-scheme``) with ``shuffle=False`` and
``reuse=1`` (every target exactly once). Under megabatch/disk a target sees only the
neighbours resident with it, as in training; ``--eval-scheme minibatch`` evaluates in
memory instead, for graphs that fit. Its fanouts default to all neighbours (-1 per hop) when the store
has at most ``FULL_EVAL_MAX_EDGES`` edges (exact and deterministic), else the training
fanouts; ``--eval-fanouts`` overrides, and the choice is recorded. ``--eval-batch-size``
(default ``--batch-size``) sets the targets per evaluation batch: a small training batch
need not make evaluation crawl.

``--normalize-features row`` divides every input feature row by its sum of absolute values
(rows of zeros stay zero): PyG's ``NormalizeFeatures`` for the non-negative features of
Planetoid and the gnn-benchmark datasets. It is applied to each batch's gathered input rows
(training and evaluation, every scheme), so it needs no pass over the store and works out of
core. ``--lr-schedule cosine`` anneals the learning rate per epoch from ``--lr`` towards 0
(``lr * (1 + cos(pi * epoch / epochs)) / 2``); it is a function of the epoch alone, so a
resumed run sets the same rates.

Data parallel: ``torchrun --nproc-per-node N trainers/node_classification.py ...`` trains
every scheme with `DistributedDataParallel` (`graphstore.distributed.data_parallel`; gloo on
CPU, NCCL with ``--device cuda``, each rank on ``cuda:LOCAL_RANK``). Each rank's loaders
yield a disjoint share of every epoch (a contiguous block of the buffer states when the
plan has at least N, as megabatch and disk do; else every N-th batch, as minibatch,
microbatch and macrobatch do); ``--batch-size`` is per rank, a step trains one batch of
every rank with the mean loss over their union, and a rank with fewer batches pads with
zero-weight steps. Sampled evaluation is split the same way and its sums all-reduced; the
exact evaluation (deterministic) is computed by every rank, so none waits on another
through a long collective. Only rank 0 prints, writes the metrics and the checkpoints;
every rank reads the checkpoint on ``--resume``, which continues exactly (the world size
is part of the recorded configuration). A rank that raises prints ``rank R: ...`` and
exits at once, and torchrun stops the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch.nn import functional as F

import graphstore
from graphstore.buffer import POLICIES as POLICY_REGISTRY
from graphstore.distributed.agreement import check_ranks_agree
from graphstore.distributed.data_parallel import (
    all_reduce_values,
    dropout_salt,
    equal_steps,
    node_classification_backward,
    rank_and_world,
    wrap_model,
)
from graphstore.distributed.feature_fetch import PLACEMENTS, PartitionedFetch
from graphstore.errors import ConfigError
from graphstore.inference import AGGREGATE_INPUTS, InferenceStats, evaluation_budget, infer_layerwise
from graphstore.layout.dtypes import storage_dtype
from graphstore.loaders import SCHEMES as SCHEME_REGISTRY
from graphstore.loaders import NodeLoader, NodeLoaderSettings
from graphstore.loaders.transfer import DeviceFeeder
from graphstore.loaders.defaults import default_batch_size, feature_normalization, macro_batch_bytes, memory_budget
from graphstore.loaders.feature_cache import default_cache_bytes
from graphstore.nn import (
    AGGREGATE_FOR,
    GNN,
    class_weighted_cross_entropy,
    layer_degrees,
    micro_batch_backward,
    model_state_bytes,
    normalize_rows,
    step_estimator,
)
from graphstore.sample import STRATEGIES as STRATEGY_REGISTRY

try:
    from trainers import common
    from trainers.options import (CommonOptions, byte_size, fanout_list, non_negative_int, option, positive_int,
                                  unit_float)
except ImportError:  # run as a script
    import common
    from options import (CommonOptions, byte_size, fanout_list, non_negative_int, option, positive_int,
                         unit_float)

PROG = "node_classification.py"
LOSS_PROGRESS = 0.01
"""Early stopping counts a validation loss as progress when it is this much (relative) below
the lowest so far; smaller drops go on for hundreds of epochs under weight decay."""
FULL_EVAL_MAX_EDGES = 10_000_000
"""Up to this many edges, evaluation samples every neighbour (exact); above, the training fanouts."""
# The choices of --model, --scheme, --eval-scheme, --policy and --micro-strategy: the
# registries' (a scheme, policy or strategy registered before this module is imported is a
# choice, and --help lists each with its summary).
MODELS = ("sage", "gcn", "gat", "gin")
SCHEMES = SCHEME_REGISTRY.names(lambda s: "node" in s.tasks)
EVAL_SCHEMES = SCHEME_REGISTRY.names(lambda s: "node" in s.tasks and not s.split_batches) + ("exact",)
"""``exact``: layer-wise inference over the whole graph out of core (`graphstore.inference`)."""
POLICIES = POLICY_REGISTRY.names(lambda p: p.task in ("node", "both"))
MICRO_STRATEGIES = STRATEGY_REGISTRY.names()


@dataclasses.dataclass(frozen=True)
class NodeClassificationOptions(CommonOptions):
    """This script's options: the common ones, then the model's and the loader's."""

    prog: ClassVar[str] = PROG
    description: ClassVar[str] = "Train a GNN node classifier on a graphstore store."

    model: str = option("sage", choices=MODELS, help="GNN layer kind")
    scheme: str = option("minibatch", choices=SCHEMES,
                         help=SCHEME_REGISTRY.help_text(lambda s: "node" in s.tasks))
    micro_batches: int | None = option(
        None, type=positive_int, metavar="K",
        help="split every batch into K micro-batches (Betty); with megabatch or disk too (default: none)")
    micro_batch_budget: int | None = option(
        None, type=byte_size, metavar="BYTES",
        help="split every batch into the fewest micro-batches whose estimated training-step memory fits BYTES "
             "(default: derived from the buffer: 1/8 of the byte budget of an out-of-core scheme, the buffer the "
             "rest; none with --micro-batches, --buffer-partitions or a scheme holding the whole graph)")
    micro_strategy: str = option(
        "reg", choices=MICRO_STRATEGIES,
        help="how targets are grouped into micro-batches: " + STRATEGY_REGISTRY.help_text())
    macro_batches: int | None = option(
        None, type=lambda text: -1 if str(text) == "all" else positive_int(text), metavar="B",
        help="macrobatch: mini-batches whose input rows are read from the store at once, or 'all' "
             "(default: 16)")
    macro_batch_bytes: int | None = option(
        None, type=byte_size, metavar="BYTES",
        help="macrobatch: most bytes of samples a macro-batch holds (it is cut short there) and of feature "
             "rows a round holds (a larger union is read in rounds) (default: a third of half the memory this "
             "process may use, less a feature cache: three rounds are held at once)")
    feature_cache_bytes: int | None = option(
        None, type=byte_size, metavar="BYTES",
        help="macrobatch: keep up to BYTES of feature rows between rounds (default: no cache; with "
             "--feature-cache, every row when they fit half the memory this process may use, else that half)")
    feature_cache: str | None = option(
        None, choices=("belady", "lru"),
        help="macrobatch: what the feature cache keeps: rows used soonest by the mini-batches sampled ahead "
             "(belady) or used most recently (lru) (default: none: no cache; belady with --feature-cache-bytes)")
    cache_lookahead: int = option(
        32, type=positive_int, metavar="K",
        help="macrobatch: mini-batches sampled ahead for the belady cache (their samples are held in memory)")
    aggregation_cache: bool = option(
        False, help="macrobatch, sage/gcn/gin: the first layer reads every input node's stored aggregate of "
                    "all its in-neighbours (BatchGNN; `graphstore aggregate STORE --op mean|gcn|sum` first) "
                    "instead of the last hop's samples, whose fanout is then unused")
    feature_placement: str = option(
        "store", choices=PLACEMENTS,
        help="macrobatch under torchrun: every rank reads its rows from the store (store), or each rank "
             "holds its block of partitions' rows in memory and fetches a round's others from their "
             "owners in one collective round (partitioned; BatchGNN's distributed fetch)")
    policy: str | None = option(
        None, choices=POLICIES,
        help="buffer policy: " + POLICY_REGISTRY.help_text(lambda p: p.task in ("node", "both"))
             + " (default: the scheme's: hierbatching for megabatch; for disk sequential when the training "
               "partitions fit the buffer, else dispersed; in_memory for the others)")
    reuse: int | None = option(None, type=positive_int,
                               help="passes over each state's targets (default: 1; HierBatching trains each "
                                    "mega-batch twice: 2)")
    static_cache: float | None = option(
        None, type=unit_float, metavar="R",
        help="fraction of nodes (highest degree) kept in a static cache (default: the scheme's: 0.01 for "
             "megabatch with its own policy, else 0)")
    fanouts: tuple[int, ...] = option(
        (15, 10), type=fanout_list, help="neighbours per hop, nearest hop first; -1 = all; one per layer")
    eval_fanouts: tuple[int, ...] | None = option(
        None, type=fanout_list,
        help=f"fanouts for evaluation (default: derived from the data: all neighbours up to "
             f"{FULL_EVAL_MAX_EDGES:,} edges, else the training fanouts)")
    eval_batch_size: int | None = option(
        None, type=positive_int, metavar="B",
        help="targets per evaluation batch; evaluation keeps no gradients, so it can take larger batches than "
             "training (default: as --batch-size)")
    eval_scheme: str | None = option(
        None, choices=EVAL_SCHEMES,
        help="scheme of evaluation (default: exact, unless --eval-fanouts or --aggregation-cache is given, then "
             "--scheme; exact = every layer over the whole graph with all neighbours, out of core, within the "
             "training buffer's memory; minibatch = sampled, in memory)")
    batch_size: int | None = option(
        None, type=positive_int, metavar="B",
        help="targets per training batch (default: derived from the data: min(1000, max(64, train split / 8)), "
             "so an epoch is several optimizer steps even on a 20-per-class split)")
    train_targets: int | None = option(
        None, type=positive_int, metavar="N",
        help="train on N targets of the train split, drawn once from --seed (the same N nodes for every scheme and "
             "run of that seed): an epoch of a bounded size on a graph whose whole split takes hours, as "
             "MariusGNN's and bench_outofcore's runs of 300,000 targets (default: the whole split)")
    patience: int = option(
        20, type=non_negative_int, run_only=True, metavar="P",
        help="stop once neither validation accuracy nor validation loss has improved for P epochs (0: run every "
             "epoch); the best-validation-accuracy model is restored and tested once at the end")
    balance_labels: str = option(
        "off", choices=("auto", "on", "off"),
        help="weigh each buffer state's loss by class so its targets have the training split's label mix (a few "
             "METIS partitions' labels cluster); auto: on when the states' label mixes are on average more than "
             "0.15 (total variation) further from the split's than random states of their sizes; off (measured: it "
             "learns faster at first and ends lower)")
    hidden: int = option(64, type=positive_int, help="hidden width")
    dropout: float = option(0.5, type=unit_float)
    weight_decay: float = option(5e-4, type=float)
    heads: int = option(4, type=positive_int, help="GAT attention heads")
    normalize_features: str = option(
        "auto", choices=("auto", "none", "row"),
        help="row: divide each input feature row by its L1 norm (PyG's NormalizeFeatures), per batch, "
             "so it works out of core; auto: derived from the data, row when sampled rows are non-negative and mostly "
             "zeros (bag-of-words), else none")
    lr_schedule: str = option("none", choices=("none", "cosine"),
                              help="cosine: anneal the learning rate per epoch from --lr towards 0")

    @property
    def micro_batching(self) -> bool:
        """Whether batches are split (``--micro-batches`` or ``--micro-batch-budget``)."""
        return self.micro_batches is not None or self.micro_batch_budget is not None

    def validate(self) -> None:
        super().validate()
        if self.eval_fanouts is not None and len(self.eval_fanouts) != len(self.fanouts):
            raise ConfigError(f"--eval-fanouts needs one fanout per layer ({len(self.fanouts)}; "
                              f"got {len(self.eval_fanouts)})")
        if self.micro_batches is not None and self.micro_batch_budget is not None:
            raise ConfigError("give --micro-batches or --micro-batch-budget, not both")
        if self.scheme == "microbatch" and not self.micro_batching:
            raise ConfigError("--scheme microbatch needs --micro-batches K or --micro-batch-budget BYTES")
        if self.scheme != "macrobatch" and (self.macro_batches is not None or self.macro_batch_bytes is not None
                                            or self.feature_cache_bytes is not None or self.feature_cache is not None):
            raise ConfigError("--macro-batches, --macro-batch-bytes, --feature-cache and --feature-cache-bytes are "
                              "for --scheme macrobatch")
        if self.feature_placement == "partitioned":
            if self.scheme != "macrobatch":
                raise ConfigError("--feature-placement partitioned is for --scheme macrobatch")
            if not self.prefetch:
                raise ConfigError("--feature-placement partitioned fetches in the prefetch thread; drop "
                                  "--no-prefetch")
        if self.aggregation_cache:
            if self.scheme != "macrobatch":
                raise ConfigError("--aggregation-cache is for --scheme macrobatch (it reads rows from the store)")
            if self.model not in AGGREGATE_FOR:
                raise ConfigError(f"--aggregation-cache takes --model {'|'.join(AGGREGATE_FOR)}: a {self.model} "
                                  "layer is not linear in a neighbour sum")
            if len(self.fanouts) < 2:
                raise ConfigError("--aggregation-cache needs at least 2 layers (the first takes the aggregate, "
                                  "the others sample)")
            if self.micro_batching:
                raise ConfigError("--aggregation-cache does not combine with micro-batching")


@dataclasses.dataclass(frozen=True)
class NodeClassificationConfig:
    """The run as recorded in the metrics JSON and the checkpoint, and compared on resume:
    the options with every default the store decides made explicit."""

    options: NodeClassificationOptions
    eval_fanouts: tuple[int, ...]
    """Evaluation's fanouts, one per layer (given, or chosen by the store's size)."""
    eval_fanouts_rule: str
    """Why those: "given", or the rule that chose them."""
    eval_batch_size: int
    """Targets per evaluation batch (``--eval-batch-size``, else ``--batch-size``)."""
    eval_scheme: str
    """Evaluation's scheme (``--eval-scheme``, else the loaders' scheme)."""
    loader_scheme: str
    """The data path of the loaders: microbatch's is minibatch's (the training loader runs
    the microbatch scheme, which is minibatch plus the split)."""
    loaders: Mapping[str, NodeLoaderSettings] | None = None
    """Each loader's settings by split, once the loaders exist."""
    world_size: int = 1
    """Data-parallel ranks (torchrun's ``WORLD_SIZE``); a resumed run needs the same."""
    eval_buffer_bytes: int | None = None
    """Exact evaluation's byte budget (`exact_eval_budget`), once the model exists; run-only
    (the result does not depend on it)."""
    derived: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Options left at a default the data decides: the rule that chose each value
    (`resolve_defaults`)."""

    @property
    def num_layers(self) -> int:
        return len(self.options.fanouts)

    def to_dict(self) -> dict[str, Any]:
        """The keys and values the metrics JSON's ``config`` has always had (old checkpoints
        compare equal), in the same order."""
        out = self.options.to_dict()
        del out["verbose"]
        out.update(eval_fanouts=list(self.eval_fanouts), eval_fanouts_rule=self.eval_fanouts_rule,
                   num_layers=self.num_layers, eval_batch_size=self.eval_batch_size,
                   loader_scheme=self.loader_scheme, micro_batching=self.options.micro_batching,
                   eval_scheme=self.eval_scheme, store=str(self.options.store))
        if self.loaders is not None:
            out["loaders"] = {name: settings.to_dict() for name, settings in self.loaders.items()}
        if self.world_size != 1:  # absent from one-process records, old ones included
            out["world_size"] = self.world_size
        if out["feature_placement"] == "store":  # the default: absent, so old records compare equal
            del out["feature_placement"]
        if out["feature_cache"] is None:  # no cache: recorded as before its default was None (old records)
            out["feature_cache"] = "belady"
        if self.derived:
            out["derived"] = dict(self.derived)
        return out


def build_parser() -> argparse.ArgumentParser:
    return NodeClassificationOptions.build_parser()


def prepare(batch, args: NodeClassificationOptions | None):
    """The batch as the model sees it: input rows row-normalised with ``--normalize-features row``.

    Raises
    ------
    ConfigError
        A stored aggregate in the batch of other inputs than the run's (it would be added
        to rows normalised otherwise).
    """
    mode = "none" if args is None else getattr(args, "normalize_features", "none")
    source = getattr(batch, "aggregated_from", None)
    if source is not None and source.input != AGGREGATE_INPUTS[int(mode == "row")]:
        raise ConfigError(f"{source.array} aggregates {source.input}, but this run reads "
                          f"{AGGREGATE_INPUTS[int(mode == 'row')]} (--normalize-features {mode})")
    if mode == "none":
        return batch
    # Stored aggregates were computed from normalised rows already (checked above).
    return dataclasses.replace(batch, features=normalize_rows(batch.features.float()))


@functools.cache
def feeder(device) -> DeviceFeeder:
    """The run's `DeviceFeeder` for ``device`` (its pinned buffers kept across epochs); on
    the CPU it hands batches on as they are."""
    return DeviceFeeder(device)


def _on(rows: torch.Tensor | None, device) -> torch.Tensor | None:
    """``rows`` on ``device`` (None stays None: a batch without stored aggregates)."""
    return None if rows is None else rows.to(device, non_blocking=True)


def epoch_lr(args: NodeClassificationOptions, epoch: int) -> float:
    """The learning rate of ``epoch`` (0-based) under ``--lr-schedule``."""
    if args.lr_schedule == "cosine":
        return args.lr * 0.5 * (1.0 + math.cos(math.pi * epoch / args.epochs))
    return args.lr


def resolve_config(args: NodeClassificationOptions, store) -> NodeClassificationConfig:
    """The options as recorded and compared on resume (every choice made explicit)."""
    # The data path of microbatch is the in-memory minibatch loader; other schemes may split
    # their batches too (micro-batches inside a mega-batch).
    loader_scheme = "minibatch" if args.scheme == "microbatch" else args.scheme
    eval_scheme = args.eval_scheme
    if eval_scheme is None:
        # Exact for every scheme: layer-wise over the whole graph within a byte budget costs
        # a pass over the graph per layer, where sampling every neighbour of every target
        # expands each one's neighbourhood (on Amazon Photo 0.42 s against 0.84 s for the
        # validation split, 0.2 s against 11 s for the test split), and its memory is bounded.
        # Evaluation fanouts ask for sampled evaluation with the training scheme, and the
        # aggregation cache's model reads stored aggregates, so those keep their loaders.
        sampled = args.eval_fanouts is not None or args.aggregation_cache
        eval_scheme = loader_scheme if sampled else "exact"
    if eval_scheme == "exact":
        eval_fanouts, rule = (-1,) * len(args.fanouts), "exact: every neighbour, layer by layer over the whole graph"
    elif args.eval_fanouts is not None:
        eval_fanouts, rule = args.eval_fanouts, "given"
    elif store.num_edges <= FULL_EVAL_MAX_EDGES:
        eval_fanouts = (-1,) * len(args.fanouts)
        rule = f"all neighbours (store has <= {FULL_EVAL_MAX_EDGES} edges)"
    else:
        eval_fanouts, rule = args.fanouts, f"training fanouts (store has > {FULL_EVAL_MAX_EDGES} edges)"
    return NodeClassificationConfig(options=args, eval_fanouts=eval_fanouts, eval_fanouts_rule=rule,
                                    eval_batch_size=args.eval_batch_size or args.batch_size,
                                    eval_scheme=eval_scheme, loader_scheme=loader_scheme)


def train_targets(store, args: NodeClassificationOptions) -> np.ndarray:
    """The training targets: the train split, or ``--train-targets N`` of its nodes drawn
    without replacement by a generator of ``--seed`` alone (ascending store ids).

    Raises
    ------
    ConfigError
        N larger than the train split.
    """
    split = np.asarray(store.read_node_split("train"), dtype=np.int64)
    if args.train_targets is None:
        return split
    if args.train_targets > split.size:
        raise ConfigError(f"{store.path}: --train-targets {args.train_targets:,} is more than the train split's "
                          f"{split.size:,} nodes")
    rng = np.random.default_rng([args.seed, 0x7A6E])  # its own stream: no other draw of the run moves it
    return np.sort(rng.choice(split, size=args.train_targets, replace=False))


def make_loaders(store, args: NodeClassificationOptions, config: NodeClassificationConfig,
                 model: GNN | None = None, *, rank: int = 0) -> dict[str, NodeLoader]:
    """The train loader (with micro-batching when asked; a budget needs ``model`` for its
    step-memory estimate) and the valid and test loaders; with ``config.world_size > 1``,
    rank ``rank``'s share of each (`graphstore.loaders.shard`)."""
    common_kw = dict(scheme=config.loader_scheme, policy=args.policy, capacity=args.buffer_partitions,
                     buffer_bytes=args.buffer_bytes, static_cache=args.static_cache, seed=args.seed,
                     prefetch=args.prefetch, rank=rank, world_size=config.world_size,
                     loader_threads=common.loader_threads(args))
    micro_kw = {}
    if args.micro_batching:
        budget = args.micro_batch_budget
        if budget is not None and "micro_batch_budget" in config.derived:
            budget += model_state_bytes(model)  # the budget's share is for the batch alone
        micro_kw = dict(micro_batches=args.micro_batches, micro_batch_budget=budget,
                        micro_strategy=args.micro_strategy,
                        step_estimator=step_estimator(model) if budget is not None else None)
    fanouts, eval_fanouts = args.fanouts, config.eval_fanouts
    if args.scheme == "macrobatch":
        micro_kw.update(macro_batches=args.macro_batches, macro_batch_bytes=args.macro_batch_bytes,
                        feature_cache_bytes=args.feature_cache_bytes, feature_cache=args.feature_cache,
                        cache_lookahead=args.cache_lookahead)
    if args.aggregation_cache:
        op = AGGREGATE_FOR[args.model]
        record = store.aggregates.get(op)
        wanted = AGGREGATE_INPUTS[int(args.normalize_features == "row")]
        if record is not None and record["input"] != wanted:
            raise ConfigError(f"{store.path}: {record['array']} aggregates {record['input']}, but training reads "
                              f"{wanted} (--normalize-features {args.normalize_features}); run `graphstore "
                              f"aggregate {store.path} --op {op} --normalize-features {args.normalize_features}`")
        # The outermost hop (the first layer's) is the stored aggregate: not sampled.
        fanouts, eval_fanouts = fanouts[:-1], eval_fanouts[:-1]
        common_kw["aggregated"] = op
    fetch_kw = {}
    if args.feature_placement == "partitioned":
        if config.world_size < 2:
            raise ConfigError("--feature-placement partitioned is for 2 or more ranks (torchrun --nproc-per-node N)")
        # One fetch (one copy of this rank's rows, one process group) for every loader: their
        # epochs run one after another, so their collective rounds never overlap.
        fetch_kw["feature_fetch"] = PartitionedFetch(store, common_kw.get("aggregated"))
    subset = {} if args.train_targets is None else {"nodes": train_targets(store, args)}
    loaders = {"train": NodeLoader(store, split="train", fanouts=fanouts, batch_size=args.batch_size,
                                   reuse=args.reuse, shuffle=True, **dict(common_kw, scheme=args.scheme),
                                   **micro_kw, **fetch_kw, **subset,
                                   balance_labels={"auto": None, "on": True, "off": False}[args.balance_labels])}
    eval_kw = dict(common_kw, seed=args.seed + 1)
    if config.eval_scheme != config.loader_scheme:  # the buffer flags describe the training scheme
        eval_kw.update(scheme=config.eval_scheme, policy=None, capacity=None, buffer_bytes=None,
                       static_cache=None)
    if config.eval_scheme == "exact":
        return loaders  # evaluation streams the store itself (`evaluate_exact`)
    if config.eval_scheme != "macrobatch" and "aggregated" in eval_kw:
        # Evaluation in memory samples every hop itself (with every neighbour, the same model).
        del eval_kw["aggregated"]
        eval_fanouts = config.eval_fanouts
    for split in ("valid", "test"):
        # reuse=1 and no shuffle: every target exactly once. A distinct seed keeps evaluation's
        # neighbour samples independent of training's (only matters with sampled fanouts).
        kw = dict(eval_kw, **fetch_kw) if config.eval_scheme == "macrobatch" else eval_kw
        loaders[split] = NodeLoader(store, split=split, fanouts=eval_fanouts,
                                    batch_size=config.eval_batch_size, reuse=1, shuffle=False, **kw)
    return loaders


def train_epoch(model, optimizer, loader: NodeLoader, epoch: int, device, *, seed: int,
                args: NodeClassificationOptions | None = None) -> tuple[float, int]:
    """One pass; returns (mean loss over targets, number of targets trained). A batch the
    loader split into micro-batches (`NodeBatch.micro_batches`) accumulates its gradient
    over them (weighted by their share of the labelled targets: the same update as the
    whole batch) before the one optimizer step."""
    model.train()
    # Dropout draws from torch's global generator: seeded per epoch so a resumed run replays
    # it (per rank too: rank 0's stream is a single process's, the others' their own).
    common.seed_everything(common.epoch_seed(seed, epoch, salt=dropout_salt(rank_and_world()[0])))
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return _train_epoch_data_parallel(model, optimizer, loader, epoch, device, args)
    total, count = 0.0, 0
    # An epoch's batches are a function of (seed, epoch) alone, whatever the buffer kept
    # from the previous epoch (graphstore.loaders), so a resumed run replays it exactly.
    batches = feeder(device)(loader.epoch(epoch))
    for batch in common.progress(batches, desc=f"epoch {epoch}", total=loader.num_batches(epoch)):
        batch = prepare(batch, args)
        labels = batch.labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        if batch.micro_batches is not None:
            # The parent batch stays on the host; each micro-batch moves to ``device`` as it
            # runs, so the device holds one micro-batch, which is what a budget counts. GCN
            # normalises by degree: every micro-batch gets its parent's (the whole batch's).
            degrees = layer_degrees(batch.dense)[0] if args is not None and args.model == "gcn" else None
            weights = batch.class_weights
            loss = micro_batch_backward(model, batch, list(batch.micro_batches), degrees=degrees, device=device,
                                        loss_fn=lambda logits, y: class_weighted_cross_entropy(logits, y, weights))
        else:
            out = model(batch.features.to(device, non_blocking=True), batch.dense.to(device),
                        aggregated=_on(batch.aggregated, device), aggregated_from=batch.aggregated_from)
            loss = class_weighted_cross_entropy(out, labels, batch.class_weights)
            loss.backward()
        optimizer.step()
        n = int((labels >= 0).sum())
        total += float(loss.detach()) * n
        count += n
    if count == 0:
        raise ConfigError("the train split has no labelled node in any batch; check the store's splits")
    return total / count, count


def _train_epoch_data_parallel(model, optimizer, loader: NodeLoader, epoch: int, device,
                               args: NodeClassificationOptions | None) -> tuple[float, int]:
    """`train_epoch` of one rank under DDP: every rank takes part in ``num_steps`` steps
    (padded after its last batch with zero-weight steps, `equal_steps`), each the mean loss
    over the step's targets on all ranks (`node_classification_backward`); returns the
    epoch's mean loss and targets over all ranks."""
    total, count = 0.0, 0
    steps = loader.num_steps(epoch)
    batches = equal_steps(loader.epoch(epoch), loader.num_batches(epoch), steps)
    for batch, weight in common.progress(batches, desc=f"epoch {epoch}", total=steps):
        batch = prepare(batch, args)
        optimizer.zero_grad(set_to_none=True)
        gcn = batch.micro_batches is not None and args is not None and args.model == "gcn"
        loss_sum, n = node_classification_backward(model, batch, weight=weight, device=device,
                                                   degrees=layer_degrees(batch.dense)[0] if gcn else None)
        optimizer.step()
        total += loss_sum
        count += n
    total, count = all_reduce_values([total, count], device)
    if count == 0:
        raise ConfigError("the train split has no labelled node in any batch; check the store's splits")
    return total / count, int(count)


@torch.no_grad()
def evaluate(model, loader: NodeLoader, epoch: int, device,
             args: NodeClassificationOptions | None = None) -> dict[str, float]:
    """Accuracy and mean cross-entropy over the split; every target is seen exactly once
    (checked). The loss shows overfitting that accuracy on a small split hides."""
    model.eval()
    correct, seen, loss_sum = 0, 0, 0.0
    for batch in common.progress(feeder(device)(loader.epoch(epoch)), desc=f"evaluate {loader.split}",
                                 total=loader.num_batches(epoch)):
        batch = prepare(batch, args)
        logits = model(batch.features.to(device), batch.dense.to(device), aggregated=_on(batch.aggregated, device),
                       aggregated_from=batch.aggregated_from)
        labels = batch.labels.to(device)
        mask = labels >= 0
        correct += int((logits[mask].argmax(1) == labels[mask]).sum())
        loss_sum += float(F.cross_entropy(logits[mask], labels[mask], reduction="sum")) if mask.any() else 0.0
        seen += int(mask.sum())
    if rank_and_world()[1] > 1:  # each rank evaluated its share of the split
        correct, seen, loss_sum = all_reduce_values([correct, seen, loss_sum], device)
        correct, seen = int(correct), int(seen)
    expected = loader.settings.num_targets
    if seen != expected:
        raise ConfigError(f"evaluation on {loader.split!r} saw {seen} labelled targets, expected {expected} "
                          "(every target exactly once)")
    return {"acc": correct / seen if seen else float("nan"), "loss": loss_sum / seen if seen else float("nan")}


@torch.no_grad()
def exact_eval_budget(model, store, capacity: int, args: NodeClassificationOptions) -> tuple[int, str]:
    """The byte budget of exact evaluation and its rule (`graphstore.inference.evaluation_budget`,
    which `graphstore plan` shows too): the training buffer's ``capacity`` partitions of
    features, at most the buffer's budget (``--buffer-bytes`` or the memory default), at
    least the walk's floor."""
    cap = args.buffer_bytes if args.buffer_bytes is not None else memory_budget().bytes
    return evaluation_budget(model, store, capacity=capacity, cap_bytes=cap,
                             resident_features=SCHEME_REGISTRY.get(args.scheme).resident_features)


def evaluate_exact(model, store, budget: int, args: NodeClassificationOptions,
                   splits: Sequence[str] = ("valid", "test")) -> tuple[dict[str, dict[str, float]], dict]:
    """Accuracy and mean cross-entropy of each split from exact layer-wise inference (every
    layer over the whole graph, all neighbours, global in-degrees for GCN) within ``budget``
    bytes (`exact_eval_budget`); returns the metrics by split and the inference's IO."""
    ids = {split: np.asarray(store.read_node_split(split), dtype=np.int64) for split in splits}
    nodes = np.concatenate(list(ids.values()))
    stats = InferenceStats()
    transform = normalize_rows if args.normalize_features == "row" else None
    with common.layer_progress("evaluate (exact)", model.num_layers) as on_layer:
        logits = torch.from_numpy(infer_layerwise(model, store, buffer_bytes=budget, nodes=nodes, stats=stats,
                                                  input_transform=transform, on_layer=on_layer))
    out, start = {}, 0
    for split, members in ids.items():
        part = logits[start:start + members.size]
        start += members.size
        labels = torch.from_numpy(np.asarray(store.labels[members] if members.size else [], dtype=np.int64))
        mask = labels >= 0
        seen = int(mask.sum())
        acc = int((part[mask].argmax(1) == labels[mask]).sum()) / seen if seen else float("nan")
        loss = float(F.cross_entropy(part[mask], labels[mask])) if seen else float("nan")
        out[split] = {"acc": acc, "loss": loss}
    io = {"bytes_read": stats.bytes_read, "bytes_written": stats.bytes_written, "planned_bytes": stats.planned_bytes,
          "spill_bytes": stats.spill_bytes, "seconds": stats.seconds}
    return out, io


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_ranks(_train, NodeClassificationOptions.parse(argv))


def resolve_defaults(args: NodeClassificationOptions, store,
                     saved: Mapping[str, Any] | None = None) -> tuple[NodeClassificationOptions, dict[str, str]]:
    """``args`` with every default the data decides filled in (`graphstore.loaders.defaults`),
    and the rule that chose each: feature normalisation, batch size, and the buffer (from the
    memory this process may use; a resumed run's from its checkpoint)."""
    changes: dict[str, Any] = {}
    derived: dict[str, str] = {}
    if args.normalize_features == "auto":
        record = store.aggregates.get(AGGREGATE_FOR.get(args.model, "")) if args.aggregation_cache else None
        if record is not None:  # the stored aggregate's inputs decide: the model must read the same
            mode = "row" if record["input"] == AGGREGATE_INPUTS[1] else "none"
            changes["normalize_features"] = mode
            derived["normalize_features"] = f"{mode}: as the stored {record['array']} ({record['input']})"
        else:
            changes["normalize_features"], derived["normalize_features"] = feature_normalization(store)
    if args.batch_size is None:
        changes["batch_size"], derived["batch_size"] = default_batch_size(int(train_targets(store, args).size))
    if args.scheme == "macrobatch" and args.feature_cache is not None and args.feature_cache_bytes is None:
        # A policy named without a size: from memory (a resumed run keeps its checkpoint's).
        if saved is not None and saved.get("feature_cache_bytes"):
            changes["feature_cache_bytes"], rule = saved["feature_cache_bytes"], "the resumed checkpoint's"
        else:
            # Rows as the cache holds them: the features', or [x_v | agg_v] in float32.
            width = store.feature_dim * (2 if args.aggregation_cache else 1)
            itemsize = 4 if args.aggregation_cache else storage_dtype(store.manifest.feature_dtype).itemsize
            changes["feature_cache_bytes"], rule = common.least_over_ranks(
                *default_cache_bytes(store.num_nodes, itemsize * width))
        derived["feature_cache_bytes"] = rule
    if args.scheme == "macrobatch" and args.macro_batch_bytes is None:
        # Bounded by memory, not only by the batch count: 16 mini-batches' rows can be
        # gigabytes on a large graph (a resumed run keeps its checkpoint's).
        if saved is not None and saved.get("macro_batch_bytes"):
            changes["macro_batch_bytes"], rule = saved["macro_batch_bytes"], "the resumed checkpoint's"
        else:
            cache = changes.get("feature_cache_bytes", args.feature_cache_bytes) or 0
            changes["macro_batch_bytes"], rule = common.least_over_ranks(*macro_batch_bytes(memory_budget(), cache))
        derived["macro_batch_bytes"] = rule
    whole_graph = SCHEME_REGISTRY.get(args.scheme).whole_graph
    buffer, rule = common.default_buffer(args, whole_graph=whole_graph, saved=saved)
    if rule is not None:
        changes.update(buffer)
        derived["buffer_bytes"] = rule
    # The batch in training counts in the budget too: a share of it, the buffer the rest.
    step, step_rule = common.training_step_share(args, buffer_bytes=changes.get("buffer_bytes", args.buffer_bytes),
                                                 whole_graph=whole_graph, buffer_rule=rule, saved=saved)
    if step_rule is not None:
        changes.update(step)
        derived["micro_batch_budget"] = step_rule
    return dataclasses.replace(args, **changes), derived


should_evaluate = common.should_evaluate  # the evaluation rhythm both trainers share


def improves(valid: Mapping[str, float], best: Mapping[str, Any] | None) -> bool:
    """Higher validation accuracy, or the same with a lower validation loss."""
    if best is None:
        return True
    top = best["valid"]
    return valid["acc"] > top["acc"] or (valid["acc"] == top["acc"] and valid["loss"] < top["loss"])


def evaluate_splits(model, store, loaders: Mapping[str, NodeLoader], config: NodeClassificationConfig,
                    args: NodeClassificationOptions, epoch: int, device,
                    splits: Sequence[str]) -> tuple[dict[str, dict[str, float]], dict]:
    """Accuracy and loss of ``splits`` by the configured evaluation, and its IO."""
    if config.eval_scheme == "exact":
        # The evaluation's budget and the training buffer's slots together must stay within
        # the run's budget: free the slots (the next epoch reads its first state again)
        # when they would not.
        budget = args.buffer_bytes
        if budget is not None and "micro_batch_budget" in config.derived:
            budget += args.micro_batch_budget  # the step's share is not in use while evaluating
        train = loaders.get("train")
        if (train is not None and budget is not None and config.eval_buffer_bytes is not None
                and train.held_bytes + config.eval_buffer_bytes > budget):
            train.release_memory()
        # On the training device: infer_layerwise runs the layers where the model is.
        return evaluate_exact(model, store, config.eval_buffer_bytes, args, splits=splits)
    scores = {split: evaluate(model, loaders[split], epoch, device, args) for split in splits}
    return scores, common.io_stats([loaders[split].last_stats for split in splits])


def _cpu_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _train(args: NodeClassificationOptions) -> int:
    common.configure_logging(args.verbose)
    rank, world, device = common.join_ranks(common.resolve_device(args.device))
    say = print if rank == 0 else (lambda *a, **k: None)
    store = graphstore.open(args.store)
    try:  # the store's locks are released when the run ends, however it ends
        if not store.manifest.has_features or not store.manifest.has_labels:
            raise ConfigError(f"{args.store}: node classification needs features and labels "
                              f"(features: {store.manifest.has_features}, labels: {store.manifest.has_labels})")
        ckpt = common.Checkpointer(args.checkpoint_dir) if args.checkpoint_dir else None
        # Read once: its configuration decides the defaults a resumed run replays.
        path = ckpt.latest() if args.resume else None
        state = ckpt.load(path) if args.resume else None
        args, derived = resolve_defaults(args, store, None if state is None else state["config"])
        config = dataclasses.replace(resolve_config(args, store), world_size=world, derived=derived)
        check_ranks_agree(config.to_dict(), store)  # before any rank reads data to train
        common.seed_everything(args.seed)  # model initialisation (the same on every rank)
        model = GNN(args.model, in_dim=store.feature_dim, hidden_dim=args.hidden, out_dim=store.num_classes,
                    num_layers=len(args.fanouts), dropout=args.dropout, heads=args.heads).to(device)
        # After the model: a micro-batch budget is checked against its step-memory estimate.
        # (Building the loaders draws nothing from torch's global generator, and every epoch
        # reseeds it, so the order changes no result.)
        try:
            loaders = make_loaders(store, args, config, model, rank=rank)
        except ConfigError as e:
            if "buffer_bytes" not in derived:
                raise
            # The budget was not the user's: say where it came from and what overrides it.
            raise ConfigError(f"the default buffer ({derived['buffer_bytes']}) does not fit: {e}; give "
                              f"--buffer-partitions or --buffer-bytes") from None
        config = dataclasses.replace(config, loaders={name: loader.settings for name, loader in loaders.items()})
        if config.eval_scheme == "exact":
            budget, rule = exact_eval_budget(model, store, loaders["train"].capacity, args)
            config = dataclasses.replace(config, eval_buffer_bytes=budget,
                                         derived={**config.derived, "eval_buffer_bytes": rule})
        s = loaders["train"].settings
        say(f"{PROG}: {store}" + (f" ({world} ranks, DistributedDataParallel)" if world > 1 else ""))
        say(f"scheme {s.scheme}: policy {s.policy}, {s.capacity} of {s.num_partitions} partitions "
            f"resident, static cache {s.static_cache_nodes} nodes ({s.static_cache_fraction:g}), "
            f"reuse {s.reuse}, fanouts {list(s.fanouts)}, batch {s.batch_size}; evaluation: scheme "
            f"{config.eval_scheme}, fanouts {list(config.eval_fanouts)} ({config.eval_fanouts_rule})", flush=True)
        for name, rule in derived.items():
            say(f"default {name}: {rule}", flush=True)
        if s.aggregated is not None:
            say(f"aggregation cache: the first layer reads {store.aggregates[s.aggregated]['array']} "
                f"(every in-neighbour) in place of the outermost hop's samples", flush=True)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        # Rank 0 alone writes the metrics and the checkpoints; every rank reads one to resume.
        metrics = common.MetricsWriter(args.metrics_out if rank == 0 else None, task="node_classification",
                                       config=config.to_dict())

        start_epoch, history, resumed_from, best_state = 0, [], None, None
        if state is not None:
            common.check_resume_config(state["config"], config.to_dict(), path,
                                       run_only=common.RUN_ONLY | NodeClassificationOptions.run_only_names())
            if args.lr_schedule != "none" and state["config"].get("epochs") != args.epochs:
                raise ConfigError(f"{path}: --lr-schedule {args.lr_schedule} depends on --epochs; the checkpoint "
                                  f"has {state['config'].get('epochs')}, resume with the same --epochs")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            common.set_rng_state(state["rng"])
            start_epoch, history, resumed_from = state["epoch"] + 1, state["history"], state["epoch"]
            best_state = state.get("best_model")
            # 1-based, as the epoch lines say it ("epoch 3/4"): the checkpoint stores it 0-based.
            say(f"resumed from {path} (epoch {state['epoch'] + 1}/{args.epochs} done)", flush=True)

        best = None
        lowest = None  # the lowest validation loss so far: while it falls the model still learns
        for record in history:
            if record.get("valid") is not None:
                if improves(record["valid"], best):
                    best = record
                if lowest is None or record["valid"]["loss"] < (1 - LOSS_PROGRESS) * lowest["valid"]["loss"]:
                    lowest = record
        train_s = sum(h["time_s"] for h in history)
        eval_s = sum(h["eval_time_s"] for h in history)
        last_eval_s = next((h["eval_time_s"] for h in reversed(history) if h.get("valid") is not None), 0.0)
        stopped = None
        # After resuming: DDP broadcasts rank 0's parameters, which every rank loaded anyway.
        trained = wrap_model(model, device) if world > 1 else model
        for epoch in range(start_epoch, args.epochs):
            t0 = time.perf_counter()
            lr = epoch_lr(args, epoch)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss, n = train_epoch(trained, optimizer, loaders["train"], epoch, device, seed=args.seed, args=args)
            common.finite_or_raise(loss, epoch)
            t1 = time.perf_counter()
            train_s += t1 - t0
            valid, eval_io = None, None
            # Validation only: the test split is scored once, at the end, on the selected model.
            if should_evaluate(args, epoch, train_s, eval_s, last_eval_s):
                scores, eval_io = evaluate_splits(model, store, loaders, config, args, epoch, device, ("valid",))
                valid = scores["valid"]
            t2 = time.perf_counter()
            eval_s += t2 - t1
            if valid is not None:
                last_eval_s = t2 - t1
            io = common.io_stats([loaders["train"].last_stats])
            record = {"epoch": epoch, "lr": lr, "train_loss": loss, "train_targets": n, "valid": valid,
                      "time_s": t1 - t0, "eval_time_s": t2 - t1, "io": io,
                      "micro_batching": loaders["train"].micro_stats or None,
                      "macro_batching": (loaders["train"].fetch_stats.to_dict()
                                         if loaders["train"].fetch_stats is not None else None),
                      "loader": loaders["train"].pipeline_stats.to_dict(), "eval_io": eval_io}
            history.append(record)
            if valid is not None and improves(valid, best):
                best, best_state = record, _cpu_state(model)
            if valid is not None and (lowest is None or valid["loss"] < (1 - LOSS_PROGRESS) * lowest["valid"]["loss"]):
                lowest = record
            shown = (f"valid acc {valid['acc']:.4f} loss {valid['loss']:.4f}  (+{t2 - t1:.2f} s eval)"
                     if valid is not None else "(not evaluated)")
            say(f"epoch {epoch + 1}/{args.epochs}  train loss {loss:.4f}  {shown}  {t1 - t0:.2f} s  "
                f"read {common.mib(io['bytes_read'])}  stall {io['stall_s']:.2f} s", flush=True)
            if ckpt is not None and rank == 0:
                ckpt.save(epoch, {"epoch": epoch, "model": model.state_dict(),
                                  "optimizer": optimizer.state_dict(), "rng": common.rng_state(),
                                  "history": history, "config": config.to_dict(), "best_model": best_state})
            metrics.write(epochs=history, resumed_from=resumed_from,
                          best=None if best is None else {"epoch": best["epoch"], "valid": best["valid"]})
            # Stop only at an evaluated epoch (one that was not evaluated might have improved),
            # once neither validation accuracy nor validation loss has improved for --patience
            # epochs: out of core, accuracy can sit at one class for tens of epochs while the
            # loss falls (Amazon Photo, 2 of 8 partitions resident), and stopping on accuracy
            # alone ended such runs before they learned.
            if args.patience and valid is not None and epoch - max(best["epoch"], lowest["epoch"]) >= args.patience:
                stopped = epoch
                say(f"stopping early: neither validation accuracy nor loss has improved for {args.patience} epochs "
                    f"(best accuracy at epoch {best['epoch'] + 1})", flush=True)
                break
        if not history:
            raise ConfigError(f"nothing to train: --epochs {args.epochs} and the checkpoint is at epoch "
                              f"{start_epoch}")
        # The run's model is the best-validation one: restored, then scored once on valid and test.
        if best_state is not None:
            model.load_state_dict(best_state)
        t3 = time.perf_counter()
        scores, _ = evaluate_splits(model, store, loaders, config, args, best["epoch"], device, ("valid", "test"))
        selection = (f"best validation accuracy: epoch {best['epoch'] + 1} of {len(history)} trained"
                     + (f" (stopped early, patience {args.patience})" if stopped is not None else ""))
        final = {"epoch": best["epoch"], "valid": scores["valid"], "test": scores["test"], "selection": selection}
        metrics.write(epochs=history, resumed_from=resumed_from, final=final, best=final, stopped_early=stopped,
                      test_time_s=time.perf_counter() - t3,
                      train_time_s=train_s, eval_time_s=eval_s)
        say(f"final: valid acc {scores['valid']['acc']:.4f}  test acc {scores['test']['acc']:.4f}  ({selection}; "
            f"train {train_s:.1f} s, evaluation {eval_s:.1f} s, peak memory {common.mib(common.peak_memory_bytes())})",
            flush=True)
        return 0
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(common.run(PROG, main))
