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


def load_model(path: str | os.PathLike, store: Store | None = None) -> tuple[GNN, dict[str, Any]]:
    """The model in ``path`` and what was recorded with it (a trainer checkpoint: its
    configuration, e.g. ``normalize_features``; a `save_model` file: nothing).

    Raises
    ------
    ConfigError
        The file is missing, unreadable, or neither kind; or a trainer checkpoint without
        ``store`` (its widths come from the store).
    """
    path = Path(path)
    if path.is_dir():
        latest = path / "latest"
        path = path / latest.read_text().strip() / "state.pt" if latest.is_file() else path / "state.pt"
    if not path.is_file():
        raise ConfigError(f"{path}: no model file (give a file from save_model, or a trainer's --checkpoint-dir)")
    try:
        # Our own files: a trainer checkpoint also holds RNG states and plain Python values.
        saved = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file: say which
        raise ConfigError(f"{path}: cannot read the model ({exc})") from None
    if isinstance(saved, dict) and saved.get("format") == FORMAT:
        model = GNN(**saved["gnn"])
        model.load_state_dict(saved["state_dict"])
        return model, {}
    if isinstance(saved, dict) and "model" in saved and isinstance(saved.get("config"), dict):
        config = saved["config"]
        if store is None:
            raise ConfigError(f"{path}: a trainer checkpoint takes its widths from the store; pass the store")
        if "num_layers" not in config or "model" not in config:
            raise ConfigError(f"{path}: a link-prediction or foreign checkpoint (no node-classification model)")
        model = GNN(config["model"], in_dim=store.feature_dim, hidden_dim=config["hidden"],
                    out_dim=store.num_classes, num_layers=config["num_layers"], heads=config.get("heads", 1))
        model.load_state_dict(saved["model"])
        return model, config
    raise ConfigError(f"{path}: not a graphstore model (neither save_model's format nor a trainer checkpoint)")
