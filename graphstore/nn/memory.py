"""Memory of one training step (forward, loss, backward, optimizer step) of a `GNN` on a
`DENSE`: an estimate from the sizes alone, and a measurement to check it against.

What is counted (both ways):

* **inputs**: the tensors the caller hands in: features [N, D], labels [T] (int64), RGCN's
  relation per sampled edge [E] (int64), GCN's degrees [N] (int64);
* **activations**: every tensor autograd keeps for the backward pass, each storage once
  (a view such as ``h[self_rows]`` costs nothing beyond its base, which is counted once),
  minus the inputs and parameters it may alias. This is the peak of a step's
  batch-dependent memory on top of inputs and parameters: it is all alive when the
  backward pass starts;
* **parameters**, **gradients** (one per parameter), **optimizer state** (Adam: ``exp_avg``
  and ``exp_avg_sq`` like each parameter, plus a float32 ``step`` per parameter tensor).

The estimate follows what each layer of `graphstore.nn.layers` actually saves (read off
``torch.autograd.graph.saved_tensors_hooks``; each `_activations_*` function lists it), for
layer ``k`` with ``n`` input rows, ``m`` output rows, ``E`` sampled edges, widths ``i -> o``
and ``f`` bytes per float. Index tensors (``nbr_index``, the segment ids) are int64. The
first layer's input needs no gradient, which spares some of its saves. With dropout in
training mode, CPU dropout keeps its mask as a float tensor like its input (CUDA's fused
kernel keeps a bool one; the estimate counts the CPU one). Temporaries freed
during the forward pass and the backward pass's own transient buffers are not counted.
On CPU the measurement is exactly this definition (`measure_step_memory`); on CUDA
``torch.cuda.max_memory_allocated`` also sees the allocator's rounding and those transients.

Examples
--------
>>> from graphstore.sample import CSCGraph, sample_dense
>>> from graphstore.nn import GNN
>>> g = CSCGraph.from_edges(torch.tensor([1, 2, 3, 0]), torch.tensor([0, 0, 1, 2]), num_nodes=4)
>>> dense = sample_dense(g, torch.tensor([0, 1]), (-1, -1))
>>> model = GNN("sage", in_dim=3, hidden_dim=8, out_dim=2, num_layers=2)
>>> est = estimate_step_memory(model, dense)
>>> got = measure_step_memory(model, dense, torch.randn(dense.num_nodes, 3), torch.tensor([0, 1]))
>>> est.total_bytes == got.total_bytes
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from graphstore.errors import ConfigError
from graphstore.nn.layers import GNN, GATConv, GCNConv, GINConv, RGCNConv
from graphstore.sample.base import DENSE
from graphstore.sample.microbatch import DenseSizes, dense_sizes

__all__ = ["OPTIMIZERS", "StepMemory", "estimate_step_memory", "measure_step_memory", "step_estimator"]

OPTIMIZERS = ("adam", "sgd", None)
"""Optimizers whose state is modelled: Adam (two moments), plain SGD (none), or no step."""

_INDEX = 8  # int64 index tensors


@dataclass(frozen=True, slots=True)
class StepMemory:
    """Bytes of one training step, by kind (see the module docstring)."""

    input_bytes: int
    """Features, labels and per-edge / per-node inputs."""
    activation_bytes: int
    """Tensors saved for backward (unique storages), the loss's included."""
    parameter_bytes: int
    """The model's parameters."""
    gradient_bytes: int
    """One gradient per parameter."""
    optimizer_bytes: int
    """Optimizer state."""
    layer_bytes: tuple[int, ...] = ()
    """Estimates only: activations per GNN layer (input layer first), then the loss's."""

    @property
    def total_bytes(self) -> int:
        """Everything above."""
        return (self.input_bytes + self.activation_bytes + self.parameter_bytes + self.gradient_bytes
                + self.optimizer_bytes)


# ------------------------------------------------------------------------------ estimate
# Each returns the bytes layer k saves besides its input rows (the input layer's are the
# features, a hidden layer's are the previous activation's output, counted there).


def _activations_sage(n, m, e, i, o, f, grad_in):
    if i > o:
        # fc_nbr(h) first: nbr_index, segment ids, gathered projections [E, o], mean scale [m, 1].
        return 2 * _INDEX * e + e * o * f + m * f
    # Mean first: fc_nbr keeps the mean [m, i]; the gather/sum/scale only when h needs grad.
    return m * i * f + (2 * _INDEX * e + e * i * f + m * f if grad_in else 0)


def _activations_gcn(n, m, e, i, o, f, grad_in):
    if i > o:
        # norm [n, 1] (its self-row slice is a view), indices, gathered rows [E, o].
        return n * f + 2 * _INDEX * e + e * o * f
    return m * i * f + (n * f + 2 * _INDEX * e + e * i * f if grad_in else 0)


def _activations_gin(n, m, e, i, o, f, grad_in, learn_eps):
    # MLP input [m, i] and its inner ReLU output [m, o]; (1 + eps) [1] when anything needs it.
    saved = m * i * f + m * o * f + (f if grad_in or learn_eps else 0)
    return saved + (2 * _INDEX * e + e * i * f if grad_in else 0)


def _activations_gat(n, m, e, heads, width, f):
    # x = fc(h) [n, H*F]; per edge and head: LeakyReLU input, exp, gathered denominator and
    # alpha; the same four per self loop [m, H]; x gathered and the messages [E, H*F]; indices.
    return n * width * f + 2 * _INDEX * e + 4 * e * heads * f + 4 * m * heads * f + 2 * e * width * f


def _activations_rgcn(n, m, e, i, o, f, grad_in, num_weights, bases):
    # Basis weights copied into bmm's layout [i, B*o] (kept only when h needs grad).
    saved = i * num_weights * o * f if grad_in else 0
    if bases:
        # nbr_index; gathered coefficients [E, B] and projections [E, o, B]; the mean divisor
        # [E, 1]; segment ids and messages [E, o].
        return saved + 2 * _INDEX * e + e * num_weights * f + e * o * num_weights * f + e * f + e * o * f
    # Combined (row, relation) index, divisor, segment ids, messages.
    return saved + 2 * _INDEX * e + e * f + e * o * f


def _keeps_input(layer: nn.Module) -> bool:
    """Whether a hidden layer keeps its input rows for backward (all but GCN with i <= o and
    GIN with a fixed eps, which keep only derived tensors)."""
    if isinstance(layer, GINConv):
        return isinstance(layer.eps, nn.Parameter)
    if isinstance(layer, GCNConv):
        return layer.in_dim > layer.out_dim
    return True


def _param_bytes(model: nn.Module) -> tuple[int, int]:
    params = list(model.parameters())
    return sum(p.numel() * p.element_size() for p in params), len(params)


def _optimizer_bytes(optimizer: str | None, param_bytes: int, num_tensors: int) -> int:
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {OPTIMIZERS} (got {optimizer!r})")
    # Adam: exp_avg and exp_avg_sq like each parameter, and a float32 step per tensor.
    return 2 * param_bytes + 4 * num_tensors if optimizer == "adam" else 0


def estimate_step_memory(model: GNN, sizes: DENSE | DenseSizes, *, feature_dim: int | None = None,
                         dtype: torch.dtype | None = None, optimizer: str | None = "adam",
                         degrees: bool = True) -> StepMemory:
    """Estimate the bytes of one training step of ``model`` on a batch of ``sizes``.

    Parameters
    ----------
    model : GNN
        The model (its kind, widths and parameters are read; GIN with its default MLP).
    sizes : DENSE or DenseSizes
        The batch, or its sizes (`graphstore.sample.micro_batch_sizes` gives them for
        micro-batches without building them).
    feature_dim : int, optional
        Input width; default the first layer's.
    dtype : torch.dtype, optional
        Float type of features and activations; default the parameters'.
    optimizer : {"adam", "sgd", None}
        Whose state to count.
    degrees : bool
        GCN: count an int64 [N] degrees input (the caller passes ``degrees``).

    Returns
    -------
    StepMemory
        With ``layer_bytes``: activations per layer, then the loss's.

    Raises
    ------
    ConfigError
        On a model that is not a `GNN`, a GIN with a custom MLP, or an unknown optimizer.
    """
    if not isinstance(model, GNN):
        raise ConfigError(f"the estimator models graphstore.nn.GNN (got {type(model).__name__})")
    if isinstance(sizes, DENSE):
        sizes = dense_sizes(sizes)
    if len(sizes.layers) != model.num_layers:
        raise ConfigError(f"the model has {model.num_layers} layers but the batch has {len(sizes.layers)} "
                          "hops; sample with as many fanouts as layers")
    params = list(model.parameters())
    dtype = dtype or (params[0].dtype if params else torch.get_default_dtype())
    f = torch.empty(0, dtype=dtype).element_size()
    first = model.layers[0]
    d = feature_dim if feature_dim is not None else first.in_dim
    inputs = sizes.num_nodes * d * f + sizes.num_targets * _INDEX
    if model.kind == "rgcn":
        inputs += sizes.layers[0][2] * _INDEX
    if model.kind == "gcn" and degrees:
        inputs += sizes.num_nodes * _INDEX
    dropout = model.training and model.dropout > 0
    layer_bytes = []
    for k, (layer, (n, m, e)) in enumerate(zip(model.layers, sizes.layers)):
        grad_in = k > 0
        if isinstance(layer, GATConv):
            width = layer.heads * layer.out_dim
            saved = _activations_gat(n, m, e, layer.heads, width, f)
            out_width = width if layer.concat else layer.out_dim
        elif isinstance(layer, GINConv):
            mlp = layer.mlp
            if not (isinstance(mlp, nn.Sequential) and len(mlp) == 3 and isinstance(mlp[0], nn.Linear)
                    and isinstance(mlp[1], nn.ReLU) and isinstance(mlp[2], nn.Linear)):
                raise ConfigError("the estimator models GIN's default MLP (Linear, ReLU, Linear) only")
            saved = _activations_gin(n, m, e, layer.in_dim, layer.out_dim, f, grad_in,
                                     isinstance(layer.eps, nn.Parameter))
            out_width = layer.out_dim
        elif isinstance(layer, RGCNConv):
            saved = _activations_rgcn(n, m, e, layer.in_dim, layer.out_dim, f, grad_in, layer.basis.shape[0],
                                      layer.coeff is not None)
            out_width = layer.out_dim
        elif model.kind == "gcn":
            saved = _activations_gcn(n, m, e, layer.in_dim, layer.out_dim, f, grad_in)
            out_width = layer.out_dim
        else:
            saved = _activations_sage(n, m, e, layer.in_dim, layer.out_dim, f, grad_in)
            out_width = layer.out_dim
        if k < model.num_layers - 1:
            saved += m * out_width * f                       # the activation's output
            if dropout:
                # CPU dropout keeps its scaled mask as a float tensor; the dropped rows are the
                # next layer's input, which it keeps unless it only needs their gathers' indices.
                saved += m * out_width * f * (1 + _keeps_input(model.layers[k + 1]))
        layer_bytes.append(saved)
    out_dim = model.layers[-1].out_dim
    # cross_entropy keeps log_softmax's output [T, C] and a scalar total weight.
    layer_bytes.append(sizes.num_targets * out_dim * f + f)
    param_bytes, num_tensors = _param_bytes(model)
    return StepMemory(inputs, sum(layer_bytes), param_bytes, param_bytes,
                      _optimizer_bytes(optimizer, param_bytes, num_tensors), tuple(layer_bytes))


def step_estimator(model: GNN, **kwargs) -> Callable[[DenseSizes], int]:
    """``sizes -> estimate_step_memory(model, sizes, **kwargs).total_bytes``, the estimator
    `graphstore.sample.choose_micro_batches` takes."""
    def estimate(sizes: DenseSizes) -> int:
        return estimate_step_memory(model, sizes, **kwargs).total_bytes
    return estimate


# ------------------------------------------------------------------------------- measure


def _storage_key(t: torch.Tensor) -> tuple[int, str]:
    return t.untyped_storage().data_ptr(), str(t.device)


def measure_step_memory(model: GNN, dense: DENSE, features: torch.Tensor, labels: torch.Tensor, *,
                        edge_type: torch.Tensor | None = None, degrees: torch.Tensor | None = None,
                        optimizer: str | None = "adam") -> StepMemory:
    """Measure one training step of ``model`` on a batch (CPU or any device).

    Runs the forward pass and ``cross_entropy(out, labels, ignore_index=-1)`` with a
    ``saved_tensors_hooks`` that records every tensor autograd keeps, then the backward
    pass. Activations are the recorded storages' bytes, each storage once, minus those of
    inputs and parameters; gradients are measured after the backward pass, and the
    optimizer state by one step of that optimizer on detached copies. The model and its
    gradients are left as they were.

    Parameters
    ----------
    model : GNN
    dense : DENSE
    features : float tensor [N, D]
    labels : int64 tensor [T]
    edge_type : int64 tensor [E], RGCN only
    degrees : tensor [N], GCN only
    optimizer : {"adam", "sgd", None}

    Returns
    -------
    StepMemory
        ``layer_bytes`` is empty (the hooks do not know the layer).
    """
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {OPTIMIZERS} (got {optimizer!r})")
    params = list(model.parameters())
    old_grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    inputs = [t for t in (features, labels, edge_type, degrees) if t is not None]
    input_keys = {_storage_key(t): t.untyped_storage().nbytes() for t in inputs}
    param_keys = {_storage_key(p) for p in params}
    saved: dict[tuple[int, str], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[_storage_key(t)] = t.untyped_storage().nbytes()
        return t

    try:
        kwargs = {}
        if edge_type is not None:
            kwargs["edge_type"] = edge_type
        if degrees is not None:
            kwargs["degrees"] = degrees
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.cross_entropy(model(features, dense, **kwargs), labels, ignore_index=-1)
        loss.backward()
        grads = {_storage_key(p.grad): p.grad.untyped_storage().nbytes()
                 for p in params if p.grad is not None}
        state_bytes = 0
        if optimizer == "adam":
            copies = [p.detach().clone().requires_grad_(True) for p in params]
            for c, p in zip(copies, params):
                c.grad = torch.zeros_like(c) if p.grad is None else p.grad.detach().clone()
            opt = torch.optim.Adam(copies)
            opt.step()
            state_bytes = sum(s.untyped_storage().nbytes() for st in opt.state.values() for s in st.values()
                              if isinstance(s, torch.Tensor))
    finally:
        for p, g in zip(params, old_grads):
            p.grad = g
    activations = sum(b for key, b in saved.items() if key not in input_keys and key not in param_keys)
    param_bytes = sum({_storage_key(p): p.untyped_storage().nbytes() for p in params}.values())
    return StepMemory(sum(input_keys.values()), activations, param_bytes, sum(grads.values()), state_bytes)
