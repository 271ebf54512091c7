"""A real mosquitto, started by the tests on a free loopback port with their own config."""

from __future__ import annotations

from pathlib import Path

from coordinator.broker_setup import free_port, start_mosquitto, wait_for_port

__all__ = ["Mosquitto", "free_port"]


class Mosquitto:
    """One broker process with its own config, log and persistence in ``workdir``."""

    def __init__(self, workdir: Path, port: int | None = None, config: Path | None = None):
        """An anonymous loopback broker, or one that runs a given config (whose port is ``port``)."""
        self.port = port or free_port()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        if config is None:
            config = self.dir / "anonymous.conf"
            config.write_text(
                f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                f"persistence true\npersistence_location {self.dir}/\n"
            )
        self.config = config
        self.process = None

    def start(self) -> "Mosquitto":
        self.process = start_mosquitto(self.config, self.dir)
        wait_for_port(self.port, self.process)
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def log(self) -> str:
        path = self.dir / "mosquitto.log"
        return path.read_text() if path.exists() else ""
