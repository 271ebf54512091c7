"""The product's default recipe in one place, as plain values (no torch: the CLI reads it for its
defaults before any model is built). Chosen by measurement in ``bench/value.py`` and
``bench/ablation.py`` (README, "Does joining the fleet pay?"): a week of hourly lookback, a day
ahead, every feature its own sequence through one shared DLinear whose head is shared too, a
seasonal base, the MAE loss; small batches and at least 64 steps a round (more passes over a
short history); and every gateway serving the best of its federated
model, its local-only model, the anchors and the median of them on its known outcomes, a
day's weight halving every two weeks, and serving the mean of the best two (``edge_agent.choice``)."""

from __future__ import annotations

MODEL = {"backbone": "dlinear", "interval": "1h", "d_qap": 1, "qap_heads": 1, "projection": "channel", "head": "shared",
         "seasonal_base": True, "loss": "mae"}
SPANS = {"lookback": "7d", "horizon": "1d", "season": "1d"}
"""The model's windows in time, turned into steps of the data's sampling interval (``ModelConfig``):
at hourly data 168, 24 and 24 steps, at half-hourly data 336, 48 and 48."""
ANCHORS = ("seasonal_naive", "seasonal_naive_week", "window_average", "ets", "ets_noseason", "theta")
"""What a gateway compares itself with: every anchor but MSTL, whose refits cost seconds per feature
over a validation split (``edge_agent.anchors``)."""
TRAINING = {"batch_size": 32, "lr": 3e-3, "min_steps": 64, "max_steps": 512, "keep_local": True, "anchors": ANCHORS, "median": True,
            "selection_days": 14, "combine": 2}
