"""Run a netx HDF5 file on Lava's bit-accurate fixed-point simulator and save every layer's spikes.

Runs inside the Lava venv (``make lava-venv``), imports nothing of edgefl. Usage:
``run_netx.py NET.h5 IN.npz OUT.npz``; IN holds ``spikes`` (T, N, d_in): N positions of T steps,
fed back to back as netx expects with ``reset_interval=T, reset_offset=1``. OUT holds ``layer<i>``
(T, N, d_i) for every dense layer i = 1, 2, ..., re-aligned for Lava's one-step delay per synapse
(layer i answers input step t at 0-based run step t + i; measured, see README).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from lava.lib.dl import netx
from lava.magma.core.run_conditions import RunSteps
from lava.magma.core.run_configs import Loihi2SimCfg
from lava.proc.io.sink import RingBuffer as Sink
from lava.proc.io.source import RingBuffer as Source


def run(net_path: str, spikes: np.ndarray) -> list[np.ndarray]:
    steps, positions, width = spikes.shape
    net = netx.hdf5.Network(net_config=net_path, reset_interval=steps, reset_offset=1)
    layers = list(net.layers)  # the dense layers: netx builds no block for our neuron-less input layer
    total = positions * steps + len(layers)
    stream = np.zeros((width, total))
    stream[:, : positions * steps] = spikes.transpose(1, 0, 2).reshape(positions * steps, width).T
    source = Source(data=stream)
    source.s_out.connect(net.inp)
    sinks = [Sink(shape=layer.out.shape, buffer=total) for layer in layers]
    for layer, sink in zip(layers, sinks):
        layer.out.connect(sink.a_in)
    net.run(condition=RunSteps(num_steps=total), run_cfg=Loihi2SimCfg(select_tag="fixed_pt"))
    recorded = [sink.data.get() for sink in sinks]
    net.stop()
    return [out[:, index: index + positions * steps].T.reshape(positions, steps, -1).transpose(1, 0, 2)
            for index, out in enumerate(recorded, start=1)]


def main() -> None:
    net_path, in_path, out_path = sys.argv[1:4]
    spikes = np.load(in_path)["spikes"]
    started = time.perf_counter()
    layers = run(net_path, spikes)
    np.savez(out_path, seconds=time.perf_counter() - started, **{f"layer{i}": s for i, s in enumerate(layers, 1)})


if __name__ == "__main__":
    main()
