"""FedPoD's adaptive prompts around a frozen foundation model (section 3.2, eq. 4, Algorithm 1).

Our reading of the paper, made concrete:
- the foundation model was pretrained to fill masked positions, so forecasting is filling the
  H future positions appended after the L observed ones;
- temporal prompts P_T (H x V) are the learned content of those appended future blocks (Algorithm
  1 concatenates prompt blocks along time, one per forecasting step); inter-variable prompts P_V
  ((L + H) x V) act along every variable at every position;
- X = P_T * W_t + P_V * W_v with learnable elementwise weights W_t, W_v;
- the spatial prompt P_S is fused with the station's latitude/longitude through a LayerNorm
  (eq. 4) into a per-variable offset added to the input;
- the forecast is FFN(F(X_ipt + X)) read at the future positions: all variables (task 2) or one
  target variable (task 1); with quantile levels the FFN's output layer gives Q non-crossing
  quantiles per step and variable instead (``PromptedForecaster``), trained with the pinball loss
  in place of eq. 6's MSE.
Prompts and the small FFN / spatial layers go on the wire; W_t and W_v stay on the device; the
foundation model is frozen and never sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from edge_agent.levels import median_index
from edge_agent.models.foundation import FoundationModel
from edge_agent.models.heads import monotone_quantiles
from edge_agent.models.prompt_settings import PromptConfig
from edge_agent.tensors import TensorDict
from edge_agent.train import Batch, forecast_error, mean_term, seeded_steps

WIRE_PREFIXES = ("prompts.", "shared.")


class PromptedForecaster(nn.Module):
    """Frozen foundation model + trainable prompts for one station.

    With ``cfg.quantiles`` (``levels``) the FFN's last layer is widened to Q outputs per variable
    and made non-crossing by ``monotone_quantiles`` (median raw, softplus gaps outward, as head
    mode's ``QuantileHead``). That layer is shared, not personal: it stays where the point FFN's
    last layer is, in ``shared``, because this implementation sends the whole FFN with the prompts
    (the paper's appendices C and D.2 keep the FFN head on the device) and the quantile read-out is
    that same layer, only wider; a personal read-out under a shared, averaged hidden layer would
    bring back the averaging penalty of FedPer. Personal stay W_t, W_v and, through FedPoD's graphs
    (section 3.3), the personalized prompts; each station's interval widths are corrected on its
    own data by split-conformal calibration (``edge_agent.conformal``) where metrics are reported.
    """

    def __init__(self, foundation: FoundationModel, cfg: PromptConfig, latitude: float, longitude: float):
        super().__init__()
        fm = foundation.cfg
        if cfg.lookback + cfg.horizon != fm.window:
            raise ValueError(
                f"lookback {cfg.lookback} + horizon {cfg.horizon} must equal the foundation window {fm.window}"
            )
        if cfg.task == "single" and cfg.target not in fm.variables:
            raise ValueError(f"target: {cfg.target!r} is not one of {list(fm.variables)}")
        self.cfg, self.levels, n_vars = cfg, cfg.quantiles, len(fm.variables)
        n_out = (n_vars if cfg.task == "multivariate" else 1) * (len(cfg.quantiles) if cfg.quantiles else 1)
        self.foundation = foundation.requires_grad_(False).eval()
        self.prompts = nn.ParameterDict({
            "temporal": nn.Parameter(torch.zeros(cfg.horizon, n_vars)),
            "variable": nn.Parameter(torch.zeros(fm.window, n_vars)),
            "spatial": nn.Parameter(torch.randn(cfg.spatial) * 0.02),
        })
        self.weights = nn.ParameterDict({  # W_t, W_v: personal
            "temporal": nn.Parameter(torch.ones(cfg.horizon, n_vars)),
            "variable": nn.Parameter(torch.ones(fm.window, n_vars)),
        })
        self.shared = nn.ModuleDict({
            "spatial": nn.Sequential(nn.Linear(cfg.spatial + 2, n_vars), nn.LayerNorm(n_vars)),
            "head": nn.Sequential(nn.Linear(fm.d_model, fm.d_model), nn.ReLU(), nn.Linear(fm.d_model, n_out)),
        })
        self.register_buffer("geo", torch.tensor([latitude / 90.0, longitude / 180.0]))
        self.target_index = fm.variables.index(cfg.target) if cfg.task == "single" else None

    def train(self, mode: bool = True) -> "PromptedForecaster":
        super().train(mode)
        self.foundation.eval()  # frozen: no dropout, no statistics updates
        return self

    def prompt_input(self) -> torch.Tensor:
        """X = P_T * W_t (at the future positions) + P_V * W_v + the spatial offset: (L + H, V)."""
        past = torch.zeros(self.cfg.lookback, self.prompts["temporal"].shape[1])
        temporal = torch.cat([past, self.prompts["temporal"] * self.weights["temporal"]])
        spatial = self.shared["spatial"](torch.cat([self.prompts["spatial"], self.geo]))
        return temporal + self.prompts["variable"] * self.weights["variable"] + spatial

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, V) canonical standardized input -> (B, H, V) or (B, H, 1) point forecast (the
        median of a quantile model)."""
        return self.point(self.full_forecast(x))

    def full_forecast(self, x: torch.Tensor) -> torch.Tensor:
        """The point forecast, or (B, H, V or 1, Q) quantiles ordered like ``levels``, non-crossing."""
        future = x.new_zeros(x.shape[0], self.cfg.horizon, x.shape[2])
        hidden = self.foundation.encode(torch.cat([x, future], dim=1) + self.prompt_input())
        out = self.shared["head"](hidden[:, self.cfg.lookback:])
        if self.levels is None:
            return out
        return monotone_quantiles(out.unflatten(-1, (-1, len(self.levels))), median_index(self.levels))

    def point(self, forecast: torch.Tensor) -> torch.Tensor:
        """The point forecast in a ``full_forecast``: itself, or a quantile model's median."""
        return forecast if self.levels is None else forecast[..., median_index(self.levels)]

    def target(self, y: torch.Tensor) -> torch.Tensor:
        """The part of a (B, H, V) future the model is asked to forecast."""
        return y if self.target_index is None else y[..., self.target_index : self.target_index + 1]

    def wire_state(self, prefixes: tuple[str, ...] = WIRE_PREFIXES) -> TensorDict:
        """What goes to the coordinator: prompts and the small shared layers, never the foundation
        (``prefixes`` names other parts for the fine-tuning baselines)."""
        return {k: v.detach().clone() for k, v in self.state_dict().items() if k.startswith(prefixes)}

    def prompt_vector(self) -> torch.Tensor:
        """All prompts of this client flattened (the node features of the coordinator's graphs)."""
        return torch.cat([p.flatten() for p in self.prompts.values()])

    @torch.no_grad()
    def set_prompt_vector(self, flat: torch.Tensor) -> None:
        """Install a flattened prompt vector (the layout of ``prompt_vector``)."""
        offset = 0
        for prompt in self.prompts.values():
            prompt.copy_(flat[offset : offset + prompt.numel()].reshape(prompt.shape))
            offset += prompt.numel()


class PromptLoss(nn.Module):
    """Eq. 6: MSE + (1/xi^2) d(P, P*) + (1/xi^2) d(P, P^l) + (1/tau^2) mean_j d(P, P_j^l)
    + 4 (log2 xi + log2 tau), with xi, tau in (0, 1) learned (uncertainty weighting after Kendall
    et al. 2018; initial 0.7 and 0.3, appendix B.3). d is the mean squared difference of the
    flattened prompts; the mean over neighbours stands for the 1 / (|N| / S_G - 1) sum.

    With quantile ``levels`` the forecast term is the pinball loss over all levels (term
    ``pinball`` instead of ``mse``); the prompt terms are unchanged."""

    def __init__(self, xi: float = 0.7, tau: float = 0.3, levels: tuple[float, ...] | None = None):
        super().__init__()
        self.levels = levels
        self.xi_logit = nn.Parameter(torch.logit(torch.tensor(xi)))
        self.tau_logit = nn.Parameter(torch.logit(torch.tensor(tau)))

    def forward(self, forecast: torch.Tensor, target: torch.Tensor, prompts: torch.Tensor,
                global_prompts: torch.Tensor | None = None, personalized: torch.Tensor | None = None,
                neighbours: list[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Every term by name and their sum under ``total``; absent references drop their term."""
        xi, tau = torch.sigmoid(self.xi_logit), torch.sigmoid(self.tau_logit)
        terms = {"mse" if self.levels is None else "pinball": forecast_error(forecast, target, self.levels)}
        if global_prompts is not None:
            terms["global"] = (prompts - global_prompts).pow(2).mean() / xi**2
        if personalized is not None:
            terms["personalized"] = (prompts - personalized).pow(2).mean() / xi**2
        if neighbours:
            terms["neighbours"] = torch.stack([(prompts - n).pow(2).mean() for n in neighbours]).mean() / tau**2
        if len(terms) > 1:
            terms["uncertainty"] = 4 * (torch.log2(xi) + torch.log2(tau))
        terms["total"] = sum(terms.values())
        return terms


def trainable(model: PromptedForecaster, loss: PromptLoss) -> list[nn.Parameter]:
    """Prompts, W_t/W_v, the shared layers and the loss's xi/tau; never the foundation."""
    return [p for p in model.parameters() if p.requires_grad] + list(loss.parameters())


def train_prompts(model: PromptedForecaster, loss: PromptLoss, windows: torch.Tensor, present: torch.Tensor,
                  epochs: int, batch_size: int, lr: float, seed: int,
                  references: dict[str, object] | None = None) -> dict[str, float]:
    """Local update (Algorithm 2, lines 19-25): AdamW (appendix B.3: weight decay 1e-4) on eq. 6
    over (N, L + H, V) canonical windows; returns each term's mean over the batches."""
    optimizer = torch.optim.AdamW(trainable(model, loss), lr=lr, weight_decay=1e-4)
    model.train()

    def step_loss(batch: torch.Tensor, epoch: int, step: int) -> dict[str, torch.Tensor]:
        forecast, target = forecast_and_target(model, windows[batch], present)
        return loss(forecast, target, model.prompt_vector(), **(references or {}))

    steps = seeded_steps(optimizer, len(windows), epochs, batch_size, seed, step_loss)
    model.eval()
    return {name: mean_term(steps, name) for name in (steps[0][0] if steps else {})}


def forecast_and_target(model: PromptedForecaster, windows: torch.Tensor,
                        present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``full_forecast`` of the last H positions from the first L and the matching target,
    restricted to the variables this station measures (task 2)."""
    past, future = windows[:, : model.cfg.lookback], windows[:, model.cfg.lookback :]
    forecast, target = model.full_forecast(past), model.target(future)
    if model.target_index is None:
        forecast, target = forecast[:, :, present], target[:, :, present]
    return forecast, target


@torch.no_grad()
def evaluate_prompts(model: PromptedForecaster, windows: torch.Tensor, present: torch.Tensor) -> tuple[float, float]:
    """(MAE, RMSE) of the point forecast (a quantile model's median) on the standardized scale
    over every window."""
    model.eval()
    forecast, target = forecast_and_target(model, windows, present)
    error = model.point(forecast) - target
    return float(error.abs().mean()), float(error.pow(2).mean().sqrt())


@torch.no_grad()
def prompt_forecasts(model: PromptedForecaster, windows: torch.Tensor, present: torch.Tensor,
                     batch_size: int = 256) -> Iterator[Batch]:
    """(full forecast, target) per batch of a station's windows, the model in eval mode: what
    ``edge_agent.train.forecast_metrics`` turns into ``Metrics`` (QS, ICP, MIL for quantiles)."""
    model.eval()
    for batch in windows.split(batch_size):
        yield forecast_and_target(model, batch, present)
