"""bench/fedal.py's summary, markdown and plot: Table 1 rows, zero-shot rows with per-station
verdicts, the attacker table; every value mean +- std over seeds."""

from __future__ import annotations

import statistics
from pathlib import Path

from common import save_figure

TABLE1 = ("fedavg", "fedprox", "standalone", "fedal", "fedal_own_bias")
ZERO_SHOT = ("fedal", "fedavg", "fedprox", "anchor", "local")
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "standalone": "Standalone", "fedal": "FeDaL",
          "fedal_own_bias": "FeDaL (own DBE bias)", "anchor": "best anchor (validation)", "local": "Local (14 days)"}


def spread(values: list[float]) -> tuple[float, float]:
    """(mean, sample std; 0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def verdict(mine: list[float], other: list[float]) -> str:
    """win / loss / tie of ``mine`` (lower is better) against ``other``, paired by seed: a win or
    loss only where the mean margin exceeds the std of the per-seed differences."""
    margin, noise = spread([o - m for m, o in zip(mine, other)])
    return "win" if margin > noise else "loss" if margin < -noise else "tie"


def weighted(values: list[float], sizes: list[int]) -> float:
    return sum(v * n for v, n in zip(values, sizes)) / sum(sizes)


def table1(runs: list[dict], fold: int) -> list[dict]:
    """Table 1 rows of a fold: per-rate and rate-averaged MSE (sample-weighted over clients),
    bytes, and per-client verdicts against FedAvg."""
    by_method = {}
    for r in (r for r in runs if r["fold"] == fold and r["method"] in TABLE1):
        by_method.setdefault(r["method"], []).append(r)
        if "recon_own_bias" in r:
            by_method.setdefault("fedal_own_bias", []).append({**r, "recon": r["recon_own_bias"]})
    per_client = {m: [[statistics.fmean(c) for c in r["recon"]] for r in rs] for m, rs in by_method.items()}
    rows = []
    for method in TABLE1:
        mine, sizes = by_method[method], by_method[method][0]["sizes"]
        rates = [[weighted([c[k] for c in r["recon"]], sizes) for r in mine] for k in range(len(mine[0]["recon"][0]))]
        verdicts = [verdict([s[c] for s in per_client[method]], [s[c] for s in per_client["fedavg"]])
                    for c in range(len(sizes))]
        fleet = [weighted(s, sizes) for s in per_client[method]]
        rows.append({"fold": fold, "method": method, "clients": len(sizes), "mse": spread(fleet),
                     "fleet_vs_fedavg": verdict(fleet, [weighted(s, sizes) for s in per_client["fedavg"]]),
                     "rates": [spread(v) for v in rates], "bytes": mine[0]["bytes"],
                     "clients_vs_fedavg": {v: verdicts.count(v) for v in ("win", "loss", "tie")}})
    return rows


def zero_shot_rows(runs: list[dict], fold: int) -> list[dict]:
    """Per held-out station and method: MSE/MAE over seeds and FeDaL's verdicts on MSE."""
    scores: dict[str, dict[str, list[dict]]] = {}
    for r in (r for r in runs if r["fold"] == fold and "zero_shot" in r):
        for method, found in ((r["method"], r["zero_shot"]), ("anchor", r.get("anchor"))):
            for site, metrics in (found or {}).items():
                scores.setdefault(site, {}).setdefault(method, []).append(metrics)
    rows = []
    for site, methods in scores.items():
        mse = {m: [v["mse"] for v in methods[m]] for m in ZERO_SHOT}
        rows.append({"fold": fold, "site": site, **{m: {"mse": spread(mse[m]),
                                                        "mae": spread([v["mae"] for v in methods[m]]),
                                                        "mase": spread([v["mase"] for v in methods[m]])}
                                                     for m in ZERO_SHOT},
                     "fedal_vs": {m: verdict(mse["fedal"], mse[m]) for m in ZERO_SHOT if m != "fedal"}})
    return rows


def summarize(runs: list[dict], cfg: dict) -> dict:
    folds = range(len(cfg["folds"]))
    attacks = [r["attack"] for r in runs if "attack" in r]
    curves = {f"{m} fold {f}": [statistics.fmean(v) for v in zip(*(r["val_curve"] for r in runs
                                                                    if r["method"] == m and r["fold"] == f))]
              for f in folds for m in ("fedavg", "fedprox", "fedal")}
    return {"table1": [row for f in folds for row in table1(runs, f)],
            "zero_shot": [row for f in folds for row in zero_shot_rows(runs, f)],
            "attack": {name: spread([a[name] for a in attacks]) for name in attacks[0]}, "val_curves": curves}


def cell(pair: tuple[float, float] | list[float]) -> str:
    return f"{pair[0]:.4f} ± {pair[1]:.4f}"


def markdown(summary: dict) -> str:
    cfg = summary["config"]
    rates = " | ".join(f"rate {r:g}" for r in cfg["rates"])
    lines = [f"FeDaL bench ({cfg['mode']} mode), mean ± std over seeds {cfg['seeds']}.", "",
             "## Table 1: masked-reconstruction MSE (training clients' test windows, averaged over "
             f"{len(cfg['rates'])} masking rates)", ""]
    for fold, held_out in enumerate(cfg["folds"]):
        clients = next(r["clients"] for r in summary["table1"] if r["fold"] == fold)
        lines += [f"Fold {fold}: {clients} training clients, held out: {', '.join(held_out)}.", "",
                  f"| method | avg MSE | {rates} | Comm. (MB) | vs FedAvg | clients win / loss / tie vs FedAvg |",
                  "|---|---|" + "---|" * len(cfg["rates"]) + "---|---|---|"]
        for r in (r for r in summary["table1"] if r["fold"] == fold):
            wins = "—" if r["method"] == "fedavg" else " / ".join(str(r["clients_vs_fedavg"][v])
                                                                  for v in ("win", "loss", "tie"))
            comm = f"{r['bytes'] / 1e6:.2f}" if r["bytes"] else "—"
            lines.append(f"| {LABELS[r['method']]} | {cell(r['mse'])} | " + " | ".join(map(cell, r["rates"])) +
                         f" | {comm} | {'—' if r['method'] == 'fedavg' else r['fleet_vs_fedavg']} | {wins} |")
    lines += ["", f"## Zero-shot on held-out stations: {cfg['horizon']} h from 12 h of context (MSE / MASE, on "
              "the scale of each station's whole training split; the best anchor is the one each station picks on its "
              f"validation windows, fitted on the same last {cfg['history_days']} days as Local)", "",
              "| station | " + " | ".join(LABELS[m] for m in ZERO_SHOT) + " | FeDaL vs FedAvg | FeDaL vs best anchor | "
              "FeDaL vs Local |", "|---|" + "---|" * (len(ZERO_SHOT) + 3)]
    for r in summary["zero_shot"]:
        lines.append(f"| {r['site']} | " + " | ".join(f"{cell(r[m]['mse'])} / {r[m]['mase'][0]:.4f}"
                                                     for m in ZERO_SHOT) +
                     f" | {r['fedal_vs']['fedavg']} | {r['fedal_vs']['anchor']} | {r['fedal_vs']['local']} |")
    lines += ["", "## Attacker: nearest-window correlation of an uploaded core-set with its client's real windows",
              "", "| upload | correlation |", "|---|---|"]
    lines += [f"| {name} | {cell(value)} |" for name, value in summary["attack"].items()]
    return "\n".join(lines + ["", *settings_and_notes(summary)]) + "\n"


def settings_and_notes(summary: dict) -> list[str]:
    """The run's settings and the verdicts in words, with what the numbers do not say."""
    cfg = summary["config"]
    fleet = {r["fold"]: r["fleet_vs_fedavg"] for r in summary["table1"] if r["method"] == "fedal"}
    zero = ", ".join(f"{r['site']} {r['fedal_vs']['fedavg']}" for r in summary["zero_shot"])
    return [
        "## Settings", "",
        f"{cfg['rounds']} rounds, participation {cfg['participation']}, {cfg['local_epochs']} local epoch(s), "
        f"every {cfg['stride']}th training window, every {cfg['test_every']}th test window, resolutions "
        f"{cfg['steps']}, single-variable clients {cfg['single_variables'] or 'all'}, FedProx mu {cfg['prox_mu']}, "
        f"{cfg['wall_seconds']} s on {cfg['cpu_count']} cores.", "",
        "## Notes", "",
        f"- FeDaL vs FedAvg: reconstruction {', '.join(f'fold {f} {v}' for f, v in fleet.items())}; "
        f"zero-shot {zero}. A win or loss needs the mean paired margin to exceed the std of the per-seed "
        "differences; the rest are ties.",
        "- The zero-shot verdicts are on MSE; compare the MASE columns before calling a method better than "
        "the anchor. Local sees 24 h of context (the foundations 12 h) and early-stops on the validation split.",
        "- Every method is pretrained at 75% masking only; the other masking rates are inputs it never saw.",
        "- The correlation is Pearson, blind to level and scale, which is what Fourier-magnitude noise partly "
        "hides; the phase (timing, periodicity) is kept exactly, so the noise is not differential privacy. A "
        "variable constant over a window has no correlation and counts 0, so real windows score just under 1.",
    ]


def plot(summary: dict, path: Path) -> None:
    """Table 1 bars, zero-shot MSE per held-out station, validation MSE per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, zero, curves) = plt.subplots(1, 3, figsize=(13, 3.4))
    rows = summary["table1"]
    bars.bar(range(len(rows)), [r["mse"][0] for r in rows], yerr=[r["mse"][1] for r in rows], capsize=3)
    bars.set_xticks(range(len(rows)), [f"{LABELS[r['method']]}\nfold {r['fold']}" for r in rows], fontsize=6)
    bars.set(title="Table 1: reconstruction MSE", ylabel="MSE (avg over masking rates)")
    sites, width = summary["zero_shot"], 0.8 / len(ZERO_SHOT)
    for k, method in enumerate(ZERO_SHOT):
        zero.bar([i + k * width for i in range(len(sites))], [r[method]["mse"][0] for r in sites], width,
                 yerr=[r[method]["mse"][1] for r in sites], capsize=2, label=LABELS[method])
    zero.set_xticks([i + 0.4 - width / 2 for i in range(len(sites))], [r["site"] for r in sites])
    zero.set(title="zero-shot, held-out stations", ylabel="forecast MSE (standardized)")
    zero.legend(fontsize=6)
    for name, curve in summary["val_curves"].items():
        curves.plot(range(1, len(curve) + 1), curve, marker="o", label=name)
    curves.set(title="pretraining validation", xlabel="round", ylabel="masked MSE")
    curves.legend(fontsize=6)
    save_figure(fig, path)
