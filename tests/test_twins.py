"""FedDTW: twin forecasters against hand-computed tensors, dropout matrices, imputed aggregation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.simulation.federation import head_learners, run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.simulation.participation import SCENARIOS, Participation, participation
from coordinator.strategies import ClientUpdate, weighted_mean
from coordinator.store import Store
from coordinator.twin_settings import TWIN_FORECASTERS
from coordinator.twins import TwinHistory, impute_missing, make_forecaster
from edge_agent.data import prepare_client, synthetic_clients
from edge_agent.learners.head import initial_shared_state
from tests.conftest import small_config, train_clients


def states(n: int) -> list[dict[str, torch.Tensor]]:
    """theta_k = [k, k^2] for k = 1..n, oldest first, plus an integer counter buffer."""
    return [{"w": torch.tensor([float(k), float(k * k)]), "count": torch.tensor(10 * k)} for k in range(1, n + 1)]


EXPECTED = {  # hand-computed forecasts of w for history lengths 1, 2 and 5
    "stale": {1: [1.0, 1.0], 2: [2.0, 4.0], 5: [5.0, 25.0]},
    "maf": {1: [1.0, 1.0], 2: [1.5, 2.5], 5: [4.5, 20.5]},  # mean of the last two
    # 0.8 theta(t-1) + 0.2 theta(t-2) + (theta(t-1) - theta(t-2))
    "wsf": {1: [1.0, 1.0], 2: [2.8, 6.4], 5: [5.8, 32.2]},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("length", [1, 2, 5])
def test_forecasters_match_hand_computed_tensors(name: str, length: int) -> None:
    forecast = make_forecaster(name).forecast(states(length))
    torch.testing.assert_close(forecast["w"], torch.tensor(EXPECTED[name][length]))


@pytest.mark.parametrize("name", sorted(TWIN_FORECASTERS))
def test_no_history_means_dropped_never_invented(name: str) -> None:
    assert make_forecaster(name).forecast([]) is None
    history = TwinHistory(2)
    imputation = impute_missing([("new", 10)], history, make_forecaster(name))
    assert imputation.updates == [] and imputation.dropped == ["new"]


def test_drop_never_imputes_and_unknown_names_list_the_choices() -> None:
    assert make_forecaster("drop").forecast(states(5)) is None
    with pytest.raises(ValueError, match="maf"):
        make_forecaster("arima")
    with pytest.raises(ValueError, match="alpha"):
        TWIN_FORECASTERS["wsf"](alpha=1.5)
    with pytest.raises(ValueError, match="twin forecaster: unknown"):
        FederationConfig(twin="kalman")


def test_imputed_update_keeps_sample_weight_and_integer_dtypes(tmp_path, request) -> None:
    storage = tensor_storage("sqlite", tmp_path, request)
    history = TwinHistory(2, storage)
    for k, state in enumerate(states(5), start=1):
        history.observe("gw-1", k, state)
    assert len(storage.names("twins/gw-1")) == 2  # bounded in the store
    imputation = impute_missing([("gw-1", 37)], history, make_forecaster("maf"))
    (update,) = imputation.updates
    assert update.client_id == "gw-1" and update.n_samples == 37
    torch.testing.assert_close(update.params["w"], torch.tensor([4.5, 20.5]))
    assert update.params["count"].dtype == torch.int64 and int(update.params["count"]) == 45


@pytest.mark.parametrize("kept", ["memory", "sqlite", "postgres"])
def test_a_client_unseen_for_more_than_max_age_rounds_is_dropped(tmp_path, request, kept: str) -> None:
    history = TwinHistory(2, tensor_storage(kept, tmp_path, request))
    for k, state in zip((2, 1), states(2)):  # a late round-1 update arrives after round 2's
        history.observe("gw-1", k, state)
    assert history.last_round("gw-1") == 2 and history.last_round("gw-2") is None
    assert [h["w"].tolist() for h in history.history("gw-1")] == [[2.0, 4.0], [1.0, 1.0]]  # by round
    stale = make_forecaster("stale")
    assert impute_missing([("gw-1", 5)], history, stale, round_number=4).imputed == ["gw-1"]  # no limit
    assert impute_missing([("gw-1", 5)], history, stale, round_number=4, max_age=2).imputed == ["gw-1"]
    dropped = impute_missing([("gw-1", 5), ("gw-2", 5)], history, stale, round_number=4, max_age=1)
    assert dropped.updates == [] and dropped.dropped == ["gw-1", "gw-2"]


def tensor_storage(kind: str, folder, request):
    """None (in memory), or the tensor table of a store in SQLite (in ``folder``) or in a fresh
    PostgreSQL database."""
    if kind == "memory":
        return None
    store = Store(folder, request.getfixturevalue("postgres_url") if kind == "postgres" else None)
    request.addfinalizer(store.close)
    return store.tensors


def test_memory_history_is_bounded_and_detached() -> None:
    history = TwinHistory(2)
    source = states(3)
    for k, state in enumerate(source, start=1):
        history.observe("a", k, state)
    source[2]["w"].add_(100)
    kept = history.history("a")
    assert len(kept) == 2 and kept[-1]["w"].tolist() == [3.0, 9.0]


def test_rcd_has_the_exact_absence_rate_and_is_seeded() -> None:
    a, b = participation("rcd", 20, 10, 0.5, seed=1), participation("rcd", 20, 10, 0.5, seed=1)
    assert a.absence_rate == 0.5 and np.array_equal(a.present, b.present)
    assert not np.array_equal(a.present, participation("rcd", 20, 10, 0.5, seed=2).present)
    assert participation("rcd", 20, 10, 0.3, seed=1).absence_rate == pytest.approx(0.3)


def test_vcpr_rate_varies_over_rounds() -> None:
    matrix = participation("vcpr", 100, 20, 0.5, seed=3)
    assert abs(matrix.absence_rate - 0.5) < 0.1
    per_round = 1 - matrix.present.mean(axis=1)
    assert per_round.max() - per_round.min() > 0.6  # thin and full stretches, not uniform noise


def test_np_cuts_off_whole_clusters_for_stretches() -> None:
    matrix = participation("np", 60, 12, 0.5, seed=4, clusters=3, stretch=3)
    columns = {tuple(matrix.present[:, c]) for c in range(12)}
    assert len(columns) == 3  # every client moves with its cluster
    assert abs(matrix.absence_rate - 0.5) < 0.2
    assert all(np.array_equal(matrix.present[r], matrix.present[r + k]) for r in range(0, 60, 3) for k in (1, 2))


def test_du_marks_late_updates_periodically() -> None:
    matrix = participation("du", 40, 8, 0.5, seed=5)
    assert np.array_equal(matrix.present + matrix.late, np.ones((40, 8)))
    assert 0.4 <= matrix.absence_rate <= 0.7
    assert all(matrix.late[:, c].any() and matrix.present[:, c].any() for c in range(8))


def test_scenarios_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="absence"):
        participation("rcd", 5, 5, 1.0)
    with pytest.raises(ValueError, match="scenario"):
        participation("storm", 5, 5)
    assert set(SCENARIOS) == {"rcd", "vcpr", "np", "du"}


@pytest.fixture(scope="module")
def fleet():
    tables = synthetic_clients(n_clients=3, n_features=3, n_steps=400, seed=2)
    return [prepare_client(t, 24, 12, stride=6) for t in tables]


def custom(present: list[list[int]], late: list[list[int]] | None = None) -> Participation:
    p = np.array(present, dtype=np.int8)
    return Participation("custom", p, np.zeros_like(p) if late is None else np.array(late, dtype=np.int8))


@pytest.mark.parametrize("twin", sorted(TWIN_FORECASTERS))
def test_full_participation_with_any_twin_equals_plain_fedavg(fleet, twin: str) -> None:
    cfg, fed = small_config("dlinear"), FederationConfig(rounds=2, batch_size=32, seed=9, test_every_round=False)
    plain = run_federation(fleet, cfg, fed).shared
    result = run_federation(fleet, cfg, fed.model_copy(update={"twin": twin}), participation=participation("fpr", 2, 3))
    assert all(torch.equal(plain[k], result.shared[k]) for k in plain)
    assert all(r.imputed == () and r.dropped == () for r in result.records)


def test_missing_client_is_imputed_with_its_weight_and_recorded(fleet) -> None:
    cfg = small_config("spikernn")
    fed = FederationConfig(rounds=2, batch_size=32, seed=4, twin="stale", test_every_round=False)
    result = run_federation(fleet, cfg, fed, participation=custom([[0, 1, 1], [0, 1, 1]]))
    assert result.records[0].dropped == (fleet[0].name,) and result.records[0].imputed == ()
    assert result.records[1].imputed == () and result.records[1].dropped == (fleet[0].name,)

    aged = FederationConfig(**{**fed.model_dump(), "rounds": 3, "twin_max_age": 1})
    result = run_federation(fleet, cfg, aged, participation=custom([[1, 1, 1], [0, 1, 1], [0, 1, 1]]))
    assert [(r.imputed, r.dropped) for r in result.records[1:]] == [((fleet[0].name,), ()), ((), (fleet[0].name,))]

    result = run_federation(fleet, cfg, fed, participation=custom([[1, 1, 1], [0, 1, 1]]))
    assert result.records[1].imputed == (fleet[0].name,) and result.records[1].twin == "stale"
    assert result.records[1].present == (fleet[1].name, fleet[2].name)
    learners = head_learners(fleet, cfg, fed, fed.seed)
    first = train_clients(learners, initial_shared_state(cfg, fed.seed), 1)
    second = train_clients(learners, weighted_mean(first), 2, [1, 2])
    expected = weighted_mean(second + [first[0]])  # the stale twin of client 0, with its own weight
    assert all(torch.equal(expected[k], result.shared[k]) for k in expected)


def late_fleet_round_3(fleet, late_updates: str):
    """Client 1 is on time in round 1, late in rounds 2 and 3 (its round-2 update arrives in
    round 3): the simulated run, and the updates of rounds 1 and 2 and round 3's on-time ones
    built by hand (round 2 aggregates clients 0 and 2 and client 1's round-1 twin)."""
    cfg = small_config("dlinear")
    fed = FederationConfig(rounds=3, batch_size=32, seed=4, twin="stale", test_every_round=False,
                           late_updates=late_updates)
    late = custom([[1, 1, 1], [1, 0, 1], [1, 0, 1]], late=[[0, 0, 0], [0, 1, 0], [0, 1, 0]])
    result = run_federation(fleet, cfg, fed, participation=late)
    assert result.records[1].late == (fleet[1].name,)
    learners = head_learners(fleet, cfg, fed, fed.seed)
    first = train_clients(learners, initial_shared_state(cfg, fed.seed), 1)
    g1 = weighted_mean(first)
    second = train_clients(learners, g1, 2)
    g2 = weighted_mean([second[0], second[2], first[1]])  # the late update of client 1 is not in round 2
    return result, g1, g2, second[1], train_clients(learners, g2, 3, [0, 2])


def test_late_updates_kept_as_history_only_feed_the_twin(fleet) -> None:
    """``late_updates = "history"`` (FedDTW's DU scenario): client 1's late round-2 update is
    not in round 2's aggregate but is its round-3 twin."""
    result, _, _, late, third = late_fleet_round_3(fleet, "history")
    assert result.records[2].imputed == (fleet[1].name,) and result.records[2].stale == ()
    expected = weighted_mean([*third, late])
    assert all(torch.equal(expected[k], result.shared[k]) for k in expected)


def test_a_late_update_counts_in_the_next_close_rebased_and_weighted_by_staleness(fleet) -> None:
    """By default a late update is not lost: client 1's round-2 update, arriving in round 3,
    stands in for it there (not its twin): its change to round 2's global applied to round 3's,
    weight n/sqrt(2) (one round late)."""
    result, g1, g2, late, third = late_fleet_round_3(fleet, "next_round")
    assert result.records[2].stale == (fleet[1].name,) and result.records[2].imputed == ()
    rebased = {k: g2[k] + (late.params[k] - g1[k]) for k in g1}
    stand_in = ClientUpdate(late.client_id, rebased, round(late.n_samples / 2 ** 0.5))
    expected = weighted_mean([*third, stand_in])
    assert all(torch.equal(expected[k], result.shared[k]) for k in expected)


def test_late_updates_of_a_client_never_on_time_do_not_feed_its_twin(fleet) -> None:
    """A device that only ever reports late cannot steer the aggregate through its twin."""
    cfg = small_config("dlinear")
    fed = FederationConfig(rounds=2, batch_size=32, seed=4, twin="stale", test_every_round=False)
    late = custom([[1, 0, 1], [1, 0, 1]], late=[[0, 1, 0], [0, 1, 0]])
    result = run_federation(fleet, cfg, fed, participation=late)
    assert [r.dropped for r in result.records] == [(fleet[1].name,)] * 2 and not result.records[1].imputed


def test_participation_matrix_shape_is_checked(fleet) -> None:
    with pytest.raises(ValueError, match="participation matrix"):
        run_federation(
            fleet, small_config("dlinear"), FederationConfig(rounds=3), participation=participation("rcd", 2, 3)
        )
