"""One silence rule for every export and energy report: a LIF layer that emits no spike on the
windows checked is named, since a spike check there compares nothing (any artefact agrees with
it) and its energy describes no computation.

``export onnx``, ``export nir`` and ``export lava`` refuse such a model before writing anything
(``--allow-silent`` exports it with a warning), and so does a gateway's serving bundle
(``export.bundle``: the last bundle keeps serving); ``edgefl energy`` and ``edgefl simulate`` flag it.
Every path measures rates per LIF module (``lif_rates``, or the operation count's own) and asks
``silent_layers`` and ``silence_line`` for the verdict and its wording.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from edge_agent.models.backbones.spiking import LIF


def lif_rates(model: nn.Module, x: torch.Tensor, marks: torch.Tensor) -> dict[str, float]:
    """Each LIF module's firing rate (spikes per neuron step) on windows ``x``, ``marks``, by module
    name in module order; empty for a model without LIF layers."""
    lifs = {name: module for name, module in model.named_modules() if isinstance(module, LIF)}
    totals = {name: [0.0, 0] for name in lifs}

    def hook(name: str):
        def record(_module: nn.Module, _args: tuple, out: torch.Tensor) -> None:
            totals[name][0] += float(out.sum())
            totals[name][1] += out.numel()

        return record

    hooks = [module.register_forward_hook(hook(name)) for name, module in lifs.items()]
    try:
        with torch.no_grad():
            model.eval()(x, marks)
    finally:
        for handle in hooks:
            handle.remove()
    return {name: spikes / steps for name, (spikes, steps) in totals.items() if steps}


class SilentLayersError(ValueError):
    """A model refused for export because a LIF layer never fired on the windows checked."""


def silent_layers(rates: Mapping[str, float]) -> list[str]:
    """The layers of ``rates`` that never fired, in order."""
    return [name for name, rate in rates.items() if rate == 0]


def silence_line(silent: list[str], windows: int) -> str:
    """The one wording of the rule: which layers emitted no spike over how many windows."""
    return f"{', '.join(silent)} emitted no spike over the {windows} windows checked"
