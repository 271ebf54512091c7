"""Digital twins of clients (FedDTW): the forecasters and the bounded history store. Their
registry and settings are torch-free, in ``coordinator.twin_settings``: adding a forecaster is one
module here plus one line in its ``TWIN_FORECASTERS``."""

from __future__ import annotations

from coordinator.twin_settings import TWIN_FORECASTERS
from coordinator.twins.base import TensorDict, TwinForecaster
from coordinator.twins.history import TwinHistory
from coordinator.twins.impute import Imputation, impute_missing
from edge_agent.registry import registered


def make_forecaster(name: str) -> TwinForecaster:
    """Instantiate a registered forecaster with its paper defaults, or fail listing the names."""
    return TWIN_FORECASTERS[registered(name, TWIN_FORECASTERS, "twin forecaster")]()


__all__ = ["Imputation", "TensorDict", "TwinForecaster", "TwinHistory", "impute_missing", "make_forecaster"]
