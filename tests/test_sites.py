"""Sites over bridged brokers, for real: a central mosquitto and two site mosquittos bridged to it
(configs from ``edgefl broker-config --sites`` / ``--site``), the central coordinator, two site
aggregators and two gateways under each. Every round's global model equals the flat (no sites)
FedAvg simulation of the four gateways, and a site aggregator killed with ``kill -9`` mid-round
and restarted loses no accepted update."""

from __future__ import annotations

import os
import signal
import tomllib
from pathlib import Path

from coordinator.broker_setup import write_fleet_setup
from coordinator.simulation.federation import FederationConfig, run_federation
from coordinator.site_setup import write_site_setup
from coordinator.store import Store
from edge_agent.config import dump_toml
from edge_agent.models import ModelConfig
from tests.broker import Mosquitto, free_port
from tests.fleet import MODEL, SEED, TRAINING, agent_config, simulation_clients, start, wait_for, write_client_csvs
from tests.test_service import assert_rounds_equal, finish, served_rounds, state

ROUNDS = 2
SITES = {"site-a": ["client00", "client01"], "site-b": ["client02", "client03"]}


def edit(path: Path, **changes: object) -> str:
    """Change fields of a generated TOML config in place; returns its path as a string."""
    with path.open("rb") as file:
        data = tomllib.load(file)
    path.write_text(dump_toml({**data, **changes}))
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
        sites = {site: edit(setups[site]["aggregator.toml"], round_timeout_s=60.0, **fleet) for site in SITES}
        coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", central)
        aggregators = {site: start(tmp_path, site, "aggregator", "serve", "-c", config) for site, config in sites.items()}
        agents = []
        for site, gateways in SITES.items():
            for gateway in gateways:
                index = int(gateway.removeprefix("client"))
                with setups[site][f"{gateway}.toml"].open("rb") as file:
                    login = tomllib.load(file)["broker"]
                config = agent_config(tmp_path / site, login["port"], index, paths[index],
                                      username=login["username"], password=login["password"])
                agents.append(start(tmp_path, gateway, "agent", "run", "-c", str(config)))

        site_db = tmp_path / "site-a" / "state" / "aggregator"
        wait_for(state(site_db, lambda s: s.latest_round() and len(s.updates(2)) >= 1), 180,
                 "site-a to accept an update in round 2")
        os.kill(aggregators["site-a"].pid, signal.SIGKILL)
        aggregators["site-a"].wait(10)
        store = Store(site_db)
        accepted_before = {(u.round, u.client_id) for r in (1, 2) for u in store.updates(r)}
        store.close()
        restarted = start(tmp_path, "site-a-restarted", "aggregator", "serve", "-c", sites["site-a"])
        finish([coordinator, restarted, aggregators["site-b"], *agents], timeout=180)
        assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
        assert restarted.returncode == 0, (tmp_path / "site-a-restarted.log").read_text()
    finally:
        for broker in started:
            broker.stop()

    central_db = tmp_path / "central" / "state" / "coordinator"
    store = Store(central_db)
    rounds = store.rounds()
    assert [r.metrics["clients"] for r in rounds] == [["site-a", "site-b"]] * ROUNDS
    assert {c.client_id: c.n_samples for c in store.clients().values()}.keys() == set(SITES)
    store.close()
    for site, gateways in SITES.items():
        store = Store(tmp_path / site / "state" / "aggregator")
        assert [r.metrics["clients"] for r in store.rounds()] == [gateways] * ROUNDS, site
        if site == "site-a":
            assert accepted_before <= {(u.round, u.client_id) for r in range(1, ROUNDS + 1) for u in store.updates(r)}
        store.close()
    assert "site site-a resuming round" in (tmp_path / "site-a-restarted.log").read_text()
    assert_rounds_equal(served_rounds(central_db), flat_run(paths).states)
