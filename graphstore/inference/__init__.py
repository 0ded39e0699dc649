"""Inference over the whole graph out of core: every layer for every node, all neighbours,
a partition and an edge bucket at a time (`layerwise`); models saved and loaded for it
(`checkpoint`), and ``graphstore infer`` on the command line; BatchGNN's aggregation cache
computed the same way and stored (`aggregate`, ``graphstore aggregate``)."""

from graphstore.inference.aggregate import AGGREGATE_INPUTS, aggregate_store
from graphstore.inference.budget import evaluation_budget
from graphstore.inference.checkpoint import load_model, save_model
from graphstore.inference.layerwise import (InferenceStats, ScratchRows, infer_layerwise, min_buffer_bytes,
                                            resolve_device)

__all__ = ["AGGREGATE_INPUTS", "InferenceStats", "ScratchRows", "aggregate_store", "evaluation_budget",
           "infer_layerwise", "load_model", "min_buffer_bytes", "resolve_device", "save_model"]
