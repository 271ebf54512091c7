"""A real mosquitto, started by the tests on a free loopback port with their own config."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Mosquitto:
    """One broker process with its own config, log and persistence in ``workdir``."""

    def __init__(self, workdir: Path, port: int | None = None, config: Path | None = None):
        """An anonymous loopback broker, or one that runs a given config (whose port is ``port``)."""
        self.binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.port = port or free_port()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "mosquitto.conf"
        user = "user root\n" if os.geteuid() == 0 else ""
        body = config.read_text() if config else (
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {self.dir}/\n"
        )
        self.config.write_text(f"{user}log_dest file {self.dir}/mosquitto.log\nlog_type all\n{body}")
        self.process: subprocess.Popen | None = None

    def start(self) -> "Mosquitto":
        self.process = subprocess.Popen([self.binary, "-c", str(self.config)], stderr=subprocess.PIPE)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.process.stderr.read().decode()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("mosquitto did not open its port")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def log(self) -> str:
        path = self.dir / "mosquitto.log"
        return path.read_text() if path.exists() else ""
