"""FedPoD's graphs: haversine against known distances, graph shapes and normalization."""

from __future__ import annotations

import pytest
import torch

from coordinator.strategies.prompt_graph import (
    PromptGraph,
    fused_graph,
    geo_graph,
    haversine_km,
    personalize,
)
from edge_agent.data import load_sites

# (lat, lon) of city centres and great-circle distances on a 6371 km sphere (rounded to 1 km)
CITIES = {"paris": (48.8566, 2.3522), "london": (51.5074, -0.1278), "new_york": (40.7128, -74.0060),
          "los_angeles": (34.0522, -118.2437), "sydney": (-33.8688, 151.2093)}


@pytest.mark.parametrize(("a", "b", "km"), [
    ("paris", "london", 344), ("new_york", "los_angeles", 3936), ("london", "sydney", 16994),
])
def test_haversine_matches_known_city_distances(a: str, b: str, km: float) -> None:
    (lat1, lon1), (lat2, lon2) = CITIES[a], CITIES[b]
    d = haversine_km(*(torch.tensor(v, dtype=torch.float64) for v in (lat1, lon1, lat2, lon2)))
    assert float(d) == pytest.approx(km, abs=2)


def test_haversine_is_zero_on_the_diagonal_and_defined_at_antipodes() -> None:
    zero = haversine_km(*(torch.tensor(v) for v in (10.0, 20.0, 10.0, 20.0)))
    antipode = haversine_km(*(torch.tensor(v, dtype=torch.float64) for v in (0.0, 0.0, 0.0, 180.0)))
    assert float(zero) == 0.0 and float(antipode) == pytest.approx(torch.pi * 6371.0088, rel=1e-9)


def test_geographic_graph_of_the_weather_sites_is_row_stochastic_and_prefers_neighbours() -> None:
    sites = load_sites()
    coordinates = torch.tensor([[s.latitude, s.longitude] for s in sites], dtype=torch.float64)
    a = geo_graph(coordinates)
    assert a.shape == (len(sites), len(sites))
    torch.testing.assert_close(a.sum(1), torch.ones(len(sites), dtype=torch.float64))
    names = [s.name for s in sites]
    greensboro, burlington, amsterdam = (names.index(n) for n in ("greensboro", "burlington", "amsterdam"))
    assert a[greensboro, burlington] > a[greensboro, amsterdam]  # both US east coast vs across the Atlantic


def test_prompt_graphs_fuse_into_row_stochastic_personalization() -> None:
    torch.manual_seed(0)
    n, prompts = 5, torch.randn(5, 3, 4)  # per client: temporal, inter-variable and spatial prompt rows
    graph = PromptGraph(prompt_size=12, hidden=8)
    a = graph(prompts.flatten(1))
    a_tv = PromptGraph(prompt_size=8, hidden=8)(prompts[:, :2].flatten(1))
    a_s = PromptGraph(prompt_size=4, hidden=8)(prompts[:, 2])
    a_geo = geo_graph(torch.tensor([[0.0, float(i)] for i in range(n)]))
    fused = fused_graph(a_geo, a_s, a_tv, a)
    for matrix in (a, a_tv, a_s, fused):
        assert matrix.shape == (n, n) and bool((matrix >= 0).all())
        torch.testing.assert_close(matrix.sum(1), torch.ones(n))
    personal = personalize(prompts, a, fused, alpha=0.99)
    assert personal.shape == prompts.shape
    torch.testing.assert_close(personalize(prompts, a, fused, alpha=1.0), (a @ prompts.flatten(1)).reshape(5, 3, 4))
    same = torch.ones(5, 3, 4)  # identical prompts stay identical under any convex mixing
    torch.testing.assert_close(personalize(same, a, fused), same)
    loss = personal.pow(2).sum()
    loss.backward()
    assert all(p.grad is not None for p in graph.parameters())  # the graph is trainable end to end

