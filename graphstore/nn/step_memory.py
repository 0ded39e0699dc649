"""Memory of one training step (forward, loss, backward, optimizer step) of a `GNN` on a
`DENSE`: an estimate from the sizes alone, and a measurement to check it against.

Two figures, estimated and measured alike:

* **the allocator's peak** (`StepMemory.total_bytes`), what a device budget must hold: the
  bytes held before the step (`StepMemory.held_bytes`: inputs, the DENSE's index tensors,
  parameters, optimizer state) plus the highest point the allocator reaches above them
  during the step (`StepMemory.peak_bytes`): activations, gradients, and every temporary
  of the forward pass, the loss, the backward pass and the optimizer step;
* **the saved tensors** (`StepMemory.saved_tensor_bytes`), the figure this module first
  modelled: inputs, the tensors autograd keeps for backward (``activation_bytes``, each
  storage once), parameters, one gradient per parameter and the optimizer state. The
  estimate reproduces the measurement to the byte. It is not the peak: the backward pass
  allocates gradient temporaries as large as the largest saved ones while most saved
  tensors are still alive (a GraphSage layer's gathered rows [E, D] and their gradient
  [E, D] coexist), and the forward pass frees temporaries nothing saves (GIN's first layer
  gathers [E, D] input rows and sums them away), so the allocator's peak was 1.13-3.03x
  this sum in ``docs/benchmarks/microbatch.json`` (1.13-1.84x for all but GIN).

What is held, and what is counted:

* **inputs**: the tensors the caller hands in: features [N, D], labels [T] (int64), RGCN's
  relation per sampled edge [E] (int64), GCN's degrees [N] (int64);
* **structure** (peak figure only): the DENSE's ``node_ids`` [N], ``node_id_offsets``,
  ``nbr_offsets`` and ``repr_map`` (one [E_k] per layer, ``nbrs`` being the first), int64;
* **parameters** and **optimizer state** (Adam: ``exp_avg`` and ``exp_avg_sq`` like each
  parameter, plus a float32 ``step`` per parameter tensor). The state exists before the
  step, as it does at every step but a run's first (which creates it inside
  ``optimizer.step()``, after the activations are freed, so the steady-state total bounds
  it too);
* **gradients**: none before the step (``zero_grad(set_to_none=True)``), so they are part
  of the peak. With ``accumulate=True`` they exist before the step and are held, as for
  micro-batches 2..K of a batch (`graphstore.nn.micro_batch_backward`): backward then adds
  into them and each new gradient is a transient.

The estimate of the peak replays the step as the allocator sees it. Each layer of
`graphstore.nn.layers` is mirrored op by op (the ``_sim_*`` functions follow the layer
code line for line): every output, every temporary and when Python or autograd lets it
go; then autograd's engine is replayed (nodes in reverse creation order, which is the
CPU engine's order; gradients of an input accumulated in one buffer; saved tensors
released after their node runs), with each backward formula's temporaries as ATen
allocates them on CPU (read off ``torch.profiler``'s per-op memory, e.g. ``div``'s other
gradient ``-grad * (a / b) / b`` holds four [E, H] tensors at once, ``index_select``'s
gradient is a zeroed copy of its whole input). Every size is a linear form in the batch's
sizes (``n_k, m_k, e_k`` per layer) and the order of events does not depend on them, so a
model is replayed once (``_compile``, cached) into a matrix of the running total after
every allocation, and a batch's peak is the largest entry of one matrix-vector product:
cheap enough for `graphstore.sample.choose_micro_batches`, which estimates every
micro-batch of every K it tries. Scalar temporaries (a few bytes each) are left out.

We depart from Betty (section 4.4) in three ways. Betty sums activations, gradients and
optimizer state and takes the peak as the larger of (6) intermediate results and (7)
gradients plus the rest; its < 8 % is against CUDA's peak for an LSTM aggregator, whose
per-node constant (18) was measured. Here the peak comes from the replayed timeline, and
no constant is fitted: every term is a tensor the code allocates. Betty counts a block as
``3 E`` numbers; here the DENSE's index tensors are held input, and the per-layer
segment ids [E_k] the layers build are timeline allocations.

On CUDA, ``torch.cuda.max_memory_allocated`` rounds every block up to a multiple of 512
bytes, dropout keeps a bool mask, and Adam runs its ``foreach`` kernels (one temporary
the size of all parameters) instead of CPU's per-parameter loop (two temporaries the size
of one). When the parameters are on CUDA the estimate models these three (the rounding
as its bound, 512 bytes more per allocation), but its terms were derived and checked on
CPU only (no GPU was available); the measurement's CUDA path (`measure_step_memory`) is
the check to run there.

Examples
--------
>>> from graphstore.sample import CSCGraph, sample_dense
>>> from graphstore.nn import GNN
>>> g = CSCGraph.from_edges(torch.tensor([1, 2, 3, 0]), torch.tensor([0, 0, 1, 2]), num_nodes=4)
>>> dense = sample_dense(g, torch.tensor([0, 1]), (-1, -1))
>>> model = GNN("sage", in_dim=3, hidden_dim=8, out_dim=2, num_layers=2)
>>> est = estimate_step_memory(model, dense)
>>> got = measure_step_memory(model, dense, torch.randn(dense.num_nodes, 3), torch.tensor([0, 1]))
>>> est.saved_tensor_bytes == got.saved_tensor_bytes, est.held_bytes == got.held_bytes
(True, True)
>>> got.peak_source, round(est.total_bytes / got.total_bytes, 2)
('cpu_allocator', 1.0)
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from graphstore.errors import ConfigError
from graphstore.nn.layers import GNN, GATConv, GCNConv, GINConv, RGCNConv
from graphstore.sample.base import DENSE
from graphstore.sample.microbatch import DenseSizes, dense_sizes

__all__ = ["OPTIMIZERS", "StepMemory", "estimate_step_memory", "measure_step_memory", "model_state_bytes",
           "step_estimator"]

OPTIMIZERS = ("adam", "sgd", None)
"""Optimizers whose state is modelled: Adam (two moments), plain SGD (none), or no step."""

PEAK_SOURCES = ("estimate", "cpu_allocator", "cuda_allocator")
"""Where `StepMemory.peak_bytes` comes from: the estimate's replayed timeline, the CPU
allocator's events seen by ``torch.profiler``, or ``torch.cuda.max_memory_allocated``."""

_INDEX = 8  # int64 index tensors
_CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to a multiple of this


@dataclass(frozen=True, slots=True)
class StepMemory:
    """Bytes of one training step, by kind (see the module docstring)."""

    input_bytes: int
    """Features, labels and per-edge / per-node inputs (held)."""
    activation_bytes: int
    """Tensors saved for backward (unique storages), the loss's included."""
    parameter_bytes: int
    """The model's parameters (held)."""
    gradient_bytes: int
    """One gradient per parameter."""
    optimizer_bytes: int
    """Optimizer state (held)."""
    layer_bytes: tuple[int, ...] = ()
    """Estimates only: activations per GNN layer (input layer first), then the loss's."""
    structure_bytes: int = 0
    """The DENSE's index tensors (held): node ids, offsets, one neighbour list per layer."""
    peak_bytes: int = 0
    """The allocator's peak during the step above what was held before it: activations,
    gradients (unless ``accumulate``: then held) and every temporary."""
    peak_source: str = "estimate"
    """How ``peak_bytes`` was obtained, one of `PEAK_SOURCES`."""
    accumulate: bool = False
    """Gradients existed before the step (micro-batches 2..K) and are counted as held."""

    @property
    def held_bytes(self) -> int:
        """What exists before the step: inputs, structure, parameters, optimizer state, and
        the gradients when ``accumulate``."""
        return (self.input_bytes + self.structure_bytes + self.parameter_bytes + self.optimizer_bytes
                + (self.gradient_bytes if self.accumulate else 0))

    @property
    def total_bytes(self) -> int:
        """The step's peak memory: ``held_bytes + peak_bytes``. What a budget must hold."""
        return self.held_bytes + self.peak_bytes

    @property
    def saved_tensor_bytes(self) -> int:
        """Inputs, saved activations, parameters, gradients and optimizer state: a sum of
        what is alive when backward starts, not the peak (see the module docstring)."""
        return (self.input_bytes + self.activation_bytes + self.parameter_bytes + self.gradient_bytes
                + self.optimizer_bytes)


# ------------------------------------------------------------------- saved-tensor estimate
# Each returns the bytes layer k saves besides its input rows (the input layer's are the
# features, a hidden layer's are the previous activation's output, counted there), for
# ``n`` input rows, ``m`` output rows, ``e`` sampled edges, widths ``i -> o`` and ``f``
# bytes per float. Index tensors (``nbr_index``, the segment ids) are int64. The first
# layer's input needs no gradient, which spares some of its saves. CPU dropout keeps its
# mask as a float tensor like its input.


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


def _activations_gin(n, m, e, i, o, f, grad_in):
    # MLP input [m, i] and its inner ReLU output [m, o]; (1 + eps) [1] for h's gradient (a
    # learnt eps keeps h's rows instead, counted with h).
    saved = m * i * f + m * o * f + (f if grad_in else 0)
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


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _optimizer_bytes(optimizer: str | None, param_bytes: int, num_tensors: int) -> int:
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {OPTIMIZERS} (got {optimizer!r})")
    # Adam: exp_avg and exp_avg_sq like each parameter, and a float32 step per tensor.
    return 2 * param_bytes + 4 * num_tensors if optimizer == "adam" else 0


def model_state_bytes(model: nn.Module, optimizer: str | None = "adam") -> int:
    """Parameters, one gradient each and the optimizer's state: what every training step
    of ``model`` holds whatever its batch (`StepMemory`'s parameter, gradient and optimizer
    bytes)."""
    params = list(model.parameters())
    param_bytes = sum(_nbytes(p) for p in params)
    return 2 * param_bytes + _optimizer_bytes(optimizer, param_bytes, len(params))


def _check_gin(layer: GINConv) -> None:
    mlp = layer.mlp
    if not (isinstance(mlp, nn.Sequential) and len(mlp) == 3 and isinstance(mlp[0], nn.Linear)
            and isinstance(mlp[1], nn.ReLU) and isinstance(mlp[2], nn.Linear)):
        raise ConfigError("the estimator models GIN's default MLP (Linear, ReLU, Linear) only")


def _saved_activations(model: GNN, sizes: DenseSizes, f: int) -> list[int]:
    """Bytes autograd saves, per layer, then the loss's."""
    dropout = model.training and model.dropout > 0
    layer_bytes = []
    for k, (layer, (n, m, e)) in enumerate(zip(model.layers, sizes.layers)):
        grad_in = k > 0
        if isinstance(layer, GATConv):
            width = layer.heads * layer.out_dim
            saved = _activations_gat(n, m, e, layer.heads, width, f)
            if layer.training and layer.attn_dropout > 0:
                # Attention dropout keeps its masks [E, H] and [m, H]; the dropped weights
                # replace alpha in the messages' saves.
                saved += (e + m) * layer.heads * f
            out_width = width if layer.concat else layer.out_dim
        elif isinstance(layer, GINConv):
            saved = _activations_gin(n, m, e, layer.in_dim, layer.out_dim, f, grad_in)
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
    # cross_entropy keeps log_softmax's output [T, C] and a scalar total weight.
    layer_bytes.append(sizes.num_targets * model.layers[-1].out_dim * f + f)
    return layer_bytes


# ---------------------------------------------------------------- allocator timeline replay
# Sizes are linear forms: numpy vectors over (1, n_0, m_0, e_0, n_1, m_1, e_1, ...), so one
# replay serves every batch. A _Tensor is a Python-visible tensor (a view shares its base's
# _Storage); a _Storage is freed when its last owner (Python names, saved-for-backward
# slots, gradient buffers) lets go, which is when the CPU allocator sees the free.

_HELD = 1 << 40  # owner count of storages that exist before the step and outlive it


class _Storage:
    __slots__ = ("nbytes", "refs")

    def __init__(self, nbytes: np.ndarray, refs: int = 1) -> None:
        self.nbytes, self.refs = nbytes, refs


class _Tensor:
    __slots__ = ("nbytes", "node", "param", "requires_grad", "slot", "storage")

    def __init__(self, storage: _Storage, nbytes: np.ndarray, *, requires_grad: bool = False,
                 param: bool = False) -> None:
        self.storage, self.nbytes = storage, nbytes
        self.node: _Node | None = None
        self.slot = 0
        self.requires_grad, self.param = requires_grad, param


class _Node:
    """An autograd node: its inputs, saved storages, backward rule and gradient buffers."""

    __slots__ = ("backward", "grads", "inputs", "saved")

    def __init__(self, inputs, saved, backward, num_outputs) -> None:
        self.inputs, self.saved, self.backward = inputs, saved, backward
        self.grads: list[_Storage | None] = [None] * num_outputs


class _Relayout:
    """A parameter gradient whose strides differ from the parameter's (einsum's permuted
    basis): AccumulateGrad copies it into a fresh tensor instead of keeping it."""

    __slots__ = ("storage",)

    def __init__(self, storage: _Storage) -> None:
        self.storage = storage


class _Timeline:
    """Replays one training step's allocations and frees; ``marks`` holds the running total
    after every allocation (the candidates for the peak)."""

    def __init__(self, dim: int, *, block: int = 0) -> None:
        self.zero = np.zeros(dim)
        self.one = np.zeros(dim)
        self.one[0] = 1.0
        self.now = self.zero
        self.marks = [self.zero]
        self.nodes: list[_Node] = []
        self.param_grads: dict[int, _Storage] = {}
        self.block = block * self.one  # CUDA: an upper bound of each block's rounding

    # -- storages
    def alloc(self, nbytes: np.ndarray) -> _Storage:
        if self.block.any():
            nbytes = nbytes + self.block
        self.now = self.now + nbytes
        self.marks.append(self.now)
        return _Storage(nbytes)

    def unref(self, storage: _Storage) -> None:
        storage.refs -= 1
        if storage.refs == 0:
            self.now = self.now - storage.nbytes

    def share(self, storage: _Storage) -> _Storage:
        storage.refs += 1
        return storage

    # -- tensors
    def held(self, nbytes: np.ndarray, *, param: bool = False) -> _Tensor:
        return _Tensor(_Storage(nbytes, _HELD), nbytes, requires_grad=param, param=param)

    def new(self, nbytes: np.ndarray) -> _Tensor:
        return _Tensor(self.alloc(nbytes), nbytes)

    def ref(self, t: _Tensor) -> _Tensor:
        """A second Python name for ``t``."""
        self.share(t.storage)
        return t

    def drop(self, *tensors: _Tensor | None) -> None:
        """Python lets go of ``tensors`` (a name rebound, a temporary consumed, a frame left)."""
        for t in tensors:
            if t is not None:
                self.unref(t.storage)

    def alias(self, t: _Tensor, nbytes: np.ndarray | None = None) -> _Tensor:
        """A view whose gradient is the base's, reshaped (``view``, ``reshape``, ``[..., None]``)."""
        v = _Tensor(self.share(t.storage), t.nbytes if nbytes is None else nbytes,
                    requires_grad=t.requires_grad, param=t.param)
        v.node, v.slot = t.node, t.slot
        return v

    def record(self, outputs: Sequence[_Tensor], inputs: Sequence[_Tensor | None], saved: Sequence[_Tensor],
               backward: Callable) -> None:
        if not any(t is not None and t.requires_grad for t in inputs):
            return
        node = _Node(tuple(inputs), [self.share(t.storage) for t in saved], backward, len(outputs))
        for slot, t in enumerate(outputs):
            t.node, t.slot, t.requires_grad = node, slot, True
        self.nodes.append(node)

    # -- the engine
    def _deliver(self, x: _Tensor, grad: _Storage | _Relayout) -> None:
        relayout = isinstance(grad, _Relayout)
        storage = grad.storage if relayout else grad
        if x.param:
            key = id(x.storage)
            if key not in self.param_grads:  # else AccumulateGrad adds in place into .grad
                self.param_grads[key] = self.alloc(storage.nbytes) if relayout else self.share(storage)
            return
        buffers, slot = x.node.grads, x.slot
        old = buffers[slot]
        if old is None:
            buffers[slot] = self.share(storage)
        elif old.refs == 1:
            pass  # InputBuffer adds in place into a buffer it alone holds
        elif storage.refs == 1:
            buffers[slot] = self.share(storage)
            self.unref(old)
        else:
            buffers[slot] = self.alloc(old.nbytes)
            self.unref(old)

    def backward(self, loss: _Tensor) -> None:
        """``loss.backward()``: nodes in reverse creation order (the CPU engine's priority:
        every consumer of a node's output was created after it)."""
        loss.node.grads[loss.slot] = self.alloc(loss.nbytes)  # ones_like(loss)
        for node in reversed(self.nodes):
            grads = node.grads
            if all(g is None for g in grads):
                continue
            outs = node.backward(self, grads)
            # call_function drops the incoming gradients, then release_variables the saved
            # tensors, then the outputs go to their buffers.
            for g in grads:
                if g is not None:
                    self.unref(g)
            for s in node.saved:
                self.unref(s)
            node.saved, node.grads = (), [None] * len(grads)
            for x, g in zip(node.inputs, outs):
                if g is not None:
                    self._deliver(x, g)
            for g in outs:
                if g is not None:
                    self.unref(g.storage if isinstance(g, _Relayout) else g)
        for node in self.nodes:  # the graph dies with the saved tensors no gradient reached
            for s in node.saved:
                self.unref(s)
            node.saved = ()

    # -- ops: forward allocations, what autograd saves, and the backward formula's allocations
    def linear(self, x: _Tensor, weight: _Tensor, bias: _Tensor | None, out: np.ndarray) -> _Tensor:
        y = self.new(out)

        def backward(sim, grads):
            if bias is None:  # mm: the weight's gradient first
                gw = sim.alloc(weight.nbytes)
                return [sim.alloc(x.nbytes) if x.requires_grad else None, gw]
            gx = sim.alloc(x.nbytes) if x.requires_grad else None  # addmm: the input's first
            return [gx, sim.alloc(weight.nbytes), sim.alloc(bias.nbytes)]  # bias: sum over rows

        self.record([y], [x, weight] if bias is None else [x, weight, bias], [x], backward)
        return y

    def index_select(self, x: _Tensor, index: _Tensor, out: np.ndarray) -> _Tensor:
        y = self.new(out)
        # Backward: zeros like the whole input, then index_add_ of the gradient.
        self.record([y], [x], [index], lambda sim, grads: [sim.alloc(x.nbytes)])
        return y

    def segment_sum(self, x: _Tensor, segment: _Tensor, out: np.ndarray) -> _Tensor:
        y = self.new(out)  # new_zeros, then index_add_ in place: it keeps the index and the source
        self.record([y], [x], [segment, x], lambda sim, grads: [sim.alloc(x.nbytes)])
        return y

    def _reduce(self, inputs, fulls, out):
        """validate_outputs: a broadcast input's gradient is summed to its shape."""
        res = []
        for t, g in zip(inputs, fulls):
            if g is not None and not np.array_equal(t.nbytes, out):
                r = self.alloc(t.nbytes)
                self.unref(g)
                g = r
            res.append(g)
        return res

    def mul(self, a: _Tensor, b: _Tensor, out: np.ndarray) -> _Tensor:
        y = self.new(out)

        def backward(sim, grads):
            fulls = [sim.alloc(out) if t.requires_grad else None for t in (a, b)]
            return sim._reduce((a, b), fulls, out)

        self.record([y], [a, b], ([a] if b.requires_grad else []) + ([b] if a.requires_grad else []),
                    backward)
        return y

    def div(self, a: _Tensor, b: _Tensor, out: np.ndarray) -> _Tensor:
        y = self.new(out)

        def backward(sim, grads):
            gb = None
            if b.requires_grad:
                # -grad * ((a / b) / b): its three temporaries live to the end of the expression.
                temps = [sim.alloc(out) for _ in range(3)]
                gb = sim.alloc(out)
                for t in temps:
                    sim.unref(t)
            ga = sim.alloc(out) if a.requires_grad else None
            return sim._reduce((a, b), [ga, gb], out)

        self.record([y], [a, b], ([a] if b.requires_grad else []) + [b], backward)
        return y

    def add(self, a: _Tensor, b: _Tensor, out: np.ndarray, *, negate_b: bool = False) -> _Tensor:
        y = self.new(out)

        def backward(sim, grads):
            res = []
            for t, neg in ((a, False), (b, negate_b)):
                if not t.requires_grad:
                    res.append(None)
                elif neg or not np.array_equal(t.nbytes, out):
                    res.append(sim.alloc(t.nbytes))  # -grad, or a broadcast input's sum
                else:
                    res.append(sim.share(grads[0]))  # the same gradient, passed on
            return res

        self.record([y], [a, b], [], backward)
        return y

    def unary(self, x: _Tensor, *, save: str) -> _Tensor:
        """relu / exp (save the result) or leaky_relu (saves its input); one gradient temporary."""
        y = self.new(x.nbytes)
        self.record([y], [x], [y if save == "result" else x], lambda sim, grads: [sim.alloc(x.nbytes)])
        return y

    def reduce(self, x: _Tensor, out: np.ndarray, *, expand: bool) -> _Tensor:
        """sum over a dim (backward: an expanded view, no allocation) or mean (a division)."""
        y = self.new(out)
        self.record([y], [x], [], lambda sim, grads: [sim.share(grads[0]) if expand else sim.alloc(x.nbytes)])
        return y

    def slice(self, x: _Tensor, nbytes: np.ndarray) -> _Tensor:
        """``x[rows]``, a view; its gradient is zeros like ``x`` with the rows copied in."""
        v = _Tensor(self.share(x.storage), nbytes)
        self.record([v], [x], [], lambda sim, grads: [sim.alloc(x.nbytes)])
        return v

    def dropout(self, x: _Tensor, numel: np.ndarray, f: int, *, cuda: bool) -> _Tensor:
        if cuda:  # native_dropout: the output and a bool mask, kept for backward
            mask = self.new(numel)
            y = self.new(x.nbytes)
            self.record([y], [x], [mask], lambda sim, grads: [sim.alloc(x.nbytes)])
            self.drop(mask)
            return y
        noise = self.new(numel * f)  # empty_like(x).bernoulli_(1 - p).div_(1 - p), then x * noise
        y = self.mul(x, noise, x.nbytes)
        self.drop(noise)
        return y

    def bmm(self, a: _Tensor, b: _Tensor, out: np.ndarray, *, b_copy: _Tensor | None = None) -> _Tensor:
        """einsum's batched product: each operand saved for the other's gradient; backward
        computes the second operand's gradient first. ``b_copy``: einsum copied ``b`` (a
        parameter) into bmm's layout; the copy is what is saved, and ``b``'s gradient comes
        in the copy's strides (`_Relayout`)."""
        y = self.new(out)
        b_saved = b if b_copy is None else b_copy

        def backward(sim, grads):
            gb = sim.alloc(b.nbytes) if b.requires_grad else None
            ga = sim.alloc(a.nbytes) if a.requires_grad else None
            return [ga, _Relayout(gb) if b_copy is not None and gb is not None else gb]

        self.record([y], [a, b], ([a] if b.requires_grad else []) + ([b_saved] if a.requires_grad else []),
                    backward)
        return y


# The mirrors of graphstore.nn.layers: each line follows a line of the layer's forward;
# ``drop`` marks where CPython releases a temporary or a local.


def _sim_segment_mean(t: _Timeline, x, view, m, width, f):
    total = t.segment_sum(x, view[1], m * width * f)
    clamp = t.new(m * _INDEX)              # counts.clamp(min=1), int64
    as_float = t.new(m * f)                # .to(x.dtype)
    t.drop(clamp)
    recip = t.new(m * f)                   # 1.0 / ...: reciprocal, then * 1.0
    scale = t.new(m * f)
    t.drop(recip, as_float)
    out = t.mul(total, scale, m * width * f)
    t.drop(total, scale)
    return out


def _sim_sage(t, spec, params, h, view, n, m, e, f, **_):
    _, i, o, _ = spec
    w_self, b_self, w_nbr = params
    if i > o:
        proj = t.linear(h, w_nbr, None, n * o * f)
        nbr = t.index_select(proj, view[0], e * o * f)
        t.drop(proj)
        agg = _sim_segment_mean(t, nbr, view, m, o, f)
    else:
        nbr = None
        gathered = t.index_select(h, view[0], e * i * f)
        mean = _sim_segment_mean(t, gathered, view, m, i, f)
        t.drop(gathered)
        agg = t.linear(mean, w_nbr, None, m * o * f)
        t.drop(mean)
    h_self = t.slice(h, m * i * f)
    s = t.linear(h_self, w_self, b_self, m * o * f)
    t.drop(h_self)
    out = t.add(s, agg, m * o * f)
    t.drop(s, nbr, agg)
    return out


def _sim_gcn(t, spec, params, h, view, n, m, e, f, **_):
    _, i, o, _ = spec
    w, bias = params
    as_float = t.new(n * f)                # degrees.to(h.dtype)
    plus = t.new(n * f)                    # + 1.0
    t.drop(as_float)
    norm = t.new(n * f)                    # .rsqrt()
    t.drop(plus)
    width = min(i, o)
    x = t.linear(h, w, None, n * o * f) if i > o else t.ref(h)
    column = t.alias(norm, n * f)                            # norm[:, None]
    scaled = t.mul(x, column, n * width * f)
    t.drop(column, x)
    x = scaled
    gathered = t.index_select(x, view[0], e * width * f)
    agg = t.segment_sum(gathered, view[1], m * width * f)
    t.drop(gathered)
    x_self = t.slice(x, m * width * f)
    s = t.add(agg, x_self, m * width * f)
    t.drop(x_self)
    column = t.slice(norm, m * f)                            # norm[self_rows, None]
    out = t.mul(s, column, m * width * f)
    t.drop(s, column)
    if i <= o:
        projected = t.linear(out, w, None, m * o * f)
        t.drop(out)
        out = projected
    if bias is not None:
        biased = t.add(out, bias, m * o * f)
        t.drop(out)
        out = biased
    t.drop(norm, x, agg)
    return out


def _sim_segment_softmax(t, logits, segment, self_logits, m, e, heads, f):
    top = t.new(m * heads * f)                               # segment_max: clone + scatter_reduce_
    top_edges = t.index_select(top, segment, e * heads * f)
    shifted = t.add(logits, top_edges, e * heads * f, negate_b=True)
    t.drop(top_edges)
    edge_exp = t.unary(shifted, save="result")
    t.drop(shifted)
    shifted = t.add(self_logits, top, m * heads * f, negate_b=True)
    self_exp = t.unary(shifted, save="result")
    t.drop(shifted)
    summed = t.segment_sum(edge_exp, segment, m * heads * f)
    denom = t.add(self_exp, summed, m * heads * f)
    t.drop(summed)
    denom_edges = t.index_select(denom, segment, e * heads * f)
    alpha = t.div(edge_exp, denom_edges, e * heads * f)
    t.drop(denom_edges)
    alpha_self = t.div(self_exp, denom, m * heads * f)
    t.drop(top, edge_exp, self_exp, denom)
    return alpha, alpha_self


def _sim_gat(t, spec, params, h, view, n, m, e, f, cuda=False, **_):
    _, _, per_head, heads, concat, attn_dropout, _ = spec
    w, attn_src, attn_dst, bias = params
    width = heads * per_head
    x = t.linear(h, w, None, n * width * f)                  # .view(-1, H, F): same storage
    prod = t.mul(x, attn_src, n * width * f)
    score_src = t.reduce(prod, n * heads * f, expand=True)
    t.drop(prod)
    x_self = t.slice(x, m * width * f)
    prod = t.mul(x_self, attn_dst, m * width * f)
    score_dst = t.reduce(prod, m * heads * f, expand=True)
    t.drop(prod)
    a = t.index_select(score_src, view[0], e * heads * f)
    b = t.index_select(score_dst, view[1], e * heads * f)
    summed = t.add(a, b, e * heads * f)
    t.drop(a, b)
    logits = t.unary(summed, save="input")                  # leaky_relu keeps its input
    t.drop(summed)
    src_self = t.slice(score_src, m * heads * f)
    summed = t.add(src_self, score_dst, m * heads * f)
    t.drop(src_self)
    self_logits = t.unary(summed, save="input")
    t.drop(summed)
    alpha, alpha_self = _sim_segment_softmax(t, logits, view[1], self_logits, m, e, heads, f)
    if attn_dropout:
        dropped = t.dropout(alpha, e * heads, f, cuda=cuda)
        t.drop(alpha)
        alpha = dropped
        dropped = t.dropout(alpha_self, m * heads, f, cuda=cuda)
        t.drop(alpha_self)
        alpha_self = dropped
    gathered = t.index_select(x, view[0], e * width * f)
    column = t.alias(alpha)                                  # alpha[..., None]
    msg = t.mul(gathered, column, e * width * f)
    t.drop(gathered, column)
    out = t.segment_sum(msg, view[1], m * width * f)
    column = t.alias(alpha_self)
    prod = t.mul(x_self, column, m * width * f)
    t.drop(column)
    summed = t.add(out, prod, m * width * f)
    t.drop(prod, out)
    out = summed
    if not concat:
        mean = t.reduce(out, m * per_head * f, expand=False)
        t.drop(out)
        out = mean
    if bias is not None:
        biased = t.add(out, bias, m * (width if concat else per_head) * f)
        t.drop(out)
        out = biased
    t.drop(x, score_src, x_self, score_dst, logits, self_logits, alpha, alpha_self, msg)
    return out


def _sim_gin(t, spec, params, h, view, n, m, e, f, **_):
    _, i, o, _ = spec
    w1, b1, w2, b2, eps_param = params
    gathered = t.index_select(h, view[0], e * i * f)
    agg = t.segment_sum(gathered, view[1], m * i * f)
    t.drop(gathered)
    one_plus = t.new(f * t.one)                              # 1 + eps, a scalar
    if eps_param is not None:
        t.record([one_plus], [eps_param], [], lambda sim, grads: [sim.share(grads[0])])
    h_self = t.slice(h, m * i * f)
    scaled = t.mul(one_plus, h_self, m * i * f)
    t.drop(one_plus, h_self)
    z = t.add(scaled, agg, m * i * f)
    t.drop(scaled)
    y = t.linear(z, w1, b1, m * o * f)
    r = t.unary(y, save="result")
    t.drop(y)
    out = t.linear(r, w2, b2, m * o * f)
    t.drop(r, z, agg)
    return out


def _sim_rgcn(t, spec, params, h, view, n, m, e, f, edge_type=None, **_):
    _, i, o, num_weights, num_relations, _ = spec
    basis, coeff, w_self, b_self = params
    # einsum("ni,bio->nbo"): the basis copied into bmm's layout, then one bmm.
    laid_out = t.new(basis.nbytes)
    proj = t.bmm(h, basis, n * num_weights * o * f, b_copy=laid_out)
    t.drop(laid_out)
    flat = None
    if coeff is None:
        flat = t.alias(proj)                                 # proj.reshape(-1, out_dim)
        times = t.new(e * _INDEX)                            # nbr_index * num_weights
        index = t.new(e * _INDEX)                            # + edge_type
        t.drop(times)
        msg = t.index_select(flat, index, e * o * f)
        t.drop(index)
    else:
        gathered = t.index_select(proj, view[0], e * num_weights * o * f)
        coeffs = t.index_select(coeff, edge_type, e * num_weights * f)
        msg = t.bmm(gathered, coeffs, e * o * f)             # einsum("ebo,eb->eo")
        t.drop(gathered, coeffs)
    t.drop(proj, flat)                                       # _messages returns: its locals go
    times = t.new(e * _INDEX)                                # segment * num_relations
    group = t.new(e * _INDEX)                                # + edge_type
    t.drop(times)
    size = t.new(m * num_relations * _INDEX)                 # bincount
    picked = t.new(e * _INDEX)                               # size.index_select(0, group)
    divisor = t.new(e * f)                                   # .to(msg.dtype)
    t.drop(picked)
    mean = t.div(msg, divisor, e * o * f)
    t.drop(divisor, msg)
    h_self = t.slice(h, m * i * f)
    s = t.linear(h_self, w_self, b_self, m * o * f)
    t.drop(h_self)
    agg = t.segment_sum(mean, view[1], m * o * f)
    out = t.add(s, agg, m * o * f)
    t.drop(s, agg, mean, group, size)
    return out


_SIMS = {"sage": _sim_sage, "gcn": _sim_gcn, "gat": _sim_gat, "gin": _sim_gin, "rgcn": _sim_rgcn}


def _layer_spec(layer: nn.Module, kind: str) -> tuple:
    """What the replay needs of a layer: its kind, widths, and its parameters' bytes in
    registration order (0 for an absent one)."""
    if isinstance(layer, GATConv):
        return ("gat", layer.in_dim, layer.out_dim, layer.heads, layer.concat,
                layer.training and layer.attn_dropout > 0,
                (_nbytes(layer.fc.weight), _nbytes(layer.attn_src), _nbytes(layer.attn_dst), _nbytes(layer.bias)))
    if isinstance(layer, GINConv):
        _check_gin(layer)
        learnt = isinstance(layer.eps, nn.Parameter)
        mlp = layer.mlp
        return ("gin", layer.in_dim, layer.out_dim,
                (_nbytes(mlp[0].weight), _nbytes(mlp[0].bias), _nbytes(mlp[2].weight), _nbytes(mlp[2].bias),
                 _nbytes(layer.eps) if learnt else 0))
    if isinstance(layer, RGCNConv):
        return ("rgcn", layer.in_dim, layer.out_dim, layer.basis.shape[0], layer.num_relations,
                (_nbytes(layer.basis), _nbytes(layer.coeff), _nbytes(layer.fc_self.weight),
                 _nbytes(layer.fc_self.bias)))
    if kind == "gcn":
        return ("gcn", layer.in_dim, layer.out_dim, (_nbytes(layer.fc.weight), _nbytes(layer.bias)))
    return ("sage", layer.in_dim, layer.out_dim,
            (_nbytes(layer.fc_self.weight), _nbytes(layer.fc_self.bias), _nbytes(layer.fc_nbr.weight)))


@functools.lru_cache(maxsize=128)
def _compile(layers: tuple, f: int, dropout: bool, param_order: tuple[int, ...], optimizer: str | None,
             degrees: bool, accumulate: bool, cuda: bool) -> np.ndarray:
    """Replay one step of a model; returns the running totals after every allocation,
    float64 [num_events, 1 + 3 L], as linear forms in (1, n_0, m_0, e_0, n_1, ...)."""
    num_layers = len(layers)
    t = _Timeline(1 + 3 * num_layers, block=_CUDA_BLOCK if cuda else 0)
    basis = np.eye(1 + 3 * num_layers)
    one = basis[0]
    sizes = [(basis[1 + 3 * k], basis[2 + 3 * k], basis[3 + 3 * k]) for k in range(num_layers)]
    n0, m0, e0 = sizes[0]
    out_dim = layers[-1][2]
    features = t.held(n0 * layers[0][1] * f)
    edge_type = t.held(e0 * _INDEX)
    # GNN.forward: every layer's view first (dense.layer(k) and layer_view).
    views = []
    for n, m, e in sizes:
        counts = t.new(m * _INDEX)                          # nbr_offsets diff
        rows = t.new(m * _INDEX)                            # arange(num_outputs)
        cumsum = t.new(m * _INDEX)                          # repeat_interleave: cumsum, indices
        indices = t.new(e * _INDEX)
        t.drop(cumsum)
        segment = t.new(e * _INDEX)                         # rows.index_select(0, indices)
        t.drop(indices, rows)
        views.append((t.held(e * _INDEX), segment, counts))
    sampled = None
    if layers[0][0] == "gcn" and not degrees:
        # layer_degrees: zeros for the outermost hop, the sample sizes, concatenated.
        zeros, diff = t.new((n0 - m0) * _INDEX), t.new(m0 * _INDEX)
        sampled = t.new(n0 * _INDEX)
        t.drop(zeros, diff)
    h = features
    for k, (spec, (n, m, e)) in enumerate(zip(layers, sizes)):
        params = tuple(t.held(b * one, param=True) if b else None for b in spec[-1])
        if accumulate:  # .grad exists: AccumulateGrad adds each new gradient into it
            t.param_grads.update({id(p.storage): p.storage for p in params if p is not None})
        out = _SIMS[spec[0]](t, spec, params, h, views[k], n, m, e, f, cuda=cuda, edge_type=edge_type)
        t.drop(h)
        h = out
        if k < num_layers - 1:
            width = spec[3] * spec[2] if spec[0] == "gat" and spec[4] else spec[2]
            act = t.unary(h, save="result")
            t.drop(h)
            h = act
            if dropout:
                dropped = t.dropout(h, m * width, f, cuda=cuda)
                t.drop(h)
                h = dropped
    for _, segment, counts in views:
        t.drop(segment, counts)
    t.drop(sampled)
    # cross_entropy: log_softmax keeps its output [T, C]; nll_loss keeps it too, and its
    # scalar total weight; backward starts from ones_like(loss).
    num_targets = sizes[-1][1]
    log_probs = t.unary(h, save="result")
    loss, total_weight = t.new(f * one), t.new(f * one)
    t.record([loss], [log_probs], [log_probs, total_weight],
             lambda sim, grads: [sim.alloc(num_targets * out_dim * f)])
    t.drop(log_probs, total_weight, h)
    t.backward(loss)
    if optimizer == "adam":
        if cuda:
            # _multi_tensor_adam: _foreach_sqrt of every exp_avg_sq, then in place.
            t.unref(t.alloc(sum(param_order) * one))
        else:
            # _single_tensor_adam per parameter: denom = (exp_avg_sq.sqrt() / c).add_(eps);
            # the previous parameter's denom dies when the name is rebound.
            previous = None
            for b in param_order:
                root = t.alloc(b * one)
                denom = t.alloc(b * one)
                t.unref(root)
                if previous is not None:
                    t.unref(previous)
                previous = denom
            if previous is not None:
                t.unref(previous)
    return np.stack(t.marks)


def _size_vector(sizes: DenseSizes) -> np.ndarray:
    return np.array([1.0] + [float(x) for layer in sizes.layers for x in layer])


def _structure_bytes(sizes: DenseSizes) -> int:
    """node_ids [N], node_id_offsets [L + 1], nbr_offsets [m_0 + 1], repr_map [E_k] per layer."""
    num_layers = len(sizes.layers)
    return _INDEX * (sizes.num_nodes + num_layers + 1 + sizes.layers[0][1] + 1
                     + sum(e for _, _, e in sizes.layers))


class _Estimator:
    """A compiled model: sizes -> `StepMemory` without replaying the step again."""

    def __init__(self, model: GNN, *, feature_dim: int | None, dtype: torch.dtype | None,
                 optimizer: str | None, degrees: bool, accumulate: bool) -> None:
        if not isinstance(model, GNN):
            raise ConfigError(f"the estimator models graphstore.nn.GNN (got {type(model).__name__})")
        params = list(model.parameters())
        self.param_bytes = sum(_nbytes(p) for p in params)
        self.optimizer_bytes = _optimizer_bytes(optimizer, self.param_bytes, len(params))
        self.model, self.degrees, self.accumulate = model, degrees, accumulate
        self.dtype = dtype or (params[0].dtype if params else torch.get_default_dtype())
        self.f = torch.empty(0, dtype=self.dtype).element_size()
        self.feature_dim = feature_dim if feature_dim is not None else model.layers[0].in_dim
        layers = tuple(_layer_spec(layer, model.kind) for layer in model.layers)
        cuda = bool(params) and params[0].device.type == "cuda"
        self.marks = _compile(layers, self.f, model.training and model.dropout > 0,
                              tuple(_nbytes(p) for p in params), optimizer, degrees, accumulate, cuda)

    def __call__(self, sizes: DENSE | DenseSizes) -> StepMemory:
        if isinstance(sizes, DENSE):
            sizes = dense_sizes(sizes)
        model, f = self.model, self.f
        if len(sizes.layers) != model.num_layers:
            raise ConfigError(f"the model has {model.num_layers} layers but the batch has {len(sizes.layers)} "
                              "hops; sample with as many fanouts as layers")
        inputs = sizes.num_nodes * self.feature_dim * f + sizes.num_targets * _INDEX
        if model.kind == "rgcn":
            inputs += sizes.layers[0][2] * _INDEX
        if model.kind == "gcn" and self.degrees:
            inputs += sizes.num_nodes * _INDEX
        layer_bytes = _saved_activations(model, sizes, f)
        peak = max(0, round(float((self.marks @ _size_vector(sizes)).max())))
        return StepMemory(inputs, sum(layer_bytes), self.param_bytes, self.param_bytes, self.optimizer_bytes,
                          tuple(layer_bytes), _structure_bytes(sizes), peak, "estimate", self.accumulate)


def estimate_step_memory(model: GNN, sizes: DENSE | DenseSizes, *, feature_dim: int | None = None,
                         dtype: torch.dtype | None = None, optimizer: str | None = "adam",
                         degrees: bool = True, accumulate: bool = False) -> StepMemory:
    """Estimate the bytes of one training step of ``model`` on a batch of ``sizes``.

    Parameters
    ----------
    model : GNN
        The model (its kind, widths, parameters, dropout and train/eval mode are read; GIN
        with its default MLP). The activation between layers is replayed as ReLU (one
        output kept, one gradient temporary), which any elementwise activation matches.
    sizes : DENSE or DenseSizes
        The batch, or its sizes (`graphstore.sample.micro_batch_sizes` gives them for
        micro-batches without building them).
    feature_dim : int, optional
        Input width; default the first layer's.
    dtype : torch.dtype, optional
        Float type of features and activations; default the parameters'.
    optimizer : {"adam", "sgd", None}
        Whose state to count and whose step to replay.
    degrees : bool
        GCN: count an int64 [N] degrees input (the caller passes ``degrees``); else the
        model computes the sampled degrees itself, which the replay allocates.
    accumulate : bool
        Gradients exist before the step (micro-batches after the first): held, with each
        new gradient a transient that backward adds into them.

    Returns
    -------
    StepMemory
        ``total_bytes`` predicts the allocator's peak (held + ``peak_bytes``);
        ``saved_tensor_bytes`` and ``layer_bytes`` (activations per layer, then the loss's)
        are the saved-tensor figure.

    Raises
    ------
    ConfigError
        On a model that is not a `GNN`, a GIN with a custom MLP, an unknown optimizer, or
        a batch with another number of hops.
    """
    return _Estimator(model, feature_dim=feature_dim, dtype=dtype, optimizer=optimizer, degrees=degrees,
                      accumulate=accumulate)(sizes)


def step_estimator(model: GNN, *, feature_dim: int | None = None, dtype: torch.dtype | None = None,
                   optimizer: str | None = "adam", degrees: bool = True,
                   accumulate: bool = True) -> Callable[[DenseSizes], int]:
    """``sizes -> estimate_step_memory(model, sizes, ...).total_bytes``, the estimator
    `graphstore.sample.choose_micro_batches` takes; arguments as for `estimate_step_memory`.

    The model is replayed once, here; each call is then one matrix-vector product.
    ``accumulate`` defaults to True: every micro-batch but the first runs with the
    gradients already allocated, which costs more than a fresh step (by at most the
    gradients' bytes), so the chosen K fits whichever micro-batch runs when.
    """
    estimator = _Estimator(model, feature_dim=feature_dim, dtype=dtype, optimizer=optimizer, degrees=degrees,
                           accumulate=accumulate)

    def estimate(sizes: DenseSizes) -> int:
        return estimator(sizes).total_bytes
    return estimate


# ------------------------------------------------------------------------------- measure


def _storage_key(t: torch.Tensor) -> tuple[int, str]:
    return t.untyped_storage().data_ptr(), str(t.device)


def _storages(tensors) -> dict[tuple[int, str], int]:
    return {_storage_key(t): t.untyped_storage().nbytes() for t in tensors if t is not None}


def _walk(events):
    for event in events:
        yield event
        yield from _walk(event.children)


def _cpu_allocator_peak(step: Callable[[], None]) -> int:
    """Peak bytes the CPU allocator holds during ``step()`` above what it held before.

    ``torch.profiler`` with ``profile_memory=True`` reports every allocation and free of
    the CPU allocator, each with the allocator's running total taken under its lock, so
    the maximum of those totals is exact whatever order the events are stored in. A
    one-byte marker allocated first gives the total before the step (the profiler counts
    only what it saw allocated, and frees of older blocks, so the baseline is not 0).
    The running total is only on the profiler's event tree (``kineto_results``, what
    ``torch.profiler._memory_profiler`` reads too); the public ``prof.events()`` memory
    records carry sizes alone, whose order within one timestamp is not kept. There is no
    CPU counterpart of ``torch.cuda.max_memory_allocated``.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        marker = torch.empty(1, dtype=torch.uint8)
        marker_ptr = marker.data_ptr()
        del marker
        step()
    events = [e for e in _walk(prof.profiler.kineto_results.experimental_event_tree())
              if e.typed[0] == _EventType.Allocation and e.typed[1].device.type == "cpu"]
    marker = next((e for e in events if e.typed[1].ptr == marker_ptr and e.typed[1].alloc_size == 1), None)
    if marker is None:
        raise RuntimeError("torch.profiler reported no CPU allocation events; this torch build does not "
                           "support profile_memory on CPU")
    start = marker.typed[1].total_allocated - 1
    return max([0] + [e.typed[1].total_allocated - start for e in events
                      if e.start_time_ns >= marker.start_time_ns])


def _cuda_allocator_peak(step: Callable[[], None], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def measure_step_memory(model: GNN, dense: DENSE, features: torch.Tensor, labels: torch.Tensor, *,
                        edge_type: torch.Tensor | None = None, degrees: torch.Tensor | None = None,
                        optimizer: str | None = "adam", accumulate: bool = False) -> StepMemory:
    """Measure one training step of ``model`` on a batch (CPU or CUDA).

    Two runs. The first counts the saved tensors: forward and
    ``cross_entropy(out, labels, ignore_index=-1)`` under a ``saved_tensors_hooks`` that
    records every tensor autograd keeps, then backward; activations are the recorded
    storages' bytes, each storage once, minus inputs and parameters. The second measures
    the allocator: on a copy of the model whose optimizer state already exists (one step
    with zero gradients, which leaves Adam's parameters unchanged) and whose gradients are
    None (or zeros, ``accumulate``), one forward, loss, backward and optimizer step; its
    ``peak_bytes`` is the allocator's peak above what it held before (CPU: `torch.profiler`
    allocation events; CUDA: ``max_memory_allocated``). Held bytes are counted by storage.
    The model and its gradients are left as they were.

    Parameters
    ----------
    model : GNN
    dense : DENSE
    features : float tensor [N, D]
    labels : int64 tensor [T]
    edge_type : int64 tensor [E], RGCN only
    degrees : tensor [N], GCN only
    optimizer : {"adam", "sgd", None}
    accumulate : bool
        Run the measured step with gradients already allocated.

    Returns
    -------
    StepMemory
        ``layer_bytes`` is empty (the hooks do not know the layer); ``peak_source`` says
        which allocator was read.
    """
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {OPTIMIZERS} (got {optimizer!r})")
    params = list(model.parameters())
    kwargs = {}
    if edge_type is not None:
        kwargs["edge_type"] = edge_type
    if degrees is not None:
        kwargs["degrees"] = degrees
    inputs = _storages([features, labels, edge_type, degrees])
    param_storages = _storages(params)
    structure = _storages([dense.node_ids, dense.node_id_offsets, dense.nbrs, dense.nbr_offsets,
                           *dense.repr_map])

    # Run 1: the saved tensors (on the model itself; its gradients are restored).
    old_grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    saved: dict[tuple[int, str], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[_storage_key(t)] = t.untyped_storage().nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.cross_entropy(model(features, dense, **kwargs), labels, ignore_index=-1)
        loss.backward()
        del loss
        grads = _storages([p.grad for p in params])
    finally:
        for p, g in zip(params, old_grads):
            p.grad = g
    activations = sum(b for key, b in saved.items() if key not in inputs and key not in param_storages)

    # Run 2: the allocator, on a copy with its optimizer state in place.
    twin = copy.deepcopy(model)
    twin_params = list(twin.parameters())
    opt = None
    if optimizer is not None:
        opt = torch.optim.Adam(twin_params) if optimizer == "adam" else torch.optim.SGD(twin_params, lr=1e-3)
        for p in twin_params:
            p.grad = torch.zeros_like(p)
        opt.step()
    state_bytes = 0 if opt is None else sum(
        s.untyped_storage().nbytes() for st in opt.state.values() for s in st.values() if isinstance(s, torch.Tensor))
    for p in twin_params:
        p.grad = torch.zeros_like(p) if accumulate else None

    def step() -> None:
        loss = F.cross_entropy(twin(features, dense, **kwargs), labels, ignore_index=-1)
        loss.backward()
        if opt is not None:
            opt.step()

    device = features.device
    if device.type == "cuda":
        peak, source = _cuda_allocator_peak(step, device), "cuda_allocator"
    else:
        peak, source = _cpu_allocator_peak(step), "cpu_allocator"
    return StepMemory(sum(inputs.values()), activations, sum(param_storages.values()), sum(grads.values()),
                      state_bytes, (), sum(structure.values()), int(peak), source, accumulate)
