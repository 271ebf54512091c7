"""The training mode and prompt mode's settings (``mode``, ``foundation``, ``[prompt]`` of agent.toml
and coordinator.toml): torch-free, so that configs are checked before the prompts
(``edge_agent.models.prompts``) load."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_agent.levels import QuantileLevels


class PromptConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lookback: int = Field(12, ge=1, description="observed steps L before the forecast; lookback + horizon must "
                                                "equal the foundation model's window")
    horizon: int = Field(12, ge=1, description="forecast steps H after the lookback")
    task: Literal["multivariate", "single"] = Field(
        "multivariate", description="task 2 (all variables) or task 1 (one target variable)"
    )
    target: str = Field("temp_air", description="with task = 'single': the variable forecast (one of the foundation "
                                                "model's variables)")
    spatial: int = Field(8, ge=1, description="size of the spatial prompt P_S")
    quantiles: QuantileLevels | None = Field(
        None, description="quantile levels of the FFN's output layer (e.g. 0.1, 0.5, 0.9); None = point forecasts"
    )


class PromptModeSettings(BaseModel):
    """The training mode and, for prompt mode, the foundation model: the same fields in
    ``agent.toml`` and ``coordinator.toml``, since both sides must name the same backbone."""

    mode: Literal["head", "prompt", "pretrain"] = Field(
        "head", description="what is trained: QAP + FedPer head, FedPoD prompts around a frozen foundation model, "
                            "or the foundation model itself (federated pretraining, FeDaL or FedPoD's)"
    )
    foundation: Path | None = Field(None, description="prompt mode: the pretrained foundation checkpoint")
    foundation_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="refuse any other backbone")
    prompt: PromptConfig = Field(PromptConfig(), description="prompt mode: the windows and the task the prompts "
                                                             "are trained for")

    @model_validator(mode="after")
    def _foundation_for_prompts(self) -> "PromptModeSettings":
        if self.mode == "prompt" and self.foundation is None:
            raise ValueError("mode 'prompt' needs foundation = <pretrained checkpoint> (edgefl pretrain)")
        return self
