"""Inference over the whole graph out of core: every layer for every node, all neighbours,
a partition and an edge bucket at a time (`layerwise`)."""

from graphstore.inference.layerwise import InferenceStats, ScratchRows, infer_layerwise

__all__ = ["InferenceStats", "ScratchRows", "infer_layerwise"]
