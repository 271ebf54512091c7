"""The training agent's side of serving: after every accepted round the model it serves becomes a
new verified ONNX bundle (written by ``export.bundle.write_bundle``, which the CLI hands over:
edge_agent does not import export), loaded at once, announced to Home Assistant if asked, and
forecast with on the gateway's schedule through the one publish path (``SensorHistory``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.serving.history import SensorHistory
from edge_agent.serving.onnx_serving import BundleInfo, OnnxServing
from edge_agent.storage import writable_folder

if TYPE_CHECKING:
    from edge_agent.learners import HeadLearner

log = logging.getLogger("edgefl.agent")
BundleWriter = Callable[["HeadLearner", str, int, Any, Path], BundleInfo]
"""(learner, client id, round index served, step in nanoseconds, folder) -> the bundle written."""


class BundleRenewal:
    """The served model's bundle, renewed after every accepted round, and its forecasts."""

    def __init__(self, history: SensorHistory, write_bundle: BundleWriter):
        self.history, self.write_bundle = history, write_bundle
        self.folder = writable_folder(Path(history.gateway.state_dir) / "serving", "state_dir")
        self.server: OnnxServing | None = None

    def renew(self, learner: HeadLearner, round_index: int) -> None:
        """Export what ``learner`` serves once ``round_index`` is announced, then forecast with it at
        once. A failed export keeps the last bundle: serving never stops training or the fleet."""
        gateway = self.history.gateway
        try:
            info = self.write_bundle(learner, gateway.client_id, round_index, gateway.sensors.step_ns, self.folder)
            self.server = OnnxServing(self.folder)
        except ValueError as refused:  # a model the export refuses (a silent spiking layer): said in one line
            log.warning("%s; forecasts keep the last bundle", refused)
            return
        except Exception:  # the guard's purpose: the bundle is a by-product of training
            log.exception("the served model could not be exported to ONNX; forecasts keep the last bundle")
            return
        log.info("serving the %s model of round %d (ONNX verified, max error %.2g)", info.model, info.round,
                 info.verified_max_error)
        self.history.publish_due(self.server, now=True)
        try:
            self.history.announce(self.server)
        except Exception:  # discovery is a convenience: logged, tried again with the next bundle
            log.exception("Home Assistant discovery not published")

    def tick(self) -> bool:
        """A forecast when one is due; True when one went out."""
        return self.history.publish_due(self.server)
