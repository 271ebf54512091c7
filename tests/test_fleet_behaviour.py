"""The fleet over time (issue 26), live on a real mosquitto: a silent device cannot stall the
rounds, a sampled fleet runs the round policy exactly as the simulation does, a revoked gateway
is refused from its next message without a restart and, refused for good, backs off and exits
non-zero, an agent on another model is told which fields differ, and a finished campaign is
not served again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.server import FINISHED_EXIT_CODE
from coordinator.simulation.participation import policy_driven
from coordinator.store import Store
from coordinator.strategies import RoundPolicy
from coordinator.strategy_settings import ParticipationSettings
from coordinator.strategies.participation import Progress, Standing
from edge_agent.learners import fleet_template
from edge_agent.protocol import HelloHeader
from edge_agent.refusals import REFUSED_EXIT_CODE
from edge_agent.toml_config import load_config
from tests.fleet import MODEL, SEED, agent_config, coordinator_config, start, wait_for, write_client_csvs
from tests.test_hostile import HOSTILE, TOPICS, Device
from tests.test_service import assert_rounds_equal, finish, replay, served_rounds, start_fleet

GIVE_UP = {"give_up_after_s": 4.0}  # refused for good, an agent exits after 4 s (30 s by default)


def closed_rounds(db: Path) -> list:
    store = Store(db)
    try:
        return [row for row in store.rounds() if row.closed_at is not None]
    finally:
        store.close()


def test_a_registered_device_that_never_reports_cannot_stall_the_rounds(tmp_path: Path, mosquitto) -> None:
    """Three agents and a fourth registered device that keeps its retained ``online`` and never
    sends an update, default round policy (quorum 0.8: 3 of these 4): rounds close at quorum +
    grace, not at the deadline, until it is excluded (3 rounds missed in a row). Each round takes at most 1.5x the time the same fleet without the device would have
    taken, which closes once its last agent reported: measured per round, from the store's
    arrival times, so the comparison holds however loaded the machine is."""
    coordinator, agents, db = start_fleet(tmp_path, mosquitto.port, 3, 4, start_clients=4,
                                          linger_s=3.0)  # the device never says goodbye
    device = Device(mosquitto.port)
    device.client.publish(TOPICS.agent(HOSTILE, "status"), b"online", qos=1, retain=True)
    cfg = load_config(tmp_path / "coordinator.toml", CoordinatorConfig)
    device.register(HelloHeader(fleet="test", sender=HOSTILE, n_features=3, n_samples=100,
                                model_signature=fleet_template(cfg, cfg.seed).signature))
    finish([coordinator, *agents], 300)
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    try:
        rows = [row for row in store.rounds() if row.closed_at is not None]
        arrivals = store.arrivals()
    finally:
        store.close()
    asked = [HOSTILE in row.metrics["asked"] for row in rows]
    assert asked == [True, True, True, False], asked  # excluded after 3 rounds missed in a row
    assert [row.metrics["closed_by"] for row in rows[:3]] == ["quorum + grace"] * 3
    assert all(row.metrics["closed_by"] == "all participants reported" for row in rows[3:])
    assert all(len(row.metrics["reported"]) == 3 for row in rows)
    for row in rows:
        without = max(at for number, _, late, at in arrivals if number == row.round and not late) - row.opened_at
        took = row.closed_at - row.opened_at
        assert took <= 1.5 * without + 0.5, (row.round, took, without)  # 0.5 s: the close itself


def test_a_sampled_fleet_asks_the_policys_clients_and_the_simulation_replays_it(tmp_path: Path, mosquitto) -> None:
    """Fraction 0.5 of four agents: each round asks the two clients the policy draws (the same
    draw as the simulation's), only they train and report, and replaying the recorded rounds in
    the simulation gives the coordinator's global states."""
    rounds, settings = 3, ParticipationSettings(fraction=0.5)
    coordinator, agents, db = start_fleet(tmp_path, mosquitto.port, 4, rounds, participation={"fraction": 0.5})
    finish([coordinator, *agents], 300)
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    rows = closed_rounds(db)
    clients = [f"client{i:02d}" for i in range(4)]
    drawn = policy_driven(RoundPolicy(settings, 1, SEED), rounds, clients).asked
    for row, expected in zip(rows, drawn):
        assert row.metrics["asked"] == [c for c, a in zip(clients, expected) if a]
        assert row.metrics["reported"] == row.metrics["asked"] and row.metrics["sampled"]
    assert len({tuple(row.metrics["asked"]) for row in rows}) > 1  # the draw changes from round to round
    simulated = replay(db, write_client_csvs(tmp_path, 4), rounds, participation=settings)
    assert_rounds_equal(served_rounds(db), simulated.states)


def test_a_revoked_gateway_is_refused_at_once_and_an_agent_refused_for_good_exits(tmp_path: Path, mosquitto) -> None:
    """A closed fleet of two; after round 2 the operator removes client01 from allowed_clients
    in coordinator.toml (no restart): its next message is refused ``not_allowed``, the rounds go
    on without waiting for it, and the agent, refused for good, backs off and exits with
    ``REFUSED_EXIT_CODE`` after a bounded number of hellos. (A campaign of 1,000 rounds, stopped
    once the rounds went on after the agent left.)"""
    allowed = ["client00", "client01"]
    coordinator, agents, db = start_fleet(tmp_path, mosquitto.port, 2, 1000, registration="closed",
                                          allowed_clients=allowed, start_clients=1, agent_extra=GIVE_UP)
    config = tmp_path / "coordinator.toml"
    wait_for(lambda: len(closed_rounds(db)) >= 2, 180, "two closed rounds")
    config.write_text(config.read_text().replace('"client01",', ""))
    written_at, closed_at_edit = time.time(), len(closed_rounds(db))
    assert load_config(config, CoordinatorConfig).allowed_clients == ["client00"]
    assert agents[1].wait(120) == REFUSED_EXIT_CODE
    left_at = len(closed_rounds(db))
    wait_for(lambda: len(closed_rounds(db)) >= left_at + 2, 120, "two more rounds without client01")
    for process in (coordinator, agents[0]):
        process.send_signal(signal.SIGTERM)
    finish([coordinator, agents[0]], 120)
    assert coordinator.returncode == 0 and agents[0].returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    try:
        refusals = [e for e in store.events(accepted=False) if e["client_id"] == "client01"]
        rows = [row for row in store.rounds() if row.closed_at is not None]
        arrivals = store.arrivals()
    finally:
        store.close()
    refused = [e for e in refusals if e["code"] == "not_allowed"]
    # an update accepted before the reload is left out of its round's close ("unregistered")
    assert refused and {e["code"] for e in refusals} <= {"not_allowed", "unregistered"}, refusals
    # not training while refused; hellos after 1-2, 2-4, 4-8 s... (equal jitter), giving up after 4 s
    assert sum(e["kind"] == "hello" for e in refused) <= 3 and len(refused) <= 10, refused
    # the file is read again within a second: client01's next message, in the round open at the edit
    # or the one after (its training may still run), is refused; a loaded machine makes that late
    assert min(e["round"] for e in refused) <= closed_at_edit + 2, (closed_at_edit, refused)
    assert not [a for a in arrivals if a[1] == "client01" and a[3] > written_at + 2]  # nothing accepted after
    first_refused = min(e["round"] for e in refused)
    assert all(row.metrics["reported"] == ["client00"] for row in rows if row.round >= first_refused)
    assert "revoked: client01" in (tmp_path / "coordinator.log").read_text()
    assert "not_allowed" in (tmp_path / "agent1.log").read_text()


def test_an_agent_on_another_model_is_told_which_fields_differ_and_a_finished_campaign_is_not_served_again(
    tmp_path: Path, mosquitto
) -> None:
    """One agent's agent.toml says lookback 36 where the fleet's coordinator.toml says 24: its
    hellos are refused ``bad_signature`` naming ``model.lookback`` with both values, it exits
    with ``REFUSED_EXIT_CODE`` and the other agent's campaign runs to its end. Started again on
    the finished campaign, ``coordinator serve`` says so and exits with ``FINISHED_EXIT_CODE``."""
    paths = write_client_csvs(tmp_path, 2)
    config = coordinator_config(tmp_path, mosquitto.port, 2, start_clients=1)
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(config))
    other = agent_config(tmp_path, mosquitto.port, 1, paths[1], model={**MODEL, "lookback": 36}, extra=GIVE_UP)
    bad = start(tmp_path, "agent1", "agent", "run", "-c", str(other))
    assert bad.wait(180) == REFUSED_EXIT_CODE
    assert "model.lookback: agent 36, fleet 24" in (tmp_path / "agent1.log").read_text()
    good = start(tmp_path, "agent0", "agent", "run", "-c", str(agent_config(tmp_path, mosquitto.port, 0, paths[0])))
    finish([coordinator, good], 300)
    assert coordinator.returncode == 0 and good.returncode == 0, (tmp_path / "coordinator.log").read_text()
    again = subprocess.run([sys.executable, "-m", "edgefl.cli", "coordinator", "serve", "-c", str(config)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == FINISHED_EXIT_CODE, again.stderr
    assert "finished with round 2: nothing to serve" in " ".join(again.stderr.split())


def test_the_round_policy_draws_closes_and_excludes_as_documented() -> None:
    """The policy alone: a seeded draw of ceil(fraction x eligible) clients (at least
    min_clients, at most MAX_ASKED), the close rules in their order, and the streaks of
    missed rounds that leave a client out for as many rounds (until it reports on time again)."""
    policy = RoundPolicy(ParticipationSettings(fraction=0.1, quorum=0.8, grace=0.5, exclude_after=2), 3, SEED)
    fleet = [f"gw{i:04d}" for i in range(1000)]
    first = policy.participants(1, reversed(fleet))
    assert len(first) == 100 and first == sorted(first) == policy.participants(1, fleet)
    assert first != policy.participants(2, fleet) and len(policy.participants(1, fleet[:20])) == 3
    assert len(RoundPolicy(ParticipationSettings(fraction=0.99), 1, SEED).participants(1, fleet)) == 990
    assert RoundPolicy(ParticipationSettings(), 1, SEED).participants(5, fleet[:7]) == fleet[:7]
    assert policy.quorum(10) == 8 and policy.quorum(2) == 3 and policy.quorum(4) == 3
    opened = 100.0
    assert policy.close_reason(Progress(2, 8, opened, None), 10, 200.0, 150.0) is None  # below min_clients
    assert policy.close_reason(Progress(10, 0, opened, 104.0), 10, 200.0, 104.0) == "all participants reported"
    assert policy.close_reason(Progress(8, 2, opened, 104.0), 10, 200.0, 105.9) is None  # grace: 0.5 x 4 s
    assert policy.close_reason(Progress(8, 2, opened, 104.0), 10, 200.0, 106.0) == "quorum + grace"
    assert policy.close_reason(Progress(5, 5, opened, None), 10, 200.0, 200.0) == "deadline"
    standing = policy.standings([(1, ["a", "b", "c"], ["a"]), (2, ["a", "b"], ["a", "c"])])
    assert standing == {"b": Standing(2, 1, 5)} and policy.excluded(standing, 4) == {"b"}
    assert policy.excluded(standing, 5) == set() and policy.standings([(3, [], ["b"])], standing) == {}
