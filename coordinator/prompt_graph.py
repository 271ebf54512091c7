"""FedPoD's Dynamic Graph Modeling (section 3.3, eqs. 7-9): graphs over clients from their
geography and their prompts, and the personalized prompts they induce.

Where the paper leaves a choice open we make it explicit: the geographic graph turns haversine
distances into similarities exp(-d / median distance); every learned graph is row-normalized
with a softmax over neighbours (so personalized prompts are convex combinations of clients'
prompts, like the Softmax of eq. 9). Training the graph parameters on the server is the next step
of this module and not done yet.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

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


def global_prompts(prompts: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
    """{P}^*: the sample-count-weighted mean of the clients' prompts."""
    weights = samples.double() / samples.double().sum()
    return (weights.reshape(-1, *([1] * (prompts.dim() - 1))) * prompts.double()).sum(0).to(prompts.dtype)
