"""Lava netx export: file layout, the fixed-point CUBA model, agreement on real weather windows."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from edge_agent.data import TIME_FEATURES, load_site, prepare_client
from edge_agent.models import build_forecaster
from export.contract import ExportMismatchError
from export.lava import (
    cuba_dense,
    export_lava,
    quantized_stack,
    read_netx,
    simulate_cuba,
    write_netx,
)
from export.stack import DenseLIF, SpikingStack, UnsupportedLayerError, spiking_stack
from tests.conftest import small_config


@pytest.fixture(scope="module")
def client():
    return prepare_client(load_site("craig_co"), 24, 12, stride=24)


def spiking_model(client, steps: int = 4):
    """A SpikeRNN forecaster after ten real training steps, BatchNorm statistics from real data.

    Training moves the weights; the running statistics are then recomputed as plain averages
    over the same batches, as after a long training run. After only ten momentum-0.1 updates
    they still sit near their initial variance of 1, and in eval mode the encoder emitted no
    spike at all (measured), which would make every agreement trivially 1.
    """
    model = build_forecaster(small_config("spikernn", steps=steps), client.n_features, TIME_FEATURES, seed=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = list(client.train.batches(64, shuffle=False))[:10]
    torch.manual_seed(0)  # dropout draws from the global generator
    for x, marks, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x, marks), y).backward()
        optimizer.step()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average
    with torch.no_grad():
        for x, marks, _ in batches:
            model(x, marks)
    return model.eval()


@pytest.fixture(scope="module")
def model(client):
    return spiking_model(client)


def test_every_field_reads_back_as_written(model, tmp_path):
    stack = spiking_stack(model.shared["backbone"])
    path = tmp_path / "net.h5"
    quantized = write_netx(stack, path, steps=4)
    netx = read_netx(path)

    assert netx["simulation"] == {"Ts": 1, "tSample": 4}
    assert all(type(v) is np.int64 for v in netx["simulation"].values())
    assert list(netx["attrs"]["off_chip"]) == stack.off_chip
    assert len(netx["layer"]) == 1 + len(stack.layers)
    first = netx["layer"][0]
    assert set(first) == {"type", "shape"} and first["type"] == "input"
    np.testing.assert_array_equal(first["shape"], [stack.input_size])

    for layer, q, source in zip(netx["layer"][1:], quantized, stack.layers):
        assert set(layer) == {"type", "shape", "inFeatures", "outFeatures", "weight", "bias", "neuron", "attrs"}
        out, inp = source.weight.shape
        assert layer["type"] == "dense"
        assert layer["shape"].dtype == np.int64 and layer["shape"].tolist() == [out]
        assert (layer["inFeatures"], layer["outFeatures"]) == (inp, out)
        assert type(layer["inFeatures"]) is np.int64
        assert layer["weight"].dtype == np.int16 and layer["weight"].shape == (out, inp)
        assert layer["bias"].dtype == np.int16 and layer["bias"].shape == (out,)
        np.testing.assert_array_equal(layer["weight"], q.weight)
        np.testing.assert_array_equal(layer["bias"], q.bias)
        assert -256 <= layer["weight"].min() and layer["weight"].max() <= 254
        assert layer["neuron"] == {
            "type": "CUBA", "iDecay": 4096, "vDecay": 2048, "vThMant": q.v_th_mant, "refDelay": 1, "gradedSpike": False,
        }
        assert {k: type(v) for k, v in layer["neuron"].items()} == {
            "type": str, "iDecay": np.int64, "vDecay": np.int64, "vThMant": np.int64, "refDelay": np.int64,
            "gradedSpike": np.bool_,
        }
        assert layer["attrs"] == {"name": source.name, "scale": q.scale}
        # The integers are the float layer times 64 * scale, rounded.
        unit = 64 * q.scale
        np.testing.assert_allclose(layer["weight"] / unit, source.weight, atol=0.5 / unit + 1e-12)
        np.testing.assert_allclose(layer["bias"] / unit, source.bias, atol=0.5 / unit + 1e-12)
        assert layer["neuron"]["vThMant"] == round(unit * source.threshold)
        assert q.clipped_weights == q.clipped_biases == 0

    # What netx's NetDict relies on: 'type' is a (1,) fixed-length ASCII dataset, groups named 0..n-1.
    with h5py.File(path) as f:
        assert sorted(f["layer"], key=int) == [str(i) for i in range(len(netx["layer"]))]
        for name in ("layer/0/type", "layer/1/type", "layer/1/neuron/type"):
            assert f[name].shape == (1,) and f[name].dtype.kind == "S"


def test_forced_scale_clips_and_counts(model, tmp_path):
    stack = spiking_stack(model.shared["backbone"])
    quantized = write_netx(stack, tmp_path / "net.h5", steps=4, scale=16.0)
    netx = read_netx(tmp_path / "net.h5")
    for layer, q, source in zip(netx["layer"][1:], quantized, stack.layers):
        raw = np.round(source.weight * 64 * 16.0)
        assert q.clipped_weights == int(((raw < -256) | (raw > 254)).sum())
        np.testing.assert_array_equal(layer["weight"], np.clip(raw, -256, 254))
    assert sum(q.clipped_weights for q in quantized) > 0


# A hand-built layer, scale 1: weight = w * 64, bias = b * 64, vThMant = 64; Lava shifts input,
# bias and threshold by 6 bits (threshold 4096) and halves v each step, truncating toward zero.
HAND = DenseLIF(
    "hand", np.array([[0.5, 0.25], [-0.5, 1.0], [0.0, 0.0]]), np.array([1 / 16, -1 / 64, -1 / 64]), 0.5, 1.0
)
HAND_INPUT = np.array([[1, 0], [1, 1], [0, 1], [1, 1], [0, 0], [0, 0], [1, 0], [0, 1]], dtype=np.float64)[:, None]
HAND_U = [  # u = (weight @ s) << 6; iDecay = 4096 keeps no current from the step before
    [2048, 3072, 1024, 3072, 0, 0, 2048, 1024],
    [-2048, 2048, 4096, 2048, 0, 0, -2048, 4096],
    [0] * 8,
]
HAND_V = [  # v = trunc(v / 2) + u + (bias << 6), then 0 after a spike (v > 4096)
    [2304, 0, 1280, 3968, 2240, 1376, 2992, 2776],  # step 1: 1152 + 3072 + 256 = 4480 spikes
    [-2112, 928, 0, 1984, 928, 400, -1912, 3076],  # step 2: 464 + 4096 - 64 = 4496 spikes
    [-64, -96, -112, -120, -124, -126, -127, -127],  # trunc(-127 / 2) = -63, floor would give -128
]
HAND_SPIKES = [[0, 1, 0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0], [0] * 8]


def test_hand_built_layer_integer_voltages(tmp_path):
    stack = SpikingStack(2, [HAND])
    write_netx(stack, tmp_path / "hand.h5", steps=8, scale=1.0)
    netx = read_netx(tmp_path / "hand.h5")
    layer = netx["layer"][1]
    assert layer["weight"].tolist() == [[32, 16], [-32, 64], [0, 0]]
    assert layer["bias"].tolist() == [4, -1, -1] and layer["neuron"]["vThMant"] == 64

    spikes, u, v = cuba_dense(layer, HAND_INPUT)
    assert u[:, 0].T.tolist() == HAND_U
    assert v[:, 0].T.tolist() == HAND_V
    assert spikes[:, 0].T.astype(int).tolist() == HAND_SPIKES
    assert simulate_cuba(netx, HAND_INPUT)[0].tolist() == spikes.tolist()
    assert quantized_stack(stack, scale=1.0).run(HAND_INPUT)[0][:, 0].T.tolist() == HAND_SPIKES


def test_current_persists_when_i_decay_below_4096():
    layer = {"weight": np.array([[64]]), "neuron": {"iDecay": 1024, "vDecay": 0, "vThMant": 1000}}
    _, u, v = cuba_dense(layer, np.array([[[1]], [[0]], [[0]]]))
    assert u.ravel().tolist() == [4096, 3072, 2304]  # u * (4096 - 1024) / 4096 each step
    assert v.ravel().tolist() == [4096, 7168, 9472]  # vDecay 0: no leak


@pytest.mark.parametrize("steps", [4, 16])
def test_fixed_point_agrees_on_weather_windows(steps, client, tmp_path):
    """The fixed-point run must reproduce the float model with the same integers.

    Up to 7 steps it must agree exactly: every voltage is a multiple of 64 halved at most six
    times, an integer that float64 also holds exactly, so both compute the same numbers. From
    step 8 on, Lava truncates v * 2048 / 4096 toward zero, at most one unit (1 / 4096 of the
    quantized voltage) off the float value per step; a neuron that lands that close to threshold
    flips and the flip travels to the next layers, hence 0.999 there (measured >= 0.99988 over
    12 models). Either fails if the file, its units or the equations were wrong.
    """
    model = spiking_model(client, steps)
    path = tmp_path / "net.h5"
    report = export_lava(model, path, client.test, n_windows=64)
    names = [layer.name for layer in spiking_stack(model.shared["backbone"]).layers]
    assert [layer["name"] for layer in report.layers] == names
    assert report.windows == 64 and report.steps == steps and report.files == [str(path)] and path.exists()
    for layer in report.layers:
        assert layer["agreement_quantized"] >= (1.0 if steps <= 7 else 0.999)
        assert layer["agreement_float"] >= 0.95  # the cost of 8-bit weights (measured 0.964-0.9996)
        assert 0.05 < report.firing_rates[layer["name"]] < 0.5
    assert report.spike_agreement == min(layer["agreement_quantized"] for layer in report.layers)
    assert report.details["clipped_weights"] == 0


def test_a_file_that_does_not_reproduce_the_model_is_refused(model, client, tmp_path, monkeypatch):
    def misread(path):
        netx = read_netx(path)
        netx["layer"][-1]["neuron"]["vThMant"] *= 2  # as if the threshold were written in other units
        return netx

    monkeypatch.setattr("export.lava.read_netx", misread)
    with pytest.raises(ExportMismatchError, match=r"^shared\.backbone\.stack\.2: the netx file's fixed-point"):
        export_lava(model, tmp_path / "net.h5", client.test, n_windows=16)


@pytest.mark.parametrize(("field", "change"), [("neuron/vThMant", 1), ("weight", -1)])
def test_one_integer_off_by_one_step_in_the_written_file_is_refused(model, client, tmp_path, monkeypatch, field,
                                                                     change):
    """The negative control: one mantissa step of one threshold (or one weight's least step) in the
    file, which may change no spike on the windows checked, must fail, and nothing is left behind."""
    from export import lava

    write = lava.write_netx

    def tampered(stack, path, steps, scale=None):
        quantized = write(stack, path, steps, scale)
        with h5py.File(path, "r+") as netx:
            data = netx[f"layer/1/{field}"]
            values = data[()]
            if values.shape:
                values.flat[0] += change
            else:
                values += change
            data[()] = values
        return quantized

    monkeypatch.setattr(lava, "write_netx", tampered)
    name = field.split("/")[-1]
    with pytest.raises(ExportMismatchError, match=rf"stack\.0: the netx file's fixed-point {name} reads back other"):
        export_lava(model, tmp_path / "net.h5", client.test, n_windows=16)
    assert not list(tmp_path.iterdir())


def test_unsupported_backbone_names_the_layer(client, tmp_path):
    model = build_forecaster(small_config("dlinear"), client.n_features, TIME_FEATURES, seed=1)
    with pytest.raises(UnsupportedLayerError, match="ANN backbone") as err:
        export_lava(model.eval(), tmp_path / "net.h5", client.test, n_windows=4)
    assert str(err.value).startswith("shared.backbone")
    assert not (tmp_path / "net.h5").exists()
