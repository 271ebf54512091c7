"""Who may take part: the allow-list of a closed fleet, reloaded from ``coordinator.toml`` without
a restart (on SIGHUP, or when the file changes), so a revoked gateway is refused from its next
message on. A reload that cannot be read keeps the list in force and says why; it never stops
the service."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from edge_agent.toml_config import ConfigError, load_config

log = logging.getLogger("edgefl.coordinator")
CHECK_EVERY_S = 1.0  # how often the config file's modification time is looked at


class Access:
    """The allow-list in force. ``config_path``: the file it came from, watched for changes (None:
    fixed for the life of the process, as for a coordinator built in a test)."""

    def __init__(self, cfg, config_path: Path | None = None):
        self.settings = type(cfg)
        self.registration, self.allowed = cfg.registration, frozenset(cfg.allowed_clients)
        self.path = Path(config_path) if config_path is not None else None
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()
        self._hangup = threading.Event()

    def allows(self, client: str) -> bool:
        """Whether ``client`` may register and send (always, in an open fleet)."""
        return self.registration == "open" or client in self.allowed

    def watch_hangup(self) -> None:
        """Reload on SIGHUP too (main thread only, where Python handles signals)."""
        if self.path is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda *_: self._hangup.set())

    def refresh(self) -> bool:
        """Reload when asked (SIGHUP) or when the file changed; whether a new list is in force."""
        if self.path is None:
            return False
        now = time.monotonic()
        if not self._hangup.is_set() and now - self._checked < CHECK_EVERY_S:
            return False
        self._checked = now
        stamp = self._file_stamp()
        if not self._hangup.is_set() and stamp == self._stamp:
            return False
        self._hangup.clear()
        self._stamp = stamp
        return self._reload()

    def _reload(self) -> bool:
        try:
            cfg = load_config(self.path, self.settings)
        except ConfigError as err:
            log.error("allow-list not reloaded, the one in force stays: %s", err)
            return False
        self.registration, self.allowed = cfg.registration, frozenset(cfg.allowed_clients)
        log.info("allow-list reloaded from %s: registration %s, %d allowed clients", self.path, self.registration,
                 len(self.allowed))
        return True

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            status = os.stat(self.path) if self.path is not None else None
        except OSError:
            return None
        return None if status is None else (status.st_mtime_ns, status.st_size)
