"""FeDaL's Global Bias Elimination on the server (FeDaL, Method, Key Design 2), three steps:

1. FedAvg of the uploaded models: theta~ (and of the clients' biases: the reference b^g, which
   travels as the model's ``latent_bias``);
2. gradient-level correction with the drift state s^r = s^{r-1} - beta * (1/m) sum_i (theta_i^r -
   theta_g^{r-1}) and theta^ = theta~ - (1/beta) s^r. The summary writes a plain sum over the
   clients; we divide by the m registered clients as FedDyn does (Acar et al. 2021, Algorithm 1),
   whose server step this is, so the correction does not grow with the fleet. beta cancels in
   the server's arithmetic (theta^ = theta~ + the sum of all past mean drifts) and is kept for
   the state's meaning;
3. core-set tuning: theta^ fine-tuned on the round's core-sets by masked reconstruction gives
   theta_t, and the next global model is the convex fusion alpha theta^ + (1 - alpha) theta_t.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy, weighted_mean
from coordinator.strategy_settings import GBESettings, StrategySettings
from edge_agent.coreset import mask_batch
from edge_agent.learners.fedal import split_coreset
from edge_agent.models.foundation import FoundationModel, masked_mse
from edge_agent.seeds import Stream, derive_seed, seed_for
from edge_agent.tensors import TensorDict
from edge_agent.train import drawn_steps, mean_term

NOT_CORRECTED = ("latent_bias",)  # the bias reference is averaged, not a trained parameter


class FeDaL(Strategy):
    """FedAvg, drift correction, core-set tuning and fusion; keeps the drift state s."""

    name = "fedal"

    @classmethod
    def from_settings(cls, initial: TensorDict, settings: StrategySettings, seed: int) -> Strategy:
        return cls(initial, settings.fedal, seed)

    def __init__(self, initial: TensorDict, settings: GBESettings, seed: int):
        self.settings, self.seed = settings, seed
        self.drift = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in initial.items()
                      if v.is_floating_point() and k not in NOT_CORRECTED}

    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        parts = {u.client_id: split_coreset(u.params) for u in [*on_time, *imputed]}
        models = [ClientUpdate(u.client_id, parts[u.client_id][0], u.n_samples) for u in [*on_time, *imputed]]
        averaged = weighted_mean(models)
        corrected = self.correct(averaged, current, models, len(roster)) if self.settings.correction else averaged
        coresets = [parts[u.client_id][1] for u in on_time]
        tuned, tune_loss = self.tune(corrected, coresets, round_number)
        alpha = self.settings.alpha
        fused = {k: (alpha * v.double() + (1 - alpha) * tuned[k].double()).to(v.dtype) if k in self.drift else v
                 for k, v in corrected.items()}
        drift_norm = float(torch.sqrt(sum(s.pow(2).sum() for s in self.drift.values())))
        return Aggregate(fused, metrics={"drift_norm": drift_norm, "tune_loss": tune_loss,
                                         "coresets": float(len([c for c in coresets if c]))})

    def correct(self, averaged: TensorDict, current: TensorDict, models: Sequence[ClientUpdate],
                registered: int) -> TensorDict:
        """Update the drift state with this round's models and return theta~ - s / beta."""
        beta, m = self.settings.beta, max(registered, 1)
        out = dict(averaged)
        for name, state in self.drift.items():
            drift = sum(u.params[name].double() - current[name].double() for u in models)
            state -= beta * drift / m
            out[name] = (averaged[name].double() - state / beta).to(averaged[name].dtype)
        return out

    def tune(self, start: TensorDict, coresets: Sequence[TensorDict], round_number: int) -> tuple[TensorDict, float]:
        """``start`` fine-tuned on the pooled core-sets (each window with its client's measured
        variables); unchanged, with NaN loss, without core-sets or tuning steps."""
        pooled = [c for c in coresets if c]
        if not pooled or self.settings.tune_steps == 0:
            return start, float("nan")
        windows = torch.cat([c["windows"] for c in pooled])
        present = torch.cat([c["present"].bool().expand(len(c["windows"]), -1) for c in pooled])
        seed = seed_for(self.seed, Stream.CORESET_TUNING, round_number)
        model = FoundationModel(self.settings.model)
        model.load_state_dict(start)
        model.train()

        def step_loss(pick: torch.Tensor, number: int) -> torch.Tensor:
            x = windows[pick]
            masked = mask_batch(x.shape, self.settings.patch, self.settings.mask_rate, derive_seed(seed, number))
            return masked_mse(model(x.masked_fill(masked, 0.0)), x, masked, present[pick])

        steps = drawn_steps(torch.optim.Adam(model.parameters(), lr=self.settings.tune_lr), len(windows),
                            self.settings.tune_steps, self.settings.tune_batch, seed, step_loss)
        tuned = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return tuned, mean_term(steps)

    def state_dict(self) -> TensorDict:
        return {f"drift.{k}": v.clone() for k, v in self.drift.items()}

    def load_state_dict(self, state: TensorDict) -> None:
        for name in self.drift:
            self.drift[name] = state[f"drift.{name}"].to(torch.float64).clone()
