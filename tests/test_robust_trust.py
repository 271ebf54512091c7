"""Influence bounded over time (issue 46): a per-client trust, the average progress of its
updates along the median of the others' deltas, cuts the weight of a persistent below-screen sign
flipper, and its twin's forecasts, to 0 while honest clients keep theirs; the service carries
the trust across a restart and rolls it back when the store fails."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch

from coordinator.engine import RoundEngine, ClosedRound
from coordinator.server import Coordinator
from coordinator.simulation.attacks import ATTACKS, INFLATED_SAMPLES
from coordinator.strategies import ClientInfo, ClientUpdate, make_strategy
from coordinator.strategy_settings import RobustSettings, StrategySettings
from coordinator.strategies.trust import LOW_TRUST, latest_trust, multiplier, progress_along_others, scored
from coordinator.twin_settings import TwinSettings
from tests.offline import closes, fed, hello_of, offline_coordinator, resumed, update_of
from tests.test_round_policy import FLEET

CURRENT = {"w": torch.zeros(20), "steps": torch.tensor(4)}
ROSTER = [ClientInfo("c0", INFLATED_SAMPLES), *(ClientInfo(f"c{i}", 10) for i in range(1, 4))]
TRUST_RATE = 0.2  # opt-in: what bench/over_time.py and docs/security.md measure
TRUST, TRUST_OFF = RobustSettings(trust_rate=TRUST_RATE), RobustSettings(trust_rate=None)


def honest_round(number: int, clients: int = 4) -> list[ClientUpdate]:
    """Non-IID honest updates: a common step plus each client's own (noise of about its size)."""
    generator = torch.Generator().manual_seed(number)
    common = torch.ones(20)
    return [ClientUpdate(f"c{i}", {"w": common + torch.randn(20, generator=generator), "steps": torch.tensor(4)},
                         10, {"loss": 1.0}) for i in range(clients)]


def flipped_round(number: int) -> list[ClientUpdate]:
    """c0 reverses its update at 3x its norm and claims 10**12 samples (below the screen)."""
    honest = honest_round(number)
    return [ATTACKS["below_screen_hello"].upload(honest[0], CURRENT), *honest[1:]]


def run(robust: RobustSettings, rounds: int, flipping_from: int = 1, silent_from: int | None = None,
        twin: str = "drop") -> list[ClosedRound]:
    """``rounds`` closes of the real engine with c0 honest, then flipping from ``flipping_from``,
    then silent (imputed) from ``silent_from``."""
    settings = StrategySettings(robust=robust)
    engine = RoundEngine(make_strategy(settings, CURRENT, 0), TwinSettings(twin=twin), robust=robust)
    results = []
    for number in range(1, rounds + 1):
        updates = flipped_round(number) if number >= flipping_from else honest_round(number)
        updates = updates[1:] if silent_from is not None and number >= silent_from else updates
        results.append(engine.close(number, CURRENT, updates, ROSTER))
    return results


def test_a_persistent_below_screen_flipper_loses_its_weight_within_a_few_rounds() -> None:
    """With the defaults the flipper, honest for 3 rounds, is left out (low_trust) from its second
    flipped round on, while the honest clients keep their full weight every round; with trust off
    it enters every round."""
    results = run(TRUST, 10, flipping_from=4)
    out = [r.round for r in results if r.rejected.get("c0") == LOW_TRUST]
    assert out[0] <= 5 and out == list(range(out[0], 11))
    assert all(set(r.rejected) <= {"c0"} and set(r.clipped) <= {"c0"} for r in results)
    assert all(r.weight == 30 and r.on_time == ("c1", "c2", "c3") for r in results[out[0] - 1:])
    assert results[-1].trust["c0"] < TRUST.trust_zero < 0 < min(results[-1].trust[c] for c in ("c1", "c2", "c3"))
    assert all("c0" in r.on_time and not r.rejected for r in run(TRUST_OFF, 10))


def test_an_honest_fleet_keeps_its_full_weight() -> None:
    """Every honest client of 7 keeps its weight in every round: trust never cuts it."""
    settings = TRUST
    engine = RoundEngine(make_strategy(StrategySettings(), CURRENT, 0), TwinSettings(twin="drop"), robust=settings)
    roster = [ClientInfo(f"c{i}", 10) for i in range(7)]
    for number in range(1, 21):
        result = engine.close(number, CURRENT, honest_round(number, 7), roster)
        assert not result.rejected and not result.clipped and result.weight == 70
    assert min(multiplier(score, settings.trust_full, settings.trust_zero) for score in engine.trust.values()) == 1.0


def test_the_twin_of_a_distrusted_client_is_left_out_too() -> None:
    """c0 is honest in rounds 1-2, flips in rounds 3-5, then goes silent: its twin's forecast (of
    its accepted updates) is left out with low_trust instead of standing in for it."""
    results = run(TRUST, 7, flipping_from=3, silent_from=6, twin="stale")
    assert [r.rejected.get("c0") for r in results[5:]] == [LOW_TRUST, LOW_TRUST]
    assert all("c0" not in r.imputed for r in results[5:])
    assert run(TRUST_OFF, 7, flipping_from=3, silent_from=6, twin="stale")[-1].imputed == ("c0",)


def test_progress_is_measured_along_the_median_of_the_others_by_hand() -> None:
    """Deltas 1, 2, 3, -9 (median norm 2, the lower middle): each is projected on the median of the
    other three (2, 2, 1.5, 2), in units of 2; the reversed one's own value never picks its median."""
    updates = [ClientUpdate(f"c{i}", {"w": torch.tensor([v]), "steps": torch.tensor(4)}, 10, {})
               for i, v in enumerate([1.0, 2.0, 3.0, -9.0])]
    progress = progress_along_others({"w": torch.zeros(1), "steps": torch.tensor(4)}, updates)
    assert list(progress.values()) == pytest.approx([0.5, 1.0, 1.5, -4.5])


def test_trust_moves_toward_each_rounds_progress_from_the_prior() -> None:
    assert scored({"a": 0.5}, {"a": -1.0, "b": 0.0}, 0.5, 1.0) == {"a": -0.25, "b": 0.5}
    assert [multiplier(s, 0.1, -0.1) for s in (-0.3, -0.1, 0.0, 0.1, 0.9)] == [0.0, 0.0, 0.5, 1.0, 1.0]
    assert latest_trust([{"trust": {"a": 0.2}}, {"loss": 1.0}, {"trust": {"a": -0.1}}, {}]) == {"a": -0.1}


def service_round(coordinator: Coordinator, number: int) -> dict:
    """One round of the 4-client fleet with "d" flipping below the screen; the closed round's metrics."""
    send_round(coordinator, number)
    return closes(coordinator, number).metrics


def send_round(coordinator: Coordinator, number: int) -> None:
    """The 4 clients' updates of round ``number``, "d" reversed at 3x."""
    honest = honest_round(number)
    step = {"a": honest[1], "b": honest[2], "c": honest[3], "d": honest[0]}
    gains = {"a": 1.0, "b": 1.0, "c": 1.0, "d": -3.0}
    current = coordinator.store.load_file(coordinator.store.round(number).global_file)
    fed(coordinator, *(update_of(coordinator, client, number, moved(current, gains[client] * 1e-3, step[client]))
                       for client in FLEET))


def moved(current: dict[str, torch.Tensor], gain: float, update: ClientUpdate) -> dict[str, torch.Tensor]:
    """The round's global state moved by ``gain`` times the update's pattern, repeated over each tensor."""
    pattern = update.params["w"].double()
    return {k: (v + gain * pattern.repeat(v.numel() // 20 + 1)[:v.numel()].reshape(v.shape)).to(v.dtype)
            if v.is_floating_point() else v for k, v in current.items()}


def test_trust_survives_a_coordinator_restart_and_rolls_back_when_the_store_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service scores like the engine: "d" is left out from its first round; a restarted coordinator
    reads the trust back from the closed rounds and keeps it out; a close whose store write fails
    leaves the trust as it was."""
    coordinator = offline_coordinator(tmp_path, rounds=5, robust={"trust_rate": TRUST_RATE})
    fed(coordinator, *(hello_of(coordinator, c) for c in FLEET))
    metrics = [service_round(coordinator, number) for number in (1, 2, 3)]
    assert [m["rejected"] for m in metrics] == [{"d": LOW_TRUST}] * 3
    assert metrics[2]["trust"]["d"] < TRUST.trust_zero < 0 < metrics[2]["trust"]["a"]
    trust = coordinator.engine.trust
    coordinator.store.close()
    restarted = resumed(coordinator.cfg)
    assert restarted.engine.trust == pytest.approx(trust)
    assert service_round(restarted, 4)["rejected"] == {"d": LOW_TRUST}
    before, tried = restarted.engine.trust, []

    def full_disk(*args: object) -> None:
        tried.append(args)
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(restarted.store, "finish_round", full_disk)
    send_round(restarted, 5)
    restarted.close_if_due(restarted.store.round(5))
    assert restarted.store.round(5).closed_at is None and tried and restarted.engine.trust is before
    restarted.store.close()
