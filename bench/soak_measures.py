"""What ``bench/soak.py`` reads once a run is over: the rounds, refusals and stored updates of
the stopped coordinator's store, the updates lost against the gateways' ledgers, and issue 27's
done-means computed on the results (``checks``, ``quantile`` and ``refused_by_code`` are pure)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

P99_LIMIT, FLAT_LIMIT = 1.5, 1.25  # hostile round p99 / clean; store's last sample / its sample at half time


def measures(work: Path, first: float, until: float, roles: dict[str, str], seen: dict[str, set[int]]) -> dict:
    """Rounds closed by ``until`` (wall clock; their times from round 1's announcement at
    ``first``), refusals by code, what became of the hostile devices ``roles`` and the updates
    lost, from the stopped coordinator's store, the update rows ``seen`` while it ran (retention
    deletes old rounds' rows) and the gateways' ledgers."""
    from coordinator.store import Store

    store = Store(work / "state")
    try:
        rows = [r for r in store.rounds() if r.closed_at is not None and r.closed_at <= until]
        arrivals, refusals = store.arrivals(), store.events(accepted=False)
    finally:
        store.close()
    took = sorted(r.closed_at - r.opened_at for r in rows)
    stored = defaultdict(set, {client: set(rounds) for client, rounds in seen.items()})
    for number, client, _, _ in arrivals:
        stored[client].add(number)
    return {"rounds": len(rows), "round_p50_s": quantile(took, 0.5), "round_p99_s": quantile(took, 0.99),
            "round_max_s": round(took[-1], 3) if took else None,
            "closed_by": dict(Counter(r.metrics.get("closed_by") for r in rows)),
            "round_s_over_time": [[round((r.opened_at - first) / 60, 2), round(r.closed_at - r.opened_at, 3)]
                                  for r in rows],
            "refused_by_code": refused_by_code(refusals), "hostile_devices": outcomes(rows, roles),
            **losses(work, stored)}


def outcomes(rows: list, roles: dict[str, str]) -> dict[str, dict]:
    """Per hostile device, in how many closed rounds it was asked, aggregated, clipped, rejected."""
    def count(client: str, key: str) -> int:
        return sum(client in (row.metrics.get(key) or ()) for row in rows)

    return {client: {"role": role, **{key: count(client, key) for key in ("asked", "clients", "clipped", "rejected")}}
            for client, role in roles.items()}


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``values`` (linear between neighbours); None when empty."""
    if not values:
        return None
    at = q * (len(values) - 1)
    low = int(at)
    high = min(low + 1, len(values) - 1)
    return round(values[low] + (values[high] - values[low]) * (at - low), 3)


def refused_by_code(events: list[dict]) -> dict[str, int]:
    """Refusals per code; a ``rate_limited`` row counts the messages it says were dropped."""
    counts: Counter = Counter()
    for event in events:
        words = (event.get("reason") or "").split()
        dropped = event["code"] == "rate_limited" and words and words[0].isdigit()
        counts[event["code"]] += int(words[0]) if dropped else 1
    return dict(sorted(counts.items()))


def losses(work: Path, stored: dict[str, set[int]]) -> dict:
    """Updates sent, lost (neither stored nor refused), unanswered, from every ledger file."""
    sent = unanswered = 0
    lost: dict[str, list[int]] = {}
    for path in sorted(work.glob("ledger*.json")):
        for client, ledger in json.loads(path.read_text()).items():
            sent += len(ledger["sent"])
            unanswered += len(ledger["unanswered"])
            missing = set(ledger["sent"]) - stored.get(client, set()) - {int(r) for r in ledger["refused"]}
            if missing:
                lost[client] = sorted(missing)
    return {"updates_sent": sent, "updates_lost": sum(map(len, lost.values())), "unanswered": unanswered,
            "lost": dict(list(lost.items())[:20])}


def checks(runs: dict[str, dict]) -> dict:
    """Issue 27's done-means on the runs there are: hostile round p99 at most 1.5x clean, no
    update lost, the store's last sample at most 1.25x its sample at half time."""
    out: dict[str, dict] = {}
    if "clean" in runs and "hostile" in runs:
        clean, hostile = runs["clean"]["round_p99_s"], runs["hostile"]["round_p99_s"]
        ratio = round(hostile / clean, 3) if clean and hostile is not None else None
        out["round_p99"] = {"ok": ratio is not None and ratio <= P99_LIMIT, "clean_s": clean, "hostile_s": hostile,
                            "ratio": ratio, "limit": P99_LIMIT}
    for name, run in runs.items():
        out[f"updates_lost_{name}"] = {"ok": run["updates_lost"] == 0, "lost": run["updates_lost"]}
        samples = run["store_mb"]
        half, last = samples[(len(samples) - 1) // 2], samples[-1]
        ratio = round(last / half, 3) if half else None
        out[f"store_flat_{name}"] = {"ok": ratio is not None and ratio <= FLAT_LIMIT, "half_mb": half,
                                     "last_mb": last, "ratio": ratio, "limit": FLAT_LIMIT}
    return {**out, "all_ok": all(check["ok"] for check in out.values())}
