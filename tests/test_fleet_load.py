"""The fleet load generator speaks the real protocol: its virtual gateways (no torch) register
with a real coordinator process over mosquitto and every update of every round is accepted."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import fleet_load  # noqa: E402


def test_virtual_gateways_complete_every_round(tmp_path: Path) -> None:
    fleet_model, spec = fleet_load.templates("loadtest")  # also decodes re-stamped envelopes
    row = fleet_load.run_fleet(12, 2, fleet_model, spec, tmp_path)
    assert row["completed"] and row["accepted_per_round"] == {1: 12, 2: 12}
    assert row["gateway_replies"]["update_accepted"] == 24 and row["rejected"] == {}
    assert not row["torch_in_gateways"] and row["round_overhead_ms"] > 0 and row["store_mb"] > 0


def test_a_sampled_fleet_of_virtual_gateways_closes_each_round_with_the_asked_share(tmp_path: Path) -> None:
    """Fraction 0.1 of 200 gateways: each round names 20 participants, only they send, and every
    round closes with their 20 updates (the README's 1,000-gateway numbers come from the bench)."""
    fleet_model, spec = fleet_load.templates("sampled")
    row = fleet_load.run_fleet(200, 2, fleet_model, spec, tmp_path, fraction=0.1)
    assert row["completed"] and row["asked_per_round"] == {1: 20, 2: 20}
    assert row["accepted_per_round"] == {1: 20, 2: 20} and row["rejected"] == {}
    assert row["gateway_replies"]["update_accepted"] == 40 and row["gateway_replies"]["rounds_not_asked"] == 360


def test_a_round_asking_more_than_900_gateways_announces_them_by_digest_and_closes_with_them(tmp_path: Path) -> None:
    """Fraction 0.95 of 1,000 gateways: 950 participants, over the 900 ids an announcement can
    name, travel as digests (``edge_agent.asked``); exactly they send and the round closes with them."""
    fleet_model, spec = fleet_load.templates("large")
    row = fleet_load.run_fleet(1000, 1, fleet_model, spec, tmp_path, fraction=0.95)
    assert row["completed"] and row["asked_per_round"] == {1: 950}
    assert row["accepted_per_round"] == {1: 950} and row["rejected"] == {}
    assert row["gateway_replies"]["rounds_not_asked"] == 50
