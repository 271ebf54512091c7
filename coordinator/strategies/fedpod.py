"""FedPoD's server step (Algorithm 2, section 3.3, appendix B.2-B.3): FedAvg of everything uploaded
(the shared layers, and the prompts, whose average is the global prompts {P}*), then Dynamic
Graph Modeling over the on-time clients' prompts and each one's personalized prompts (eq. 9) and
strongest neighbours' prompts (the references of eq. 6), sent as that client's personal message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy, weighted_mean
from coordinator.strategies.prompt_graph import PROMPT_NAMES, DynamicGraphs, geo_graph, personalize, views_from_states
from coordinator.strategy_settings import GraphSettings, StrategySettings
from edge_agent.seeds import Stream, seed_for
from edge_agent.tensors import TensorDict


class FedPoD(Strategy):
    """FedAvg + graph personalization; the graph parameters persist between rounds."""

    name = "fedpod"

    @classmethod
    def from_settings(cls, initial: TensorDict, settings: StrategySettings, seed: int) -> Strategy:
        return cls(initial, settings.fedpod, seed)

    def __init__(self, initial: TensorDict, settings: GraphSettings, seed: int):
        sizes = {name: view.shape[1] for name, view in views_from_states([initial]).items()}
        self.settings, self.graphs = settings, DynamicGraphs(sizes, seed_for(seed, Stream.GRAPH_INIT))

    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        state = weighted_mean([*on_time, *imputed])
        if not on_time:
            return Aggregate(state)
        overall = torch.cat([state[f"prompts.{name}"].flatten() for name in PROMPT_NAMES])
        references, graph_loss = self.personalize([u.params for u in on_time], _coordinates(on_time, roster))
        personal = {u.client_id: {**mine, "global_prompts": overall} for u, mine in zip(on_time, references)}
        return Aggregate(state, personal, {"graph_loss": graph_loss})

    def personalize(self, states: list[TensorDict], coordinates: torch.Tensor) -> tuple[list[TensorDict], float]:
        """Per client {"personalized": (P,), "neighbours": (k, P)}, and the final graph loss."""
        s = self.settings
        views, a_geo = views_from_states(states), geo_graph(coordinates.float())
        graph_loss = self.graphs.fit(views, a_geo, s.graph_epochs, s.graph_lr, s.sparsity)[-1]
        with torch.no_grad():
            a, a_fused = self.graphs.matrices(views, a_geo)
            personal = personalize(views["all"], a, a_fused, s.alpha)
        keep = max(1, len(a) // s.subgraph_step - 1)
        out = []
        for i in range(len(a)):
            ranked = [j for j in a[i].argsort(descending=True).tolist() if j != i][:keep]
            out.append({"personalized": personal[i].clone(), "neighbours": personal[ranked].clone()})
        return out, graph_loss

    def state_dict(self) -> TensorDict:
        return self.graphs.state_dict()

    def load_state_dict(self, state: TensorDict) -> None:
        self.graphs.load_state_dict(state)


def _coordinates(updates: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> torch.Tensor:
    """(N, 2) latitude/longitude of the updating clients; unknown positions count as (0, 0)."""
    return torch.tensor([[roster[u.client_id].latitude or 0.0, roster[u.client_id].longitude or 0.0]
                         for u in updates], dtype=torch.float64)
