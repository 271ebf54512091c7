"""FeDaL on the seven weather stations: the paper's Table 1 and a leave-sites-out zero-shot table.

Pretraining fleet (FeDaL's dataset heterogeneity): the training stations at several resolutions
plus per-variable clients (``mixed_fleet``), 24-step windows. Held-out stations never enter
pretraining. All methods train on the same patch masks, rounds, participation, local epochs and
seeds, so one thing changes at a time:

- Table 1: masked-reconstruction MSE on the training clients' test windows, averaged over five
  masking rates, sample-weighted, for FedAvg, FedProx, Standalone and FeDaL (FeDaL also with each
  client's own DBE bias), and the bytes communicated over the run (float32 models both ways for
  every participant and round, plus FeDaL's core-sets up);
- zero-shot (Table 4's setting): 12 h forecasts from 12 h of context on held-out stations' test
  windows, MSE and MASE on the scale of each station's whole training split: FeDaL's and FedAvg's
  foundation models (masked-future reconstruction), the anchor each station picks on its
  validation windows (edge_agent.selection, fitted on the same 14 days) and a Local DLinear trained
  on those 14 days;
- attacker report: how closely uploaded core-sets follow a real window of their client
  (nearest-window correlation) per Fourier-magnitude noise level.

Mean +- std over seeds; a method wins on a client or station only where its margin exceeds the
std of the paired per-seed differences. Usage:

    python bench/fedal.py --quick     # one fold, few rounds (about 10 min on 2 cores)
    python bench/fedal.py             # two folds, paper-like rounds, all per-variable clients
"""

from __future__ import annotations

import functools
import time

from common import bench_parser, configure, run_config, run_parallel, write_report
from fedal_report import markdown, plot, summarize

QUICK = {"folds": [["greensboro", "amsterdam"]], "steps": ["1h", "3h"], "single_variables": ["temp_air", "ghi"],
         "rounds": 8, "local_epochs": 1, "participation": 0.5, "stride": 12, "test_every": 4, "prox_mu": 0.01,
         "rates": [0.25, 0.375, 0.5, 0.625, 0.75], "horizon": 12, "history_days": 14, "local_epochs_max": 40,
         "local_patience": 5, "attack_clients": 4, "sigmas": [0.0, 0.25, 0.5, 1.0], "seeds": [1, 2, 3]}
FULL = {**QUICK, "folds": [["greensboro", "amsterdam"], ["miami", "pvgis_it"]], "single_variables": None,
        "rounds": 20, "local_epochs": 2, "stride": 3, "test_every": 1, "attack_clients": 8}
METHODS = ("fedavg", "fedprox", "standalone", "fedal")


@functools.lru_cache(maxsize=2)
def fleet(held_out: tuple[str, ...], cfg_items: tuple) -> list:
    """The pretraining devices of a fold: every other station at ``steps``, plus its per-variable
    clients (only ``single_variables`` if given), windowed on the foundation's layout."""
    from edge_agent.data import list_sites, load_sites
    from edge_agent.data.canonical import device_series
    from edge_agent.data.resample import mixed_fleet
    from edge_agent.models.foundation_config import FoundationConfig

    cfg, fm = dict(cfg_items), FoundationConfig()
    tables = mixed_fleet(load_sites([s for s in list_sites() if s not in held_out]), cfg["steps"])
    keep = cfg["single_variables"]
    tables = [t for t in tables if keep is None or t.n_features > 1 or t.columns[0] in keep]
    return [device_series(t, fm.variables, fm.window, cfg["stride"]) for t in tables]


def settings(method: str, seed: int, cfg: dict):
    """The PretrainConfig of a method: FedAvg/FedProx/Standalone on FeDaL's patch masks, no DBE or core-sets."""
    from coordinator.simulation.pretrain_config import PretrainConfig
    from edge_agent.learners.fedal import FedalClientSettings

    plain = FedalClientSettings(dbe=None, coreset=None, prox_mu=cfg["prox_mu"] if method == "fedprox" else 0.0)
    return PretrainConfig(rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], participation=cfg["participation"],
                          stride=cfg["stride"], seed=seed, strategy="fedal" if method == "fedal" else "fedavg",
                          client=None if method == "fedal" else plain)


def recon(model, device, pcfg, cfg: dict, bias=None) -> list[float]:
    """Masked-reconstruction MSE on a device's (subsampled) test windows, one value per masking rate."""
    from edge_agent.learners.fedal import reconstruction_mse

    client = pcfg.device_side
    return [reconstruction_mse(model, device.test[:: cfg["test_every"]], device.present, client.patch, rate,
                               pcfg.seed, bias) for rate in cfg["rates"]]


def communicated_bytes(devices: list, pcfg) -> int:
    """Float32 bytes over the run: the global model down and the model (+ core-set) up, per participant."""
    from coordinator.simulation.participation import sampled
    from edge_agent.learners.fedal import coreset_layout
    from edge_agent.models.foundation import FoundationModel
    from edge_agent.models.foundation_config import FoundationConfig

    fm = FoundationConfig()
    state = sum(v.numel() for v in FoundationModel(fm).state_dict().values())
    coreset = sum(v.numel() for v in coreset_layout(fm, pcfg.device_side).values())
    participations = int(sampled(pcfg.rounds, len(devices), pcfg.participation, pcfg.seed).present.sum())
    return 4 * participations * (2 * state + coreset)


def pretrain_job(method: str, fold: int, seed: int, cfg: dict, threads: int) -> dict:
    """One pretraining method with one seed on one fold: Table 1 values, zero-shot on the held-out
    stations (not Standalone: it has no shared model), and FeDaL's attacker report."""
    import torch

    from coordinator.simulation.pretrain import pretrain, pretrain_standalone, pretraining_learners
    from edge_agent.models.foundation_config import FoundationConfig

    torch.set_num_threads(threads)
    started, held_out = time.perf_counter(), tuple(cfg["folds"][fold])
    devices, pcfg, fm = fleet(held_out, items(cfg)), settings(method, seed, cfg), FoundationConfig()
    out = {"method": method, "fold": fold, "seed": seed, "clients": [d.name for d in devices],
           "sizes": [len(d.test[:: cfg["test_every"]]) for d in devices]}
    if method == "standalone":
        learners = pretrain_standalone(devices, fm, pcfg)
        out.update(recon=[recon(l.model, d, pcfg, cfg) for l, d in zip(learners, devices)], bytes=0, val_curve=[])
    else:
        learners = pretraining_learners(devices, fm, pcfg)
        model, records = pretrain(devices, fm, pcfg, lambda r: print(f"  {method} fold {fold} seed {seed} round "
                                                                    f"{r.round}: val {r.val_loss:.4f}", flush=True),
                                  learners=learners)
        out.update(recon=[recon(model, d, pcfg, cfg) for d in devices], bytes=communicated_bytes(devices, pcfg),
                   val_curve=[r.val_loss for r in records], zero_shot=zero_shot(model, held_out, cfg))
    if method == "fedal":
        out["recon_own_bias"] = [recon(model, d, pcfg, cfg, l.own_bias()) for l, d in zip(learners, devices)]
        spaced = devices[:: len(devices) // cfg["attack_clients"]][: cfg["attack_clients"]]  # across stations
        out["attack"] = attack(model, spaced, pcfg, cfg)
    return {**out, "seconds": time.perf_counter() - started}


def items(cfg: dict) -> tuple:
    """``cfg`` as a hashable key for the per-worker caches."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in cfg.items()
                        if k not in ("folds", "seeds")))


@functools.lru_cache(maxsize=4)
def held_out_client(site: str, cfg_items: tuple):
    """A held-out station's windows (24 h of context, ``horizon`` ahead) with the last
    ``history_days`` of its training split as the only history, scaled with their statistics."""
    from edge_agent.data import load_site, prepare_client

    cfg = dict(cfg_items)
    return prepare_client(load_site(site), 24, cfg["horizon"], history=cfg["history_days"] * 24)


def zero_shot(model, held_out: tuple[str, ...], cfg: dict) -> dict[str, dict[str, float]]:
    """Per held-out station: MSE/MAE of the foundation's forecasts of its test windows."""
    import torch

    from edge_agent.data import load_site
    from edge_agent.data.canonical import canonical_index
    from edge_agent.zero_shot import fill_horizon

    from edge_agent.train import forecast_metrics

    scores = {}
    for site in held_out:
        client = held_out_client(site, items(cfg))
        x, _, y = client.test.batch(torch.arange(len(client.test)))
        index = canonical_index(load_site(site), model.cfg.variables)
        scores[site] = metric_dict(forecast_metrics([(fill_horizon(model, x, index, cfg["horizon"]), y)], None, None,
                                                    client.test.scale))
    return scores


def metric_dict(metrics) -> dict[str, float]:
    return {"mse": metrics.mse, "mae": metrics.mae, "mase": metrics.mase}


def local_job(fold: int, seed: int, cfg: dict, threads: int) -> dict:
    """The held-out stations' Local DLinear (14 days, early stopping on validation) and the anchor
    each would serve: the best on its validation windows, fitted on the same 14 days."""
    import torch

    from common import ANCHORS
    from coordinator.simulation.baselines import TrainingBudget, run_local_only
    from edge_agent.models import ModelConfig
    from edge_agent.selection import best_anchor

    torch.set_num_threads(threads)
    started = time.perf_counter()
    clients = [held_out_client(site, items(cfg)) for site in cfg["folds"][fold]]
    model = ModelConfig.paper(lookback=24, horizon=cfg["horizon"], d_qap=32, hidden=32, moving_avg=13)
    budget = TrainingBudget(cfg["local_epochs_max"], cfg["local_patience"], 32, 3e-3, seed)
    local = run_local_only(clients, model, budget)
    anchors = {c.name: best_anchor(c, ANCHORS) for c in clients}
    return {"method": "local", "fold": fold, "seed": seed, "seconds": time.perf_counter() - started,
            "zero_shot": {c: metric_dict(m) for c, m in local.client_test.items()},
            "anchor": {c.name: {**metric_dict(anchors[c.name].metrics(c, "test")), "which": anchors[c.name].which}
                       for c in clients}}


def attack(model, devices: list, pcfg, cfg: dict) -> dict[str, float]:
    """Nearest-window correlation (mean over ``devices``) of a core-set learnt on the final model,
    uploaded at each noise level; the same noise on real windows handed over (what the noise alone
    hides); and the Gaussian noise the core-set starts from (the same draw)."""
    import torch

    from edge_agent.coreset import learn_coreset, nearest_window_correlation, private_coreset
    from edge_agent.seeds import Stream, seed_for

    client, found = pcfg.device_side, {}
    for i, d in enumerate(devices):
        seed = seed_for(pcfg.seed, Stream.CORESET, 0, i)  # round 0: never one of the training rounds
        learnt = learn_coreset(model, d.train, d.present, client.coreset, client.patch, client.mask_rate, seed)
        uploads = {"gaussian start": torch.randn(learnt.shape, generator=torch.Generator().manual_seed(seed))
                   * d.present}
        for sigma in cfg["sigmas"]:
            noise = seed_for(pcfg.seed, Stream.CORESET_NOISE, 0, i)
            uploads[f"core-set, sigma={sigma:g}"] = private_coreset(learnt, d.present, sigma, noise)
            uploads[f"real windows, sigma={sigma:g}"] = private_coreset(d.train[: len(learnt)], d.present, sigma, noise)
        for name, upload in uploads.items():
            found.setdefault(name, []).append(nearest_window_correlation(upload, d.train, d.present))
    return {name: sum(v) / len(v) for name, v in sorted(found.items())}


def run_job(method: str, fold: int, seed: int, cfg: dict, threads: int) -> dict:
    return (local_job(fold, seed, cfg, threads) if method == "local"
            else pretrain_job(method, fold, seed, cfg, threads))


def main() -> None:
    args, cfg, started = configure(bench_parser(__doc__, "one fold, few rounds, sparse windows"), QUICK, FULL)
    print(f"{'quick' if args.quick else 'full'} mode: {cfg}")
    jobs = [(m, f, s, cfg) for f in range(len(cfg["folds"])) for m in (*METHODS, "local") for s in cfg["seeds"]]
    runs = run_parallel(run_job, jobs, args.workers,
                        lambda r: f"{r['method']:>10} fold {r['fold']} seed {r['seed']} done ({r['seconds']:.0f} s)")
    summary = {**summarize(runs, cfg), "runs": runs, "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "fedal", summary, markdown, plot)


if __name__ == "__main__":
    main()
