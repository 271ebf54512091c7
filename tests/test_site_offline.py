"""A site aggregator without brokers, over the in-memory transport: towards the central
coordinator it is a protocol client like an edge agent (``edge_agent.protocol_client``). It
registers upward once a gateway registered, sends its closed round's partial aggregate up, re-sends
it on every reconnect until the central coordinator answers it, and then no more."""

from __future__ import annotations

import time
from pathlib import Path

from coordinator.broker_setup import free_port
from coordinator.config import UPLINK, AggregatorConfig
from coordinator.site import SiteAggregator
from edge_agent.protocol import ReplyHeader, RoundHeader, UpdateHeader, decode, encode
from edge_agent.topics import Topics
from edge_agent.transport import Incoming, MemoryTransport
from tests.fleet import MODEL, SEED
from tests.offline import hello_of, transport_of, turn_until, update_of

SITE, CAMPAIGN = "site-a", "central-campaign-1"
CENTRAL = Topics("test", UPLINK)


def offline_site(folder: Path, **overrides: object) -> SiteAggregator:
    cfg = AggregatorConfig.model_validate({
        "fleet": "test", "site": SITE, "state_dir": str(folder / "site"), "min_clients": 1, "start_clients": 1,
        "round_timeout_s": 60.0, "seed": SEED, "model": MODEL, "broker": {"port": free_port()}, **overrides})
    return SiteAggregator(cfg, transport=MemoryTransport())


def central(header: RoundHeader | ReplyHeader, state: dict | None = None) -> Incoming:
    """A message of the central coordinator, as the site broker's bridge hands it over."""
    topic = CENTRAL.round if isinstance(header, RoundHeader) else CENTRAL.agent(SITE, "task")
    return Incoming(topic, encode(header, state or {}), 1, 1, False)


def upward(transport: MemoryTransport) -> list[str]:
    """The kinds of what the site sent the central coordinator since the last call."""
    sent = [topic.rsplit("/", 1)[1] for topic, _, _ in transport.published if topic.startswith(CENTRAL.root)]
    transport.published.clear()
    return sent


def test_a_site_registers_upward_sends_its_round_up_and_resends_it_until_the_central_coordinator_answers(
    tmp_path: Path,
) -> None:
    site = offline_site(tmp_path)
    gateways = site.gateways  # the coordinator the site runs towards its gateways
    transport = transport_of(gateways)
    transport.start()
    site.client.tick()
    assert upward(transport) == ["status"]  # no gateway registered yet: nothing to register upward

    transport.deliver(hello_of(gateways, "client00"))
    site.turn()
    assert upward(transport) == ["hello"]

    announcement = RoundHeader(fleet="test", sender="coordinator", round=1, deadline_unix=time.time() + 120,
                               model_signature=gateways.signature, campaign=CAMPAIGN)
    transport.deliver(central(announcement, gateways.initial))
    site.turn()
    site.follow()
    transport.deliver(update_of(gateways, "client00", 1))
    turn_until(lambda: site.store.round(1).closed_at is not None, lambda: (site.turn(), site.follow()),
               "the site's round 1 closed")
    upload = [payload for topic, payload, _ in transport.published if topic == CENTRAL.agent(SITE, "update")]
    assert upward(transport) == ["update"]
    header, _ = decode(upload[0], 1 << 24)
    assert isinstance(header, UpdateHeader) and (header.sender, header.round, header.n_samples,
                                                 header.campaign) == (SITE, 1, 50, CAMPAIGN)

    transport.start()  # a reconnect before the central answer: the upload goes again
    site.client.tick()
    assert upward(transport) == ["status", "hello", "update"]

    answer = ReplyHeader(fleet="test", sender="coordinator", round=1, about="update", accepted=False,
                         code="duplicate", reason="already taken")
    transport.deliver(central(answer))
    site.turn()
    transport.start()  # answered: a reconnect repeats the hello only
    site.client.tick()
    assert upward(transport) == ["status", "hello"] and site.store.meta("delivered") == "1"
    site.store.close()


def test_a_site_round_the_central_coordinator_moved_on_from_closes_with_what_it_has(tmp_path: Path) -> None:
    """Below the site's quorum when the central round 2 comes: round 1 can no longer wait, so it
    closes through the coordinator's own close with the one update it has (the site's process
    goes on), its aggregate goes up, and round 2 opens for the gateways."""
    site = offline_site(tmp_path, min_clients=2, start_clients=2)
    gateways = site.gateways
    transport = transport_of(gateways)
    transport.start()
    transport.deliver(hello_of(gateways, "client00"), hello_of(gateways, "client01"))
    site.turn()
    for number in (1, 2):
        announcement = RoundHeader(fleet="test", sender="coordinator", round=number, deadline_unix=time.time() + 120,
                                   model_signature=gateways.signature, campaign=CAMPAIGN)
        transport.deliver(central(announcement, gateways.initial))
        site.turn()
        if number == 1:
            site.follow()
            transport.deliver(update_of(gateways, "client00", 1))
            site.turn()
            site.follow()
            assert site.store.round(1).closed_at is None  # one of two: the site waits
            upward(transport)
    site.follow()
    closed = site.store.round(1)
    assert closed.closed_at is not None and closed.metrics["closed_by"] == "the central round moved on"
    assert closed.metrics["clients"] == ["client00"] and upward(transport) == ["update"]
    assert site.store.latest_round().round == 2 and site.store.latest_round().closed_at is None
    site.store.close()
