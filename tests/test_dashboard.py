"""The fleet dashboard in a real browser: mosquitto, a coordinator with ``[http]`` and three
agents; Debian's headless chromium (driven by playwright) reads the page the way an operator
would: every client listed, the round counter advancing, a frozen agent (SIGSTOP) shown as not
reported and then imputed by its twin, a garbage message counted under its reason code."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from edge_agent.config import dump_toml
from edge_agent.topics import Topics
from tests.broker import free_port
from tests.fleet import MODEL, SEED, TRAINING, coordinator_config, start, wait_for

CHROMIUM = "/usr/bin/chromium"  # Debian's (make chromium); playwright's own downloads are not used
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 120_000
SITES = ("amsterdam", "miami", "greensboro")


@pytest.fixture
def browser_page():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1100})
        finally:
            browser.close()


def round_shown(page: Page) -> int:
    return int(page.get_attribute("#round-panel", "data-round"))


CHEAP_ANCHORS = ("seasonal_naive", "window_average")  # so each gateway reports what it serves and its MASE


def station_config(folder: Path, port: int, index: int, site: str) -> Path:
    """An agent on a bundled weather station: its hello carries the station's coordinates."""
    path = folder / f"agent{index}.toml"
    path.write_text(dump_toml({
        "fleet": "test", "client_id": f"client{index:02d}", "state_dir": str(folder / f"agent{index}"), "seed": SEED,
        "client_index": index, "data": {"site": site, "columns": ["ghi", "temp_air", "wind_speed"]}, "model": MODEL,
        "training": {**TRAINING, "stride": 97, "anchors": list(CHEAP_ANCHORS)},
        "broker": {"port": port, "keepalive_s": 60},  # frozen, it stays online
    }))
    return path


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def publish_garbage(port: int, client: str) -> None:
    """What a broken gateway might send on its update topic: bytes that are no envelope."""
    rogue = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="garbage", protocol=mqtt.MQTTv5)
    rogue.connect("127.0.0.1", port)
    rogue.loop_start()
    try:
        rogue.publish(Topics("test").agent(client, "update"), b"not an envelope " * 4, qos=1).wait_for_publish(10)
    finally:
        rogue.loop_stop()
        rogue.disconnect()


def test_the_dashboard_shows_clients_rounds_a_frozen_agent_imputed_and_a_rejection(
    tmp_path: Path, mosquitto, browser_page: Page
) -> None:
    http_port = free_port()
    config = coordinator_config(tmp_path, mosquitto.port, 40, start_clients=3, min_clients=2, round_timeout_s=6.0,
                                twin="stale", http={"port": http_port})
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(config))
    agents = [start(tmp_path, f"agent{i}", "agent", "run", "-c", str(station_config(tmp_path, mosquitto.port, i, site)))
              for i, site in enumerate(SITES)]
    page = browser_page
    wait_for(lambda: listening(http_port) or coordinator.poll() is not None, 120, "the dashboard to listen")
    assert coordinator.poll() is None, (tmp_path / "coordinator.log").read_text()
    page.goto(f"http://127.0.0.1:{http_port}/")
    expect(page.locator("#clients tbody tr")).to_have_count(3, timeout=WAIT_MS)
    assert page.locator("#clients tbody tr").all_inner_texts()[0].startswith("client00")
    expect(page.locator("#round-of")).to_have_text("of 40")
    expect(page.locator("#stations circle")).to_have_count(3)  # placed by the coordinates each hello carried
    publish_garbage(mosquitto.port, "client01")
    # frozen once it has an update, so its twin has a history to impute from
    expect(page.locator('#clients tr[data-client="client02"] td[data-field="last_round"]')).not_to_have_text(
        "–", timeout=WAIT_MS)
    os.kill(agents[2].pid, signal.SIGSTOP)
    try:
        reported = "".join(f':has(tr[data-client="{c}"][data-reported="{r}"])'
                           for c, r in (("client00", "yes"), ("client01", "yes"), ("client02", "no")))
        expect(page.locator(f'body:has(#round-panel[data-open="true"]) #clients tbody{reported}')).to_have_count(
            1, timeout=WAIT_MS)
        waiting_in = round_shown(page)
        expect(page.locator("#round-waiting")).to_have_text("client02")
        later = f'body:has(#round-panel:not([data-round="{waiting_in}"]))'  # the counter advances, never back
        expect(page.locator(f'{later} #clients tr[data-client="client02"][data-state="imputed"]')).to_have_count(
            1, timeout=WAIT_MS)
        assert round_shown(page) > waiting_in
        expect(page.locator('#stations circle[data-client="client02"]')).to_have_attribute("data-state", "imputed")
        expect(page.locator('#rejections-by-code tr[data-code="bad_magic"] td[data-field="count"]')).to_have_text("1")
        expect(page.locator('#rejections-by-client tr[data-client="client01"] td[data-field="count"]')).to_have_text("1")
        for client in ("client00", "client01"):  # forecast quality: what each serves beside its best anchor
            row = f'#clients tr[data-client="{client}"]'
            expect(page.locator(f'{row} td[data-field="served_mase"]')).to_have_text(re.compile(r"^\d+\.\d{3}$"))
            expect(page.locator(f'{row} td[data-field="best_anchor"]')).to_have_text(
                re.compile(rf"^({'|'.join(CHEAP_ANCHORS)}) \(\d+\.\d{{3}}\)$"))
            expect(page.locator(f'{row} td[data-field="vs_anchor"]')).to_have_text(re.compile(r"^[+-]?\d+\.\d%$"))
        for line in ("served", "federated", "anchor"):
            expect(page.locator(f"#quality polyline.{line}")).not_to_have_attribute("data-rounds", "0")
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    finally:
        os.kill(agents[2].pid, signal.SIGCONT)
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    coordinator.send_signal(signal.SIGTERM)
    assert coordinator.wait(60) == 0, (tmp_path / "coordinator.log").read_text()
