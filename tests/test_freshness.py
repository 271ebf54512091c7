"""Stale readings are never served as current: over a real mosquitto, a gateway whose newest
reading is older than ``[serving] stale_after`` withholds its forecast, publishes a retained stale
state (naming the sensor and its age) and logs it once; when readings return it forecasts again and
says fresh. A forecast of a quantity never negative in the history is not negative."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edge_agent.data import load_site, prepare_client
from edge_agent.learners import HeadLearner
from edge_agent.serving.freshness import freshness
from edge_agent.serving.history import SensorHistory
from edge_agent.serving.onnx_serving import OnnxServing, floored, never_negative
from edge_agent.toml_config import LiveGatewayConfig
from edge_agent.training_settings import HeadTraining
from export.bundle import write_bundle
from tests.conftest import small_config
from tests.fleet import wait_for
from tests.test_never_blocked import Arrivals

FEATURES, TOPIC, FORECASTS = ("temp_air", "ghi"), "station/miami", "home/miami/forecast"
FRESHNESS = f"{FORECASTS}/freshness"
HOUR = pd.Timedelta(hours=1)


def test_the_least_recent_feature_decides_and_the_default_allows_two_missed_readings() -> None:
    now = pd.Timestamp("2026-11-28 12:30", tz="UTC").value
    latest = {"temp_air": now - 3 * HOUR.value + 1, "ghi": now - HOUR.value, "never": None}
    state = freshness(latest, now, 3 * HOUR.value)
    assert (state.sensor, state.state) == ("temp_air", "fresh")
    late = freshness({**latest, "temp_air": now - 3 * HOUR.value - 1}, now, 3 * HOUR.value)
    assert late.state == "stale" and "sensor temp_air: newest reading 2026-11-28T09:29:59Z" in late.describe()
    assert freshness({"never": None}, now, 1) is None


def test_a_never_negative_feature_is_floored_at_zero_and_the_others_are_not() -> None:
    history = np.array([[-1.0, 0.0], [2.0, np.nan], [3.0, 5.0]])
    assert never_negative(history) == [False, True]
    values = np.array([[-2.0, -0.5], [1.0, 2.0]])
    np.testing.assert_array_equal(floored(values, [False, True]), [[-2.0, 0.0], [1.0, 2.0]])
    levels = np.stack([values - 1, values, values + 1], axis=-1)
    assert floored(levels, [False, True])[:, 1].min() == 0.0 and floored(levels, [False, True])[0, 0, 0] == -3.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """A bundle of a small model of Miami's temperature and irradiance, and the site's last 3 days."""
    site = load_site("miami").select(list(FEATURES))
    learner = HeadLearner(small_config("dlinear"), prepare_client(site, 24, 12, stride=24), HeadTraining(batch_size=64),
                          3, 0)
    learner.train(1)
    folder = tmp_path_factory.mktemp("agent") / "serving"
    write_bundle(learner, "miami", 2, HOUR.value, folder)
    return folder, pd.DataFrame(site.values[-72:], columns=list(FEATURES))


def readings(rows: pd.DataFrame, last: pd.Timestamp) -> list[bytes]:
    """One JSON reading per row, hourly, the last stamped ``last``."""
    stamps = pd.date_range(end=last, periods=len(rows), freq="h")
    return [json.dumps({**{f: float(row[f]) for f in FEATURES}, "time": stamp.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
            for stamp, (_, row) in zip(stamps, rows.iterrows())]


def test_stale_readings_withhold_the_forecast_publish_a_stale_state_once_and_recover(
    trained, tmp_path: Path, mosquitto, caplog
) -> None:
    folder, rows = trained
    gateway = LiveGatewayConfig.model_validate({
        "client_id": "miami", "state_dir": str(folder.parent), "data": {"source": "sensors"},
        "sensors": {"step": "1h", "broker": {"port": mosquitto.port},
                    "features": [{"name": f, "topic": TOPIC, "path": f, "time_path": "time"} for f in FEATURES]},
        "serving": {"topic": FORECASTS}})
    server, history = OnnxServing(folder), SensorHistory(gateway, mqtt_id="miami-test")
    watch = Arrivals(mosquitto.port, [FORECASTS, FRESHNESS])
    now = pd.Timestamp.now(tz="UTC").floor("h")
    history.start()
    try:
        wait_for(lambda: history.ingest.connected, 60, "the sensor client")
        for payload in readings(rows.iloc[:48], now - 6 * HOUR):  # the newest reading 6 h old: 3 h is the limit
            history.ingest.handle(TOPIC, payload)
        with caplog.at_level(logging.INFO, logger="edgefl.agent"):
            assert not history.publish_forecast(server) and not history.publish_forecast(server)
            wait_for(lambda: watch.on(FRESHNESS), 30, "the stale state")
            stale = json.loads(watch.on(FRESHNESS)[-1][1])
            for payload in readings(rows.iloc[48:54], pd.Timestamp.now(tz="UTC") - pd.Timedelta(minutes=1)):
                history.ingest.handle(TOPIC, payload)
            assert history.publish_forecast(server)
            wait_for(lambda: watch.on(FORECASTS) and len(watch.on(FRESHNESS)) == 2, 30, "the forecast")
    finally:
        history.stop()
        watch.close()
    assert stale["state"] == "stale" and stale["sensor"] == "temp_air" and stale["age_s"] >= 6 * 3600
    assert json.loads(watch.on(FRESHNESS)[-1][1])["state"] == "fresh"
    published = json.loads(watch.on(FORECASTS)[-1][1])
    assert len(watch.on(FORECASTS)) == 1 and pd.Timestamp(published["window_end"]) == now - HOUR
    assert min(published["forecast"]["ghi"]["value"]) >= 0.0
    withheld = [r.getMessage() for r in caplog.records if "forecasts withheld" in r.getMessage()]
    assert len(withheld) == 1 and "sensor temp_air: newest reading" in withheld[0] and "(stale after 3:00:00)" in withheld[0]
    assert sum("readings are current again" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(("age", "reason"), [("soon", "not a fixed duration"), ("0h", "longer than zero")])
def test_a_bad_stale_after_is_refused_by_name(age: str, reason: str) -> None:
    from pydantic import ValidationError

    from edge_agent.sensors.settings import ServingSettings

    with pytest.raises(ValidationError, match=f"stale_after(.|\n)*{reason}"):
        ServingSettings(stale_after=age)
