"""FedPoD rounds in one process (Algorithm 2): local prompt tuning around the frozen foundation
model, then Dynamic Graph Modeling on the server (section 3.3, appendix B.2-B.3).

Server objective for the graph parameters (our concrete form of G(A) in eq. 13): every learned
graph should connect clients whose prompts are close, sum_ij A_ij S_ij / mean(S) with S the
Euclidean prompt distances of eq. 14, while staying spread, + ``sparsity`` * sum_ij A_ij^2 / N
(a row-stochastic graph minimizing distance alone collapses onto the identity). Trained with SGD
(lr 1e-3, 40 epochs, appendix B.3) every round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from coordinator.aggregators import ClientUpdate, make_aggregator
from coordinator.prompt_graph import PromptGraph, fused_graph, geo_graph, global_prompts, personalize
from edge_agent.data.canonical import DeviceSeries
from edge_agent.models.prompts import PromptedForecaster, PromptLoss, evaluate_prompts, train_prompts


class FedPodConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(5, ge=1)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(256, ge=1, description="appendix B.3: 256")
    lr: float = Field(1e-2, gt=0, description="AdamW, appendix B.3: 1e-2")
    alpha: float = Field(0.99, ge=0.0, le=1.0, description="weight of A P against A' P (eq. 9)")
    subgraph_step: int = Field(2, ge=1, description="S_G: each client is regularized towards N/S_G - 1 neighbours")
    graph_epochs: int = Field(40, ge=1)
    graph_lr: float = Field(1e-3, gt=0)
    sparsity: float = Field(1.0, ge=0.0)
    dp_sigma: float = Field(0.0, ge=0.0, description="std of Gaussian noise added to uploaded prompts (Table 5)")
    seed: int = 42


@dataclass
class Client:
    """One station in the simulation: its model, loss weights and data, and what the server sent."""

    model: PromptedForecaster
    loss: PromptLoss
    data: DeviceSeries
    references: dict


class DynamicGraphs:
    """The server's three prompt graphs (A from all prompts, A_TV from temporal + inter-variable,
    A_S from spatial), trained each round and used to personalize."""

    def __init__(self, sizes: dict[str, int], seed: int):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.graphs = {name: PromptGraph(size) for name, size in sizes.items()}

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for graph in self.graphs.values() for p in graph.parameters()]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{name}.{k}": v.detach().clone() for name, g in self.graphs.items() for k, v in g.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, graph in self.graphs.items():
            graph.load_state_dict({k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")})

    def matrices(self, views: dict[str, torch.Tensor], a_geo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, A') from the clients' prompts (eqs. 8 and 9)."""
        a_all, a_tv, a_s = (self.graphs[name](standardized(views[name])) for name in ("all", "tv", "spatial"))
        return a_all, fused_graph(a_geo, a_s, a_tv, a_all)

    def fit(self, views: dict[str, torch.Tensor], a_geo: torch.Tensor, cfg: FedPodConfig) -> list[float]:
        distance = torch.cdist(views["all"], views["all"])
        distance = distance / distance.mean().clamp_min(1e-12)
        optimizer = torch.optim.SGD(self.parameters(), lr=cfg.graph_lr)
        losses = []
        for _ in range(cfg.graph_epochs):
            a, a_fused = self.matrices(views, a_geo)
            loss = sum((m * distance).sum() + cfg.sparsity * m.pow(2).sum() for m in (a, a_fused)) / len(a)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses


PROMPT_NAMES = ("temporal", "variable", "spatial")  # the order of PromptedForecaster.prompt_vector


def views_from_states(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The node features of each graph from uploaded wire states, one row per client: all
    prompts (the rows that get personalized), temporal + inter-variable, spatial."""
    def flat(names: tuple[str, ...]) -> torch.Tensor:
        return torch.stack([torch.cat([s[f"prompts.{n}"].flatten() for n in names]) for s in states]).detach()

    return {"all": flat(PROMPT_NAMES), "tv": flat(PROMPT_NAMES[:2]), "spatial": flat(PROMPT_NAMES[2:])}


def prompt_views(clients: list[Client]) -> dict[str, torch.Tensor]:
    return views_from_states([c.model.wire_state() for c in clients])


def standardized(view: torch.Tensor) -> torch.Tensor:
    """Each prompt entry centred and scaled across clients: the graphs compare clients, and raw
    prompts (initialized at zero, small after a few steps) would give every edge the same score."""
    return (view - view.mean(0)) / (view.std(0, unbiased=False) + 1e-6)


def with_privacy_noise(views: dict[str, torch.Tensor], sigma: float, seed: int) -> dict[str, torch.Tensor]:
    """What the server sees when every client adds N(0, sigma^2) noise to its uploaded prompts
    (FedPoD's differential-privacy variant, Table 5). The views are slices of the same prompts,
    so one noise draw per client is applied consistently to all three."""
    if sigma == 0.0:
        return views
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(views["all"].shape, generator=generator) * sigma
    n_tv = views["tv"].shape[1]
    return {"all": views["all"] + noise, "tv": views["tv"] + noise[:, :n_tv], "spatial": views["spatial"] + noise[:, n_tv:]}


class Personalizer:
    """The coordinator's side of a FedPoD round: graphs trained on the uploaded prompts, then
    each client's personalized prompts and its strongest neighbours' (eq. 9, eq. 6 references)."""

    def __init__(self, cfg: FedPodConfig, sizes: dict[str, int]):
        """``sizes``: the width of each prompt view (see ``views_from_states``)."""
        self.cfg, self.graphs = cfg, DynamicGraphs(sizes, cfg.seed)

    def personalize(self, views: dict[str, torch.Tensor], coordinates: torch.Tensor,
                    round_index: int) -> tuple[list[dict[str, torch.Tensor]], float]:
        """Per client {"personalized": (P,), "neighbours": (k, P)}, and the final graph loss."""
        views = with_privacy_noise(views, self.cfg.dp_sigma, self.cfg.seed * 7919 + round_index)
        a_geo = geo_graph(coordinates.float())
        graph_loss = self.graphs.fit(views, a_geo, self.cfg)[-1]
        with torch.no_grad():
            a, a_fused = self.graphs.matrices(views, a_geo)
            personal = personalize(views["all"], a, a_fused, self.cfg.alpha)
        keep = max(1, len(a) // self.cfg.subgraph_step - 1)
        out = []
        for i in range(len(a)):
            ranked = [j for j in a[i].argsort(descending=True).tolist() if j != i][:keep]
            out.append({"personalized": personal[i], "neighbours": personal[ranked]})
        return out, graph_loss


def server_round(clients: list[Client], personalizer: Personalizer, coordinates: torch.Tensor,
                 round_index: int = 0) -> float:
    """Personalize prompts, FedAvg the shared layers and give each client its part; returns the
    final graph loss."""
    views = prompt_views(clients)
    references, graph_loss = personalizer.personalize(views, coordinates, round_index)
    sizes = [len(c.data.train) for c in clients]
    overall = global_prompts(views["all"], torch.tensor(sizes))
    shared = make_aggregator("fedavg").aggregate([
        ClientUpdate(c.data.name, {k: v for k, v in c.model.wire_state().items() if k.startswith("shared.")}, n)
        for c, n in zip(clients, sizes)
    ])
    for client, mine in zip(clients, references):
        client.references = {"global_prompts": overall, "personalized": mine["personalized"],
                             "neighbours": list(mine["neighbours"])}
        client.model.set_prompt_vector(mine["personalized"])
        client.model.load_state_dict(shared, strict=False)
    return graph_loss


def sent_state(model: PromptedForecaster) -> dict[str, torch.Tensor]:
    """The trainable tensors a client uploads when the baseline averages them all: its wire
    state (prompts and shared layers) plus, when the foundation is being fine-tuned, the
    foundation; W_t and W_v stay personal."""
    return {name: p.detach().clone() for name, p in model.named_parameters()
            if p.requires_grad and not name.startswith("weights.")}


def run_fedavg(clients: list[Client], cfg: FedPodConfig) -> list[dict]:
    """The baselines of Table 1: local training with plain MSE, then FedAvg of every sent
    trainable tensor to every client (no graphs, no prompt regularization)."""
    fedavg, records = make_aggregator("fedavg"), []
    for r in range(1, cfg.rounds + 1):
        for i, client in enumerate(clients):
            train_prompts(client.model, client.loss, client.data.train, client.data.present, cfg.local_epochs,
                          cfg.batch_size, cfg.lr, seed=cfg.seed * 1000 + r * 100 + i)
        merged = fedavg.aggregate([ClientUpdate(c.data.name, sent_state(c.model), len(c.data.train)) for c in clients])
        for client in clients:
            client.model.load_state_dict(merged, strict=False)
        records.append(_scores(r, clients))
    return records


def _scores(round_index: int, clients: list[Client]) -> dict:
    scores = [evaluate_prompts(c.model, c.data.val, c.data.present) for c in clients]
    return {"round": round_index, "mae": sum(s[0] for s in scores) / len(scores),
            "rmse": sum(s[1] for s in scores) / len(scores)}


def run_fedpod(clients: list[Client], coordinates: torch.Tensor, cfg: FedPodConfig) -> list[dict]:
    """``cfg.rounds`` rounds of FedPoD; per round the mean validation MAE/RMSE over clients."""
    sizes = {name: view.shape[1] for name, view in prompt_views(clients).items()}
    personalizer, records = Personalizer(cfg, sizes), []
    for r in range(1, cfg.rounds + 1):
        for i, client in enumerate(clients):
            train_prompts(client.model, client.loss, client.data.train, client.data.present, cfg.local_epochs,
                          cfg.batch_size, cfg.lr, seed=cfg.seed * 1000 + r * 100 + i, references=client.references)
        graph_loss = server_round(clients, personalizer, coordinates, r)
        records.append({**_scores(r, clients), "graph_loss": graph_loss})
    return records
