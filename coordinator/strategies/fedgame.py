"""Fed-GAME's server step (section 2.2): the clients' parameter differences dW_i = theta_i -
theta_global, averaged into the global model with the server learning rate (2.2 i), and their
selected final-layer parts personalized by the GAME aggregator (2.2 ii, 2.3), trained each round
on the meta-loss (2.4). Each on-time client gets its personalized difference as its message.

Updates arrive as full states (the engine screens full states), so the strategy forms the
differences against ``current`` itself. The average is FedAvg's sample-weighted one (the
dataset weights of section 2.1), so with eta_g = 1 the global state equals FedAvg's. Twins'
forecasts join the average but not the personalization (they have no fine-tuned model of their
own). Gate slots go to clients in the order first seen and persist with the aggregator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy, weighted_mean
from coordinator.strategies.game import GameAggregator
from coordinator.strategy_settings import GameSettings, StrategySettings
from edge_agent.seeds import Stream, seed_for
from edge_agent.tensors import TensorDict

BACKBONE = "backbone."  # head mode's shared backbone (edge_agent.models.forecaster)
CLIENTS_KEY = "clients"  # the gate slots' client ids, UTF-8, newline-separated, in a uint8 tensor


class FedGAME(Strategy):
    """Server-learning-rate FedAvg of differences + GAME personalization of the selected layers."""

    name = "fedgame"

    @classmethod
    def from_settings(cls, initial: TensorDict, settings: StrategySettings, seed: int) -> Strategy:
        return cls(initial, settings.game, seed)

    def __init__(self, initial: TensorDict, settings: GameSettings, seed: int):
        self.settings, self.seed = settings, seed
        self.selected = selected_names(initial, settings.selected)
        width = sum(initial[name].numel() for name in self.selected)
        self.aggregator = GameAggregator(width, settings, seed_for(seed, Stream.GAME_INIT))
        self.clients: list[str] = []

    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        state = self.global_step(current, weighted_mean([*on_time, *imputed]))
        if not on_time:
            return Aggregate(state)
        differences = torch.stack([self.flat_difference(current, u.params) for u in on_time])
        slots = torch.tensor([self.slot(u.client_id) for u in on_time])
        noise_seed = seed_for(self.seed, Stream.GAME_GATE_NOISE, round_number)
        self.aggregator.fit(differences, self.settings.steps, self.settings.lr, noise_seed, slots)
        with torch.no_grad():
            personalized = self.aggregator(differences, slots)
            loss = self.aggregator.loss(differences, slots).item()
        personal = {u.client_id: self.unflatten(row, current) for u, row in zip(on_time, personalized)}
        return Aggregate(state, personal, {"meta_loss": loss})

    def global_step(self, current: TensorDict, averaged: TensorDict) -> TensorDict:
        """theta + eta_g * mean_i dW_i for floating tensors (mean_i dW_i = FedAvg - theta); other
        tensors (counters) take FedAvg's value."""
        eta = self.settings.server_lr
        return {name: (value + eta * (averaged[name] - value)).to(value.dtype) if value.is_floating_point()
                else averaged[name] for name, value in current.items()}

    def flat_difference(self, current: TensorDict, params: TensorDict) -> torch.Tensor:
        """The selected tensors' dW_i, flattened and concatenated (float32)."""
        return torch.cat([(params[n].double() - current[n].double()).flatten() for n in self.selected]).float()

    def unflatten(self, row: torch.Tensor, current: TensorDict) -> TensorDict:
        """A personalized row back into named tensors shaped and typed like ``current``'s."""
        sizes = [current[name].numel() for name in self.selected]
        return {name: part.reshape(current[name].shape).to(current[name].dtype).clone()
                for name, part in zip(self.selected, row.split(sizes))}

    def slot(self, client_id: str) -> int:
        """The client's personalized gate, assigned when first seen."""
        if client_id not in self.clients:
            if len(self.clients) >= self.settings.max_clients:
                raise ValueError(f"fedgame: client {client_id!r} exceeds max_clients ({self.settings.max_clients})")
            self.clients.append(client_id)
        return self.clients.index(client_id)

    def state_dict(self) -> TensorDict:
        encoded = torch.tensor(list("\n".join(self.clients).encode()), dtype=torch.uint8)
        return {**{f"aggregator.{k}": v.detach().clone() for k, v in self.aggregator.state_dict().items()},
                CLIENTS_KEY: encoded}

    def load_state_dict(self, state: TensorDict) -> None:
        prefix = "aggregator."
        self.aggregator.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        text = bytes(state[CLIENTS_KEY].tolist()).decode()
        self.clients = text.split("\n") if text else []


def selected_names(initial: TensorDict, prefixes: Sequence[str]) -> tuple[str, ...]:
    """The tensors personalized: those under ``prefixes``, else the final layer (section 2.2 ii):
    the floating tensors of the module holding the last weight matrix (a floating tensor of two
    or more dimensions) of the backbone, where the state has one (head mode: the backbone is the
    last shared stage before each gateway's own head), else of the whole state."""
    floating = [name for name, value in initial.items() if value.is_floating_point()]
    if not prefixes:
        prefixes = (_final_layer(initial, floating),)
    names = tuple(name for name in floating if name.startswith(tuple(prefixes)))
    if not names:
        raise ValueError(f"fedgame: no floating tensor of the global state starts with {list(prefixes)}")
    return names


def _final_layer(initial: TensorDict, floating: list[str]) -> str:
    """The module path (with its trailing dot) of the last weight matrix, see ``selected_names``."""
    matrices = [name for name in floating if initial[name].dim() >= 2]
    if not matrices:
        raise ValueError("fedgame: the global state has no weight matrix to personalize")
    in_backbone = [name for name in matrices if BACKBONE in name]
    last = (in_backbone or matrices)[-1]
    return last.rpartition(".")[0] + "." if "." in last else last
