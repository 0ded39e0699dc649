"""Inference over the whole graph out of core: every layer for every node, all neighbours,
a partition and an edge bucket at a time (`layerwise`); models saved and loaded for it
(`checkpoint`), and ``graphstore infer`` on the command line."""

from graphstore.inference.checkpoint import load_model, save_model
from graphstore.inference.layerwise import InferenceStats, ScratchRows, infer_layerwise, min_buffer_bytes

__all__ = ["InferenceStats", "ScratchRows", "infer_layerwise", "load_model", "min_buffer_bytes", "save_model"]
