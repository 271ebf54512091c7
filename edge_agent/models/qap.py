"""Feature alignment: Query Attention Pooling (FedQAPer section 3.2, Algorithm 1) and its baseline."""

from __future__ import annotations

import torch
from torch import nn

from edge_agent.models.config import ModelConfig


class QueryPooling(nn.Module):
    """Multi-head cross-attention from a few learned queries over a set of vectors.

    Same parameters and result as ``nn.MultiheadAttention(queries, keys=x, values=x)``, but
    with few queries the key and value projections are moved off the set: the query is
    folded into the key weights (scores = x . W_k^T q; the key bias only shifts every score
    equally and cancels in the softmax) and the values are projected after pooling. That
    costs O(F d h) per set instead of O(F d^2), which is what makes QAP affordable on a CPU.
    """

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, queries: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``queries`` (Q, d), ``x`` (N, F, d) -> (N, Q, d)."""
        d = x.shape[-1]
        head_dim = d // self.heads
        q = self.q(queries).unflatten(-1, (self.heads, head_dim))
        keys = torch.einsum("qhe,hed->qhd", q, self.k.weight.unflatten(0, (self.heads, head_dim)))
        scores = x @ (keys.flatten(0, 1).T / head_dim**0.5)
        pooled = scores.softmax(1).transpose(1, 2) @ x
        pooled = pooled.unflatten(1, (queries.shape[0], self.heads))
        values = torch.einsum("nqhd,hed->nqhe", pooled, self.v.weight.unflatten(0, (self.heads, head_dim)))
        values = values + self.v.bias.unflatten(0, (self.heads, head_dim))
        return self.out(values.flatten(-2))


class QueryAttentionPooling(nn.Module):
    """Pools a variable number of feature channels into one ``d_qap`` vector per time step.

    Steps 1-4 of FedQAPer section 3.2: a shared ``Linear(1, d)`` value projection plus the
    client's slot embeddings, LayerNorm, multi-head cross-attention from ``Q`` learnable
    queries over the features of each time step, and a two-layer FFN fusing the attention
    output with the mean and max over features. Every parameter here is shared; the slot
    embeddings are personal and passed in.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_qap
        self.value = nn.Linear(1, d)
        self.norm = nn.LayerNorm(d)
        self.queries = nn.Parameter(torch.randn(cfg.qap_queries, d) * 0.02)
        self.attn = QueryPooling(d, cfg.qap_heads)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.fuse = nn.Sequential(
            nn.Linear((cfg.qap_queries + 2) * d, d), nn.GELU(), nn.Linear(d, d)
        )

    def forward(self, x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """``x`` (B, L, F) and ``slots`` (F, d) -> (B, L, d)."""
        batch, length, features = x.shape
        values = self.norm(self.value(x.unsqueeze(-1)) + slots)
        flat = values.reshape(batch * length, features, -1)
        pooled = self.attn_dropout(self.attn(self.queries, flat)).flatten(1)
        fused = self.fuse(torch.cat([pooled, flat.mean(1), flat.max(1).values], dim=-1))
        return fused.reshape(batch, length, -1)


class SlotEmbedding(nn.Module):
    """The client's learnable slot vector per feature channel (personal: its shape is F_i x d)."""

    def __init__(self, n_features: int, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_features, d) * 0.02)


class TimeFusion(nn.Module):
    """Step 5 of section 3.2: project time features to ``d`` and fuse them by concat + Linear(2d, d)."""

    def __init__(self, time_features: int, d: int):
        super().__init__()
        self.project = nn.Linear(time_features, d)
        self.concat = nn.Linear(2 * d, d)

    def forward(self, z: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        """``z`` (B * copies, L, d) and ``marks`` (B, L, t): the time features are projected once per
        window and shared by its ``copies`` sequences (a channel-independent model's features).
        The concat Linear is applied as its two halves: the same map without building the concat."""
        d = z.shape[-1]
        copies = z.shape[0] // marks.shape[0]
        weight, bias = self.concat.weight, self.concat.bias
        time = nn.functional.linear(self.project(marks), weight[:, d:], bias)  # (B, L, d)
        values = nn.functional.linear(z, weight[:, :d])
        return (values.unflatten(0, (marks.shape[0], copies)) + time[:, None]).flatten(0, 1)
