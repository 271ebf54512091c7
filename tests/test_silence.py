"""One silence rule (issue 44 item 3): a LIF layer that never fires on the windows checked is named
and refused by `export onnx`, `export nir` and `export lava` before anything is written (or, with
--allow-silent, exported with a warning), and flagged by `energy` on the console and in its files.
Negative controls: an inner layer of a firing model silenced by its BatchNorm (weight 0, bias -10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from edge_agent.data import load_site, prepare_client
from edge_agent.models import save_checkpoint
from edgefl.commands import app
from export.contract import sample_windows
from export.silence import lif_rates, silent_layers
from tests.conftest import calibrated

SILENCED = {"spikernn": "shared.backbone.stack.0", "ispikformer": "shared.backbone.blocks.0.attn"}


@pytest.fixture(scope="module")
def site():
    return prepare_client(load_site("amsterdam"), 24, 12, stride=24)


def silenced(backbone: str, site) -> torch.nn.Module:
    """A calibrated model (every LIF fires) whose ``SILENCED`` layer's LIF never reaches threshold:
    SpikeRNN's first stack layer, iSpikformer's first attention LIF (the norm before it)."""
    model = calibrated(backbone, site)
    norm = model.get_submodule(SILENCED[backbone]).norm
    with torch.no_grad():
        norm.weight.zero_()
        norm.bias.fill_(-10.0)
    return model


def checkpoint(model: torch.nn.Module, site, folder: Path) -> Path:
    path = folder / "model.safetensors"
    save_checkpoint(model, path, list(site.columns))
    return path


def lif_of(backbone: str) -> str:
    return f"{SILENCED[backbone]}.attn_lif" if backbone == "ispikformer" else f"{SILENCED[backbone]}.lif"


@pytest.mark.parametrize("backbone", sorted(SILENCED))
def test_the_rule_names_the_silenced_layer_and_only_after_it(backbone: str, site) -> None:
    x, marks = sample_windows(site.test, 16)
    assert silent_layers(lif_rates(calibrated(backbone, site), x, marks)) == []  # the positive control
    silent = silent_layers(lif_rates(silenced(backbone, site), x, marks))
    assert silent[0] == lif_of(backbone)


def export_command(fmt: str, backbone: str, site, folder: Path) -> tuple[list[str], Path]:
    """``edgefl export <fmt>`` of the silenced ``backbone`` on 16 windows, and where it would write."""
    out = folder / ("out" if fmt == "onnx" else "model.h5")
    return ["export", fmt, "--checkpoint", str(checkpoint(silenced(backbone, site), site, folder)),
            "--site", "amsterdam", "--windows", "16", "--out", str(out)], out


@pytest.mark.parametrize(("fmt", "backbone"), [("onnx", "spikernn"), ("onnx", "ispikformer"), ("nir", "spikernn"),
                                               ("lava", "spikernn"), ("lava", "ispikformer")])
def test_every_export_refuses_a_silent_inner_layer_in_one_line_and_writes_nothing(fmt: str, backbone: str, site,
                                                                                 tmp_path: Path) -> None:
    command, out = export_command(fmt, backbone, site, tmp_path)
    refused = CliRunner().invoke(app, command)
    assert refused.exit_code == 2, refused.output
    lines = refused.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {fmt} export refused: {lif_of(backbone)}")
    assert "emitted no spike over the 16 windows checked" in lines[0] and "--allow-silent" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["onnx", "nir", "lava"])
def test_allow_silent_exports_with_a_warning_naming_the_layer(fmt: str, site, tmp_path: Path) -> None:
    command, out = export_command(fmt, "spikernn", site, tmp_path)
    kept = CliRunner().invoke(app, [*command, "--allow-silent"])
    assert kept.exit_code == 0, kept.output
    assert "warning: shared.backbone.stack.0.lif" in kept.output and "exported anyway (--allow-silent)" in kept.output
    assert out.exists()


def test_energy_flags_a_silent_layer_on_the_console_and_in_its_files(site, tmp_path: Path) -> None:
    path = checkpoint(silenced("spikernn", site), site, tmp_path)
    result = CliRunner().invoke(app, ["energy", "--checkpoint", str(path), "--site", "amsterdam",
                                      "--profile", "cmos45nm", "--out", str(tmp_path / "energy")])
    assert result.exit_code == 0, result.output
    warning = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and warning[0].startswith("warning: shared.backbone.stack.0.lif")
    assert "their energy describes no computation" in warning[0]
    assert "**Silent: shared.backbone.stack.0.lif" in (tmp_path / "energy" / "energy.md").read_text()
    report = json.loads((tmp_path / "energy" / "energy.json").read_text())["reports"][0]
    assert report["silent_layers"][0] == "shared.backbone.stack.0.lif"


def test_a_gateway_does_not_serve_a_spiking_model_with_a_silent_layer(site, tmp_path: Path) -> None:
    """The serving bundle follows the same rule: refused naming the layer, nothing written."""
    from edge_agent.learners import HeadLearner
    from edge_agent.training_settings import HeadTraining
    from export.bundle import write_bundle
    from export.silence import SilentLayersError

    model = silenced("spikernn", site)
    learner = HeadLearner(model.cfg, site, HeadTraining(), 3, 0)
    learner.model.load_state_dict(model.state_dict())
    with pytest.raises(SilentLayersError, match=rf"gw: the served model's {lif_of('spikernn')}.* emitted no spike"):
        write_bundle(learner, "gw", 2, 3_600_000_000_000, tmp_path)
    assert not any(tmp_path.iterdir())
