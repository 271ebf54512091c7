"""Dashboard under load: the fleet dashboard and its API while 1,000 virtual gateways run rounds.

``bench/fleet_load.py``'s fleet (fresh broker, coordinator process, virtual gateways) with the
coordinator's ``[http]`` on; beside it, headless chromium (Debian's, through playwright) opens the
page again and again and times each load until the page has drawn the fleet, and a plain HTTP
client times ``/api/fleet`` and ``/metrics``. The same fleet also runs without the dashboard, so
the round timings show what watching it costs the coordinator.

    python bench/dashboard_load.py --quick   # 1,000 gateways, 30 rounds (about 1-2 min)
    python bench/dashboard_load.py           # 1,000 gateways, 60 rounds
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import bench_parser, configure, run_config, save_figure, write_report
from fleet_load import run_fleet, templates
from mqtt_bench import raise_fd_limit

QUICK = {"agents": 1000, "rounds": 30}
FULL = {"agents": 1000, "rounds": 60}
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
API_EVERY_S = 0.5


def timed_get(url: str) -> tuple[float, bytes]:
    """Seconds to fetch ``url`` completely, and what came."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return time.perf_counter() - started, body


class ApiProbe:
    """Fetches ``/api/fleet`` and ``/metrics`` every ``API_EVERY_S``; sets ``finished`` when the
    API says the fleet's last round closed (or the caller sets it when the run ended)."""

    def __init__(self, address: str, finished: threading.Event):
        self.address, self.finished = address, finished
        self.samples: list[tuple[float, float, int]] = []  # (seconds since start, api seconds, api bytes)
        self.metrics_s: list[float] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        while not self.finished.wait(API_EVERY_S):
            try:
                api_s, body = timed_get(f"http://{self.address}/api/fleet")
                self.metrics_s.append(timed_get(f"http://{self.address}/metrics")[0])
            except OSError:
                continue  # not listening yet
            self.samples.append((time.perf_counter() - started, api_s, len(body)))
            if (json.loads(body)["round"] or {}).get("finished"):
                self.finished.set()


def page_loads(address: str, finished: threading.Event, screenshot: Path) -> dict:
    """Open the page until the fleet finishes: seconds from navigation to the first drawing of
    every registered gateway, and the page's own time per redraw."""
    from playwright.sync_api import sync_playwright

    loads, redraws, shown = [], [], 0
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            while not finished.is_set():
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                try:
                    started = time.perf_counter()
                    page.goto(f"http://{address}/", timeout=30_000)
                    page.wait_for_selector('body[data-loaded="yes"]', timeout=30_000)
                    loads.append(time.perf_counter() - started)
                    shown = max(shown, page.locator("#clients tbody tr").count())
                    finished.wait(3.0)  # a few polls: the page redraws the whole fleet each time
                    redraws.append(float(page.get_attribute("body", "data-render-ms")))
                    if shown >= 1000 and not screenshot.exists():
                        page.screenshot(path=str(screenshot), full_page=False)
                except Exception as err:  # the coordinator not listening yet, or gone at the end
                    if not finished.is_set() and "ERR_CONNECTION_REFUSED" not in str(err):
                        raise
                    finished.wait(0.5)
                finally:
                    page.close()
        finally:
            browser.close()
    return {"page_loads": len(loads), "clients_shown": shown, "load_s": _spread(loads),
            "redraw_ms": _spread(redraws)}


def watch(address: str, finished: threading.Event, screenshot: Path) -> dict:
    """The page and the API, measured from the coordinator's start until its fleet finished."""
    api = ApiProbe(address, finished)
    pages = page_loads(address, finished, screenshot)
    api.thread.join(60)
    return {**pages, "api_requests": len(api.samples), "api_s": _spread([s[1] for s in api.samples]),
            "api_kb": round(max((s[2] for s in api.samples), default=0) / 1e3, 1),
            "metrics_s": _spread(api.metrics_s), "api_timeline": [[round(t, 2), round(s, 4)] for t, s, _ in api.samples]}


def watched_fleet(agents: int, rounds: int, fleet_model: dict, spec, work: Path, screenshot: Path) -> dict:
    """``fleet_load.run_fleet`` with the coordinator's ``[http]`` on and ``watch`` beside it."""
    from coordinator.broker_setup import free_port

    port, finished, outcome = free_port(), threading.Event(), {}
    watcher = threading.Thread(target=lambda: outcome.update(watch(f"127.0.0.1:{port}", finished, screenshot)),
                               daemon=True)
    watcher.start()
    try:
        row = run_fleet(agents, rounds, {**fleet_model, "http": {"port": port}}, spec, work)
    finally:
        finished.set()
        watcher.join(120)
    return {**row, "dashboard": outcome}


def _spread(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 4), "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 4),
            "max": round(ordered[-1], 4), "n": len(ordered)}


def table(summary: dict) -> str:
    head = ("dashboard", "gateways", "rounds done", "round overhead ms", "ingest upd/s", "page load s (median/p95)",
            "redraw ms", "/api/fleet s (median/p95)", "API KB", "/metrics s")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in summary["rows"]:
        d = r.get("dashboard")
        cells = ["-"] * 5 if not d else [
            f"{d['load_s'].get('median')} / {d['load_s'].get('p95')}", d["redraw_ms"].get("median"),
            f"{d['api_s'].get('median')} / {d['api_s'].get('p95')}", d["api_kb"], d["metrics_s"].get("median")]
        lines.append(" | ".join(str(x) for x in ("on" if d else "off", r["agents"], r["rounds_completed"],
                                                  r["round_overhead_ms"], r["ingest_updates_s"], *cells)))
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    """``/api/fleet`` response time over the run (the fleet registers, then runs its rounds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(7, 3.5))
    for row in summary["rows"]:
        if row.get("dashboard"):
            timeline = row["dashboard"]["api_timeline"]
            axis.plot([t for t, _ in timeline], [s * 1000 for _, s in timeline], ".-", label=f"{row['agents']} gateways")
    axis.set(xlabel="seconds into the run", ylabel="/api/fleet response (ms)", title="dashboard API while rounds run")
    axis.legend()
    save_figure(fig, path)


def main() -> None:
    args, cfg, started = configure(bench_parser(__doc__, "10 rounds instead of 30"), QUICK, FULL)
    cfg.update(fd_limit=raise_fd_limit(), load_average_before=os.getloadavg())
    fleet = f"load{cfg['agents']}"
    fleet_model, spec = templates(fleet)
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for watched in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(watched_fleet(cfg["agents"], cfg["rounds"], fleet_model, spec, Path(tmp),
                                      args.out / "dashboard_load_page.png") if watched
                        else run_fleet(cfg["agents"], cfg["rounds"], fleet_model, spec, Path(tmp)))
        print(table({"rows": rows[-1:]}).splitlines()[-1], flush=True)
    cfg.update(load_average_after=os.getloadavg())
    summary = {"rows": rows, "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "dashboard_load", summary, table, plot)


if __name__ == "__main__":
    main()
