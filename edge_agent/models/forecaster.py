"""The per-client model: alignment -> time fusion -> backbone -> personalized head."""

from __future__ import annotations

import torch
from torch import nn

from edge_agent.models.backbones import BACKBONES
from edge_agent.models.config import ModelConfig
from edge_agent.models.heads import PersonalHead, QuantileHead
from edge_agent.models.qap import QueryAttentionPooling, SlotEmbedding, TimeFusion
from edge_agent.models.seasonal import SeasonalBase
from edge_agent.tensors import TensorDict, check_layout, layout_of

SHARED_PREFIX = "shared."

class Forecaster(nn.Module):
    """One client's forecaster with FedPer's split made structural.

    The rule (FedQAPer Algorithm 2): everything under ``shared`` (QAP value projection,
    queries, attention, fusion, norm, time projection, concat fusion, backbone) is
    aggregated; everything under ``personal`` (slot embeddings or the plain per-client
    projection, and the forecast head) stays on the device. The personal part is exactly
    what depends on the client's feature count F_i. A channel-independent model's head does not
    depend on F_i: with ``head = "shared"`` it is aggregated too, and only the slot vectors of a
    gateway's own features stay on the device.
    """

    def __init__(self, cfg: ModelConfig, n_features: int, time_features: int):
        super().__init__()
        self.cfg, self.n_features, self.time_features = cfg, n_features, time_features
        self.levels = cfg.quantiles
        backbone = BACKBONES[cfg.backbone](cfg)
        self.shared = nn.ModuleDict(
            {"time": TimeFusion(time_features, cfg.d_qap), "backbone": backbone}
        )
        outputs = 1 if self.channel_independent else n_features
        head = (QuantileHead(backbone.out_shape, cfg.horizon, outputs, cfg.quantiles) if cfg.quantiles
                else PersonalHead(backbone.out_shape, cfg.horizon, outputs))
        self.personal = nn.ModuleDict()
        (self.shared if cfg.head == "shared" else self.personal)["head"] = head
        if cfg.projection == "qap":
            self.shared["qap"] = QueryAttentionPooling(cfg)
            self.personal["slots"] = SlotEmbedding(n_features, cfg.d_qap)
        elif self.channel_independent:
            self.shared["value"] = nn.Linear(1, cfg.d_qap)
            self.personal["slots"] = SlotEmbedding(n_features, cfg.d_qap)
        else:
            self.personal["project"] = nn.Linear(n_features, cfg.d_qap)
        if cfg.seasonal_base:
            self.shared["base"] = SeasonalBase(cfg.lookback, cfg.horizon, cfg.season)
            nn.init.zeros_(head.channels.weight)
            nn.init.zeros_(head.channels.bias)

    @property
    def kind(self) -> str:
        return self.shared["backbone"].kind

    @property
    def head(self) -> nn.Module:
        """The forecast head: personal (FedPer), or shared by the fleet (``head = "shared"``)."""
        return (self.shared if self.cfg.head == "shared" else self.personal)["head"]

    @property
    def channel_independent(self) -> bool:
        """Whether every feature is its own sequence through the shared model (``projection = "channel"``)."""
        return self.cfg.projection == "channel"

    def align(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, F_i) -> (B, L, d_qap); channel-independent: (B * F_i, L, d_qap), each feature's
        values embedded by the shared value projection plus the feature's own slot vector."""
        if self.cfg.projection == "qap":
            return self.shared["qap"](x, self.personal["slots"].weight)
        if self.channel_independent:
            per_feature = x.transpose(1, 2).unsqueeze(-1)  # (B, F, L, 1)
            embedded = self.shared["value"](per_feature) + self.personal["slots"].weight[:, None, :]
            return embedded.flatten(0, 1)
        return self.personal["project"](x)

    def forward(self, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        """``x`` (B, L, F_i) scaled values, ``marks`` (B, L, t) time features -> (B, H, F_i): the
        point forecast, which is the median of a quantile model (``cfg.quantiles``).

        With ``instance_norm`` each window is centred and scaled per feature before the model
        and the forecast is mapped back (the ``use_norm`` of the iTransformer reference code,
        RevIN without affine terms): a chronological split puts val/test at other levels than
        train, and QAP's LayerNorm over a scalar's projection saturates outside the trained
        range (measured on the weather pool: val MSE rose round after round without it).
        """
        z, mean, std = self.encode(x, marks)
        return self.readout(self.shared["backbone"](z), mean, std)

    def forward_quantiles(self, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        """A quantile model's full forecast (B, H, F_i, Q), non-crossing, levels ``cfg.quantiles``."""
        z, mean, std = self.encode(x, marks)
        return self.readout_quantiles(self.shared["backbone"](z), mean, std)

    @staticmethod
    def window_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-window, per-feature mean and std (B, 1, F) used by ``instance_norm``."""
        mean = x.mean(1, keepdim=True)
        return mean, ((x - mean).square().mean(1, keepdim=True) + 1e-5).sqrt()

    def encode(self, x: torch.Tensor, marks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Everything before the backbone: (x, marks) -> aligned, time-fused z (B, L, d_qap) and the
        window mean and std (B, 1, F_i) that ``readout`` undoes (0 and 1 without ``instance_norm``).
        With ``seasonal_base`` the mean becomes the offset the head's output is added to, (B, H, F_i):
        the window mean plus the seasonal base (``edge_agent.models.seasonal``) in data scale."""
        if self.cfg.instance_norm:
            mean, std = self.window_stats(x)
        else:
            mean, std = torch.zeros_like(x[:, :1]), torch.ones_like(x[:, :1])
        normalized = (x - mean) / std
        if self.cfg.seasonal_base:
            mean = mean + self.shared["base"](normalized) * std
        return self.shared["time"](self.align(normalized), marks), mean, std

    def readout(self, representation: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Everything after the backbone: its representation (B, A, C) -> personal head -> forecast
        (B, H, F_i) in the window's own scale (``encode``'s mean and std); a quantile model's median."""
        if self.levels:
            return self.readout_quantiles(representation, mean, std)[..., self.cfg.median_index]
        return self._per_feature(self.head(representation), mean) * std + mean

    def readout_quantiles(self, representation: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """``readout`` for a quantile model: (B, A, C) -> (B, H, F_i, Q). Scaling by a positive std
        keeps the quantiles non-crossing."""
        if not self.levels:
            raise ValueError("readout_quantiles: this model's config has no quantiles (point forecasts)")
        head = self._per_feature(self.head(representation), mean)
        return head * std.unsqueeze(-1) + mean.unsqueeze(-1)

    def _per_feature(self, head: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """The head's output as (B, H, F_i, ...): channel-independent heads give one feature per
        sequence, (B * F_i, H, 1, ...), put back side by side."""
        if not self.channel_independent:
            return head
        batch, features = mean.shape[0], mean.shape[-1]
        per_feature = head.squeeze(2).unflatten(0, (batch, features))  # (B, F, H, ...)
        return per_feature.transpose(1, 2)

    def _shared_tensors(self) -> TensorDict:
        return {
            name: tensor
            for name, tensor in self.state_dict().items()
            if name.startswith(SHARED_PREFIX) and tensor.is_floating_point()
        }

    def shared_state(self) -> TensorDict:
        """The parameters and float buffers that go on the wire, as detached copies."""
        return {name: tensor.detach().clone() for name, tensor in self._shared_tensors().items()}

    def personal_state(self) -> TensorDict:
        """Everything that stays on the device (includes integer BatchNorm counters)."""
        shared = self._shared_tensors()
        return {k: v.detach().clone() for k, v in self.state_dict().items() if k not in shared}

    def load_shared_state(self, state: TensorDict) -> None:
        """Install aggregated shared parameters; names, shapes and dtypes must match exactly
        (``LayoutError`` otherwise)."""
        check_layout(state, layout_of(self._shared_tensors()), "shared state")
        self.load_state_dict(state, strict=False)


def build_forecaster(cfg: ModelConfig, n_features: int, time_features: int, seed: int) -> Forecaster:
    """Build a forecaster with deterministic initialisation under ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Forecaster(cfg, n_features, time_features)
