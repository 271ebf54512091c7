"""Zero-shot forecasts with the foundation model alone, for a gateway whose history is still too
short to train anything of its own.

FedPoD (appendix B.1, section 3.2; our reading in ``edge_agent.models.prompts``) pretrains the
foundation model to fill masked positions, so forecasting is filling H future positions appended,
zeroed, after the observed ones. FeDaL ("Federated Dataset Learning for General Time Series
Foundation Models", arXiv 2508.04045, zero-shot forecasting, Table 4) forecasts with the federated
foundation model alone on data it was never trained on. Here: the latest ``window - H`` rows,
standardized with the gateway's own statistics and placed on the canonical variable layout
(unmeasured variables zero, as in pretraining), then H zeroed positions; the model's
reconstruction of those positions, in the data's own units, is the forecast.
"""

from __future__ import annotations

import numpy as np
import torch

from edge_agent.data import DataError, SeriesTable, StandardScaler
from edge_agent.data.canonical import canonical_index
from edge_agent.models.foundation import FoundationModel

STATS_ROWS = 10_000  # the latest present rows the scaling statistics use: bounded cost on long histories


def context_rows(foundation: FoundationModel, horizon: int) -> int:
    """Observed positions before the ``horizon`` forecast positions in the foundation's window."""
    window = foundation.cfg.window
    if not 1 <= horizon < window:
        raise ValueError(f"horizon {horizon}: a zero-shot forecast needs 1 <= horizon < the foundation window {window}")
    return window - horizon


def fit_scaler(table: SeriesTable) -> StandardScaler:
    """Per-column statistics of the latest ``STATS_ROWS`` present rows (a constant column keeps std 1)."""
    return StandardScaler().fit(table.values[table.present][-STATS_ROWS:])


@torch.no_grad()
def zero_shot_forecast(foundation: FoundationModel, table: SeriesTable, horizon: int) -> np.ndarray:
    """(horizon, F) forecast of ``table``'s columns after its last row, in the data's units.

    Refused with the reason: a horizon that leaves no context in the window, fewer rows than the
    context, a gap in the context rows, or a column the foundation model does not know."""
    context = context_rows(foundation, horizon)
    index = canonical_index(table, foundation.cfg.variables)
    if table.n_rows < context:
        raise DataError(f"{table.name}: {table.n_rows} rows; a zero-shot forecast of {horizon} steps needs the "
                        f"latest {context} (foundation window {foundation.cfg.window} - horizon {horizon})")
    if not table.present[-context:].all():
        raise DataError(f"{table.name}: the latest {context} steps have a gap; no zero-shot forecast from them")
    scaler = fit_scaler(table)
    scaled = torch.from_numpy(scaler.transform(table.values[-context:]).astype(np.float32))
    return scaler.inverse_transform(fill_horizon(foundation, scaled[None], index, horizon)[0].numpy())


@torch.no_grad()
def fill_horizon(foundation: FoundationModel, context: torch.Tensor, index: torch.Tensor, horizon: int) -> torch.Tensor:
    """(B, horizon, F) standardized forecasts from a batch of standardized ``context`` (B, >= C, F):
    its latest C = window - horizon rows placed at ``index`` of the canonical layout (other
    variables zero), then ``horizon`` zeroed positions, which the model's reconstruction fills."""
    size = context_rows(foundation, horizon)
    if context.shape[1] < size:
        raise ValueError(f"a context of {context.shape[1]} rows; a {horizon}-step zero-shot forecast needs {size}")
    x = torch.zeros(len(context), foundation.cfg.window, len(foundation.cfg.variables))
    x[:, :size, index] = context[:, -size:].float()
    return foundation.eval()(x)[:, size:, index]
