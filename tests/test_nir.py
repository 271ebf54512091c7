"""NIR export: graph layout and neuron mapping, file round trip, our interpreter against the stack
and the torch model on real weather windows, the export's own verification, and clear refusals."""

from __future__ import annotations

import dataclasses

import nir
import numpy as np
import pytest
import torch

from edge_agent.data import TIME_FEATURES, ClientData, load_site, prepare_client
from edge_agent.models import Forecaster, build_forecaster
from edge_agent.train import make_optimizer, train_epochs
from export import nir as nir_export
from export.contract import ExportMismatchError
from export.nir import (
    DT,
    UnsupportedNodeError,
    export_nir,
    model_spikes,
    read_nir,
    simulate_nir,
    to_nir,
    write_nir,
)
from export.stack import SpikingStack, UnsupportedLayerError, spiking_stack
from tests.conftest import small_config

COLUMNS = ["ghi", "temp_air", "wind_speed"]
WINDOWS = 48


@pytest.fixture(scope="module")
def data() -> ClientData:
    """Three real weather variables from Amsterdam, windowed as the models expect."""
    return prepare_client(load_site("amsterdam").select(COLUMNS), lookback=24, horizon=12, stride=24)


@pytest.fixture(scope="module")
def model(data: ClientData) -> Forecaster:
    """A SpikeRNN forecaster as after training: two optimizer steps move weights and BatchNorm
    affines, then the running statistics are set to the training data's (cumulative average over
    one pass), as many epochs would leave them. With the initial statistics (mean 0, var 1) the
    eval-mode encoder is silent on real windows, and folding would be nearly the identity."""
    model = build_forecaster(small_config("spikernn"), len(COLUMNS), TIME_FEATURES, seed=1)
    two_batches = dataclasses.replace(data.train, starts=data.train.starts[:128])
    train_epochs(model, two_batches, epochs=1, batch_size=64, optimizer=make_optimizer(model, 1e-2), seed=0)
    norms = [module for module in model.modules() if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    with torch.no_grad():
        for x, marks, _ in data.train.batches(64, shuffle=False):
            model(x, marks)
    return model.eval()


@pytest.fixture(scope="module")
def spikes(model: Forecaster, data: ClientData) -> tuple[np.ndarray, list[np.ndarray]]:
    """Encoder spikes of real test windows and the torch stack's own spikes on them."""
    x, marks, _ = data.test.batch(torch.arange(WINDOWS))
    return model_spikes(model, x, marks)


def test_batchnorm_statistics_are_not_the_identity(model: Forecaster) -> None:
    for block in model.shared["backbone"].stack:
        assert block.norm.running_mean.abs().max() > 0.05
        assert (block.norm.running_var - 1).abs().min() > 0.05
        assert (block.norm.weight - 1).abs().max() > 1e-3 and block.norm.bias.abs().max() > 1e-3


def test_graph_is_a_chain_of_affine_and_lif_with_the_euler_mapping(model: Forecaster) -> None:
    stack = spiking_stack(model.shared["backbone"])
    graph = to_nir(stack, steps=4, source="unit test")
    n = len(stack.layers)
    chain = ["input", *[f"{kind}{i}" for i in range(n) for kind in ("affine", "lif")], "output"]
    assert list(graph.nodes) == chain
    assert graph.edges == list(zip(chain, chain[1:]))
    assert graph.metadata == {**graph.metadata, "dt": DT, "steps": 4, "source": "unit test"}
    for i, layer in enumerate(stack.layers):
        affine, lif = graph.nodes[f"affine{i}"], graph.nodes[f"lif{i}"]
        assert isinstance(affine, nir.Affine) and isinstance(lif, nir.LIF)
        assert np.array_equal(affine.weight, layer.weight) and np.array_equal(affine.bias, layer.bias)
        # Euler: decay 1 - dt/tau = beta and input gain dt*r/tau = 1, exactly in floating point
        assert np.all(1 - DT / lif.tau == layer.beta) and np.all(DT * lif.r / lif.tau == 1.0)
        assert np.all(lif.v_leak == 0) and np.all(lif.v_reset == 0)
        assert np.all(lif.v_threshold == layer.threshold)
        assert lif.metadata["source_layer"] == layer.name == f"shared.backbone.stack.{i}"


def _assert_same(a: object, b: object, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == np.asarray(b).dtype and np.array_equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert [tuple(e) for e in a] == [tuple(e) for e in b], where
    else:
        assert a == b, where


def test_write_read_round_trip_keeps_every_node_and_array(model: Forecaster, tmp_path) -> None:
    stack = spiking_stack(model.shared["backbone"])
    written = write_nir(stack, tmp_path / "stack.nir", steps=4, source="round trip")
    read = read_nir(tmp_path / "stack.nir")
    assert set(read.nodes) == set(written.nodes)  # HDF5 lists groups by name: only the edges carry the order
    for name, node in written.nodes.items():
        assert type(read.nodes[name]) is type(node), name
    _assert_same(written.to_dict(), read.to_dict(), "graph")


def test_simulated_file_matches_reference_and_torch_spike_for_spike(model, spikes, tmp_path) -> None:
    encoder, torch_layers = spikes
    stack = spiking_stack(model.shared["backbone"])
    write_nir(stack, tmp_path / "stack.nir")
    graph = read_nir(tmp_path / "stack.nir")
    simulated = simulate_nir(graph, encoder, float(graph.metadata["dt"]))
    reference = stack.run(encoder)
    assert encoder.shape == (4, WINDOWS * 24, 16) and set(np.unique(encoder)) == {0.0, 1.0}
    assert len(reference) == len(torch_layers) == 3
    for i, (ref, torch_spikes) in enumerate(zip(reference, torch_layers)):
        assert 0.02 < ref.mean() < 0.98, f"layer {i} is trivially silent or saturated"
        assert np.array_equal(simulated[f"lif{i}"], ref), f"lif{i} differs from SpikingStack.run"
        assert np.array_equal(simulated[f"lif{i}"], torch_spikes), f"lif{i} differs from the torch model"
    assert np.array_equal(simulated["output"], reference[-1])


def test_float32_model_agrees_with_the_export(model, spikes) -> None:
    """The deployed float32 stack (BatchNorm unfolded) run on the same encoder spikes: rounding
    differs from the float64 fold by ~1e-7, so a spike could flip in principle; none does here."""
    encoder, _ = spikes
    reference = spiking_stack(model.shared["backbone"]).run(encoder)
    h = torch.from_numpy(encoder).float().unflatten(1, (WINDOWS, 24))
    with torch.no_grad():
        for i, block in enumerate(model.shared["backbone"].stack):
            h = block(h)
            assert np.mean(h.flatten(1, 2).numpy() != reference[i]) <= 1e-4, f"layer {i}"


def test_export_nir_reports_and_writes_a_verified_file(model, data, tmp_path) -> None:
    path = tmp_path / "model.nir"
    report = export_nir(model, path, data.test, n_windows=WINDOWS)
    assert report.format == "nir" and report.files == [str(path)] and report.windows == WINDOWS
    assert report.spike_agreement == 1.0 and report.max_abs_error is None
    assert [layer["name"] for layer in report.layers] == [f"shared.backbone.stack.{i}" for i in range(3)]
    assert set(report.firing_rates) == {"input", "lif0", "lif1", "lif2"}
    assert all(0 < rate < 1 for rate in report.firing_rates.values())
    assert report.details["sequences"] == WINDOWS * 24 and report.steps == 4
    graph = read_nir(path)
    assert int(graph.metadata["steps"]) == 4 and '"backbone":"spikernn"' in graph.metadata["source"]
    assert list(tmp_path.iterdir()) == [path]


def test_export_nir_refuses_a_file_that_does_not_reproduce_the_model(model, data, tmp_path, monkeypatch) -> None:
    def tampered(path):
        graph = nir.read(path)
        graph.nodes["lif1"].v_threshold = graph.nodes["lif1"].v_threshold * 0.5
        return graph

    monkeypatch.setattr(nir_export, "read_nir", tampered)
    path = tmp_path / "model.nir"
    path.write_bytes(b"previous export")
    with pytest.raises(ExportMismatchError, match="shared.backbone.stack.1"):
        export_nir(model, path, data.test, n_windows=8)
    assert path.read_bytes() == b"previous export" and list(tmp_path.iterdir()) == [path]


def test_an_ann_backbone_is_refused_naming_it(data, tmp_path) -> None:
    model = build_forecaster(small_config("dlinear"), len(COLUMNS), TIME_FEATURES, seed=1).eval()
    with pytest.raises(UnsupportedLayerError, match="shared.backbone: DLinear is an ANN backbone"):
        export_nir(model, tmp_path / "model.nir", data.test, n_windows=4)
    assert list(tmp_path.iterdir()) == []


def _stack_without_bias(model: Forecaster) -> SpikingStack:
    stack = spiking_stack(model.shared["backbone"])
    layers = [dataclasses.replace(layer, bias=np.zeros_like(layer.bias)) for layer in stack.layers]
    return dataclasses.replace(stack, layers=layers)


def test_interpreter_cubalif_linear_and_fan_in_match_the_reference(model, spikes) -> None:
    """CubaLIF with tau_syn = dt and w_in = 1 is our LIF; Linear is Affine without bias; two
    Linear halves into one neuron add up to the whole weight (exact: halving is exact)."""
    encoder, _ = spikes
    stack = _stack_without_bias(model)
    reference = stack.run(encoder)
    graph = to_nir(stack)
    for i, layer in enumerate(stack.layers):
        lif = graph.nodes[f"lif{i}"]
        graph.nodes[f"lif{i}"] = nir.CubaLIF(
            tau_syn=np.full_like(lif.tau, DT), tau_mem=lif.tau, r=lif.r, v_leak=lif.v_leak,
            v_threshold=lif.v_threshold, v_reset=lif.v_reset, w_in=1.0,
        )
        graph.nodes[f"affine{i}"] = nir.Linear(weight=layer.weight / 2)
        graph.nodes[f"half{i}"] = nir.Linear(weight=layer.weight / 2)
        source = "input" if i == 0 else f"lif{i - 1}"
        graph.edges += [(source, f"half{i}"), (f"half{i}", f"lif{i}")]
    simulated = simulate_nir(graph, encoder, DT)
    for i, ref in enumerate(reference):
        assert np.array_equal(simulated[f"lif{i}"], ref), f"lif{i}"


def test_interpreter_names_unsupported_nodes_and_bad_graphs(model, spikes) -> None:
    encoder, _ = spikes
    graph = to_nir(spiking_stack(model.shared["backbone"]))
    graph.nodes["lif0"] = nir.Threshold(threshold=graph.nodes["lif0"].v_threshold)
    with pytest.raises(UnsupportedNodeError, match="node 'lif0': NIR type Threshold is not supported"):
        simulate_nir(graph, encoder, DT)

    graph = to_nir(spiking_stack(model.shared["backbone"]))
    graph.edges.append(("lif1", "affine1"))
    with pytest.raises(ValueError, match="recurrent edges"):
        simulate_nir(graph, encoder, DT)

    graph = to_nir(spiking_stack(model.shared["backbone"]))
    graph.edges.append(("lif2", "nowhere"))
    with pytest.raises(ValueError, match="lif2 -> nowhere names a node"):
        simulate_nir(graph, encoder, DT)

    graph.edges.pop()
    graph.edges.remove(("input", "affine0"))
    with pytest.raises(ValueError, match="node 'affine0' has no incoming edge"):
        simulate_nir(graph, encoder, DT)

    with pytest.raises(ValueError, match="node 'input' takes \\(16,\\) per step"):
        simulate_nir(to_nir(spiking_stack(model.shared["backbone"])), encoder[..., :3], DT)


def test_a_spike_check_that_compared_nothing_fails_the_export_command(model, data, tmp_path) -> None:
    """A layer that emits no spike on the windows checked agrees with anything: `export nir` (and
    lava, onnx: tests/test_silence.py) refuses it before writing and names the layer, unless --allow-silent."""
    import copy

    from typer.testing import CliRunner

    from edgefl.commands import app
    from edge_agent.models import save_checkpoint

    silent = copy.deepcopy(model)
    modules = dict(silent.named_modules())
    for name in spiking_stack(silent.shared["backbone"]).layers[-1].modules:
        module = modules[name]
        if isinstance(module, (torch.nn.Linear, torch.nn.modules.batchnorm._BatchNorm)):
            with torch.no_grad():
                module.weight.zero_()
                module.bias.fill_(-10.0)
    save_checkpoint(silent, tmp_path / "silent.safetensors", COLUMNS)
    command = ["export", "nir", "--checkpoint", str(tmp_path / "silent.safetensors"), "--site", "amsterdam",
               "--windows", "16", "--out", str(tmp_path / "model.nir")]
    refused = CliRunner().invoke(app, command)
    assert refused.exit_code == 2, refused.output
    assert "shared.backbone.stack.2.lif emitted no spike over the 16 windows checked" in refused.output
    assert not (tmp_path / "model.nir").exists()
    kept = CliRunner().invoke(app, [*command, "--allow-silent"])
    assert kept.exit_code == 0 and (tmp_path / "model.nir").exists()
    assert "warning: shared.backbone.stack.2.lif emitted no spike" in kept.output
