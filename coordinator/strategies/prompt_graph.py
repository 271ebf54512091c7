"""FedPoD's Dynamic Graph Modeling (section 3.3, eqs. 7-9): graphs over clients from their
geography and their prompts, and the personalized prompts they induce.

Where the paper leaves a choice open we make it explicit: the geographic graph turns haversine
distances into similarities exp(-d / median distance); every learned graph is row-normalized
with a softmax over neighbours (so personalized prompts are convex combinations of clients'
prompts, like the Softmax of eq. 9).

Server objective for the graph parameters (our concrete form of G(A) in eq. 13): every learned
graph should connect clients whose prompts are close, sum_ij A_ij S_ij / mean(S) with S the
Euclidean prompt distances of eq. 14, while staying spread, + ``sparsity`` * sum_ij A_ij^2 / N
(a row-stochastic graph minimizing distance alone collapses onto the identity). Trained with SGD
(lr 1e-3, 40 epochs, appendix B.3) every round.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from edge_agent.tensors import TensorDict

EARTH_RADIUS_KM = 6371.0088  # mean Earth radius (IUGG)


def haversine_km(lat1: torch.Tensor, lon1: torch.Tensor, lat2: torch.Tensor, lon2: torch.Tensor) -> torch.Tensor:
    """Great-circle distance in km between points given in degrees (eq. 7, written with atan2,
    which equals the paper's 2R atan(sqrt(a / (1 - a))) and stays defined at a = 1)."""
    phi1, phi2 = torch.deg2rad(lat1), torch.deg2rad(lat2)
    half_dphi, half_dlambda = (phi1 - phi2) / 2, torch.deg2rad(lon1 - lon2) / 2
    a = torch.sin(half_dphi) ** 2 + torch.cos(phi1) * torch.cos(phi2) * torch.sin(half_dlambda) ** 2
    return 2 * EARTH_RADIUS_KM * torch.atan2(a.sqrt(), (1 - a).clamp_min(0).sqrt())


def geo_graph(coordinates: torch.Tensor) -> torch.Tensor:
    """A_geo (N, N) from (N, 2) latitude/longitude in degrees: exp(-d_ij / median off-diagonal
    distance), rows normalized to sum to one (self-similarity 1 before normalizing)."""
    lat, lon = coordinates[:, 0], coordinates[:, 1]
    distance = haversine_km(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    n = len(coordinates)
    off_diagonal = distance[~torch.eye(n, dtype=torch.bool)]
    scale = off_diagonal.median().clamp_min(1e-6) if n > 1 else torch.tensor(1.0)
    similarity = torch.exp(-distance / scale)
    return similarity / similarity.sum(1, keepdim=True)


class PromptGraph(nn.Module):
    """Eq. 8 for one family of prompts: e_ij = a(W P_i, W P_j) with a shared attention a (a
    LeakyReLU of a learned linear form of the concatenation, as in graph attention), gated by
    sigmoid(w . (W P_i - W P_j)); rows then softmax-normalized over j."""

    def __init__(self, prompt_size: int, hidden: int = 32):
        super().__init__()
        self.project = nn.Linear(prompt_size, hidden, bias=False)  # W
        self.attention = nn.Linear(2 * hidden, 1, bias=False)  # a
        self.gate = nn.Linear(hidden, 1, bias=False)  # the edge-weight matrix of eq. 8

    def forward(self, prompts: torch.Tensor) -> torch.Tensor:
        """(N, prompt_size) flattened prompts -> (N, N) row-stochastic adjacency."""
        h = self.project(prompts)
        n = len(h)
        pairs = torch.cat([h[:, None, :].expand(n, n, -1), h[None, :, :].expand(n, n, -1)], dim=-1)
        scores = F.leaky_relu(self.attention(pairs).squeeze(-1), 0.2)
        edges = scores * torch.sigmoid(self.gate(h[:, None, :] - h[None, :, :]).squeeze(-1))
        return edges.softmax(dim=1)


def fused_graph(a_geo: torch.Tensor, a_s: torch.Tensor, a_tv: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Eq. 9: A' = Softmax((A_geo - A_S) A_TV^T / sqrt(d_k)) A with d_k = N."""
    n = a.shape[0]
    return torch.softmax((a_geo - a_s) @ a_tv.T / math.sqrt(n), dim=1) @ a


def personalize(prompts: torch.Tensor, a: torch.Tensor, a_fused: torch.Tensor, alpha: float = 0.99) -> torch.Tensor:
    """{P_i}^l = alpha A P + (1 - alpha) A' P (eq. 9, alpha = 0.99 as in appendix B.3)."""
    flat = prompts.flatten(1)
    return (alpha * a @ flat + (1 - alpha) * a_fused @ flat).reshape(prompts.shape)


PROMPT_NAMES = ("temporal", "variable", "spatial")  # the order of PromptedForecaster.prompt_vector


def views_from_states(states: list[TensorDict]) -> dict[str, torch.Tensor]:
    """The node features of each graph from uploaded wire states, one row per client: all
    prompts (the rows that get personalized), temporal + inter-variable, spatial."""
    def flat(names: tuple[str, ...]) -> torch.Tensor:
        return torch.stack([torch.cat([s[f"prompts.{n}"].flatten() for n in names]) for s in states]).detach()

    return {"all": flat(PROMPT_NAMES), "tv": flat(PROMPT_NAMES[:2]), "spatial": flat(PROMPT_NAMES[2:])}


def standardized(view: torch.Tensor) -> torch.Tensor:
    """Each prompt entry centred and scaled across clients: the graphs compare clients, and raw
    prompts (initialized at zero, small after a few steps) would give every edge the same score."""
    return (view - view.mean(0)) / (view.std(0, unbiased=False) + 1e-6)


class DynamicGraphs:
    """The server's three prompt graphs (A from all prompts, A_TV from temporal + inter-variable,
    A_S from spatial), trained each round and used to personalize."""

    def __init__(self, sizes: dict[str, int], seed: int):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.graphs = {name: PromptGraph(size) for name, size in sizes.items()}

    def parameters(self) -> list[nn.Parameter]:
        return [p for graph in self.graphs.values() for p in graph.parameters()]

    def state_dict(self) -> TensorDict:
        return {f"{name}.{k}": v.detach().clone() for name, g in self.graphs.items() for k, v in g.state_dict().items()}

    def load_state_dict(self, state: TensorDict) -> None:
        for name, graph in self.graphs.items():
            graph.load_state_dict({k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")})

    def matrices(self, views: dict[str, torch.Tensor], a_geo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, A') from the clients' prompts (eqs. 8 and 9)."""
        a_all, a_tv, a_s = (self.graphs[name](standardized(views[name])) for name in ("all", "tv", "spatial"))
        return a_all, fused_graph(a_geo, a_s, a_tv, a_all)

    def fit(self, views: dict[str, torch.Tensor], a_geo: torch.Tensor, epochs: int, lr: float,
            sparsity: float) -> list[float]:
        """``epochs`` SGD steps on the objective above; the loss after each."""
        distance = torch.cdist(views["all"], views["all"])
        distance = distance / distance.mean().clamp_min(1e-12)
        optimizer = torch.optim.SGD(self.parameters(), lr=lr)
        losses = []
        for _ in range(epochs):
            a, a_fused = self.matrices(views, a_geo)
            loss = sum((m * distance).sum() + sparsity * m.pow(2).sum() for m in (a, a_fused)) / len(a)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses
