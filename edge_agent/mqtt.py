"""MQTT plumbing shared by agent and coordinator: the one paho client factory (``paho_client``,
which the replay command and the bench and tools clients use too) and a persistent-session client
(its settings, ``BrokerConfig``, are in the paho-free ``edge_agent.broker_settings``).

Every message is sent and received on its own thread by paho; callbacks only move messages into
a queue, which the owning service drains on its main thread.
"""

from __future__ import annotations

import logging
import math
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Collection

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from edge_agent.broker_settings import QOS, BrokerConfig
from edge_agent.transport import Incoming

log = logging.getLogger("edgefl.mqtt")
REPEAT_FAILURE_LOG_S = 60.0  # the same connect failure is logged again at most this often
CONNECT_TIMEOUT_S = 3.0  # a TCP/TLS connect that takes longer fails (and is retried): logged within 5 s
PROBE_TIMEOUT_S = 1.5  # the probe that names a failure's cause
AUTH_FAILURES = (0x86, 0x87)  # MQTT 5 CONNACK: bad user name or password, not authorized
FIRST_CONNECT_WAIT_S = 3.0  # no session this long after start: say so, whatever paho is still waiting for


def paho_client(client_id: str = "", *, manual_ack: bool = False, broker: BrokerConfig | None = None) -> mqtt.Client:
    """A paho client as every edgefl client speaks: the version 2 callback API and MQTT 5, logging
    in with ``broker``'s user name and password and its TLS CA where it sets them."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5,
                         manual_ack=manual_ack)
    if broker is not None and broker.username is not None:
        client.username_pw_set(broker.username, broker.password)
    if broker is not None and broker.tls_ca is not None:
        client.tls_set(ca_certs=str(broker.tls_ca))
    return client


class Connection:
    """A paho MQTT 5 client with a persistent session, a Last Will and an inbox queue (a ``Transport``)."""

    def __init__(
        self,
        broker: BrokerConfig,
        client_id: str,
        will_topic: str,
        subscriptions: list[str],
        manual_ack: bool = False,
        receive_maximum: int | None = None,
        live_only: Collection[str] = (),
    ):
        """``receive_maximum`` (MQTT 5): how many QoS 1 messages the broker may send before we
        acknowledge; with ``manual_ack`` that is the batch a slow consumer can hold. ``live_only``:
        subscriptions whose retained messages the broker keeps to itself (MQTT 5 retain handling 2)."""
        self.broker, self.subscriptions, self.receive_maximum = broker, subscriptions, receive_maximum
        self.live_only = frozenset(live_only)
        self.inbox: queue.Queue[Incoming] = queue.Queue()
        self.connected = threading.Event()
        self.client = paho_client(client_id, manual_ack=manual_ack, broker=broker)
        self.client.will_set(will_topic, b"offline", qos=QOS, retain=True)
        self.client.reconnect_delay_set(min_delay=1, max_delay=10)
        self.client.connect_timeout = CONNECT_TIMEOUT_S
        self.client.on_connect = self._on_connect
        self.client.on_connect_fail = self._on_connect_fail
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.on_connected: list[Callable[[], None]] = []
        self._failing = False  # a connect failure was logged since the last session
        self._logged: dict[str, float] = {}  # each failure cause, when it was last logged

    def start(self) -> None:
        """Connect (clean_start=False, session expiry) and run the network loop in the background."""
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = self.broker.session_expiry_s
        if self.receive_maximum is not None:
            props.ReceiveMaximum = self.receive_maximum
        self.client.connect_async(
            self.broker.host, self.broker.port, self.broker.keepalive_s, clean_start=False, properties=props
        )
        self.client.loop_start()
        watchdog = threading.Timer(FIRST_CONNECT_WAIT_S, self._check_first_connect)
        watchdog.daemon = True
        watchdog.start()

    def stop(self, status_topic: str | None = None) -> None:
        """Say goodbye (retained 'offline') and disconnect cleanly."""
        if status_topic and self.connected.is_set():
            self.client.publish(status_topic, b"offline", qos=QOS, retain=True).wait_for_publish(5)
        self.client.disconnect()
        self.client.loop_stop()

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> mqtt.MQTTMessageInfo:
        return self.client.publish(topic, payload, qos=QOS, retain=retain)

    def ack(self, message: Incoming) -> None:
        self.client.ack(message.mid, message.qos)

    @property
    def address(self) -> str:
        return f"{self.broker.host}:{self.broker.port}"

    def _on_connect(self, client: mqtt.Client, _userdata, _flags, reason_code, _props) -> None:
        if reason_code.is_failure:
            hint = " (check [broker] username and password)" if reason_code.value in AUTH_FAILURES else ""
            self._log_failure(f"the broker refused the connection: {reason_code}{hint}")
            return
        if self._failing:
            log.info("connected to the broker at %s", self.address)
            self._failing = False
            self._logged.clear()
        for topic in self.subscriptions:
            retain_handling = 2 if topic in self.live_only else 0  # 2: no retained message at subscribe
            client.subscribe(topic, options=SubscribeOptions(qos=QOS, retainHandling=retain_handling))
        self.connected.set()
        for callback in self.on_connected:
            callback()

    def _on_connect_fail(self, _client, _userdata) -> None:
        """The socket or TLS connection failed (paho does not say why: a probe finds out)."""
        self._log_failure(connect_failure(self.broker))

    def _log_failure(self, cause: str) -> None:
        """One line naming the broker and the cause, at once; each cause again at most once every
        ``REPEAT_FAILURE_LOG_S`` while paho keeps retrying."""
        now = time.monotonic()
        self._failing = True
        if now - self._logged.get(cause, -math.inf) >= REPEAT_FAILURE_LOG_S:
            log.error("cannot connect to the MQTT broker at %s: %s (retrying)", self.address, cause)
            self._logged[cause] = now

    def _check_first_connect(self) -> None:
        if not self.connected.is_set() and not self._failing:
            self._log_failure(connect_failure(self.broker))

    def _on_disconnect(self, _client, _userdata, _flags, reason_code, _props) -> None:
        if not self.connected.is_set():
            if not self._failing:  # after a refusal the drop is its consequence, not a second cause
                self._log_failure(f"the connection dropped before the broker accepted it ({reason_code})")
        elif reason_code.is_failure:
            log.warning("lost the connection to the broker at %s: %s (reconnecting)", self.address, reason_code)
        self.connected.clear()

    def _on_message(self, _client, _userdata, message: mqtt.MQTTMessage) -> None:
        self.inbox.put(Incoming(message.topic, bytes(message.payload), message.mid, message.qos, message.retain))


def connect_failure(broker: BrokerConfig, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Why a connection to ``broker`` fails: name resolution, TCP or the TLS handshake, tried
    once with a short timeout (what an operator needs to fix it)."""
    try:
        with socket.create_connection((broker.host, broker.port), timeout=timeout_s) as raw:
            if broker.tls_ca is None:
                return ("TCP connects but no MQTT session came of it (not an MQTT broker, one that expects TLS, "
                        "or one too busy to answer?)")
            context = ssl.create_default_context(cafile=str(broker.tls_ca))
            with context.wrap_socket(raw, server_hostname=broker.host):
                return "the TLS handshake succeeded on a retry; the first attempt failed"
    except socket.gaierror as err:
        return f"cannot resolve the host name ({err.strerror})"
    except ssl.SSLError as err:
        return f"TLS handshake failed ({err.reason or err})"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s (unreachable, or a firewall drops the packets)"
    except OSError as err:
        return err.strerror or str(err)
