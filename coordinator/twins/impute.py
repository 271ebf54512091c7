"""Fill a round's missing clients with their twins' forecasts (FedDTW section 2, Algorithm 5 line 13)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.strategies.base import ClientUpdate
from coordinator.twins.base import TensorDict, TwinForecaster
from coordinator.twins.history import TwinHistory


@dataclass(frozen=True)
class Imputation:
    """The forecast updates of missing clients, and the missing clients left out (no history,
    or none recent enough)."""

    updates: list[ClientUpdate]
    dropped: list[str]

    @property
    def imputed(self) -> list[str]:
        return [update.client_id for update in self.updates]


def impute_missing(
    missing: Sequence[tuple[str, int]], history: TwinHistory, forecaster: TwinForecaster,
    round_number: int = 0, max_age: int | None = None,
) -> Imputation:
    """Forecast each missing ``(client, n_samples)``; it enters aggregation with its own weight.

    With ``max_age``, a client whose last report is more than ``max_age`` rounds before
    ``round_number`` is dropped instead (a gateway gone for good is not averaged in forever; the
    paper sets no limit). Forecasts are cast back to the dtype of the client's last state
    (integer buffers such as BatchNorm's ``num_batches_tracked`` are rounded), so an imputed
    update looks like a real one.
    """
    updates, dropped = [], []
    for client, n_samples in missing:
        last = history.last_round(client)
        if max_age is not None and last is not None and round_number - last > max_age:
            dropped.append(client)
            continue
        past = history.history(client)
        forecast = forecaster.forecast(past)
        if forecast is None:
            dropped.append(client)
        else:
            updates.append(ClientUpdate(client, _cast_like(forecast, past[-1]), n_samples))
    return Imputation(updates, dropped)


def _cast_like(state: TensorDict, template: TensorDict) -> TensorDict:
    out = {}
    for name, tensor in state.items():
        dtype = template[name].dtype
        rounded = tensor.round() if tensor.is_floating_point() and not dtype.is_floating_point else tensor
        out[name] = rounded.to(dtype)
    return out
