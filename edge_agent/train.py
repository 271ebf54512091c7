"""Local training and evaluation on one client's windows."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.adam import adam

from edge_agent.conformal import apply_offsets, fit_offsets
from edge_agent.data import WindowSet
from edge_agent.levels import median_index
from edge_agent.metrics import covered, pinball_loss, pinball_terms, widths
from edge_agent.scoring import Scale, scaled_errors

Batch = tuple[torch.Tensor, torch.Tensor]  # (forecast, target) of one batch of windows


@dataclass(frozen=True)
class Metrics:
    """Mean squared and absolute error over every predicted element (FedQAPer A.1), of the median
    for a quantile model, which also gets Fed-GAME's QS, ICP and MIL (``edge_agent.metrics``;
    None for point models) and, when evaluated with split-conformal offsets
    (``edge_agent.conformal``), the ICP and MIL of the calibrated intervals (None otherwise).
    Errors, QS and MIL are on the windows' reference scale and ``mase`` is the mean absolute
    scaled error (``edge_agent.scoring``; None where the windows carry no scale)."""

    mse: float
    mae: float
    qs: float | None = None
    icp: float | None = None
    mil: float | None = None
    icp_conformal: float | None = None
    mil_conformal: float | None = None
    mase: float | None = None

    @property
    def score(self) -> float:
        """The validation criterion (lower is better): QS for quantile models, else MASE, the
        headline error, where known, else MSE."""
        if self.qs is not None:
            return self.qs
        return self.mse if self.mase is None else self.mase


class Optimizer(Protocol):
    """What the training loops use of an optimizer: ``torch.optim``'s or ``ForeachAdam``."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> object: ...


class ForeachAdam:
    """``torch.optim.Adam(params, lr=lr, foreach=True)`` (its other settings at their defaults),
    bit for bit, without ``torch.optim.Optimizer``: that class's constructor, ``zero_grad`` and
    ``step`` import ``torch._dynamo`` on their first call (for ``torch.compile``, which nothing
    here uses), some 800 modules (sympy, torch.distributed, ...) and 70 MB of a training
    process's memory (bench/gateway.py's training child). Each step gathers the
    parameters that have a gradient and their moments as ``Adam.step`` does and hands them to
    ``torch.optim.adam.adam``, the functional form ``Adam.step`` itself calls, with the same
    arguments; tests/test_models.py checks that both train to identical parameters."""

    BETAS, EPS = (0.9, 0.999), 1e-8

    def __init__(self, params: Iterable[torch.Tensor], lr: float):
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        self.lr = lr
        self.state: dict[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # step, moments

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (the only form the training loops ask for: ``set_to_none=True``)."""
        if not set_to_none:
            raise ValueError("ForeachAdam.zero_grad sets gradients to None only")
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in self.params:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Adam does not support sparse gradients")
            if p not in self.state:  # Adam's lazy state: the step count on the CPU, zero moments
                self.state[p] = (torch.tensor(0.0, dtype=torch.get_default_dtype(), device="cpu"),
                                 torch.zeros_like(p, memory_format=torch.preserve_format),
                                 torch.zeros_like(p, memory_format=torch.preserve_format))
            step, exp_avg, exp_avg_sq = self.state[p]
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(exp_avg)
            exp_avg_sqs.append(exp_avg_sq)
            steps.append(step)
        adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True, capturable=False, differentiable=False,
             fused=None, grad_scale=None, found_inf=None, has_complex=any(torch.is_complex(p) for p in params),
             decoupled_weight_decay=False, amsgrad=False, beta1=self.BETAS[0], beta2=self.BETAS[1], lr=self.lr,
             weight_decay=0, eps=self.EPS, maximize=False)


def make_optimizer(model: nn.Module, lr: float) -> ForeachAdam:
    """Adam over every parameter of ``model``, as in the paper's training setup (A.2: lr 1e-3)."""
    return ForeachAdam(model.parameters(), lr)


def full_forecast(model: nn.Module, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
    """The point forecast (B, H, F) of a point model, every quantile (B, H, F, Q) of a quantile
    model (one whose ``levels`` are set)."""
    if getattr(model, "levels", None) is None:
        return model(x, marks)
    return model.forward_quantiles(x, marks)


def forecast_error(forecast: torch.Tensor, target: torch.Tensor, levels: Sequence[float] | None,
                   point_loss: str = "mse") -> torch.Tensor:
    """The forecast term of every training loss: the pinball loss over all levels (Fed-GAME's QS) of
    a quantile forecast; of a point forecast, the MSE (it learns the mean) or with ``point_loss =
    "mae"`` the MAE (it learns the median, what MASE rewards)."""
    if levels is not None:
        return pinball_loss(forecast, target, levels)
    return F.l1_loss(forecast, target) if point_loss == "mae" else F.mse_loss(forecast, target)


def forecast_loss(model: nn.Module, x: torch.Tensor, marks: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The one training loss of a forecaster: ``forecast_error`` of its full forecast, with the
    point loss its config names."""
    return forecast_error(full_forecast(model, x, marks), y, getattr(model, "levels", None),
                          getattr(getattr(model, "cfg", None), "loss", "mse"))


LossTerms = torch.Tensor | dict[str, torch.Tensor]


def seeded_steps(optimizer: Optimizer, size: int, epochs: int, batch_size: int, seed: int,
                 step_loss: Callable[[torch.Tensor, int, int], LossTerms],
                 max_steps: int = 0, replacement: bool = False,
                 generator: torch.Generator | None = None) -> list[tuple[dict[str, float], int]]:
    """The one seeded minibatch loop (every learner's, Centralized's, FeDaL's core-set learning and
    server-side tuning): ``epochs`` passes over ``size`` samples, each in a shuffled order drawn
    from ``seed`` and cut into batches (with ``replacement``, as many batches of ``batch_size``
    indices drawn with replacement), one optimizer step per batch on ``step_loss(indices, epoch,
    step)``: a loss, or named terms whose ``total`` is minimised. Dropout and every other draw of
    torch's global generator take ``seed`` too, so a run is reproducible; ``max_steps`` (0: none)
    ends it after that many steps. The orders come from ``generator`` where one is given (a caller
    whose ``step_loss`` draws from it too), else from a fresh one seeded with ``seed``. Returns each
    step's terms as floats (a plain loss as ``total``) and batch size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    steps = []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        orders = generator if generator is not None else torch.Generator().manual_seed(seed)
        for epoch in range(epochs):
            for step, batch in enumerate(epoch_batches(size, batch_size, orders, replacement)):
                if max_steps and len(steps) == max_steps:
                    return steps
                terms = step_loss(batch, epoch, step)
                terms = terms if isinstance(terms, dict) else {"total": terms}
                optimizer.zero_grad(set_to_none=True)
                terms["total"].backward()
                optimizer.step()
                steps.append(({name: value.item() for name, value in terms.items()}, len(batch)))
    return steps


def drawn_steps(optimizer: Optimizer, size: int, steps: int, batch_size: int, seed: int,
                step_loss: Callable[[torch.Tensor, int], LossTerms],
                generator: torch.Generator | None = None) -> list[tuple[dict[str, float], int]]:
    """``steps`` optimizer steps of ``seeded_steps`` with ``replacement``, each on ``min(batch_size,
    size)`` indices drawn from ``size``; ``step_loss(indices, number)`` gets the running step number
    (FeDaL's core-set learning and server-side tuning draw their masks from it)."""
    batch = min(batch_size, size)
    per_epoch = -(-size // batch)
    return seeded_steps(optimizer, size, -(-steps // per_epoch), batch, seed,
                        lambda pick, epoch, step: step_loss(pick, epoch * per_epoch + step), steps,
                        replacement=True, generator=generator)


def epoch_batches(size: int, batch_size: int, generator: torch.Generator, replacement: bool) -> list[torch.Tensor]:
    """One epoch's batches of sample indices: a shuffled order cut into batches, or (``replacement``)
    ``ceil(size / batch_size)`` batches of ``batch_size`` indices drawn with replacement."""
    if not replacement:
        return list(torch.randperm(size, generator=generator).split(batch_size))
    return [torch.randint(size, (batch_size,), generator=generator) for _ in range(-(-size // batch_size))]


def mean_term(steps: Sequence[tuple[dict[str, float], int]], name: str = "total", weighted: bool = False) -> float:
    """The mean of one term over ``seeded_steps``' steps, per step or weighted by batch size (NaN: no step)."""
    if not steps:
        return float("nan")
    weights = [size if weighted else 1 for _, size in steps]
    return sum(terms[name] * w for (terms, _), w in zip(steps, weights)) / sum(weights)


def train_epochs(
    model: nn.Module,
    windows: WindowSet,
    epochs: int,
    batch_size: int,
    optimizer: Optimizer,
    seed: int,
    penalty: Callable[[], torch.Tensor] | None = None,
    max_steps: int = 0,
) -> float:
    """Train with ``forecast_loss`` (plus ``penalty()``, e.g. FedProx's proximal term) for ``epochs``
    passes over shuffled windows, at most ``max_steps`` steps (``seeded_steps``); returns the mean
    loss per window, without the penalty."""
    model.train()

    def step_loss(batch: torch.Tensor, epoch: int, step: int) -> dict[str, torch.Tensor]:
        x, marks, y = windows.batch(batch)
        loss = forecast_loss(model, x, marks, y)
        return {"total": loss if penalty is None else loss + penalty(), "forecast": loss}

    steps = seeded_steps(optimizer, len(windows), epochs, batch_size, seed, step_loss, max_steps)
    return mean_term(steps, "forecast", weighted=True) if steps else 0.0


@torch.no_grad()
def calibrate_batchnorm(model: nn.Module, windows: WindowSet, batch_size: int = 256) -> nn.Module:
    """Recompute every BatchNorm's running statistics as plain averages over ``windows``.

    Eval mode normalizes with running statistics, which after a short training still sit near
    their initial values (mean 0, variance 1); a spiking model then sees tiny currents and stays
    silent. One pass without gradients over the training windows fixes that without changing any
    weight. Dropout stays off during the pass. Returns the model in eval mode.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    model.eval()
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average
        norm.train()
    try:
        for x, marks, _ in windows.batches(batch_size, shuffle=False):
            model(x, marks)
    finally:
        for norm, momentum in zip(norms, momenta):
            norm.momentum = momentum
    return model.eval()


@torch.no_grad()
def forecasts(model: nn.Module, windows: WindowSet, batch_size: int = 256) -> Iterator[Batch]:
    """(``full_forecast``, target) per batch of a split, the model in eval mode."""
    model.eval()
    for x, marks, y in windows.batches(batch_size, shuffle=False):
        yield full_forecast(model, x, marks), y


def evaluate(model: nn.Module, windows: WindowSet, batch_size: int = 256,
             offsets: torch.Tensor | None = None) -> Metrics:
    """MSE, MAE and MASE on the windows' reference scale over all windows of a split (and QS, ICP,
    MIL for a quantile model, plus the calibrated ICP and MIL when conformal ``offsets`` are given)."""
    return forecast_metrics(forecasts(model, windows, batch_size), getattr(model, "levels", None), offsets,
                            windows.scale)


@torch.no_grad()
def forecast_metrics(batches: Iterable[Batch], levels: Sequence[float] | None,
                     offsets: torch.Tensor | None = None, scale: Scale | None = None) -> Metrics:
    """``Metrics`` of (forecast, target) batches of any model, on the normalized scale, scored with
    ``scale`` (``edge_agent.scoring``): point forecasts, or quantile forecasts of ``levels``
    (``quantile_metrics``)."""
    if levels is not None:
        return quantile_metrics(batches, levels, offsets, scale)
    if offsets is not None:
        raise ValueError("conformal offsets calibrate quantile intervals; this is a point model")
    squared, absolute, scaled, count = 0.0, 0.0, 0.0, 0
    for forecast, y in batches:
        error, mase = scaled_errors(forecast - y, scale)
        squared += error.pow(2).sum().item()
        absolute += error.abs().sum().item()
        scaled += mase.sum().item()
        count += error.numel()
    return Metrics(squared / count, absolute / count, mase=_known(scaled / count))


def quantile_metrics(batches: Iterable[Batch], levels: Sequence[float], offsets: torch.Tensor | None = None,
                     scale: Scale | None = None) -> Metrics:
    """``forecast_metrics`` of quantile forecasts: MSE, MAE and MASE of the median, QS, ICP and MIL;
    with conformal ``offsets`` (H, F) also ICP and MIL of the calibrated intervals."""
    names = ("squared", "absolute", "scaled", "pinball", "covered", "width", "covered_cp", "width_cp")
    sums, count = dict.fromkeys(names, 0.0), 0
    factor = torch.ones(1) if scale is None else scale.reference
    for forecast, y in batches:
        error, mase = scaled_errors(forecast[..., median_index(levels)] - y, scale)
        terms = {"squared": error.pow(2), "absolute": error.abs(), "scaled": mase,
                 "pinball": pinball_terms(forecast, y, levels) * factor.unsqueeze(-1),
                 "covered": covered(forecast, y), "width": widths(forecast) * factor}
        if offsets is not None:
            calibrated = apply_offsets(forecast, offsets)
            terms |= {"covered_cp": covered(calibrated, y), "width_cp": widths(calibrated) * factor}
        for name, value in terms.items():
            sums[name] += value.sum().item()
        count += error.numel()
    conformal = (sums["covered_cp"] / count, sums["width_cp"] / count) if offsets is not None else (None, None)
    return Metrics(sums["squared"] / count, sums["absolute"] / count, sums["pinball"] / (count * len(levels)),
                   sums["covered"] / count, sums["width"] / count, *conformal, mase=_known(sums["scaled"] / count))


def _known(value: float) -> float | None:
    """A score, or None where it could not be computed (NaN: no MASE scale)."""
    return None if math.isnan(value) else value


def conformal_offsets(model: nn.Module, windows: WindowSet, batch_size: int = 256) -> torch.Tensor:
    """Split-conformal offsets (H, F) of a quantile model's intervals fitted on ``windows`` (a
    gateway's own validation split; ``edge_agent.conformal.fit_offsets``, CQR eq. 7)."""
    return fitted_offsets(forecasts(model, windows, batch_size), getattr(model, "levels", None))


@torch.no_grad()
def fitted_offsets(batches: Iterable[Batch], levels: Sequence[float] | None) -> torch.Tensor:
    """Split-conformal offsets (H, F) from calibration batches of quantile forecasts."""
    if levels is None:
        raise ValueError("conformal offsets calibrate quantile intervals; this is a point model")
    pairs = list(batches)
    return fit_offsets(torch.cat([f for f, _ in pairs]), torch.cat([y for _, y in pairs]), levels)


def calibrated_metrics(val: Iterable[Batch], test: Iterable[Batch], levels: Sequence[float] | None,
                       scale: Scale | None = None) -> Metrics:
    """Test metrics of one gateway's model; a quantile model's intervals are also reported
    calibrated on its own validation forecasts (split conformal). The batches are consumed lazily,
    so a point model's ``val`` is never computed."""
    return forecast_metrics(test, levels, None if levels is None else fitted_offsets(val, levels), scale)


def weighted_metrics(metrics: Sequence[Metrics], sizes: Sequence[int]) -> Metrics:
    """Dataset-size-weighted mean of per-client metrics (FedQAPer section 4.1); QS, ICP and MIL,
    and the conformal ICP and MIL, where every client has them."""
    weights = np.asarray(sizes, dtype=np.float64) / float(sum(sizes))

    def means(*names: str) -> tuple[float, ...]:
        if any(getattr(m, names[0]) is None for m in metrics):
            return ()
        return tuple(float(np.dot(weights, [getattr(m, name) for m in metrics])) for name in names)

    quantile = means("qs", "icp", "mil")
    conformal = means("icp_conformal", "mil_conformal") if quantile else ()
    mase = means("mase")
    return Metrics(*means("mse", "mae"), *quantile, *conformal, mase=mase[0] if mase else None)


def early_stopping(
    module: nn.Module,
    run_epoch: Callable[[int], None],
    validate: Callable[[], float],
    max_epochs: int,
    patience: int,
) -> int:
    """Run epochs until the validation score stops improving for ``patience`` epochs.

    Restores ``module`` to its best epoch and returns the number of epochs run (the
    local-only protocol of FedQAPer 4.3.1: 100 epochs, patience 20).
    """
    best, best_state, waited, epoch = float("inf"), copy.deepcopy(module.state_dict()), 0, 0
    for epoch in range(1, max_epochs + 1):
        run_epoch(epoch)
        score = validate()
        if score < best:
            best, best_state, waited = score, copy.deepcopy(module.state_dict()), 0
        else:
            waited += 1
            if waited >= patience:
                break
    module.load_state_dict(best_state)
    return epoch
