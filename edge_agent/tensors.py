"""Named tensors as they cross every boundary (wire, checkpoint, aggregation), and the one check
that a set of them has exactly the expected names, shapes and dtypes."""

from __future__ import annotations

import torch

TensorDict = dict[str, torch.Tensor]
Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]


class LayoutError(ValueError):
    """Tensors whose names, shapes or dtypes differ from the expected layout."""


def layout_of(state: TensorDict) -> Layout:
    """Every tensor's shape and dtype by name."""
    return {name: (tuple(tensor.shape), tensor.dtype) for name, tensor in state.items()}


def check_layout(tensors: TensorDict, expected: Layout, what: str = "tensors") -> None:
    """Fail, naming ``what`` and the first differences, unless names, shapes and dtypes match exactly."""
    missing, unknown = expected.keys() - tensors.keys(), tensors.keys() - expected.keys()
    if missing or unknown:
        raise LayoutError(f"{what}: missing {sorted(missing)[:3]}, unexpected {sorted(unknown)[:3]} tensor names")
    for name, tensor in tensors.items():
        shape, dtype = expected[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise LayoutError(f"{what}: {name} is {tuple(tensor.shape)} {tensor.dtype}, expected {shape} {dtype}")


def first_non_finite(tensors: TensorDict) -> str | None:
    """The name of the first floating tensor holding NaN or inf, or None when all are finite (one
    check over all of them first: concatenating promotes to the widest dtype, which keeps finite
    values finite; the per-tensor search runs only when something is not)."""
    floating = [(name, t) for name, t in tensors.items() if t.is_floating_point()]
    if not floating or bool(torch.cat([t.reshape(-1) for _, t in floating]).isfinite().all()):
        return None
    return next((name for name, t in floating if not bool(t.isfinite().all())), None)


def l2_norm(tensors: TensorDict) -> float:
    """The L2 norm of all floating tensors together, in float64 (finite float32 values such as
    1e30 do not overflow; NaN or inf give a non-finite norm)."""
    squares = sum(float(t.double().pow(2).sum()) for t in tensors.values() if t.is_floating_point())
    return float(squares) ** 0.5


def flat64(tensors: TensorDict, names: list[str]) -> torch.Tensor:
    """The named tensors, flattened and concatenated in that order, in float64 (one vector per
    model, so fleet-wide sums and norms cost a few calls per client instead of a few per tensor)."""
    parts = [tensors[name].reshape(-1) for name in names]
    if len({part.dtype for part in parts}) > 1:  # concatenating mixed dtypes would promote them
        parts = [part.to(torch.float64) for part in parts]
    return torch.cat(parts).to(torch.float64) if parts else torch.zeros(0, dtype=torch.float64)


def unflat(vector: torch.Tensor, like: TensorDict, names: list[str]) -> TensorDict:
    """``flat64``'s inverse: the vector cut into ``like``'s shapes and cast to its dtypes."""
    out, start = {}, 0
    for name in names:
        end = start + like[name].numel()
        out[name] = vector[start:end].reshape(like[name].shape).to(like[name].dtype)
        start = end
    return out
