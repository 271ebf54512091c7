"""FedPoD's weather foundation model (appendix B.1, Table 9): an encoder-only Transformer over the
canonical weather variables, pretrained by masked reconstruction, frozen afterwards.

Every gateway maps its own variables onto the canonical layout; a variable a station does not
measure is zero and never enters the loss. The checkpoint carries a content hash so that an agent
can refuse a backbone that differs from the coordinator's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from pydantic import ValidationError
from torch import nn

from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.storage import read_tagged_tensors, write_tagged_tensors

FORMAT = "edgefl-foundation/1"


class FoundationError(ValueError):
    """A foundation checkpoint that cannot be used; the message names the file and the reason."""


class FoundationModel(nn.Module):
    """(B, L, V) values, masked positions zeroed -> (B, L, V) reconstruction; ``encode`` gives
    the (B, L, d_model) hidden sequence that prompts steer.

    ``latent_bias`` (window, d_model) is added to the hidden sequence before reconstruction: zero
    unless the model was pretrained with FeDaL, whose server places the global bias reference b^g
    there (FeDaL, Method, DBE: the bias is re-injected to restore the sequence; a new client has
    no bias of its own, so it reconstructs with the fleet's)."""

    def __init__(self, cfg: FoundationConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Linear(len(cfg.variables), cfg.d_model)
        self.position = nn.Parameter(torch.randn(cfg.window, cfg.d_model) * 0.02)  # learnable (Table 9)
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.heads, cfg.d_ff, cfg.dropout, activation="relu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.reconstruct = nn.Linear(cfg.d_model, len(cfg.variables))
        self.register_buffer("latent_bias", torch.zeros(cfg.window, cfg.d_model))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embed(x) + self.position[: x.shape[1]])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reconstruct(self.encode(x) + self.latent_bias[: x.shape[1]])


def geometric_mask(length: int, variables: int, rate: float, mean_masked: float,
                   rng: np.random.Generator) -> np.ndarray:
    """(length, variables) bool, True = masked. Per variable an independent two-state Markov
    chain whose masked runs have geometric lengths of mean ``mean_masked`` and unmasked runs of
    mean ``mean_masked * (1 - rate) / rate`` (appendix B.1, after Zerveas et al. 2021)."""
    leave_masked = 1.0 / mean_masked
    leave_unmasked = leave_masked * rate / (1.0 - rate)
    masked = np.empty((length, variables), dtype=bool)
    state = rng.random(variables) < rate
    draws = rng.random((length, variables))
    for t in range(length):
        masked[t] = state
        flip = draws[t] < np.where(state, leave_masked, leave_unmasked)
        state = state ^ flip
    return masked


def patch_mask(length: int, variables: int, patch: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """(length, variables) bool, True = masked: the series cut into patches of ``patch`` steps
    (the last one shorter if ``patch`` does not divide ``length``) and round(rate * patches) of
    them masked per variable, drawn without replacement (FeDaL, Method: patching and 75% random
    masking; the masks are applied to the model's per-step input, so the model is unchanged)."""
    patches = -(-length // patch)
    chosen = np.argsort(rng.random((variables, patches)), axis=1)[:, : round(rate * patches)]
    masked_patches = np.zeros((variables, patches), dtype=bool)
    np.put_along_axis(masked_patches, chosen, True, axis=1)
    return np.repeat(masked_patches, patch, axis=1)[:, :length].T


def masked_mse(reconstruction: torch.Tensor, target: torch.Tensor, masked: torch.Tensor,
               present: torch.Tensor) -> torch.Tensor:
    """Eq. 12 on masked positions of measured variables only (``present`` is (V,) or (B, V))."""
    keep = masked & present.reshape(*present.shape[:-1], 1, present.shape[-1]).expand_as(masked)
    if not bool(keep.any()):
        return reconstruction.sum() * 0.0
    return (reconstruction - target)[keep].pow(2).mean()


def content_hash(model: FoundationModel) -> str:
    """SHA-256 over the config and every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256(model.cfg.model_dump_json().encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def save_foundation(model: FoundationModel, path: Path) -> str:
    """Write the checkpoint atomically; returns its content hash."""
    digest = content_hash(model)
    write_tagged_tensors(Path(path), model.state_dict(), FORMAT,
                         {"config": model.cfg.model_dump_json(), "sha256": digest})
    return digest


def load_foundation(path: Path, expected_hash: str | None = None) -> FoundationModel:
    """Load, check the stored hash against the tensors, and against ``expected_hash`` if given."""
    path = Path(path)
    state, metadata = read_tagged_tensors(path, FORMAT, FoundationError)
    try:
        model = FoundationModel(FoundationConfig.model_validate(json.loads(metadata["config"])))
        model.load_state_dict(state)
    except (KeyError, ValueError, ValidationError, RuntimeError) as err:
        raise FoundationError(f"{path}: config and tensors do not fit: {err}") from None
    digest = content_hash(model)
    if digest != metadata.get("sha256"):
        claimed = metadata.get("sha256", "")[:12]
        raise FoundationError(f"{path}: tensors hash to {digest[:12]}, the file claims {claimed}")
    if expected_hash is not None and digest != expected_hash:
        raise FoundationError(f"{path}: backbone {digest[:12]} differs from the coordinator's {expected_hash[:12]}")
    return model.eval()
