"""Named tensors as they cross every boundary (wire, checkpoint, aggregation), and the one check
that a set of them has exactly the expected names, shapes and dtypes.

The checks work on torch tensors and numpy arrays alike (dtypes compare by name: ``float32`` is
``torch.float32`` and numpy's ``float32``), so the training agent, which never loads torch, checks
what it receives with the same code as the coordinator. Serialization picks safetensors' torch or
numpy side (``Framework``); torch is imported only where torch tensors are asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

TensorDict = dict[str, "torch.Tensor"]
Layout = dict[str, tuple[tuple[int, ...], Any]]
"""Every tensor's shape and dtype by name; a dtype is torch's, numpy's or its name."""
Framework = Literal["pt", "np"]
"""What safetensors loads tensors as (its own names): torch tensors or numpy arrays."""
FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})


class LayoutError(ValueError):
    """Tensors whose names, shapes or dtypes differ from the expected layout."""


def dtype_name(dtype: Any) -> str:
    """``float32`` for ``torch.float32``, numpy's ``float32`` and ``"float32"`` alike."""
    return str(dtype).removeprefix("torch.")


def layout_of(state: TensorDict) -> Layout:
    """Every tensor's shape and dtype by name."""
    return {name: (tuple(tensor.shape), tensor.dtype) for name, tensor in state.items()}


def named_layout(layout: Layout) -> Layout:
    """``layout`` with its dtypes by name (what a torch-free process compares with)."""
    return {name: (tuple(shape), dtype_name(dtype)) for name, (shape, dtype) in layout.items()}


def check_layout(tensors: TensorDict, expected: Layout, what: str = "tensors") -> None:
    """Fail, naming ``what`` and the first differences, unless names, shapes and dtypes match exactly."""
    missing, unknown = expected.keys() - tensors.keys(), tensors.keys() - expected.keys()
    if missing or unknown:
        raise LayoutError(f"{what}: missing {sorted(missing)[:3]}, unexpected {sorted(unknown)[:3]} tensor names")
    for name, tensor in tensors.items():
        shape, dtype = expected[name]
        if tuple(tensor.shape) != tuple(shape) or dtype_name(tensor.dtype) != dtype_name(dtype):
            raise LayoutError(f"{what}: {name} is {tuple(tensor.shape)} {tensor.dtype}, expected {shape} {dtype}")


def _floating(tensors: TensorDict) -> list[tuple[str, np.ndarray]]:
    """The floating tensors' values as float64 numpy arrays (a torch tensor cast by torch first:
    numpy has no bfloat16)."""
    return [(name, np.asarray(t.detach().double() if hasattr(t, "detach") else t, dtype=np.float64).reshape(-1))
            for name, t in sorted(tensors.items()) if dtype_name(t.dtype) in FLOATING]


def first_non_finite(tensors: TensorDict) -> str | None:
    """The name of the first floating tensor holding NaN or inf, or None when all are finite (one
    check over all of them first; the per-tensor search runs only when something is not)."""
    floating = _floating(tensors)
    if not floating or bool(np.isfinite(np.concatenate([values for _, values in floating])).all()):
        return None
    return next((name for name, values in floating if not bool(np.isfinite(values).all())), None)


def l2_norm(tensors: TensorDict) -> float:
    """The L2 norm of all floating tensors together, in float64 (finite float32 values such as
    1e30 do not overflow; NaN or inf give a non-finite norm)."""
    return float(sum(float(np.dot(values, values)) for _, values in _floating(tensors))) ** 0.5


def framework_of(tensors: TensorDict) -> Framework:
    """``np`` for numpy arrays, else ``pt``."""
    return "np" if all(isinstance(t, np.ndarray) for t in tensors.values()) else "pt"


def _codec(framework: Framework) -> Any:
    if framework == "np":
        import safetensors.numpy as codec
    else:
        import safetensors.torch as codec
    return codec


def tensors_to_bytes(tensors: TensorDict, metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors blob of torch tensors or numpy arrays."""
    framework = framework_of(tensors)
    if framework == "pt":
        tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    return _codec(framework).save(tensors, metadata=metadata)


def tensors_from_bytes(blob: bytes, framework: Framework = "pt") -> TensorDict:
    """A safetensors blob's tensors, as torch tensors or numpy arrays, in name order (safetensors
    hands them over in a hash order that changes from process to process, and a float sum over
    tensors taken in that order would change its last bits with it)."""
    return dict(sorted(_codec(framework).load(blob).items()))


def read_tensors(path: str, framework: Framework = "pt") -> TensorDict:
    """A safetensors file's tensors, as torch tensors or numpy arrays."""
    return _codec(framework).load_file(str(path))


def flat64(tensors: TensorDict, names: list[str]) -> torch.Tensor:
    """The named tensors, flattened and concatenated in that order, in float64 (one vector per
    model, so fleet-wide sums and norms cost a few calls per client instead of a few per tensor)."""
    import torch

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
