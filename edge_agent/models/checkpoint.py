"""One trained client model in one file: a safetensors state dict whose metadata holds what is
needed to rebuild it (model config, feature count and names). Nothing in it is ever unpickled."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from edge_agent.models.config import ModelConfig
from edge_agent.models.forecaster import Forecaster
from edge_agent.storage import read_tagged_tensors, write_tagged_tensors
from edge_agent.tensors import LayoutError, check_layout, first_non_finite, layout_of

FORMAT = "edgefl-forecaster/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the reason."""


def save_checkpoint(model: Forecaster, path: Path, columns: list[str] | None = None) -> None:
    """Write ``model`` (every parameter and buffer) with its config, atomically."""
    metadata = {
        "model": model.cfg.model_dump_json(), "n_features": str(model.n_features),
        "time_features": str(model.time_features), "columns": json.dumps(columns or []),
    }
    write_tagged_tensors(Path(path), model.state_dict(), FORMAT, metadata)


def load_checkpoint(path: Path) -> tuple[Forecaster, list[str]]:
    """Rebuild the model in eval mode and return it with its feature names (possibly empty)."""
    path = Path(path)
    state, metadata = read_tagged_tensors(path, FORMAT, CheckpointError)
    try:
        cfg = ModelConfig.model_validate_json(metadata["model"])
        n_features, time_features = int(metadata["n_features"]), int(metadata["time_features"])
        columns = json.loads(metadata.get("columns", "[]"))
    except (KeyError, ValueError, ValidationError) as err:
        raise CheckpointError(f"{path}: bad metadata: {err}") from None
    model = Forecaster(cfg, n_features, time_features)
    _check_state(path, model, state)
    model.load_state_dict(state)
    return model.eval(), [str(c) for c in columns]


def _check_state(path: Path, model: Forecaster, state: dict) -> None:
    try:
        check_layout(state, layout_of(model.state_dict()), f"{path}: the model's tensors")
    except LayoutError as err:
        raise CheckpointError(str(err)) from None
    bad = first_non_finite(state)
    if bad is not None:
        raise CheckpointError(f"{path}: tensor {bad!r} holds NaN or infinite values")
