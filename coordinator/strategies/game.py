"""Fed-GAME's server-side aggregator (sections 2.2-2.4): personalized message passing over a
learned, fully connected implicit graph of the clients' selected parameter differences.

Each client's selected difference dW_i (flattened final-layer difference) is embedded by a shared
linear encoder h_i = W_enc dW_i (section 2.2 ii). Shared scoring experts rate every pair (i, j),
a personalized noisy top-k gate per client mixes the experts' scores, and a temperature-scaled
softmax over the other clients gives the attention a_ij (section 2.3). Eq. 1 then yields one
personalized difference per client: dW^_i = beta dW_i + (1 - beta) sum_{j != i} a_ij dW_j.
The server trains encoder, experts and gates with the similarity meta-loss of eq. 3
(lambda_1 * L2 + lambda_2 * cosine dissimilarity between dW^_i and dW_i, section 2.4).

The equations' symbols were lost from our copy of the paper, so where it is silent we choose and
say so here: an expert's score is bilinear, s^e_ij = h_i^T W_e h_j / sqrt(H) (a linear network on
both embeddings, so relevance depends on the pair, not only on j); the gate is Shazeer et al.'s
noisy top-k router (logits h_i W_g^i + b_g^i + N(0, 1) * softplus(h_i W_n^i), noise only while
training); a client attends to its peers only (j != i; its own update enters through beta). The
encoder sees the differences divided by their overall RMS and the meta-loss compares the scaled
differences, so scores and loss weights do not depend on how far the clients moved this round.

Variants for the ablation of Table 3: "game" (above), "gat" (one GAT attention head,
LeakyReLU(a^T [h_i || h_j]), no experts or gates) and "mean" (the plain mean of the peers'
differences, GraphSAGE's mean aggregator).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from coordinator.strategy_settings import GameSettings


def meta_loss(personalized: torch.Tensor, target: torch.Tensor, l2_weight: float, cosine_weight: float) -> torch.Tensor:
    """Eq. 3 over (N, D) rows: lambda_1 * mean squared error + lambda_2 * mean (1 - cosine)."""
    l2 = F.mse_loss(personalized, target)
    dissimilarity = (1 - F.cosine_similarity(personalized, target, dim=1, eps=1e-12)).mean()
    return l2_weight * l2 + cosine_weight * dissimilarity


def _scaled(differences: torch.Tensor) -> torch.Tensor:
    """Differences divided by their overall RMS (see the module docstring)."""
    return differences / differences.pow(2).mean().sqrt().clamp_min(1e-12)


class GameAggregator(nn.Module):
    """Encoder + experts + per-client gates (or the GAT / mean ablations) over (N, D) differences;
    ``slots`` (N,) says which client slot (personalized gate) each row belongs to."""

    def __init__(self, in_features: int, settings: GameSettings, seed: int):
        super().__init__()
        self.settings = s = settings
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.encoder = nn.Linear(in_features, s.hidden)
            self.experts = nn.Parameter(torch.randn(s.experts, s.hidden, s.hidden) / math.sqrt(s.hidden))
            self.gate_weight = nn.Parameter(torch.randn(s.max_clients, s.hidden, s.experts) / math.sqrt(s.hidden))
            self.gate_bias = nn.Parameter(torch.zeros(s.max_clients, s.experts))
            self.noise_weight = nn.Parameter(torch.randn(s.max_clients, s.hidden, s.experts) / math.sqrt(s.hidden))
            self.gat = nn.Linear(2 * s.hidden, 1, bias=False)
        self.eval()  # gate noise only inside ``fit``

    def gates(self, h: torch.Tensor, slots: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(N, E) sparse expert weights: noisy logits (noise only in training mode), top-k, softmax
        over the kept k (section 2.3 (2))."""
        logits = torch.einsum("nh,nhe->ne", h, self.gate_weight[slots]) + self.gate_bias[slots]
        if self.training:
            spread = F.softplus(torch.einsum("nh,nhe->ne", h, self.noise_weight[slots]))
            logits = logits + torch.randn(logits.shape, generator=generator) * spread
        kept, index = logits.topk(self.settings.top_k, dim=1)
        return torch.zeros_like(logits).scatter(1, index, kept.softmax(dim=1))

    def scores(self, h: torch.Tensor, slots: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(N, N) relevance of client j's message to client i, before the softmax."""
        if self.settings.variant == "gat":
            a_src, a_dst = self.gat.weight[0].split(self.settings.hidden)
            return F.leaky_relu((h @ a_src)[:, None] + (h @ a_dst)[None, :], 0.2)
        per_expert = torch.einsum("ih,ehk,jk->eij", h, self.experts, h) / math.sqrt(self.settings.hidden)
        return torch.einsum("ie,eij->ij", self.gates(h, slots, generator), per_expert)

    def attention(self, differences: torch.Tensor, slots: torch.Tensor | None = None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
        """(N, N) row-stochastic attention over each client's peers (zero diagonal); a lone client
        attends to itself, having no peers."""
        n = len(differences)
        if n == 1:
            return torch.ones(1, 1, dtype=differences.dtype)
        peers = ~torch.eye(n, dtype=torch.bool)
        if self.settings.variant == "mean":
            return peers.to(differences.dtype) / (n - 1)
        slots = torch.arange(n) if slots is None else slots
        scores = self.scores(self.encoder(_scaled(differences)), slots, generator) / self.settings.temperature
        return scores.masked_fill(~peers, float("-inf")).softmax(dim=1)

    def forward(self, differences: torch.Tensor, slots: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Eq. 1: (N, D) personalized differences from (N, D) selected differences."""
        beta = self.settings.balance
        return beta * differences + (1 - beta) * self.attention(differences, slots, generator) @ differences

    def loss(self, differences: torch.Tensor, slots: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """The meta-loss (eq. 3) of the personalized against the clients' own differences, both
        RMS-scaled."""
        s, target = self.settings, _scaled(differences)
        return meta_loss(self(target, slots, generator), target, s.l2_weight, s.cosine_weight)

    def fit(self, differences: torch.Tensor, steps: int, lr: float, seed: int,
            slots: torch.Tensor | None = None) -> list[float]:
        """``steps`` Adam steps on the meta-loss (eq. 3) of this round's differences, gate noise
        drawn from ``seed``; the loss before each step. Each call starts a fresh Adam, so a restart
        that reloads ``state_dict`` trains on exactly as before. Leaves the module in eval mode."""
        generator = torch.Generator().manual_seed(seed)
        optimizer = torch.optim.Adam(self.parameters(), lr=lr)
        losses = []
        self.train()
        for _ in range(steps):
            loss = self.loss(differences.detach(), slots, generator)
            losses.append(loss.item())
            if loss.requires_grad:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        self.eval()
        return losses
