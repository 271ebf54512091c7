"""The model's calendar inputs from epoch nanoseconds with numpy alone, so the serving path needs
no pandas; ``edge_agent.data.arrays.time_features`` is this function on a DatetimeIndex."""

from __future__ import annotations

import numpy as np

NS_PER_S, S_PER_DAY = 1_000_000_000, 86_400
EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (Monday = 0, as pandas' day_of_week)


def calendar_features(times_ns: np.ndarray) -> np.ndarray:
    """Cyclic calendar features (L, 4) float32 of timestamps given as int64 nanoseconds since the
    epoch (naive times read as they are): sin/cos of the hour of day and of the day of week."""
    seconds = np.asarray(times_ns, dtype=np.int64) // NS_PER_S
    days, in_day = np.divmod(seconds, S_PER_DAY)
    day_fraction = (in_day // 3600 + (in_day % 3600 // 60) / 60.0) / 24.0
    hour = 2 * np.pi * day_fraction
    week = 2 * np.pi * ((days + EPOCH_WEEKDAY) % 7 + day_fraction) / 7.0
    return np.stack((np.sin(hour), np.cos(hour), np.sin(week), np.cos(week)), axis=1).astype(np.float32)
