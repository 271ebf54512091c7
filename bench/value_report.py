"""bench/value.py's report: the rows (means over seeds, per-gateway comparisons), the issue's
verdicts, value.md's tables and value.png, from the runs alone, so ``--report-only`` re-renders
them without training; and the names of the methods every part of the bench shares."""

from __future__ import annotations

from pathlib import Path

from common import panel_row, save_figure

FEDERATED = ("fedavg", "fedrep")  # fedrep: personal_epochs from the config fit the personal part first
POOLED = "centralized"  # every gateway's data in one place: the most a federation of them could learn
SERVED, SERVED_FEDERATED = "served", "fedavg"  # what the product serves, and its federated candidate


def summarize(runs: list[dict], cfg: dict) -> list[dict]:
    """One row per (dataset, K, backbone, method): means over seeds and per-client comparisons."""
    import numpy as np

    anchor_names = set(cfg["anchors"])
    best_anchor, val_anchor = {}, {}
    for r in runs:
        if r["method"] in anchor_names:
            for client, s in r["clients"].items():
                key = (r["dataset"], r["history_days"], client)
                best_anchor[key] = min(best_anchor.get(key, np.inf), s["mase"])
                val_anchor[key] = min(val_anchor.get(key, (np.inf, np.inf)), (s["val"], s["mase"]))
    local = {(r["dataset"], r["history_days"], r["backbone"], r["seed"]): r["clients"] for r in runs
             if r["method"] == "local"}
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["dataset"], r["history_days"], r["backbone"], r["method"]), []).append(r)
    rows = []
    for (dataset, days, backbone, method), group in groups.items():
        fleet_means = {m: [float(np.mean([c[m] for c in r["clients"].values()])) for r in group]
                       for m in ("mase", "mse", "mae")}
        excess = [s["mase"] / best_anchor[dataset, days, c] - 1 for r in group for c, s in r["clients"].items()]
        row = {"dataset": dataset, "history_days": days, "backbone": backbone, "method": method,
               "mase": float(np.mean(fleet_means["mase"])), "mse": float(np.mean(fleet_means["mse"])),
               "mae": float(np.mean(fleet_means["mae"])),
               "mase_spread": (max(fleet_means["mase"]) - min(fleet_means["mase"])) / 2,
               "seeds": [r["seed"] for r in group if r["seed"] is not None],
               "client_runs": sum(len(r["clients"]) for r in group),
               "clients_better_than_best_anchor": sum(e < 0 for e in excess),
               "worst_client_vs_best_anchor": max(excess), **against_val_anchor(group, val_anchor)}
        if backbone is not None:
            row["clients_better_than_local"] = sum(
                s["mase"] < local[dataset, days, backbone, r["seed"]][c]["mase"]
                for r in group for c, s in r["clients"].items())
        if method == SERVED:
            counts: dict[str, int] = {}
            for r in group:
                for s in r["clients"].values():
                    for name, n in s["served"].items():
                        counts[name] = counts.get(name, 0) + n
            row["served_share"] = {name: n / sum(counts.values()) for name, n in sorted(counts.items())}
        rows.append(row)
    return rows


def against_val_anchor(group: list[dict], val_anchor: dict[tuple, tuple[float, float]]) -> dict:
    """Each gateway against the anchor its own validation windows pick (no hindsight; its test
    MASE): the share of gateway runs within 2% of it and the largest excess of one."""
    excess = [s["mase"] / val_anchor[r["dataset"], r["history_days"], c][1] - 1
              for r in group for c, s in r["clients"].items()]
    return {"gateways_within_2pct": sum(e <= 0.02 for e in excess) / len(excess),
            "worst_gateway_vs_val_anchor": max(excess)}


def verdicts(rows: list[dict], cfg: dict) -> dict:
    """The issue's goals, each with the numbers that decide it."""
    import numpy as np

    out: dict = {"served_at_most_best_anchor": [], "federated_pays_when_scarce": [], "learned_beats_anchors_full": []}
    for dataset in cfg["datasets"]:
        for days in cfg["history_days"]:
            cell = [r for r in rows if (r["dataset"], r["history_days"]) == (dataset, days)]
            anchor = min((r for r in cell if r["backbone"] is None), key=lambda r: r["mase"])
            for backbone in cfg["backbones"]:
                by = {r["method"]: r for r in cell if r["backbone"] == backbone}
                served = by[SERVED]
                out["served_at_most_best_anchor"].append({
                    "dataset": dataset, "history_days": days, "backbone": backbone, "served": served["mase"],
                    "best_anchor": anchor["method"], "best_anchor_mase": anchor["mase"],
                    "met": served["mase"] <= anchor["mase"] and served["gateways_within_2pct"] >= 0.9
                    and served["worst_gateway_vs_val_anchor"] <= 0.10,
                    "gateways_within_2pct": served["gateways_within_2pct"],
                    "worst_gateway_vs_val_anchor": served["worst_gateway_vs_val_anchor"],
                    "worst_client_vs_best_anchor": served["worst_client_vs_best_anchor"]})
                fed = min((by[m] for m in FEDERATED if m in by), key=lambda r: r["mase"])
                gain_local, gain_anchor = 1 - fed["mase"] / by["local"]["mase"], 1 - fed["mase"] / anchor["mase"]
                if days in (14, 30):
                    out["federated_pays_when_scarce"].append({
                        "dataset": dataset, "history_days": days, "backbone": backbone, "federated": fed["method"],
                        "vs_local": gain_local, "vs_best_anchor": gain_anchor,
                        "met": gain_local >= 0.05 and gain_anchor >= 0.05, **pooling_bound(by, anchor)})
                if days == 0:
                    best = min((by[m] for m in cfg["learned"] if m in by and m != POOLED), key=lambda r: r["mase"])
                    out["learned_beats_anchors_full"].append({
                        "dataset": dataset, "backbone": backbone, "method": best["method"],
                        "vs_best_anchor": 1 - best["mase"] / anchor["mase"], "met": best["mase"] <= 0.9 * anchor["mase"]})
    scarce = out["federated_pays_when_scarce"]
    out["summary"] = {
        "served_at_most_best_anchor_everywhere": all(v["met"] for v in out["served_at_most_best_anchor"]),
        "datasets_where_federated_pays_when_scarce": sorted({v["dataset"] for v in scarce if v["met"]}),
        "datasets_where_pooling_pays_when_scarce": sorted({v["dataset"] for v in scarce if v.get("pooled_met")}),
        "datasets_where_learned_beats_anchors_by_10pct": sorted(
            {v["dataset"] for v in out["learned_beats_anchors_full"] if v["met"]}),
        "cells": int(np.prod([len(cfg["datasets"]), len(cfg["history_days"])])),
    }
    return out


def pooling_bound(by: dict[str, dict], anchor: dict) -> dict:
    """Where Centralized was run: its gains over Local-only and the best anchor, and whether it
    clears the 5% a federated method is asked for (if pooling every gateway's data cannot, no
    federation of them can)."""
    if POOLED not in by:
        return {}
    pooled = by[POOLED]["mase"]
    vs_local, vs_anchor = 1 - pooled / by["local"]["mase"], 1 - pooled / anchor["mase"]
    return {"pooled": pooled, "pooled_vs_local": vs_local, "pooled_vs_best_anchor": vs_anchor,
            "pooled_met": vs_local >= 0.05 and vs_anchor >= 0.05}


def headline(summary: dict) -> list[str]:
    """One line per (dataset, K, backbone): the best anchor, Local-only, the federated methods and
    what the product serves, with the served forecast's gain over the best anchor, its worst
    gateway against its best anchor in hindsight and against the anchor its validation picks."""
    cfg = summary["config"]
    learned = cfg["learned"] + (["median"] if any(r["method"] == "median" for r in summary["rows"]) else [])
    lines = ["| dataset | K days | backbone | best anchor | " + " | ".join(learned) + " | served | served vs anchor "
             "| worst gateway vs its anchor | within 2% of its val anchor (worst) | served (share of forecasts) |",
             "|---|---|---|---|" + "---|" * len(learned) + "---|---|---|---|---|"]
    for dataset in cfg["datasets"]:
        for days in cfg["history_days"]:
            cell = [r for r in summary["rows"] if (r["dataset"], r["history_days"]) == (dataset, days)]
            anchor = min((r for r in cell if r["backbone"] is None), key=lambda r: r["mase"])
            for backbone in cfg["backbones"]:
                by = {r["method"]: r for r in cell if r["backbone"] == backbone}
                served = by[SERVED]
                counts = ", ".join(f"{name} {share:.0%}" for name, share in served["served_share"].items())
                lines.append(f"| {dataset} | {days or 'full'} | {backbone} | {anchor['method']} {anchor['mase']:.3f} | "
                             + " | ".join(f"{by[m]['mase']:.3f}" if m in by else "-" for m in learned)
                             + f" | **{served['mase']:.3f}** | {served['mase'] / anchor['mase'] - 1:+.1%} | "
                             f"{served['worst_client_vs_best_anchor']:+.1%} | {within(served)} | {counts} |")
    return lines


def within(row: dict) -> str:
    """A served row's share of gateways within 2% of the anchor their validation picks, and the
    worst one's excess ("-" for a results file written before these were kept)."""
    if "gateways_within_2pct" not in row:
        return "-"
    return f"{row['gateways_within_2pct']:.0%} ({row['worst_gateway_vs_val_anchor']:+.1%})"


def markdown(summary: dict) -> str:
    lines = ["Per cell: the best anchor (chosen on test, in hindsight), each learned method and what the product "
             "serves (test MASE, means over seeds); 'worst gateway' = the largest excess of one gateway's served "
             "MASE over its own best anchor's.", "", *headline(summary), "",
             "MASE (headline), MSE and MAE on the whole training split's scale per feature, means over seeds ± "
             "half-range of the fleet MASE; 'beat local' / 'beat anchor' = client runs better than their own "
             "Local-only model / their own best anchor (on test); 'worst vs anchor' = the largest excess of one "
             "gateway's MASE over its own best anchor's, over clients and seeds.", "",
             "| dataset | K days | backbone | method | MASE | MSE | MAE | beat local | beat anchor | worst vs anchor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary["rows"]:
        days = s["history_days"] or "full"
        local = f"{s['clients_better_than_local']}/{s['client_runs']}" if "clients_better_than_local" in s else "-"
        lines.append(f"| {s['dataset']} | {days} | {s['backbone'] or '-'} | {s['method']} | {s['mase']:.4f} ± "
                     f"{s['mase_spread']:.4f} | {s['mse']:.4f} | {s['mae']:.4f} | {local} | "
                     f"{s['clients_better_than_best_anchor']}/{s['client_runs']} | {s['worst_client_vs_best_anchor']:+.1%} |")
    v = summary["verdicts"]["summary"]
    lines += ["", f"served <= best anchor and no gateway > +2% over its own best anchor, in every cell: "
              f"{v['served_at_most_best_anchor_everywhere']}; federated beats Local and the best anchor by >= 5% "
              f"at K = 14 or 30 on: {v['datasets_where_federated_pays_when_scarce'] or 'no dataset'} (Centralized, "
              f"every gateway's data pooled, on: {v.get('datasets_where_pooling_pays_when_scarce') or 'no dataset'}); a learned "
              f"model beats the best anchor by >= 10% with the full history on: "
              f"{v['datasets_where_learned_beats_anchors_by_10pct'] or 'no dataset'}."]
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """MASE vs history days per method, one panel per (dataset, backbone); anchors dashed."""
    cfg = summary["config"]
    panels = [(d, b) for d in cfg["datasets"] for b in cfg["backbones"]]
    fig, axes = panel_row(len(panels), 3.8)
    days = cfg["history_days"]
    ticks = [d or max(days) * 3 for d in days]
    for ax, (dataset, backbone) in zip(axes, panels):
        methods = [(m, None) for m in cfg["anchors"]] + [(m, backbone) for m in cfg["learned"] + ["median", SERVED]]
        for method, bb in methods:
            by = {r["history_days"]: r["mase"] for r in summary["rows"]
                  if (r["dataset"], r["backbone"], r["method"]) == (dataset, bb, method)}
            run_at = [(tick, by[d]) for tick, d in zip(ticks, days) if d in by]  # Centralized: the scarce cells only
            if len(run_at) > 1:
                ax.plot(*zip(*run_at), marker="o" if bb else ".", linestyle="-" if bb else "--",
                        linewidth=2.2 if method == SERVED else 1.0, label=method)
        ax.set(xscale="log", title=f"{dataset}, {backbone}", xlabel="training history (days)", ylabel="test MASE")
        ax.minorticks_off()
        ax.set_xticks(ticks, [str(d or "full") for d in days])
        ax.legend(fontsize=6)
    save_figure(fig, path)
