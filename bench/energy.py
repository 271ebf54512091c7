"""Energy per forecast of every backbone on real weather windows, per hardware target, and
ONNX Runtime vs torch eager inference time.

FedQAPer section 4.2: pre-backbone and head are MACs for every backbone; an ANN backbone is
MACs, a spiking one ACs in proportion to its firing rate (plus the real-valued encoder's MACs).
The paper reports iSpikformer's backbone at 8.51e8 pJ vs iTransformer's 9.64e10 pJ (about 113x)
on 45 nm. Loihi and TrueNorth run exactly the spiking stack ``export lava``/``export nir``
deploy (``export.energy.chip_layers``); what they leave off-chip is priced on ``HOST`` (45 nm
fp32 arithmetic, a stand-in for the gateway CPU: no sourced per-operation CPU figure is shipped).
Each backbone here is trained briefly on one site so its firing rates are those of a
trained model (BatchNorm statistics recomputed on the training windows, see
``calibrate_batchnorm``), then counted on that site's held-out test windows. Per backbone a
per-layer table (input shape per window, fan-out, spikes in, MACs, ACs, pJ) lets a reader check
every count by hand, and for the spiking backbones NeuroBench's counts sit beside ours
(``export.crosscheck``; skipped when neurobench is not installed). Usage:

    python bench/energy.py --quick      # a few minutes on 2 cores
    python bench/energy.py              # longer training of the same paper-size models
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import bench_parser, configure, native_environment, run_config, run_parallel, save_figure, write_report

QUICK = {"site": "greensboro", "lookback": 96, "horizon": 48, "stride": 12, "epochs": 1, "batch_size": 64,
         "lr": 1e-3, "test_windows": 128, "seed": 7}
FULL = {**QUICK, "stride": 1, "epochs": 5, "test_windows": 512}
BACKBONES = ["dlinear", "itransformer", "lstm", "gru", "spikernn", "spikformer", "ispikformer"]
PROFILES = ["cmos45nm", "jetson_orin_nano", "loihi", "truenorth"]
HOST = "cmos45nm"
PAPER = {"ispikformer": 8.51e8, "itransformer": 9.64e10}


def paper_model(backbone: str, n_features: int, cfg: dict):
    """The backbone at the paper's sizes with the run's lookback, horizon and seed, untrained."""
    from edge_agent.models import ModelConfig, build_forecaster

    return build_forecaster(ModelConfig.paper(backbone=backbone, lookback=cfg["lookback"], horizon=cfg["horizon"]),
                            n_features, 4, cfg["seed"])


def run_job(backbone: str, cfg: dict, threads: int) -> dict:
    """Train one paper-size backbone briefly, count its ops, price them, time ONNX vs torch."""
    import dataclasses
    import tempfile

    import torch

    from edge_agent.data import load_site, prepare_client
    from edge_agent.models import BACKBONES as REGISTRY
    from edge_agent.train import calibrate_batchnorm, evaluate, make_optimizer, train_epochs
    from export.energy import chip_layers, energy_report
    from export.onnx import export_onnx
    from export.opcount import count_ops
    from export.profiles import load_profile

    torch.set_num_threads(threads)
    started = time.perf_counter()
    data = prepare_client(load_site(cfg["site"]), cfg["lookback"], cfg["horizon"], cfg["stride"])
    model = paper_model(backbone, data.n_features, cfg)
    train_epochs(model, data.train, cfg["epochs"], cfg["batch_size"], make_optimizer(model, cfg["lr"]), cfg["seed"])
    calibrate_batchnorm(model, data.train)  # after a short training the running stats are still at init
    error = evaluate(model, data.test)  # every test window: the forecast the counted firing rates buy
    positions = torch.linspace(0, len(data.test) - 1, cfg["test_windows"]).round().long().unique()
    test = dataclasses.replace(data.test, starts=data.test.starts[positions])  # evenly spread test windows
    layers, windows = count_ops(model, test)
    cmos = energy_report(layers, windows, load_profile(HOST))
    per_layer = [layer_row(layer, windows, cmos.layers[layer.name].pj) for layer in layers if layer.stage == "backbone"]
    rows, host = [], load_profile(HOST)
    for name in PROFILES:
        profile = load_profile(name)
        report = energy_report(layers, windows, profile, on_chip=chip_layers(model, profile), host=host)
        stages = report.stages.values()
        rows.append({
            "backbone": backbone, "kind": REGISTRY[backbone].kind, "profile": name, "precision": report.precision,
            "backbone_pj": report.backbone_pj, "chip_pj": report.chip_pj, "host_pj": report.host_pj,
            "host": report.host, "on_chip": report.on_chip, "total_pj": report.total_pj,
            "backbone_synaptic_pj": sum(v for k, v in report.stages["backbone"].pj_by_op.items() if k != "neuron_updates"),
            "macs": sum(s.macs for s in stages), "acs": sum(s.acs for s in stages),
            "dense_macs": sum(s.dense_macs for s in stages),  # spike-fed work on a target without ACs
            "backbone_neuron_updates": report.stages["backbone"].neuron_updates, "silent_layers": report.silent,
            "backbone_macs": report.stages["backbone"].macs, "backbone_acs": report.stages["backbone"].acs,
            "firing_rate": report.firing_rate, "not_priced": report.unpriced,
        })
    with tempfile.TemporaryDirectory() as folder:
        onnx = export_onnx(model, Path(folder), data.test, n_windows=cfg["test_windows"], timed=False)
        timing = timed_natively(model, Path(folder), data.test, {"backbone": backbone, "n_features": data.n_features,
                                                                 "threads": threads, **cfg})
    for row in rows:
        row.update(onnx_speedup=timing["torch_ms"] / timing["onnx_ms"], torch_ms=timing["torch_ms"],
                   onnx_ms=timing["onnx_ms"], onnx_max_abs_error=onnx.max_abs_error)
    neurobench = crosscheck(model, test) if REGISTRY[backbone].kind == "snn" else None
    return {"backbone": backbone, "rows": rows, "layers": per_layer, "neurobench": neurobench,
            "test": {"mase": error.mase, "mse": error.mse, "mae": error.mae}, "seconds": time.perf_counter() - started}


def timed_natively(model, folder: Path, windows, spec: dict) -> dict[str, float]:
    """torch eager against ONNX Runtime on the exported windows (``folder/model.onnx``), timed in a
    child process on the CPU's own kernels (``common.native_environment``): the counts above come
    from the pinned kernels, a speed ratio must not."""
    import subprocess
    import sys

    import torch

    from export.onnx import sample_windows

    x, marks = sample_windows(windows, spec["test_windows"])
    torch.save(model.state_dict(), folder / "state.pt")
    torch.save({"x": x, "marks": marks}, folder / "windows.pt")
    (folder / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, __file__, "--time-exported", str(folder)], env=native_environment(),
                          capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(done.stdout.splitlines()[-1])


def time_exported(folder: Path) -> dict[str, float]:
    """The child's side of ``timed_natively``: the same model rebuilt from its saved weights."""
    import torch

    from export.onnx import time_inference

    spec = json.loads((folder / "spec.json").read_text())
    torch.set_num_threads(spec["threads"])
    model = paper_model(spec["backbone"], spec["n_features"], spec)
    model.load_state_dict(torch.load(folder / "state.pt", weights_only=True))
    windows = torch.load(folder / "windows.pt", weights_only=True)
    return time_inference(model.eval(), folder / "model.onnx", windows["x"], windows["marks"])


def layer_row(layer, windows: int, pj: float) -> dict:
    """One backbone layer per window, as a reader checks it: ACs = spikes in x fan-out, MACs from shapes."""
    shape = list(layer.input_shape)
    if windows in shape:  # the batch axis (the first of that size: T or B leads every layout)
        shape[shape.index(windows)] = 1
    return {"name": layer.name.removeprefix("shared.backbone."), "cost": layer.cost, "input_shape": shape,
            "calls": layer.calls, "fan_out": layer.fan_out, "input_spikes": layer.input_spikes / windows,
            "input_rate": layer.input_rate, "macs": layer.macs / windows, "acs": layer.acs / windows,
            "neuron_updates": layer.neuron_updates / windows, "spikes": layer.spikes / windows,
            "firing_rate": layer.firing_rate, "pj": pj}


def crosscheck(model, test, windows: int = 16) -> dict | None:
    """NeuroBench's SynapticOperations and ActivationSparsity beside ours on ``windows`` test windows."""
    import dataclasses

    from export.contract import sample_windows
    from export.crosscheck import compare

    try:
        return dataclasses.asdict(compare(model, *sample_windows(test, windows)))
    except ImportError as err:
        return {"skipped": f"neurobench not installed ({err})"}


def markdown(summary: dict) -> str:
    rows = summary["rows"]
    lines = ["| backbone | kind | profile | backbone pJ on target | target pJ | off-chip pJ (host) | MACs | "
             "ACs (a target without ACs: dense MACs of spike-fed layers) | firing rate | layers on chip |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rate = f"{r['firing_rate']:.3f}" if r["firing_rate"] is not None else "-"
        host = f"{r['host_pj']:.3g} ({r['host']})" if r["host"] else "-"
        chip = "all" if r["on_chip"] is None else len(r["on_chip"])
        fed = f"{r['dense_macs']:.3g} dense MACs" if r["dense_macs"] else f"{r['acs']:.3g}"
        lines.append(f"| {r['backbone']} | {r['kind']} | {r['profile']} | {r['backbone_pj']:.3g} | {r['chip_pj']:.3g} | "
                     f"{host} | {r['macs']:.3g} | {fed} | {rate} | {chip} |")
    ratio = summary["snn_vs_ann"]
    lines += ["", f"Backbone energy on cmos45nm, iTransformer / iSpikformer: **{ratio['measured']:.1f}x** counting "
              f"MACs and ACs only (the paper's model; paper: {ratio['paper']:.0f}x; iSpikformer "
              f"{ratio['ispikformer_pj']:.3g} pJ vs paper 8.51e8, iTransformer {ratio['itransformer_pj']:.3g} pJ vs "
              f"paper 9.64e10); **{ratio['with_neuron_updates']:.1f}x** with neuron updates too (5.5 pJ each: "
              f"iSpikformer {ratio['ispikformer_with_updates_pj']:.3g} pJ, iTransformer has none).", "",
              "| backbone | torch eager ms | ONNX Runtime ms | speedup |", "|---|---|---|---|"]
    for r in rows:
        if r["profile"] == PROFILES[0]:
            lines.append(f"| {r['backbone']} | {r['torch_ms']:.2f} | {r['onnx_ms']:.2f} | {r['onnx_speedup']:.2f}x |")
    lines += error_table(summary)
    lines += neurobench_table(summary["neurobench"])
    for backbone, layers in summary["layers"].items():
        lines += layer_table(backbone, layers)
    return "\n".join(lines) + "\n"


def layer_table(backbone: str, layers: list[dict]) -> list[str]:
    """Per backbone layer, per window on cmos45nm: a Linear fed spikes costs spikes in x fan-out ACs."""
    lines = ["", f"### {backbone}: backbone layers per window (cmos45nm)", "",
             "| layer | op | input shape | fan-out | spikes in (rate) | MACs | ACs | neuron updates | spikes out (rate) | pJ |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in layers:
        spikes_in = f"{r['input_spikes']:.4g} ({r['input_rate']:.3f})" if r["fan_out"] and r["acs"] else "-"
        spikes_out = f"{r['spikes']:.4g} ({r['firing_rate']:.3f})" if r["firing_rate"] is not None else "-"
        shape = "x".join(map(str, r["input_shape"])) + (f" x{r['calls']} calls" if r["calls"] > 1 else "")
        lines.append(f"| {r['name']} | {r['cost']} | {shape} | {r['fan_out'] or '-'} | {spikes_in} | "
                     f"{r['macs']:.4g} | {r['acs']:.4g} | {r['neuron_updates']:.4g} | {spikes_out} | {r['pj']:.4g} |")
    return lines


def error_table(summary: dict) -> list[str]:
    """Each trained backbone's test error at the firing rates priced above, beside the anchors
    fitted on the same site's history and scored on the same test windows."""
    rates = {r["backbone"]: r["firing_rate"] for r in summary["rows"] if r["profile"] == PROFILES[0]}
    lines = ["", "Test error of the models priced above (every test window of the site; MASE on the training "
             "split's scale), and the free anchors on the same windows:", "",
             "| forecaster | firing rate | MASE | MSE | MAE |", "|---|---|---|---|---|"]
    for backbone, s in summary["test"].items():
        rate = f"{rates[backbone]:.3f}" if rates[backbone] is not None else "-"
        lines.append(f"| {backbone} | {rate} | {s['mase']:.4f} | {s['mse']:.4f} | {s['mae']:.4f} |")
    for name, s in summary["anchors"].items():
        if s:
            lines.append(f"| {name} (anchor) | - | {s['mase']:.4f} | {s['mse']:.4f} | {s['mae']:.4f} |")
    return lines


def neurobench_table(results: dict) -> list[str]:
    """Our counts beside NeuroBench's on the spiking backbones' Linear/Conv layers (export.crosscheck)."""
    lines = ["", "NeuroBench 2.3.0 beside our counter, per window (16 test windows; Linear and Conv layers):", "",
             "| backbone | activation sparsity ours / NeuroBench | ACs ours | NeuroBench ACs | NeuroBench MACs "
             "| our ACs on layers NeuroBench calls MAC | ops NeuroBench does not see |", "|---|---|---|---|---|---|---|"]
    for backbone, r in results.items():
        if "skipped" in r:
            lines.append(f"| {backbone} | {r['skipped']} | | | | | |")
            continue
        acs = sum(layer["ops"] for layer in r["layers"] if layer["cost"] == "ac")
        as_mac = sum(layer["ops"] for layer in r["layers"] if layer["cost"] == "ac" and layer["neurobench_cost"] == "mac")
        lines.append(f"| {backbone} | {r['sparsity']:.6f} / {r['neurobench_sparsity']:.6f} | {acs:.4g} | "
                     f"{r['neurobench_acs']:.4g} | {r['neurobench_macs']:.4g} | {as_mac:.4g} | {r['unseen_ops']:.4g} |")
    return lines


def plot(summary: dict, path: Path) -> None:
    """Backbone energy per forecast, backbones x profiles, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.8 / len(PROFILES)
    for offset, profile in enumerate(PROFILES):
        mine = {r["backbone"]: r["backbone_pj"] for r in rows if r["profile"] == profile}
        heights = [mine.get(b) or float("nan") for b in BACKBONES]  # nothing priced (off-chip): no bar
        ax.bar([i + offset * width for i in range(len(BACKBONES))], heights, width, label=profile)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(BACKBONES))], BACKBONES, rotation=20)
    ax.set(yscale="log", ylabel="backbone pJ per forecast",
           title="Backbone energy per forecast (no bar: runs off-chip on that target)")
    ax.set_ylim(top=ax.get_ylim()[1] * 30)  # room for the legend
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    save_figure(fig, path)


def site_anchors(cfg: dict) -> dict[str, dict | None]:
    """The anchors' test MASE, MSE and MAE on the benchmark site's windows (``common.anchor_scores``)."""
    from common import anchor_scores
    from edge_agent.data import load_site, prepare_client

    return anchor_scores([prepare_client(load_site(cfg["site"]), cfg["lookback"], cfg["horizon"], cfg["stride"])])


def main() -> None:
    parser = bench_parser(__doc__, "one short epoch of training per backbone")
    parser.add_argument("--time-exported", type=Path, help=argparse.SUPPRESS)  # timed_natively's child
    args, cfg, started = configure(parser, QUICK, FULL)
    if args.time_exported:
        print(json.dumps(time_exported(args.time_exported)))
        return
    jobs = run_parallel(run_job, [(b, cfg) for b in BACKBONES], args.workers,
                        lambda r: f"{r['backbone']:>12}: {r['rows'][0]['backbone_pj']:.3g} pJ backbone on "
                        f"{PROFILES[0]} ({r['seconds']:.0f} s)")
    rows = sorted((row for job in jobs for row in job["rows"]),
                  key=lambda r: (BACKBONES.index(r["backbone"]), PROFILES.index(r["profile"])))
    cmos = {r["backbone"]: r["backbone_synaptic_pj"] for r in rows if r["profile"] == "cmos45nm"}
    updates = {r["backbone"]: r["backbone_pj"] for r in rows if r["profile"] == "cmos45nm"}  # neuron updates priced
    ordered = sorted(jobs, key=lambda j: BACKBONES.index(j["backbone"]))
    summary = {
        "rows": rows,
        "layers": {job["backbone"]: job["layers"] for job in ordered},
        "test": {job["backbone"]: job["test"] for job in ordered},
        "anchors": site_anchors(cfg),
        "neurobench": {job["backbone"]: job["neurobench"] for job in jobs if job["neurobench"] is not None},
        "snn_vs_ann": {"measured": cmos["itransformer"] / cmos["ispikformer"], "paper": PAPER["itransformer"] /
                       PAPER["ispikformer"], "ispikformer_pj": cmos["ispikformer"], "itransformer_pj": cmos["itransformer"],
                       "with_neuron_updates": updates["itransformer"] / updates["ispikformer"],
                       "ispikformer_with_updates_pj": updates["ispikformer"]},
        "config": run_config(cfg, args.quick, started),
    }
    write_report(args.out, "energy", summary, markdown, plot)


if __name__ == "__main__":
    main()
