"""Which strategy aggregates a fleet's updates and every strategy's settings (``strategy`` and its
tables in coordinator.toml, and the simulations'): torch-free, so that a config is checked before
any strategy loads. Adding a strategy is one module under ``coordinator/strategies/`` plus one
line in ``STRATEGIES``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.registry import LazyRegistry, registered

STRATEGIES: LazyRegistry[type] = LazyRegistry("coordinator.strategies", {  # coordinator.strategies.base.Strategy each
    "fedavg": "fedavg:FedAvg",
    "fedavgm": "fedopt:FedAvgM",
    "fedadam": "fedopt:FedAdam",
    "fedpod": "fedpod:FedPoD",
    "median": "median:Median",
    "trimmed_mean": "trimmed_mean:TrimmedMean",
    "dp_fedavg": "dp_fedavg:DPFedAvg",
    "fedal": "fedal:FeDaL",
    "fedgame": "fedgame:FedGAME",
})
VARIANTS = ("game", "gat", "mean")
"""Fed-GAME's aggregators (``coordinator.strategies.game``)."""
MAX_BUFFER = 10_000  # bound on K and on the staleness kept (rounds)


class RobustSettings(BaseModel):
    """How updates are bounded before aggregation, and the robust aggregators' trimming.

    The defaults leave honest rounds alone (honest delta norms stay within about 1.5 times the
    median on the bundled stations; weights change only for a client that declared more than 3
    times the fleet's median count) while rejecting scaled or absurd updates. A looser weight
    cap of 10 let one client lying at hello take 10/16 of the weight of 7 clients and, over 15
    rounds, raise the honest clients' loss by half (bench/robustness.py, hello_inflation)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_samples: int | None = Field(None, ge=1, description="cap on an update's weight (sample count); "
                                    "the count declared at hello always bounds it; None: no further cap")
    clip_factor: float | None = Field(4.0, ge=1, description="clip each delta to this multiple of the "
                                      "round's median delta norm, and cut the weight of an update whose weight "
                                      "times delta norm exceeds this multiple of the round's median; None: no "
                                      "clipping")
    reject_factor: float | None = Field(20.0, ge=1, description="reject an update whose delta norm exceeds "
                                        "this multiple of the round's median delta norm; None: no rejection")
    min_cosine: float | None = Field(None, ge=-1, le=1, description="reject an update whose delta's cosine with "
                                     "the round's coordinate-wise median delta is below this (rounds of 3 or more "
                                     "updates): 0 refuses a reversed update at any norm, which the clip bound "
                                     "lets through below 4x (issue 27), but on real non-IID fleets it also rejects "
                                     "4.5-10% of honest updates (bench/direction_check.py); None (default): no "
                                     "direction check")
    trust_rate: float | None = Field(None, gt=0, le=1, description="trust over time: how far a client's trust "
                                     "(the average progress of its on-time deltas along the median of the other "
                                     "updates' deltas, in median delta norms; rounds of 3 or more updates) moves toward "
                                     "each new one; the weight of its updates and twin forecasts falls from full at "
                                     "trust_full to 0 (left out, low_trust) at trust_zero; None (default: with 0.2 it cut 3-9% of honest client-rounds "
                                     "on the value fleets at 14 days, docs/security.md): no trust; 0.2 is what "
                                     "docs/security.md measures")
    trust_full: float = Field(-0.15, ge=-4, le=4, description="the trust from which a client keeps its full weight "
                              "(honest clients of the bench's station fleets mostly stay above it, the most unusual "
                              "averaging about -0.09: 4% of their client-rounds fell below on 4 clients, none on 7)")
    trust_zero: float = Field(-0.25, ge=-4, le=4, description="the trust at or below which a client's updates and "
                              "twin forecasts are left out (a below-screen sign flipper's trust stayed at -0.17 to "
                              "-0.8 on the same fleets)")
    trust_prior: float = Field(0.0, ge=-4, le=4, description="the trust a client starts with, before its first "
                               "scored update (0: no evidence either way)")
    weight_factor: float | None = Field(3.0, ge=1, description="cap on an update's weight: this multiple "
                                        "of the median sample count the registered clients declared; None: no cap")
    trim_fraction: float = Field(0.2, gt=0, lt=0.5, description="trimmed_mean: share of the updates cut "
                                 "from each end of every coordinate (beta)")
    site_clients: list[str] = Field(default_factory=list, description="clients that are site aggregators "
                                    "(edgefl aggregator serve): their weight, the sum of their gateways', is bounded "
                                    "by their hello only (max_samples and weight_factor bound the gateways, at "
                                    "their site), and weight_factor's median is taken over the other clients")

    @model_validator(mode="after")
    def _ordered_bounds(self) -> "RobustSettings":
        if self.clip_factor is not None and self.reject_factor is not None and self.reject_factor < self.clip_factor:
            raise ValueError(f"reject_factor {self.reject_factor} is below clip_factor {self.clip_factor}: "
                             "updates would be rejected before they could be clipped")
        if self.trust_zero >= self.trust_full:
            raise ValueError(f"trust_zero {self.trust_zero} is not below trust_full {self.trust_full}")
        return self


class NoiseSettings(BaseModel):
    """DP-FedAvg's clip norm S and noise multiplier z."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    clip_norm: float = Field(1.0, gt=0, description="S: every client's delta is clipped to this L2 norm")
    noise_multiplier: float = Field(1.0, ge=0, description="z: noise std is z * S on the sum of the deltas")


class ServerSettings(BaseModel):
    """The server optimizer's hyperparameters (the paper's defaults where it gives them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(1.0, gt=0, description="server learning rate eta")
    momentum: float = Field(0.9, ge=0, lt=1, description="beta (FedAvgM) or beta1 (FedAdam)")
    beta2: float = Field(0.99, ge=0, lt=1, description="FedAdam's second-moment decay")
    tau: float = Field(1e-3, gt=0, description="FedAdam's adaptivity (denominator floor)")


class GraphSettings(BaseModel):
    """The coordinator's graph training and personalization (appendix B.3 defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(0.99, ge=0.0, le=1.0, description="weight of A P against A' P (eq. 9)")
    subgraph_step: int = Field(2, ge=1, description="S_G: each client is regularized towards N/S_G - 1 neighbours")
    graph_epochs: int = Field(40, ge=1, description="SGD steps fitting the client graphs each round")
    graph_lr: float = Field(1e-3, gt=0, description="learning rate of the graph fitting (SGD)")
    sparsity: float = Field(1.0, ge=0.0, description="weight of the spread term sum A_ij^2 / N in the graph "
                            "objective (keeps a graph from collapsing onto the identity)")


class GBESettings(BaseModel):
    """The server half of FeDaL; the summary names alpha and beta without values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: FoundationConfig = Field(FoundationConfig(), description="the foundation model being pretrained")
    beta: float = Field(0.1, gt=0.0, description="drift-state step beta")
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="weight of the corrected model in the fusion")
    correction: bool = Field(True, description="apply the gradient-level correction (off: ablation)")
    tune_steps: int = Field(10, ge=0, description="core-set tuning steps per round (0: no tuning)")
    tune_lr: float = Field(1e-3, gt=0.0, description="learning rate of core-set tuning (Adam)")
    tune_batch: int = Field(64, ge=1, description="core-set windows per tuning step, drawn with replacement")
    patch: int = Field(3, ge=1, description="patch length of the tuning masks (the clients')")
    mask_rate: float = Field(0.75, gt=0.0, lt=1.0, description="masked share of the tuning masks (the clients')")


class GameSettings(BaseModel):
    """The GAME aggregator and the Fed-GAME server step. Section 3 gives four experts and the
    learning rate 0.0005; top-k, temperature, beta and the meta-loss weights lost their values in
    our copy, so these defaults are ours (top-2 of 4 as in Shazeer et al.'s router, tau = 1,
    an even balance, equal loss weights)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: str = Field("game", description="aggregator: game, gat (single attention) or mean (of peers)")
    experts: int = Field(4, ge=1, description="shared scoring experts (section 3: four)")
    top_k: int = Field(2, ge=1, description="experts each client's gate keeps")
    temperature: float = Field(1.0, gt=0.0, description="tau of the attention softmax")
    balance: float = Field(0.5, ge=0.0, le=1.0, description="beta of eq. 1: weight of a client's own difference")
    hidden: int = Field(64, ge=1, description="encoder output size H")
    lr: float = Field(5e-4, gt=0.0, description="Adam learning rate of the server's meta-training (section 3)")
    steps: int = Field(20, ge=0, description="meta-training steps per round")
    l2_weight: float = Field(1.0, ge=0.0, description="lambda_1 of eq. 3")
    cosine_weight: float = Field(1.0, ge=0.0, description="lambda_2 of eq. 3")
    server_lr: float = Field(1.0, gt=0.0, description="eta_g: step of the averaged difference on the global model")
    max_clients: int = Field(256, ge=1, description="personalized gate slots (one per client ever seen)")
    selected: tuple[str, ...] = Field((), description="tensor-name prefixes personalized (empty: the final layer)")

    @model_validator(mode="after")
    def _consistent(self) -> GameSettings:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant: unknown {self.variant!r}; choose one of {list(VARIANTS)}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k: {self.top_k} exceeds experts ({self.experts})")
        return self


class BufferSettings(BaseModel):
    """``[participation.buffer]``: FedBuff's server side (Nguyen et al., AISTATS 2022, Algorithm 1),
    read only with ``policy = "buffered"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int | None = Field(None, ge=1, le=MAX_BUFFER, description="K: updates (on time, and late ones from "
                             "earlier rounds) that close a round; None: the quorum's count of the round's "
                             "participants")
    server_lr: float = Field(1.0, gt=0, le=10, description="eta_g: the global model moves by this multiple of the "
                             "aggregated (staleness-weighted) change")
    staleness_exponent: float = Field(0.5, ge=0, le=4, description="a: an update trained t rounds before the close "
                                      "enters with its change scaled by s(t) = (1 + t)^-a (0.5: the paper's "
                                      "1/sqrt(1 + t); 0: no discount)")
    max_staleness: int = Field(8, ge=1, le=MAX_BUFFER, description="a late update trained more than this many "
                               "rounds before the close is left out (bounded staleness)")


class ParticipationSettings(BaseModel):
    """``[participation]``: the round policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fraction: float = Field(1.0, gt=0, le=1, description="share of the eligible online clients asked to train "
                            "each round (a seeded draw; at least min_clients)")
    quorum: float = Field(0.8, gt=0, le=1, description="share of a round's participants whose updates let it "
                          "close after the grace period (rounded up; from 3 participants on at most all but one, "
                          "unless 1: wait for all)")
    grace: float = Field(0.5, ge=0, description="after the quorum, wait at most this multiple of the time the "
                         "quorum took for the other participants")
    exclude_after: int = Field(3, ge=1, description="a client that missed this many rounds in a row it was asked "
                               "to is left out for as many rounds, then asked once more, the time out doubling "
                               "with each further miss; only an on-time update clears that (not a hello)")
    policy: Literal["synchronous", "buffered"] = Field(
        "synchronous", description="synchronous: a round closes at quorum + grace or its deadline, a late update "
        "stands in for its client as late_updates says; buffered (FedBuff): a round closes once buffer.size updates "
        "are in, late ones from earlier rounds included, each late change scaled down by its staleness")
    buffer: BufferSettings = Field(BufferSettings(), description="the buffered policy's K, server learning rate "
                                   "and staleness discount")

    @property
    def sampling(self) -> bool:
        """Whether rounds name their participants (else every eligible client trains)."""
        return self.fraction < 1.0

    @property
    def buffering(self) -> BufferSettings | None:
        """The buffer's settings where the policy is buffered (None: synchronous rounds)."""
        return self.buffer if self.policy == "buffered" else None

    @model_validator(mode="after")
    def _buffer_needs_policy(self) -> "ParticipationSettings":
        if self.policy == "synchronous" and self.buffer != BufferSettings():
            raise ValueError("buffer: read only with policy = 'buffered' (set it, or leave [participation.buffer] out)")
        return self


class StrategySettings(BaseModel):
    """Which strategy aggregates and its settings: the same fields in simulations and
    ``coordinator.toml``."""

    strategy: str = Field("fedavg", description="how a round's updates are combined")
    fedpod: GraphSettings = Field(GraphSettings(), description="fedpod: graph training and personalization")
    server: ServerSettings = Field(ServerSettings(), description="fedavgm / fedadam: the server optimizer")
    robust: RobustSettings = Field(RobustSettings(), description="weight caps and norm bounds every update "
                                   "passes, and trimmed_mean's trim share")
    noise: NoiseSettings = Field(NoiseSettings(), description="dp_fedavg: clip norm and noise multiplier")
    fedal: GBESettings = Field(GBESettings(), description="fedal: Global Bias Elimination (correction, core-set "
                               "tuning, fusion)")
    game: GameSettings = Field(GameSettings(), description="fedgame: server learning rate and the GAME aggregator")
    participation: ParticipationSettings = Field(ParticipationSettings(), description="the round policy: who is "
                                                 "asked to train, when a round closes, who is left out")

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, name: str) -> str:
        return registered(name, STRATEGIES, "strategy")
