"""One partition: a neuromorphic target prices on-chip exactly the stack the exporters deploy."""

from __future__ import annotations

import h5py
import pytest

from edge_agent.data import load_site, prepare_client
from export.energy import chip_layers, energy_report
from export.lava import export_lava, write_netx
from export.nir import export_nir
from export.opcount import count_ops
from export.profiles import load_profile
from export.stack import UnsupportedLayerError, spiking_stack
from tests.conftest import calibrated, trained


@pytest.fixture(scope="module")
def site():
    return prepare_client(load_site("amsterdam"), 24, 12, stride=24)


def report_for(model, site, profile: str):
    layers, windows = count_ops(model, site.test)
    target = load_profile(profile)
    return energy_report(layers, windows, target, on_chip=chip_layers(model, target), host=load_profile("cmos45nm"))


def on_chip(report) -> set[str]:
    """The layers the target itself priced: counted operations, none of them off-chip."""
    return {name for name, row in report.layers.items() if (row.macs or row.acs or row.neuron_updates)
            and not row.off_chip}


def exported_layers(model, tmp_path) -> set[str]:
    """The counted modules (Linear, LIF) of every layer in the netx file ``export lava`` writes."""
    path = tmp_path / "stack.h5"
    write_netx(spiking_stack(model.shared["backbone"]), path, steps=4)
    with h5py.File(path) as netx:
        names = [netx[f"layer/{index}"].attrs["name"] for index in range(1, len(netx["layer"]))]
    return {f"{name}.{part}" for name in names for part in ("linear", "lif")}


@pytest.mark.parametrize("profile", ["loihi", "truenorth"])
def test_the_chip_prices_exactly_the_exported_spikernn_stack(profile: str, site, tmp_path) -> None:
    model = trained("spikernn", site)
    report = report_for(model, site, profile)
    stack = exported_layers(model, tmp_path)
    assert on_chip(report) == set(report.on_chip) == stack
    encoder = report.layers["shared.backbone.encoder.lif"]  # off-chip, as the netx file and README say
    assert encoder.off_chip == {"neuron_updates": encoder.neuron_updates} and encoder.host_pj > 0 and encoder.pj == 0
    assert {name for name, row in report.layers.items() if row.off_chip} == set(report.layers) - stack
    assert report.host == "cmos45nm" and not report.unpriced and report.chip_pj > 0


def test_a_backbone_the_exporters_refuse_runs_nothing_on_chip(site) -> None:
    model = trained("dlinear", site)
    with pytest.raises(UnsupportedLayerError):
        spiking_stack(model.shared["backbone"])
    report = report_for(model, site, "loihi")
    assert report.on_chip == [] and on_chip(report) == set() and report.chip_pj == 0
    assert report.host_pj == pytest.approx(report_for(model, site, "cmos45nm").total_pj)


@pytest.mark.parametrize("kind", ["spikformer", "ispikformer"])
def test_a_spikformer_runs_its_embedding_on_chip_and_its_blocks_on_the_host(kind: str, site, tmp_path) -> None:
    """Spike x spike attention and the residual-fed layers around it stay on the host; the spiking
    embedding is what export lava/nir write and what the chip is priced for."""
    model = calibrated(kind, site)
    stack = spiking_stack(model.shared["backbone"])
    assert [layer.name for layer in stack.layers] == ["shared.backbone.embed"]
    assert any("blocks.1 (spiking self-attention" in part for part in stack.off_chip)
    report = report_for(model, site, "loihi")
    assert on_chip(report) == set(report.on_chip) == exported_layers(model, tmp_path) == {
        "shared.backbone.embed.linear", "shared.backbone.embed.lif"}
    attention = report.layers["shared.backbone.blocks.0.attn"]
    assert attention.off_chip["acs"] > 0 and attention.host_pj > 0 and report.chip_pj > 0
    nir = export_nir(model, tmp_path / "m.nir", site.test, n_windows=8)
    lava = export_lava(model, tmp_path / "m.net", site.test, n_windows=8)
    assert nir.spike_agreement == 1.0 and lava.spike_agreement >= 0.99
    assert nir.details["off_chip"] == lava.details["off_chip"] == stack.off_chip


def test_a_neuromorphic_target_without_its_partition_is_refused(site) -> None:
    layers, windows = count_ops(trained("spikernn", site), site.test)
    with pytest.raises(ValueError, match="loihi runs only the exported spiking stack"):
        energy_report(layers, windows, load_profile("loihi"))
    unpriced = energy_report(layers, windows, load_profile("loihi"), on_chip=frozenset({"shared.backbone.stack.0.lif"}))
    assert unpriced.host is None and unpriced.unpriced == ["ac", "mac", "neuron_update"]


def test_a_dense_target_prices_a_silent_spike_fed_layer_as_the_dense_work_it_runs() -> None:
    """A GPU multiplies every input of a spike-fed layer, spike or not: no spikes is not no work.
    An event-driven target (ACs priced) pays nothing for it."""
    from export.opcount import LayerOps

    silent = LayerOps("shared.backbone.out", "Linear", "backbone", cost="ac", acs=0.0, dense_macs=4000.0, calls=2)
    jetson, cmos = load_profile("jetson_orin_nano"), load_profile("cmos45nm")
    dense = energy_report([silent], 2, jetson)
    mac = jetson.cost("mac", jetson.default_precision).pj
    assert dense.total_pj == pytest.approx(2000.0 * mac) and dense.total_pj > 0
    assert energy_report([silent], 2, cmos).total_pj == 0.0


def test_a_gpu_prices_neuron_updates_and_labels_spike_fed_work_as_dense_macs() -> None:
    """Jetson has no ACs: a spike-fed layer's column holds the dense MACs it is priced for (not the
    sparse ACs an event-driven target would run), and each LIF update costs its derived price."""
    from export.opcount import LayerOps
    from export.report import markdown

    fed = LayerOps("shared.backbone.out", "Linear", "backbone", cost="ac", acs=300.0, dense_macs=4000.0, calls=2)
    lif = LayerOps("shared.backbone.stack.0.lif", "LIF", "backbone", cost="neuron_update", neuron_updates=640.0,
                   spikes=64.0, calls=2)
    jetson = load_profile("jetson_orin_nano")
    report = energy_report([fed, lif], 2, jetson)
    backbone = report.stages["backbone"]
    assert (backbone.acs, backbone.dense_macs, backbone.neuron_updates) == (0.0, 2000.0, 320.0)
    assert backbone.pj_by_op["neuron_updates"] == pytest.approx(320 * jetson.cost("neuron_update").pj)
    assert not report.unpriced and report.dense
    table = markdown("test", [report])
    assert "| stage | MACs | dense MACs of spike-fed layers |" in table and "| backbone | 0 | 2e+03 | 320 |" in table
    assert "| stage | MACs | ACs |" in markdown("test", [energy_report([fed, lif], 2, load_profile("cmos45nm"))])


def test_an_ann_under_a_neuromorphic_profile_gets_one_statement_and_a_plot(site, tmp_path) -> None:
    """Nothing of an ANN runs on Loihi; without --host nothing is priced: one line says so, and the
    plot (no bar to put on a log axis) is still drawn."""
    from typer.testing import CliRunner

    from edge_agent.models import save_checkpoint
    from edgefl.commands import app

    save_checkpoint(trained("dlinear", site), tmp_path / "ann.safetensors", list(site.columns))
    result = CliRunner().invoke(app, ["energy", "--checkpoint", str(tmp_path / "ann.safetensors"), "--site",
                                      "amsterdam", "--profile", "loihi", "--out", str(tmp_path / "energy")])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: loihi runs no layer of this model (the exporters deploy no spiking stack of its "
                        "backbone): the whole model runs off-chip, not priced (--host cmos45nm prices it there)"]
    assert {path.name for path in (tmp_path / "energy").iterdir()} == {"energy.md", "energy.json", "energy.png"}
