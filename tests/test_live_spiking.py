"""A spiking gateway end to end over a real mosquitto (issue 44 item 4): an agent whose model is
a channel-independent SpikeRNN (the recipe's projection and head) trains the coordinator's round
on replayed sensor readings, exports the federated spiking model as its ONNX bundle (verified
against torch, every LIF layer firing on the verification windows) and publishes forecasts from it,
equal to the bundle's own forecast of the window."""

from __future__ import annotations

import json
import signal
import tomllib
from pathlib import Path

from edge_agent.config import AgentConfig, dump_toml, load_config
from edge_agent.live import gateway_table
from edge_agent.models import ModelConfig
from edge_agent.serving.onnx_serving import INFO_FILE, OnnxServing
from tests.fleet import coordinator_config, exit_code, start, wait_for
from tests.test_live_gateway import FEATURES, live_config, latest_forecast, replay, Watch

SPIKING = {"backbone": "spikernn", "lookback": 24, "horizon": 12, "hidden": 16}
SPIKING_STEPS = 300  # a handful of steps leaves its LIF layers silent, and a silent model is not served


def spiking_config(folder: Path, port: int) -> Path:
    """test_live_gateway's live gateway with the spiking model, serving its federated model."""
    path = live_config(folder, port, False)
    data = tomllib.loads(path.read_text())
    data["model"] = SPIKING
    data["training"]["min_steps"] = SPIKING_STEPS
    path.write_text(dump_toml(data))
    return path


def test_a_spiking_gateway_trains_exports_its_bundle_and_serves_forecasts(tmp_path: Path, mosquitto) -> None:
    port, config = mosquitto.port, spiking_config(tmp_path, mosquitto.port)
    cfg = load_config(config, AgentConfig)
    assert (cfg.model.projection, cfg.model.head) == (ModelConfig().projection, ModelConfig().head)  # the recipe's
    watch = Watch(port)
    try:
        agent = start(tmp_path, "agent", "agent", "run", "-c", str(config))
        wait_for(lambda: b"online" in watch.seen, 180, "the agent's sensor client")
    finally:
        watch.close()
    replay(port, "--columns", ",".join(FEATURES))
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c",
                        str(coordinator_config(tmp_path, port, 1, start_clients=1, fleet_model={"model": SPIKING})))
    assert exit_code(coordinator) == 0, (tmp_path / "coordinator.log").read_text()
    log = tmp_path / "agent.log"
    wait_for(lambda: "serving forecasts and waiting for the next campaign" in log.read_text(), 120,
             "the gateway serving after the campaign")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 0
    assert "Traceback" not in log.read_text()
    folder = cfg.state_dir / "serving"
    info = json.loads((folder / INFO_FILE).read_text())
    assert info["model"] == "federated" and info["verified_max_error"] <= 1e-4, info
    published, table = latest_forecast(port), gateway_table(cfg)
    lookback = SPIKING["lookback"]
    offline = OnnxServing(folder).forecast(table.index[-lookback:].as_unit("ns").asi8, table.values[-lookback:])
    assert published["model"] == "federated" and published["window_end"] == offline["window_end"]
    assert published["forecast"] == offline["forecast"]
