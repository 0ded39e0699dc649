"""The ``graphstore`` command: ``convert``, ``info``, ``verify``, ``upgrade``, ``hubs``, ``plan``,
``infer``, ``aggregate``, ``plot``.

Exit codes: 0 success, 1 a known error (one line on stderr, no traceback), 2 bad usage (at
most three lines: the error, the closest known flag, where to look; `graphstore._argparse`),
141 when the reader of stdout has gone (``graphstore info S | head -1``, quietly). Every
option's default is in ``--help``; no flag may be abbreviated.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from graphstore._argparse import ArgumentParser, stdout_closed
from graphstore.errors import GraphStoreError
from graphstore.units import parse_byte_size

__all__ = ["byte_size", "fanout_list", "main", "non_negative_int", "positive_int"]


# Argparse value types, also the trainers' (trainers/options.py): a flag's message is the
# problem, in ``argument --x: <message>``.

def positive_int(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected an integer (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive (got {value})")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (``--patience 0``: never stop early; ``--loader-threads 0``)."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected an integer (got {text!r})") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more (got {value})")
    return value


def byte_size(text: str) -> int:
    """``4194304``, ``4MiB``, ``512K``, ``1G`` -> bytes (`graphstore.units.parse_byte_size`)."""
    try:
        return parse_byte_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fanout_list(text: str) -> tuple[int, ...]:
    """``"15,10,5"`` -> (15, 10, 5); -1 means all neighbours. ``fanouts[0]`` is the hop
    nearest the targets (the last GNN layer's)."""
    try:
        values = tuple(int(t) for t in str(text).split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 15,10 (got {text!r})") from None
    if not values or any(v == 0 or v < -1 for v in values):
        raise argparse.ArgumentTypeError(
            f"fanouts must be positive or -1 (all), one per layer (got {text!r})")
    return values


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse %-formats help strings


def _parser() -> argparse.ArgumentParser:
    from graphstore._version import __version__
    from graphstore.layout.partition import PARTITIONERS
    from graphstore.layout.sources import READERS

    # Every option shows its default in --help (a None default says what it means by hand:
    # tests/test_cli_manners.py fails on one that shows none).
    parser = ArgumentParser(prog="graphstore", description="Out-of-core graph store for GNN training.")
    parser.add_argument("--version", action="version", version=f"graphstore {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each conversion phase")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    c = sub.add_parser("convert", help="ingest a dataset into a store",
                       description="Convert SOURCE (a directory, .zip, .tar.gz, file, or an OGB name "
                                   "with --root) into a store at OUT.")
    c.add_argument("source")
    c.add_argument("out")
    c.add_argument("--format", choices=READERS.names(),
                   help=_escape(f"source format (default: detected): {READERS.help_text()}"))
    size = c.add_mutually_exclusive_group()
    size.add_argument("--partitions", type=positive_int, metavar="P",
                      help="number of partitions (default: derived from the data: the features' and edges' bytes "
                           "/ --partition-bytes, at least 4096 nodes a partition, at most 1024 partitions)")
    size.add_argument("--partition-bytes", type=byte_size, metavar="B",
                      help="target bytes of features+edges per partition (default: 4MiB)")
    c.add_argument("--partitioner", choices=PARTITIONERS.names(),
                   help=_escape(PARTITIONERS.help_text() + " (default: metis, or stream for graphs too large for "
                                "it: over 50M edges, or over 128 bytes an edge of the memory this process may use)"))
    c.add_argument("--seed", type=int, default=0, help="seeds the partitioner and generated splits")
    c.add_argument("--overwrite", action="store_true", help="replace OUT once the new store is complete")
    loops = c.add_mutually_exclusive_group()
    loops.add_argument("--keep-self-loops", dest="keep_self_loops", action="store_true", default=None,
                       help="store self loops (default: dropped, except in knowledge graphs)")
    loops.add_argument("--drop-self-loops", dest="keep_self_loops", action="store_false",
                       help="drop self loops, also in knowledge graphs")
    c.add_argument("--keep-duplicates", action="store_true", help="store repeated edges instead of merging them")
    c.add_argument("--compress", action="store_true", help="zstd-compress every array")
    direction = c.add_mutually_exclusive_group()
    direction.add_argument("--directed", dest="directed", action="store_true", default=None,
                           help="treat source edges as directed (default: the format's rule; knowledge "
                                "graphs and directed OGB datasets are directed, other sources undirected)")
    direction.add_argument("--undirected", dest="directed", action="store_false",
                           help="store every source edge in both directions")
    c.add_argument("--features", metavar="NPY", help="edge list: node features (.npy, [N, D]) (default: none)")
    c.add_argument("--labels", metavar="NPY", help="edge list: node labels (.npy, [N]) (default: none)")
    c.add_argument("--num-nodes", type=positive_int, help="edge list: number of nodes (default: max id + 1)")
    c.add_argument("--root", metavar="DIR", help="OGB: directory holding (or to download) named datasets "
                                                 "(default: none: SOURCE is a path)")
    c.add_argument("--split", metavar="NAME", help="OGB: split directory to use when there are several "
                                                   "(default: the only one)")
    c.add_argument("--chunk-edges", type=positive_int, default=1 << 20,
                   help="edges per streaming step (bounds memory)")
    c.add_argument("--partition-memory", type=byte_size, metavar="B", dest="partition_memory_bytes",
                   help="memory budget of the stream partitioner (default: 1GiB, more for graphs "
                        "of over 33M nodes: it keeps 24 bytes per node)")
    c.add_argument("--hub-fraction", type=float, default=0.01, metavar="F",
                   help="fraction of nodes (highest degree) whose features and a contiguous copy of their "
                        "edges form the hub group, HierBatching's static cache (0: none)")
    c.add_argument("--feature-dtype", choices=["float16", "bfloat16", "float32"],
                   help="store the features in this dtype, cast chunk by chunk (default: the source's; "
                        "float16 sources stay float16, the rest float32). bfloat16 is stored as uint16 bit "
                        "patterns; a value beyond float16's range (|x| > 65504) is an error")
    c.add_argument("--json", action="store_true", help="print the resulting summary as JSON")

    i = sub.add_parser("info", help="summarise a store")
    i.add_argument("store")
    i.add_argument("--json", action="store_true", help="machine-readable output")

    v = sub.add_parser("verify", help="re-read a store and check checksums and invariants")
    v.add_argument("store")

    u = sub.add_parser("upgrade", help="add segment checksums to a store written before them",
                       description="Add the per-bucket and per-partition checksums that let every "
                                   "training read be verified to a store written before they existed "
                                   "(takes the store's writer lock; readers may keep it open).")
    u.add_argument("store")

    h = sub.add_parser("hubs", help="rewrite the hub group (HierBatching's static cache) for a fraction",
                       description="Write the hub group of STORE: the FRACTION highest-degree nodes, their "
                                   "feature rows, and a copy of their edges grouped by partition, which "
                                   "the mega-batch scheme's static cache reads (takes the writer lock).")
    h.add_argument("store")
    h.add_argument("--fraction", type=float, default=0.01, help="fraction of nodes (0 removes it)")

    inf = sub.add_parser("infer", help="exact whole-graph inference of a trained GNN, out of core",
                         description="Run every layer of a trained graphstore.nn GNN over the whole graph of "
                                     "STORE with all neighbours, a partition and an edge bucket at a time, "
                                     "and write the outputs (logits) of a split's nodes.")
    inf.add_argument("store")
    inf.add_argument("--checkpoint", required=True, metavar="CKPT",
                     help="a file from graphstore.inference.save_model, or a trainer's --checkpoint-dir")
    inf.add_argument("--split", default="test", help="node split whose outputs to write, or 'all'")
    inf.add_argument("--out", required=True, metavar="OUT", type=_outputs_file,
                     help="OUT.npy: the outputs [n, C] in the split's order (ascending store ids); "
                          "OUT.npz: also ids, source_ids and predictions")
    held = inf.add_mutually_exclusive_group()
    held.add_argument("--buffer-bytes", type=byte_size, metavar="B",
                      help="memory for the walk (e.g. 2GiB); each layer holds as many partitions as its "
                           "widths allow (default: what a quarter of the partitions' features take)")
    held.add_argument("--capacity", type=positive_int, metavar="C",
                      help="partitions held at once in every layer, instead of --buffer-bytes "
                           "(default: from --buffer-bytes)")
    inf.add_argument("--normalize-features", choices=["none", "row"],
                     help="row-normalise the input features (default: what the trainer's checkpoint recorded)")
    inf.add_argument("--work-dir", metavar="D", help="scratch arrays here (default: a temporary directory)")
    inf.add_argument("--device", default="cpu", type=_device_name, metavar="DEV",
                     help="where the layers run: cpu, cuda or cuda:N; the store and the scratch "
                          "arrays stay on the host, and the buffer's bytes are then the device's")

    ag = sub.add_parser("aggregate", help="store every node's aggregate of its in-neighbours' features "
                                          "(BatchGNN's aggregation cache), computed out of core",
                        description="Compute, for every node of STORE, the mean, sum or GCN propagation of its "
                                    "in-neighbours' feature rows (all neighbours, global degrees) by streaming "
                                    "partitions and edge buckets, and store it as nodes/aggregated_OP "
                                    "(checksummed, recorded in the manifest; takes the writer lock). The "
                                    "macrobatch scheme's first GraphSage (mean), GIN (sum) or GCN (gcn) layer "
                                    "then reads it instead of a sampled last hop.")
    ag.add_argument("store")
    ag.add_argument("--op", required=True, choices=["mean", "sum", "gcn"],
                    help="mean: GraphSage's; sum: GIN's; gcn: GCN's normalized propagation with the self loop")
    ag.add_argument("--normalize-features", choices=["none", "row"], default="none",
                    help="aggregate row-normalised features (for training with --normalize-features row)")
    ag.add_argument("--buffer-bytes", type=byte_size, metavar="B",
                    help="memory for the walk (default: what a quarter of the partitions' features take)")
    ag.add_argument("--work-dir", metavar="D", help="scratch arrays here (default: a temporary directory)")

    pl = sub.add_parser("plan", help="show what an epoch will read and the memory it takes, before training",
                        description="With STORE: read the store and say, as the node-classification trainer "
                                    "would derive it from the same flags, the byte budget and its rule, how many "
                                    "partitions stay resident, the buffer states and swaps of an epoch, the bytes "
                                    "it reads, exact evaluation's memory floor and the peak memory to expect. "
                                    "Without STORE: print a buffer policy's states for --partitions and "
                                    "--capacity, and what each trains.")
    pl.add_argument("store", nargs="?", metavar="STORE", help="a store (omit to plan a policy from numbers alone)")
    pl.add_argument("--policy", metavar="NAME",
                    help="comet, beta, disjoint, sequential, dispersed, hierbatching or in_memory (default: none; "
                         "required without STORE; with STORE, the scheme's)")
    pl.add_argument("--partitions", type=positive_int, metavar="P",
                    help="number of partitions (default: none; required without STORE, which gives its own)")
    pl.add_argument("--capacity", type=positive_int, metavar="C",
                    help="partitions the buffer holds, clamped to P (default: none; required without STORE, "
                         "--buffer-partitions with one)")
    pl.add_argument("--seed", type=int, default=0, help="with the epoch, every random choice of the plan")
    pl.add_argument("--epoch", type=int, default=0, help="the epoch to plan")
    pl.add_argument("--reuse", type=positive_int,
                    help="hierbatching: passes over each mega-batch (default: HierBatching's 2; with STORE, the "
                         "scheme's: 1)")
    pl.add_argument("--num-logical-partitions", type=positive_int, metavar="L",
                    help="without STORE, comet: logical partitions (default: ceil(P / floor(C/2)))")
    pl.add_argument("--train-partitions", type=_id_list, metavar="0,1,2",
                    help="without STORE, node policies: partitions holding training nodes (default: all; "
                         "a STORE's training split gives them)")
    pl.add_argument("--task", choices=["link", "node"],
                    help="without STORE, in_memory: plan only this task's fields (default: both; a STORE is "
                         "planned for node classification)")
    pl.add_argument("--world-size", type=positive_int, metavar="N",
                    help="without STORE, disjoint: data-parallel ranks sharing each round (default: 1)")
    # STORE's options: the node-classification trainer's flags of the same names, with its defaults.
    pl.add_argument("--scheme", choices=_node_schemes(),
                    help=_escape(f"with STORE: the training scheme (default: {PLAN_DEFAULTS['scheme']})"))
    held = pl.add_mutually_exclusive_group()
    held.add_argument("--buffer-bytes", type=byte_size, metavar="B",
                      help="with STORE: the run's byte budget, e.g. 512MiB; an out-of-core scheme keeps 1/8 of it "
                           "for the batch in training (default: derived from the machine: half of the memory this "
                           "process may still use; none for a scheme holding the whole graph)")
    held.add_argument("--buffer-partitions", type=positive_int, metavar="C",
                      help="with STORE: partitions the buffer holds, instead of --buffer-bytes (default: none)")
    pl.add_argument("--fanouts", type=fanout_list,
                    help="with STORE: neighbours per hop, nearest hop first; one per layer "
                         f"(default: {','.join(map(str, PLAN_DEFAULTS['fanouts']))})")
    pl.add_argument("--batch-size", type=positive_int, metavar="B",
                    help="with STORE: targets per training batch (default: derived from the data: "
                         "min(1000, max(64, train split / 8)))")
    pl.add_argument("--model", choices=["sage", "gcn", "gat", "gin"],
                    help=f"with STORE: the GNN layer kind, for evaluation's floor and the model's memory "
                         f"(default: {PLAN_DEFAULTS['model']})")
    pl.add_argument("--hidden", type=positive_int,
                    help=f"with STORE: hidden width (default: {PLAN_DEFAULTS['hidden']})")
    pl.add_argument("--heads", type=positive_int,
                    help=f"with STORE: GAT attention heads (default: {PLAN_DEFAULTS['heads']})")
    pl.add_argument("--loader-threads", type=non_negative_int, metavar="N",
                    help="with STORE: the trainer's loader threads, whose batches made ahead take 1/8 of the "
                         "buffer's bytes (default: derived from the machine: the cores torch's threads leave free)")
    pl.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    pl.set_defaults(usage_error=pl.error)

    fig = sub.add_parser("plot", help="draw trainer runs' metrics files (needs matplotlib)",
                         description="Draw, per epoch, each run's training loss, validation metric, "
                                     "training time split into compute and stall, and bytes read, one "
                                     "line per run named by its scheme, from the trainers' --metrics-out "
                                     "files (pip install graphstore[plot]).")
    fig.add_argument("runs", nargs="+", metavar="RUN.json", help="trainer metrics files of one task")
    fig.add_argument("-o", "--out", required=True, metavar="OUT.png", help="the PNG to write")
    fig.add_argument("--dpi", type=positive_int, default=110, help="resolution")
    return parser


PLAN_DEFAULTS = {"scheme": "minibatch", "fanouts": (15, 10), "model": "sage", "hidden": 64, "heads": 4,
                 "dropout": 0.5}
"""``graphstore plan STORE``'s defaults: the node-classification trainer's
(trainers/node_classification.py); tests/test_cli_plan_store.py checks they agree."""


def _node_schemes() -> tuple[str, ...]:
    from graphstore.loaders import SCHEMES

    return SCHEMES.names(lambda s: "node" in s.tasks)


def _device_name(text: str) -> str:
    """``graphstore infer --device``: its form checked while parsing (a usage error);
    whether this machine has it, when the command runs (`resolve_device`)."""
    if text != "cpu" and not (text == "cuda" or text.startswith("cuda:") and text[5:].isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} must be cpu, cuda or cuda:N")
    return text


def _outputs_file(text: str) -> str:
    """``graphstore infer --out``: checked before the walk, which np.save's added suffix
    would otherwise fail only after the whole inference."""
    if Path(text).suffix not in (".npy", ".npz"):
        raise argparse.ArgumentTypeError(f"{text!r} must end in .npy (the outputs) or .npz (with ids, "
                                         "source_ids and predictions)")
    return text


def _id_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,1,2 "
                                         f"(got {text!r})") from None


def _run_convert(args: argparse.Namespace) -> int:
    from graphstore.layout._convert import ConvertOptions, convert
    from graphstore.layout._verify import store_summary

    reader_options = {
        key: getattr(args, key)
        for key in ("directed", "features", "labels", "num_nodes", "root", "split")
        if getattr(args, key) is not None
    }
    options = ConvertOptions(
        format=args.format, num_partitions=args.partitions, partition_bytes=args.partition_bytes,
        partitioner=args.partitioner, seed=args.seed, overwrite=args.overwrite,
        keep_self_loops=args.keep_self_loops, keep_duplicates=args.keep_duplicates,
        compress=args.compress, chunk_edges=args.chunk_edges, reader_options=reader_options,
        hub_fraction=args.hub_fraction, partition_memory_bytes=args.partition_memory_bytes,
        feature_dtype=args.feature_dtype,
    )
    start = time.perf_counter()
    m = convert(args.source, args.out, options)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({**store_summary(args.out), "seconds": round(seconds, 3)}, indent=2))
        return 0
    conv, part = m.conversion, m.partitioner
    print(f"wrote {args.out} in {seconds:.1f} s: {m.num_nodes:,} nodes, {m.num_edges:,} edges "
          f"({'directed' if m.directed else 'both directions'}), {m.feature_dim} features, "
          f"{m.num_classes} classes, {m.num_relations} relations")
    print(f"  source {m.source['format']} {m.source['name']}: {conv['source_edges']:,} edges read, "
          f"{conv['self_loops']:,} self loops {'kept' if conv['keep_self_loops'] else 'dropped'}, "
          f"{conv['duplicates']:,} duplicate edges {'kept' if conv['keep_duplicates'] else 'merged'}"
          + ("" if m.directed else f", {conv['reverse_edges_added']:,} reverse edges added "
             f"({conv['reverse_edges_present']:,} listed both ways already)"))
    print(f"  partitions: {m.num_partitions} x {m.partition_size:,} nodes by {part['method']} "
          f"({part['num_partitions_rule']}), edge cut {part['edge_cut']:.1%}")
    print("  splits: " + (", ".join(f"{k} {v:,} {m.split_kinds[k]}" for k, v in m.splits.items()) or "none")
          + f" ({m.split_origin.get('kind', 'unknown')})")
    return 0


def _run_info(args: argparse.Namespace) -> int:
    from graphstore.layout._verify import store_summary

    s = store_summary(args.store)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"{s['path']}: graphstore format v{s['format_version']}, {s['name']}")
    print(f"  nodes {s['num_nodes']:,}  edges {s['num_edges']:,} ({'directed' if s['directed'] else 'both directions'})"
          f"  features {s['feature_dim']} ({s['feature_dtype'] or '-'})  classes {s['num_classes']}"
          f"  relations {s['num_relations']}")
    print(f"  partitions {s['num_partitions']} x {s['partition_size']:,} by {s['partitioner']['method']}, "
          f"edge cut {s['edge_cut']:.1%}")
    print(f"  tasks {', '.join(s['tasks']) or '-'}; splits "
          + (", ".join(f"{k} {v:,}" for k, v in s['splits'].items()) or "none"))
    print(f"  source {s['source']['format']} {s['source']['path']}")
    if s["segment_checksums"]:
        print("  checksums: every chunk, edge bucket and node partition (every read is verified)")
    else:
        print("  checksums: whole chunks only; reads of single buckets and partitions are NOT verified "
              f"(run `graphstore upgrade {s['path']}`)")
    if s["aggregates"]:
        print("  aggregates (graphstore aggregate): " + ", ".join(
            f"{op} of {r['input']} in {r['array']}" for op, r in s["aggregates"].items()))
    print(f"  {s['bytes_on_disk'] / 2**20:,.1f} MiB on disk:")
    for name, a in s["arrays"].items():
        print(f"    {name:32s} {str(tuple(a['shape'])):22s} {a['dtype']:8s} {a['bytes_on_disk'] / 2**20:10,.2f} MiB")
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    from graphstore.layout._verify import verify_store

    start = time.perf_counter()
    result = verify_store(args.store)
    print(f"{args.store}: OK ({result['arrays']} arrays, {result['num_nodes']:,} nodes, "
          f"{result['num_edges']:,} edges checked in {time.perf_counter() - start:.1f} s)")
    if not result["segment_checksums"]:
        print(f"{args.store}: no segment checksums: training reads of single buckets and partitions are "
              f"not verified (run `graphstore upgrade {args.store}`)")
    return 0


def _run_upgrade(args: argparse.Namespace) -> int:
    from graphstore.layout._upgrade import upgrade_store

    start = time.perf_counter()
    result = upgrade_store(args.store)
    verb = "rebuilt" if result["had_checksums"] else "added"
    hubs = " and the hub group (1 % of the nodes)" if result["added_hubs"] else ""
    print(f"{args.store}: {verb} segment checksums for {len(result['arrays'])} arrays{hubs} "
          f"in {time.perf_counter() - start:.1f} s; every read is now verified")
    return 0


def _run_hubs(args: argparse.Namespace) -> int:
    from graphstore.layout._upgrade import write_store_hubs

    start = time.perf_counter()
    r = write_store_hubs(args.store, args.fraction)
    if not r["num_hubs"]:
        print(f"{args.store}: no hub group (fraction {args.fraction:g})")
        return 0
    print(f"{args.store}: {r['num_hubs']:,} hubs ({args.fraction:g} of the nodes) touch {r['num_edges']:,} of "
          f"{r['num_store_edges']:,} edges ({r['num_edges'] / max(1, r['num_store_edges']):.1%}); "
          f"written in {time.perf_counter() - start:.1f} s")
    return 0


def _run_infer(args: argparse.Namespace) -> int:
    import numpy as np

    from graphstore.dataset import open_dataset
    from graphstore.inference import InferenceStats, infer_layerwise, load_model, resolve_device
    from graphstore.nn import normalize_rows

    device = resolve_device(args.device)  # no CUDA here: one line, before the store is opened
    with open_dataset(args.store) as store:
        model, recorded = load_model(args.checkpoint, store, device=device)
        nodes = None if args.split == "all" else np.asarray(store.read_node_split(args.split), dtype=np.int64)
        normalize = args.normalize_features or recorded.get("normalize_features", "none")
        stats = InferenceStats()
        logits = infer_layerwise(model, store, capacity=args.capacity, buffer_bytes=args.buffer_bytes,
                                 nodes=nodes, stats=stats, device=device,
                                 work_dir=args.work_dir, input_transform=normalize_rows if normalize == "row" else None)
        ids = np.arange(store.num_nodes) if nodes is None else nodes
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp{out.suffix}")
        try:
            if out.suffix == ".npz":
                np.savez(tmp, ids=ids, source_ids=store.to_source_ids(ids), logits=logits,
                         predictions=logits.argmax(1))
            else:
                np.save(tmp, logits)
            os.replace(tmp, out)  # whole or not at all
        finally:
            tmp.unlink(missing_ok=True)  # a failed write (disk full) leaves nothing behind
    print(f"{args.store}: {model.kind} x{model.num_layers} over every node, {len(ids):,} rows of {args.split!r} "
          f"to {out}; read {stats.bytes_read / 2**20:.1f} MiB (plan {stats.planned_bytes / 2**20:.1f} MiB), "
          f"{'/'.join(map(str, stats.capacities))} partitions resident per layer, {stats.seconds:.1f} s "
          f"on {device}")
    return 0


def _run_aggregate(args: argparse.Namespace) -> int:
    from graphstore.inference import InferenceStats, aggregate_store

    stats = InferenceStats()
    r = aggregate_store(args.store, args.op, normalize=args.normalize_features == "row",
                        buffer_bytes=args.buffer_bytes, work_dir=args.work_dir, stats=stats)
    print(f"{args.store}: {r['array']} [{r['dim']} wide] = {args.op} over every node's in-neighbours of its "
          f"{r['input']}; read {stats.bytes_read / 2**20:.1f} MiB, {'/'.join(map(str, stats.capacities))} "
          f"partitions resident, {r['seconds']:.1f} s")
    return 0


_POLICY_ONLY = ("partitions", "capacity", "num_logical_partitions", "train_partitions", "task", "world_size")
"""``graphstore plan``'s flags that plan a policy from numbers: a STORE gives them."""
_STORE_ONLY = ("scheme", "buffer_bytes", "buffer_partitions", "fanouts", "batch_size", "model", "hidden", "heads",
               "loader_threads")
"""``graphstore plan``'s flags that need a STORE."""


def _flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def _run_plan(args: argparse.Namespace) -> int:
    """Either mode, refusing flags of the other in one line (usage: exit 2)."""
    if args.store is not None:
        mixed = [_flag(a) for a in _POLICY_ONLY if getattr(args, a) is not None]
        if mixed == ["--task"]:
            args.usage_error("with a STORE, plan plans node classification (link prediction's plan from a store "
                             "is not built yet); --task is for a policy planned without one")
        if mixed:
            args.usage_error(f"{mixed[0]} plans a policy from numbers, without a STORE (the store gives its "
                             f"partitions; the buffer is --buffer-bytes or --buffer-partitions)")
        return _run_plan_store(args)
    mixed = [_flag(a) for a in _STORE_ONLY if getattr(args, a) is not None]
    if mixed:
        args.usage_error(f"{mixed[0]} needs a STORE (graphstore plan STORE {mixed[0]} ...)")
    missing = [_flag(a) for a in ("policy", "partitions", "capacity") if getattr(args, a) is None]
    if missing:
        args.usage_error(f"without a STORE, the following arguments are required: {', '.join(missing)}")
    return _run_plan_policy(args)


def _run_plan_policy(args: argparse.Namespace) -> int:
    from graphstore.buffer import plan_epoch

    options = {
        key: getattr(args, attr)
        for key, attr in (("reuse", "reuse"), ("num_logical_partitions", "num_logical_partitions"),
                          ("train_partitions", "train_partitions"), ("task", "task"), ("world_size", "world_size"))
        if getattr(args, attr) is not None
    }
    start = time.perf_counter()
    plan = plan_epoch(args.policy, num_partitions=args.partitions, capacity=args.capacity,
                      epoch=args.epoch, seed=args.seed, **options)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(plan.to_dict()))
        return 0
    loads = len(plan.states[0]) + plan.num_swaps
    print(f"{plan.policy} ({plan.task}), p={plan.num_partitions} c={plan.capacity} epoch {plan.epoch} "
          f"seed {plan.seed}: {plan.num_states} states, {plan.num_swaps} swaps, "
          f"{loads} partition loads from a cold buffer (planned in {seconds * 1000:.0f} ms)")
    extras = {k: v for k, v in plan.options.items() if k != "train_partitions"}
    if extras:
        print("  options: " + ", ".join(f"{k}={v}" for k, v in extras.items()))
    shown = 8
    for state in plan.buffer_states():
        if state.index == shown:
            print(f"  ... {plan.num_states - shown} more states (--json for all)")
            break
        trains = ("" if state.train_partitions is None
                  else f"  trains {list(state.train_partitions)} x{state.passes}")
        owner = ("" if plan.state_rounds is None
                 else f"  round {plan.state_rounds[state.index]}, rank {plan.state_ranks[state.index]}")
        print(f"  state {state.index}: {list(state.partitions)}{trains}{owner}")
    if plan.static_cache is not None:
        print(f"  static cache: {len(plan.static_cache)} nodes")
    return 0


def _plan_store(args: argparse.Namespace) -> dict:
    """What the node-classification trainer would do with ``args`` on ``args.store``, derived
    by its own rules (`graphstore.loaders.defaults`, the loader it builds, exact evaluation's
    budget), before anything is trained: one JSON-ready dict."""
    import resource

    import torch

    from graphstore.buffer.budget import footprint
    from graphstore.buffer.manager import planned_read_bytes
    from graphstore.dataset import open_dataset
    from graphstore.errors import ConfigError
    from graphstore.inference import evaluation_budget, min_buffer_bytes
    from graphstore.inference.budget import floor_reason
    from graphstore.loaders import SCHEMES, NodeLoader, default_loader_threads
    from graphstore.loaders.defaults import default_batch_size, macro_batch_bytes, memory_budget, step_share
    from graphstore.nn import GNN, model_state_bytes

    d = PLAN_DEFAULTS
    scheme = args.scheme or d["scheme"]
    fanouts = args.fanouts or d["fanouts"]
    spec = SCHEMES.get(scheme)
    with open_dataset(args.store) as store:
        # What a training process holds before the run's own memory (the runtime's fixed
        # cost): the interpreter, torch, the package and the open store, and the code of
        # autograd and Adam's step, which torch loads at a run's first step (about 75 MiB on
        # torch 2.x: measured on Cora, trainer peaks were ~100 MiB above a count without it).
        # One step on one scalar loads it.
        weight = torch.nn.Parameter(torch.zeros(1))
        adam = torch.optim.Adam([weight])
        (weight * 2).sum().backward()
        adam.step()
        runtime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        m = store.manifest
        if not m.has_features or not m.has_labels:
            raise ConfigError(f"{args.store}: node classification needs features and labels (features: "
                              f"{m.has_features}, labels: {m.has_labels})")
        rules = {}
        batch_size = args.batch_size
        if batch_size is None:
            batch_size, rules["batch_size"] = default_batch_size(int(store.read_node_split("train").size))
        # The budget: given, or (an out-of-core scheme without a buffer flag) half of what the
        # process may use; 1/8 of it for the batch in training, the buffer the rest.
        budget, buffer_bytes, step = args.buffer_bytes, args.buffer_bytes, None
        if budget is not None:
            rules["budget_bytes"] = "given (--buffer-bytes)"
        elif not spec.whole_graph and args.buffer_partitions is None:
            default = memory_budget()
            budget = buffer_bytes = default.bytes
            rules["budget_bytes"] = default.rule
        if budget is not None and not spec.whole_graph:
            buffer_bytes, step, rules["step_bytes"] = step_share(budget)
        macro = None
        if not spec.resident_features:  # macrobatch: a round's rows bounded as the trainer bounds them
            macro, rules["macro_batch_bytes"] = macro_batch_bytes(memory_budget())
        threads = args.loader_threads if args.loader_threads is not None else default_loader_threads("cpu")
        # microbatch's data path is minibatch's loader (the trainer's own rule); the split
        # into micro-batches changes what a step holds, not what is read.
        try:
            loader = NodeLoader(store, split="train", fanouts=fanouts, batch_size=batch_size,
                                scheme="minibatch" if scheme == "microbatch" else scheme, policy=args.policy,
                                capacity=args.buffer_partitions, buffer_bytes=buffer_bytes, reuse=args.reuse,
                                seed=args.seed, loader_threads=threads,
                                **({} if macro is None else {"macro_batch_bytes": macro}))
        except ConfigError as e:
            if args.buffer_bytes is not None or "budget_bytes" not in rules:
                raise
            # As the trainer says it: the budget was not the user's.
            raise ConfigError(f"the default buffer ({rules['budget_bytes']}) does not fit: {e}; give "
                              f"--buffer-partitions or --buffer-bytes") from None
        settings = loader.settings
        plan = loader.plan(args.epoch)
        torch.manual_seed(args.seed)
        model = GNN(args.model or d["model"], in_dim=store.feature_dim, hidden_dim=args.hidden or d["hidden"],
                    out_dim=store.num_classes, num_layers=len(fanouts), dropout=d["dropout"],
                    heads=args.heads or d["heads"])
        model_bytes = model_state_bytes(model)
        floor = min_buffer_bytes(model, store)
        cap = buffer_bytes if buffer_bytes is not None else memory_budget().bytes
        eval_bytes, rules["eval_budget_bytes"] = evaluation_budget(
            model, store, capacity=loader.capacity, cap_bytes=cap, resident_features=spec.resident_features)
        store_bytes = planned_read_bytes(store, [range(store.num_partitions)], prefetch=False)
        epoch_bytes = loader.walk.planned_bytes(args.epoch)
        resident = loader.footprint
        if resident is None:  # a capacity in partitions, or the whole graph: what the plan holds
            resident = footprint(store, plan.states, prefetch=loader.prefetch, static_cache=loader.cache,
                                 with_features=spec.resident_features)
        if budget is not None and not spec.whole_graph:
            # The budget bounds the buffer, the batches made ahead and the batch in training;
            # exact evaluation frees the buffer's slots when both would not fit it.
            peak = {"budget": budget}
            peak_rule = ("the budget (buffer, batches made ahead, the batch in training; exact evaluation "
                         "within it) + the model's state + the runtime (the interpreter, torch with its autograd "
                         "and optimizer code, graphstore and the open store, as this process holds them)")
        else:
            # Nothing bounds the resident graph: it stays held while exact evaluation runs.
            peak = {"resident": resident.total, "evaluation": eval_bytes}
            peak_rule = ("what the buffer holds (its partitions, buckets and assembled graphs) + exact "
                         "evaluation's budget + the model's state + the runtime (the interpreter, torch with its "
                         "autograd and optimizer code, graphstore and the open store, as this process holds them); "
                         "a training batch's input rows come on top (no budget bounds them)")
        peak.update(model_state=model_bytes, runtime=runtime)
        return {
            "store": str(args.store), "task": "node", "scheme": scheme, "policy": settings.policy,
            "num_nodes": store.num_nodes, "num_edges": store.num_edges, "num_partitions": store.num_partitions,
            "partition_size": store.partition_size, "store_bytes": store_bytes,
            "fanouts": list(fanouts), "batch_size": batch_size, "seed": args.seed, "epoch": args.epoch,
            "budget_bytes": budget, "buffer_bytes": buffer_bytes, "step_bytes": step,
            "loader_queue_bytes": settings.loader_queue_bytes, "loader_threads": threads,
            "capacity": loader.capacity, "static_cache_nodes": settings.static_cache_nodes, "reuse": settings.reuse,
            "macro_batch_bytes": macro,
            "num_states": plan.num_states, "num_swaps": plan.num_swaps,
            "partition_loads": len(plan.states[0]) + plan.num_swaps,
            "num_batches": loader.num_batches(args.epoch),
            "epoch_bytes": epoch_bytes,
            "epoch_bytes_exact": spec.resident_features,
            # The whole graph's rows read once stay for the run; macrobatch reads sampled rows
            # every epoch, an out-of-core buffer what the last epoch did not leave resident.
            "later_epoch_bytes": 0 if spec.whole_graph and spec.resident_features else None,
            "resident_bytes": resident.total,
            "eval_scheme": "exact", "eval_floor_bytes": floor, "eval_floor_reason": floor_reason(model, store),
            "eval_budget_bytes": eval_bytes, "model": model.kind, "model_state_bytes": model_bytes,
            "runtime_bytes": runtime, "peak_bytes": sum(peak.values()), "peak_parts": peak, "peak_rule": peak_rule,
            "rules": rules,
        }


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _mib(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**20:,.1f} MiB"


def _run_plan_store(args: argparse.Namespace) -> int:
    r = _plan_store(args)
    if args.json:
        print(json.dumps(r))
        return 0
    rules = r["rules"]
    print(f"{r['store']}: {r['num_nodes']:,} nodes, {r['num_edges']:,} edges, {r['num_partitions']} partitions of "
          f"{r['partition_size']:,} nodes, {_mib(r['store_bytes'])} read in full")
    print(f"scheme {r['scheme']} (policy {r['policy']}), node classification, fanouts "
          f"{','.join(map(str, r['fanouts']))}, batch {r['batch_size']}")
    if r["budget_bytes"] is None:
        print("budget: none (" + ("the scheme holds the whole graph" if r["capacity"] == r["num_partitions"]
                                  else "--buffer-partitions") + ")")
    else:
        print(f"budget {_mib(r['budget_bytes'])}: {rules['budget_bytes']}"
              + ("" if r["step_bytes"] is None else
                 f"; {_mib(r['step_bytes'])} of it for the batch in training, {_mib(r['buffer_bytes'])} the buffer"))
    print(f"resident: {r['capacity']} of {r['num_partitions']} partitions"
          + (f" + a static cache of {r['static_cache_nodes']:,} hubs" if r["static_cache_nodes"] else "")
          + f" ({_mib(r['resident_bytes'])} held)")
    share = r["epoch_bytes"] / r["store_bytes"] if r["store_bytes"] else 0.0
    print(f"epoch {r['epoch']}: {_count(r['num_states'], 'state')}, {_count(r['num_swaps'], 'swap')}, "
          f"{_count(r['partition_loads'], 'partition load')}, {_count(r['num_batches'], 'batch', 'batches')}")
    if r["epoch_bytes_exact"]:
        read = f"reads {_mib(r['epoch_bytes'])} ({share:.2f}x the store) from an empty buffer"
    else:
        read = (f"reads the structure and labels, {_mib(r['epoch_bytes'])} ({share:.2f}x the store), then each "
                f"macro-batch's sampled feature rows (not predicted), in rounds of at most "
                f"{_mib(r['macro_batch_bytes'])} ({rules['macro_batch_bytes']})")
    if r["later_epoch_bytes"] == 0:
        later = "later epochs read nothing (the graph stays resident)"
    elif not r["epoch_bytes_exact"]:
        later = "later epochs the sampled rows alone (the structure stays)"
    else:
        later = "later epochs keep what the one before left resident (unless exact evaluation freed it)"
    print(f"  {read}; {later}")
    print(f"evaluation (exact, {r['model']}): floor {_mib(r['eval_floor_bytes'])} "
          f"({r['eval_floor_bytes']:,} bytes), budget {_mib(r['eval_budget_bytes'])}")
    parts = " + ".join(f"{k.replace('_', ' ')} {_mib(v)}" for k, v in r["peak_parts"].items())
    # An estimate, not a bound: a graph that fits the budget holds less of it, and at a budget
    # of a few MiB a run's own fixed costs (its ops' code, its threads) add 30-40 MiB (Cora at
    # 12-16 MiB: the trainer peaked 28-40 MiB above this sum; the wide stand-in at 512 MiB,
    # 25-42 MiB below it).
    print(f"expected peak about {_mib(r['peak_bytes'])} = {parts}")
    return 0


def _run_plot(args: argparse.Namespace) -> int:
    from graphstore.plot import plot_runs

    fig = plot_runs(args.runs, args.out, dpi=args.dpi)
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    print(f"wrote {args.out}: {len(args.runs)} run(s) ({', '.join(labels)}), "
          f"{len(fig.axes)} panels: loss, validation, time (compute/stall), bytes read")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    handlers = {"convert": _run_convert, "info": _run_info, "verify": _run_verify, "upgrade": _run_upgrade,
                "hubs": _run_hubs, "plan": _run_plan, "infer": _run_infer,
                "aggregate": _run_aggregate, "plot": _run_plot}
    try:
        status = handlers[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except BrokenPipeError:
        # `graphstore info X | head`: the reader has gone, as it may; stop as Unix tools do,
        # quietly and with SIGPIPE's status.
        return stdout_closed()
    except GraphStoreError as exc:
        print(f"graphstore {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # disk full, permission denied: the user's to fix, not a bug
        print(f"graphstore {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"graphstore {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
