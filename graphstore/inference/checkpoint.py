"""A trained `GNN` to and from a file, for inference where it was not trained.

Two kinds of file load: one written by `save_model` (the stack's hyperparameters and
weights), and a trainer checkpoint (``trainers/node_classification.py --checkpoint-dir D``:
the directory, or its ``state.pt``), whose recorded options rebuild the model against the
store it trained on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from graphstore.errors import ConfigError
from graphstore.inference.layerwise import resolve_device
from graphstore.layout.store import Store
from graphstore.nn import GNN

__all__ = ["load_model", "save_model"]

FORMAT = "graphstore-gnn/1"


def save_model(model: GNN, path: str | os.PathLike) -> None:
    """Write ``model``'s hyperparameters and weights to ``path`` (whole or not at all)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({"format": FORMAT, "gnn": model.hyperparameters, "state_dict": model.state_dict()}, tmp)
    os.replace(tmp, path)


def load_model(path: str | os.PathLike, store: Store | None = None, *,
               device: str | torch.device = "cpu") -> tuple[GNN, dict[str, Any]]:
    """The model in ``path``, on ``device`` (``"cpu"``, ``"cuda"`` or ``"cuda:N"``, where
    `graphstore.inference.infer_layerwise` then runs its layers), and what was recorded
    with it (a trainer checkpoint: its configuration, e.g. ``normalize_features``; a
    `save_model` file: nothing). A checkpoint written on any device loads.

    Raises
    ------
    ConfigError
        A device this machine does not have (`resolve_device`, checked before the file is
        read); the file is missing, unreadable, or neither kind; a trainer checkpoint without
        ``store`` (its widths come from the store); or, with ``store``, a model that does
        not fit it (another store's checkpoint, an ``in_dim`` that is not the store's
        feature width, fewer RGCN relations than the store has): checked here, before any
        inference starts.
    """
    device = resolve_device(device)
    path = Path(path)
    if path.is_dir():
        latest = path / "latest"
        path = path / latest.read_text().strip() / "state.pt" if latest.is_file() else path / "state.pt"
    if not path.is_file():
        raise ConfigError(f"{path}: no model file (give a file from save_model, or a trainer's --checkpoint-dir)")
    try:
        # Our own files: a trainer checkpoint also holds RNG states and plain Python values.
        # Read onto the host (a CUDA checkpoint loads where there is no CUDA), then moved.
        saved = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file: say which
        raise ConfigError(f"{path}: cannot read the model ({exc})") from None
    if isinstance(saved, dict) and saved.get("format") == FORMAT:
        model = GNN(**saved["gnn"])
        _load_weights(model, saved["state_dict"], path, "the file's own hyperparameters")
        if store is not None:
            _check_fits(model, store, path)
        return model.to(device), {}
    if isinstance(saved, dict) and "model" in saved and isinstance(saved.get("config"), dict):
        config = saved["config"]
        if store is None:
            raise ConfigError(f"{path}: a trainer checkpoint takes its widths from the store; pass the store")
        if "num_layers" not in config or "model" not in config:
            raise ConfigError(f"{path}: a link-prediction or foreign checkpoint (no node-classification model)")
        model = GNN(config["model"], in_dim=store.feature_dim, hidden_dim=config["hidden"],
                    out_dim=store.num_classes, num_layers=config["num_layers"], heads=config.get("heads", 1))
        trained_on = config.get("store", "another store")
        _load_weights(model, saved["model"], path,
                      f"{store.path} ({store.feature_dim} features, {store.num_classes} classes; "
                      f"the checkpoint was trained on {trained_on})")
        return model.to(device), config
    raise ConfigError(f"{path}: not a graphstore model (neither save_model's format nor a trainer checkpoint)")


def _load_weights(model: GNN, state: dict[str, torch.Tensor], path: Path, expected: str) -> None:
    """``state`` into ``model``, a mismatch named in one line (torch's message lists every
    tensor over many lines, as a traceback)."""
    mine = model.state_dict()
    for name, tensor in state.items():
        if name in mine and tuple(tensor.shape) != tuple(mine[name].shape):
            raise ConfigError(f"{path}: {name} is {list(tensor.shape)} in the file but "
                              f"{list(mine[name].shape)} for {expected}")
    missing, unexpected = sorted(set(mine) - set(state)), sorted(set(state) - set(mine))
    if missing or unexpected:
        what = f"no {missing[0]}" if missing else f"an unexpected {unexpected[0]}"
        raise ConfigError(f"{path}: the weights do not fit a {model.kind} x{model.num_layers} ({what})")
    model.load_state_dict(state)


def _check_fits(model: GNN, store: Store, path: Path) -> None:
    """A `save_model` file against the store it is to run on: the first layer reads the
    store's feature rows, an RGCN a weight per stored relation type."""
    hp = model.hyperparameters
    if store.manifest.has_features and hp["in_dim"] != store.feature_dim:
        raise ConfigError(f"{path}: in_dim is {hp['in_dim']} but {store.path} has {store.feature_dim} "
                          "features (a model trained on another store?)")
    if model.kind == "rgcn" and hp["num_relations"] < store.num_relations:
        raise ConfigError(f"{path}: num_relations is {hp['num_relations']} but {store.path} has "
                          f"{store.num_relations} relation types")
