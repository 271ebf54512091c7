"""``agent.toml``: the fleet's model settings and the agent's own. The TOML plumbing of every
service config, ``[data]`` and the tables of a live gateway's sensor side are in the torch-free
``edge_agent.toml_config`` (imported here too, so this module stays every config's entry)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_agent.broker_settings import DEFAULT_MAX_PAYLOAD_BYTES, BrokerConfig
from edge_agent.limits import NAME_PATTERN
from edge_agent.models import ModelConfig
from edge_agent.models.fedal_settings import FedalClientSettings
from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.models.prompt_settings import PromptModeSettings
from edge_agent.recipe import TRAINING as RECIPE
from edge_agent.sensors.settings import SensorSettings, ServingSettings
from edge_agent.toml_config import (  # noqa: F401  (re-exported: every config imports them from here)
    ConfigError,
    DataSource,
    LiveGatewayConfig,
    dump_toml,
    load_config,
)
from edge_agent.training_settings import HeadTraining, with_defaults

MODE_FIELDS = {"head": {"model"}, "prompt": {"foundation", "foundation_sha256", "prompt"},
               "pretrain": {"foundation_model", "fedal_client"}}
SIGNED_FIELDS = {"head": ("model",), "prompt": ("foundation_sha256", "prompt"),
                 "pretrain": ("foundation_model", "fedal_client")}  # what the model signature stands for
SHOWN_CHARS = 40  # of one value in a difference


class FleetModel(PromptModeSettings):
    """What the fleet trains: the same fields in ``agent.toml`` and ``coordinator.toml``, since both
    sides must build the same model (head mode: ``model``; prompt mode: foundation + prompts;
    pretrain mode: the foundation model's sizes and FeDaL's device side). Settings of the other
    modes are refused rather than silently ignored."""

    model: ModelConfig = ModelConfig()
    foundation_model: FoundationConfig = Field(
        FoundationConfig(), description="pretrain mode: the foundation model being pretrained (its sizes)")
    fedal_client: FedalClientSettings | None = Field(
        None, description="pretrain mode: FeDaL's device side (patch masks, DBE, core-sets); absent: FedPoD's plain "
                          "masked pretraining")

    @model_validator(mode="after")
    def _one_mode(self) -> "FleetModel":
        other = set().union(*(fields for mode, fields in MODE_FIELDS.items() if mode != self.mode))
        given = sorted(other & self.model_fields_set)
        if given:
            raise ValueError(f"{', '.join(given)}: not used in mode {self.mode!r}")
        return self


def signed_settings(cfg: FleetModel) -> dict:
    """The settings a fleet's model signature stands for, as plain data: what a hello carries so
    that a refusal can name every field where an agent's model differs from the fleet's."""
    values = {name: getattr(cfg, name) for name in SIGNED_FIELDS[cfg.mode]}
    return {"mode": cfg.mode, **{name: v.model_dump(mode="json") if isinstance(v, BaseModel) else v
                                 for name, v in values.items()}}


def differences(fleet: dict, agent: dict, prefix: str = "") -> list[str]:
    """Every field where an agent's settings differ from the fleet's, as ``path: agent X, fleet
    Y`` (nested tables walked; cost bounded by the inputs, which a header bounds)."""
    found = []
    for key in sorted({*fleet, *agent}, key=str):
        ours, theirs = fleet.get(key, "(unset)"), agent.get(key, "(unset)")
        if isinstance(ours, dict) and isinstance(theirs, dict):
            found += differences(ours, theirs, f"{prefix}{key}.")
        elif ours != theirs:
            found.append(f"{prefix}{key}: agent {_shown(theirs)}, fleet {_shown(ours)}")
    return found


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


AgentTraining = with_defaults(
    HeadTraining, "AgentTraining", __name__,
    """Local training plus how densely the gateway cuts its history into training windows. The
    defaults are the product's recipe (``edge_agent.recipe.TRAINING``; README, "Does joining the
    fleet pay?"): small batches, and the gateway serves the mean of the two of its federated
    model, its local-only model, the anchors and their median that score best.""",
    RECIPE, stride=(int, Field(1, ge=1, description="step between training windows")))


class AgentConfig(FleetModel):
    """``agent.toml``: who this gateway is, its data, its model and the broker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str = Field(pattern=NAME_PATTERN, description="the fleet's name, as in coordinator.toml: its MQTT topics "
                                                         "are under edgefl/<fleet>/")
    client_id: str = Field(pattern=NAME_PATTERN, description="this gateway's id in the fleet: its topics "
                                                             "(edgefl/<fleet>/agents/<client_id>/) and its name in "
                                                             "allowed_clients")
    state_dir: Path = Field(description="folder of the agent's state, created if missing: its models, training "
                                        "progress, the update to (re)send and a live gateway's readings")
    data: DataSource
    dp_sigma: float = Field(0.0, ge=0.0, description="prompt mode: std of Gaussian noise on uploaded prompts (privacy)")
    training: AgentTraining = AgentTraining()
    seed: int = Field(42, description="base of the agent's seed streams (model initialization, shuffling, dropout), "
                                      "combined with client_index and the round")
    client_index: int = Field(0, ge=0, description="this client's index in the fleet's seed schedule")
    max_payload_bytes: int = Field(DEFAULT_MAX_PAYLOAD_BYTES, ge=1024, description="largest MQTT message, in bytes, "
                                   "the agent accepts (the broker's max_packet_size, less the MQTT headers); it refuses "
                                   "to start if its updates would be larger")
    max_global_growth: float = Field(
        100.0, gt=1.0, description="refuse a global model whose L2 norm exceeds this multiple of the last accepted "
                                   "one's (at least 1.0): a poisoned average is not trained on")
    broker: BrokerConfig = BrokerConfig()
    give_up_after_s: float = Field(30.0, ge=0, description="refused for good (not allowed, another model) this long "
                                   "and at least 3 times, the agent exits with status 3")
    sensors: SensorSettings | None = Field(None, description="the gateway's sensors; needed with data.source = "
                                                             "'sensors' and only then")
    serving: ServingSettings | None = Field(None, description="a live gateway: publish forecasts on its local broker")
    zero_shot_foundation: Path | None = Field(
        None, description="head mode: a pretrained foundation checkpoint (edgefl pretrain) that `agent forecast` "
                          "uses alone (zero-shot) while the local history is too short to train on or no model is "
                          "trained yet; prompt mode does this with its `foundation`")
    zero_shot_foundation_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="refuse any other zero-shot checkpoint")

    @model_validator(mode="after")
    def _settings_of_this_mode(self) -> "AgentConfig":
        if (self.data.source == "sensors") != (self.sensors is not None):
            raise ValueError("sensors: required when data.source = 'sensors'" if self.sensors is None
                             else "sensors: given, but data.source is not 'sensors'")
        if self.serving is not None and (self.sensors is None or self.mode != "head"):
            raise ValueError("serving: publishes a head-mode model's forecasts on the [sensors] broker; "
                             "set data.source = 'sensors' and [sensors]")
        if self.dp_sigma > 0 and self.mode != "prompt":
            raise ValueError("dp_sigma: noise applies to uploaded prompts (mode 'prompt')")
        zero_shot = sorted({"zero_shot_foundation", "zero_shot_foundation_sha256"} & self.model_fields_set)
        if zero_shot and self.mode != "head":
            why = "forecasts zero-shot with its foundation" if self.mode == "prompt" else "serves no forecasts"
            raise ValueError(f"{', '.join(zero_shot)}: mode {self.mode!r} {why}")
        if self.zero_shot_foundation_sha256 and self.zero_shot_foundation is None:
            raise ValueError("zero_shot_foundation_sha256: given without zero_shot_foundation")
        head_only = sorted({"personal_epochs", "alternate", "prox_mu"} & self.training.model_fields_set)
        if head_only and self.mode != "head":
            raise ValueError(f"training.{', '.join(head_only)}: head-mode options, not used in mode {self.mode!r}")
        return self

    def live_gateway(self) -> LiveGatewayConfig:
        """The tables a live gateway's sensor side reads (``data.source = "sensors"`` only), as the
        serving-only process sees them."""
        return LiveGatewayConfig(client_id=self.client_id, state_dir=self.state_dir, data=self.data,
                                 sensors=self.sensors, serving=self.serving)
