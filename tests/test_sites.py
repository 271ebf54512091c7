"""Sites over bridged brokers, for real: a central mosquitto and two site mosquittos bridged to it
(configs from ``edgefl broker-config --sites`` / ``--site``), the central coordinator, two site
aggregators and two gateways under each. Every round's global model equals the flat (no sites)
FedAvg simulation of the four gateways, and a site aggregator killed with ``kill -9`` mid-round
and restarted loses no accepted update."""

from __future__ import annotations

import os
import signal
import tomllib
import urllib.request
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from coordinator.broker_setup import write_fleet_setup
from coordinator.config import AggregatorConfig
from coordinator.simulation.federation import run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.site_setup import parse_uplink, write_site_setup
from coordinator.strategies import ClientInfo, ClientUpdate
from coordinator.strategy_settings import RobustSettings
from coordinator.strategies.bounds import screen
from coordinator.store import Store
from edge_agent.config import dump_toml
from edge_agent.models import ModelConfig
from tests.broker import Mosquitto, free_port
from tests.fleet import MODEL, SEED, TRAINING, agent_config, simulation_clients, start, wait_for, write_client_csvs
from tests.test_service import assert_rounds_equal, finish, served_rounds, state

ROUNDS = 2
SITES = {"site-a": ["client00", "client01"], "site-b": ["client02", "client03"]}


def read_toml(path: Path) -> dict:
    with path.open("rb") as file:
        return tomllib.load(file)


def edit(path: Path, **changes: object) -> str:
    """Change fields of a generated TOML config in place; returns its path as a string."""
    path.write_text(dump_toml({**read_toml(path), **changes}))
    return str(path)


def brokers(tmp_path: Path) -> tuple[dict[str, dict[str, Path]], list[Mosquitto]]:
    """The central setup and one bridged setup per site, written by broker-config's code, and
    their three brokers started (central first, so the bridges connect at once)."""
    ports = {name: free_port() for name in ("central", *SITES)}
    setups = {"central": write_fleet_setup("test", [], tmp_path / "central", port=ports["central"], sites=[*SITES])}
    for site, gateways in SITES.items():
        setups[site] = write_site_setup("test", site, gateways, tmp_path / site, f"127.0.0.1:{ports['central']}",
                                        tmp_path / "central", port=ports[site])
    started = [Mosquitto(tmp_path / f"{name}-broker", ports[name], setups[name]["mosquitto.conf"]).start()
               for name in ("central", *SITES)]
    return setups, started


def aggregator_db(tmp_path: Path, site: str) -> Path:
    return tmp_path / site / "state" / "aggregator"


def flat_run(paths: list[Path]):
    """The same four gateways without sites: in-process FedAvg, everyone on time every round."""
    fed = FederationConfig(rounds=ROUNDS, local_epochs=TRAINING["local_epochs"], batch_size=TRAINING["batch_size"],
                           lr=TRAINING["lr"], seed=SEED, test_every_round=False)
    return run_federation(simulation_clients(paths), ModelConfig(**MODEL), fed)


def test_sites_equal_the_flat_run_and_a_killed_site_aggregator_loses_no_update(tmp_path: Path) -> None:
    setups, started = brokers(tmp_path)
    try:
        paths = write_client_csvs(tmp_path, 4)
        fleet = {"model": MODEL, "seed": SEED, "min_clients": 2, "start_clients": 2}
        central = edit(setups["central"]["coordinator.toml"], rounds=ROUNDS, round_timeout_s=90.0, **fleet)
        http = {"site-a": {"http": {"port": free_port()}}, "site-b": {}}  # site-a also serves /metrics
        sites = {site: edit(setups[site]["aggregator.toml"], round_timeout_s=60.0, **fleet, **http[site],
                            broker={**read_toml(setups[site]["aggregator.toml"])["broker"], "keepalive_s": 60})
                 for site in SITES}
        coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", central)
        aggregators = {site: start(tmp_path, site, "aggregator", "serve", "-c", path) for site, path in sites.items()}
        agents = []
        for site, gateways in SITES.items():
            for gateway in gateways:
                index = int(gateway.removeprefix("client"))
                login = read_toml(setups[site][f"{gateway}.toml"])["broker"]
                config = agent_config(tmp_path / site, login["port"], index, paths[index], keepalive_s=60,
                                      username=login["username"], password=login["password"])
                agents.append(start(tmp_path, gateway, "agent", "run", "-c", str(config)))

        # Held processes (SIGSTOP; long keepalives keep their sessions) make the kill land mid-round:
        # site-b's aggregator from its registration, so the central round 1 waits for it, until
        # site-a sent round 1 up; client00 from then, so site-a's round 2 gets client01's update only.
        central_db, site_db = tmp_path / "central" / "state" / "coordinator", aggregator_db(tmp_path, "site-a")
        wait_for(state(central_db, lambda s: s.is_registered("site-b")), 180, "site-b to register centrally")
        os.kill(aggregators["site-b"].pid, signal.SIGSTOP)
        wait_for(state(central_db, lambda s: s.latest_round() and s.has_update(1, "site-a")), 180,
                 "site-a's round-1 update at the central coordinator")
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{http['site-a']['http']['port']}/metrics", timeout=10)
        assert "edgefl_updates_accepted_total 2.0" in scraped.read().decode()  # its two gateways' round 1
        os.kill(agents[0].pid, signal.SIGSTOP)
        os.kill(aggregators["site-b"].pid, signal.SIGCONT)
        wait_for(state(site_db, lambda s: s.latest_round() and s.has_update(2, "client01")), 120,
                 "site-a to accept client01's round-2 update")
        os.kill(aggregators["site-a"].pid, signal.SIGKILL)
        aggregators["site-a"].wait(10)
        store = Store(site_db)
        accepted_before = {(u.round, u.client_id) for r in (1, 2) for u in store.updates(r)}
        assert store.round(2).closed_at is None and accepted_before == {(1, "client00"), (1, "client01"),
                                                                        (2, "client01")}
        store.close()
        restarted = start(tmp_path, "site-a-restarted", "aggregator", "serve", "-c", sites["site-a"])
        os.kill(agents[0].pid, signal.SIGCONT)
        finish([coordinator, restarted, aggregators["site-b"], *agents], timeout=180)
        assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
        assert restarted.returncode == 0, (tmp_path / "site-a-restarted.log").read_text()
    finally:
        for broker in started:
            broker.stop()

    weights = {}
    for site, gateways in SITES.items():
        store = Store(aggregator_db(tmp_path, site))
        assert [r.metrics["clients"] for r in store.rounds()] == [gateways] * ROUNDS, site
        weights[site] = sum(c.n_samples for c in store.clients().values())
        assert store.meta("delivered") == str(ROUNDS), site  # the central coordinator answered every upload
        if site == "site-a":
            assert accepted_before <= {(u.round, u.client_id) for r in range(1, ROUNDS + 1) for u in store.updates(r)}
        store.close()
    store = Store(central_db)
    assert [r.metrics["clients"] for r in store.rounds()] == [["site-a", "site-b"]] * ROUNDS
    assert {c.client_id: c.n_samples for c in store.clients().values()} == weights
    assert all(r.metrics["weight"] == sum(weights.values()) for r in store.rounds())
    assert {e["client_id"] for e in store.events()} == set(SITES)  # the gateways' own topics stay at their site
    store.close()
    resumed = "site site-a resuming round 2 (open) with 1 accepted updates ['client01']"
    assert resumed in (tmp_path / "site-a-restarted.log").read_text()
    assert_rounds_equal(served_rounds(central_db), flat_run(paths).states)


def test_a_site_weighs_what_its_gateways_hold_while_a_gateway_stays_capped() -> None:
    """weight_factor caps a gateway at 3 x the median gateway count; a site's summed count is
    bounded by its hello only (else central FedAvg over sites would not equal the flat one)."""
    roster = {"site-a": ClientInfo("site-a", 4000), **{f"gw{i}": ClientInfo(f"gw{i}", 100) for i in range(3)}}
    current = {"w": torch.zeros(4)}
    updates = [ClientUpdate("site-a", {"w": torch.ones(4)}, 4000), ClientUpdate("gw0", {"w": torch.ones(4)}, 100),
               ClientUpdate("gw1", {"w": torch.ones(4)}, 10_000)]
    plain = {u.client_id: u.n_samples for u in screen(current, updates, roster, RobustSettings()).accepted}
    sites = {u.client_id: u.n_samples
             for u in screen(current, updates, roster, RobustSettings(site_clients=["site-a"])).accepted}
    assert plain == {"site-a": 300, "gw0": 100, "gw1": 100}
    assert sites == {"site-a": 4000, "gw0": 100, "gw1": 100}


@pytest.mark.parametrize("fields, says", [
    ({"mode": "prompt", "foundation": "fm.pt"}, "not supported over sites yet"),
    ({"strategy": "fedavgm"}, "'fedavg' only"),
    ({"rounds": 3}, "the central coordinator decides the rounds"),
    ({"participation": {"policy": "buffered"}}, "a site closes on the central round's deadline"),
])
def test_aggregator_config_refuses_what_a_site_cannot_do(tmp_path: Path, fields: dict, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        AggregatorConfig(fleet="test", state_dir=tmp_path, site="site-a", **fields)


def test_uplink_is_host_and_optional_port() -> None:
    assert parse_uplink("central.example") == ("central.example", 1883)
    assert parse_uplink("10.0.0.5:8883") == ("10.0.0.5", 8883)
    for bad in ("central:", ":1883", "central:99999", "central:x"):
        with pytest.raises(ValueError, match="--uplink"):
            parse_uplink(bad)


def test_broker_config_writes_a_central_setup_with_sites_and_a_bridged_site(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from edgefl.commands import app

    cli = CliRunner()
    central = cli.invoke(app, ["broker-config", "--fleet", "farm", "--agents", "0", "--sites", "north,south",
                               "--out", str(tmp_path / "central")])
    assert central.exit_code == 0, central.output
    coordinator = read_toml(tmp_path / "central" / "coordinator.toml")
    assert coordinator["robust"]["site_clients"] == coordinator["allowed_clients"] == ["north", "south"]
    assert coordinator["start_clients"] == 2
    unbridged = cli.invoke(app, ["broker-config", "--fleet", "farm", "--site", "north", "--out", str(tmp_path / "x")])
    assert unbridged.exit_code == 2 and "--site needs --uplink" in unbridged.output
    site = cli.invoke(app, ["broker-config", "--fleet", "farm", "--site", "north", "--uplink", "10.0.0.5", "--central",
                            str(tmp_path / "central"), "--names", "n1,n2", "--out", str(tmp_path / "north")])
    assert site.exit_code == 0, site.output
    assert "edgefl aggregator serve --config" in site.output
    conf = (tmp_path / "north" / "mosquitto.conf").read_text()
    password = read_toml(tmp_path / "central" / "sites" / "north.toml")["password"]
    assert "address 10.0.0.5:1883" in conf and f"remote_password {password}" in conf
    assert 'topic edgefl/farm/agents/north/update out 1 uplink/ ""' in conf
    assert (tmp_path / "north" / "mosquitto.conf").stat().st_mode & 0o077 == 0
    aggregator = AggregatorConfig(**read_toml(tmp_path / "north" / "aggregator.toml"))
    assert (aggregator.site, aggregator.allowed_clients, aggregator.start_clients) == ("north", ["n1", "n2"], 2)
    assert not (tmp_path / "north" / "coordinator.toml").exists()
