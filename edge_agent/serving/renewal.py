"""The training agent's side of serving: after every accepted round the model it serves becomes a
new verified ONNX bundle, loaded at once, announced to Home Assistant if asked, and forecast with
on the gateway's schedule through the one publish path (``SensorHistory``).

The export needs torch, so it runs in the round's child process (``edge_agent.training_child``,
``export_bundle``) with the writer the CLI names (``export.bundle:write_bundle``: edge_agent does
not import export); the agent loads the bundle it leaves (``BundleRenewal.renewed``)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.serving.history import SensorHistory
from edge_agent.serving.onnx_serving import BundleInfo, OnnxServing
from edge_agent.storage import writable_folder

if TYPE_CHECKING:
    from edge_agent.config import AgentConfig
    from edge_agent.learners import Learner

log = logging.getLogger("edgefl.agent")
BundleWriter = Callable[["Learner", str, int, Any, Path], BundleInfo]
"""(learner, client id, round index served, step in nanoseconds, folder) -> the bundle written."""
SERVING_FOLDER = "serving"


def serving_folder(state_dir: Path) -> Path:
    """Where a gateway's bundle lives (``state_dir/serving``)."""
    return writable_folder(Path(state_dir) / SERVING_FOLDER, "state_dir")


def export_bundle(writer: str, learner: Learner, cfg: AgentConfig, round_index: int) -> bool:
    """In the round's child: export what ``learner`` serves once ``round_index`` is announced with
    ``writer`` (``module:function``); True when a new bundle is there. A failed export keeps the
    last bundle: serving never stops training or the fleet."""
    module, _, name = writer.partition(":")
    gateway = cfg.live_gateway()
    try:
        write: BundleWriter = getattr(importlib.import_module(module), name)
        info = write(learner, gateway.client_id, round_index, gateway.sensors.step_ns, serving_folder(cfg.state_dir))
    except ValueError as refused:  # a model the export refuses (a silent spiking layer): said in one line
        log.warning("%s; forecasts keep the last bundle", refused)
        return False
    except Exception:  # the guard's purpose: the bundle is a by-product of training
        log.exception("the served model could not be exported to ONNX; forecasts keep the last bundle")
        return False
    log.info("exported the %s model of round %d (ONNX verified, max error %.2g)", info.model, info.round,
             info.verified_max_error)
    return True


class BundleRenewal:
    """The served model's bundle, renewed after every accepted round, and its forecasts."""

    def __init__(self, history: SensorHistory, writer: str):
        """``writer``: the ``module:function`` of the ``BundleWriter`` the round's child exports with."""
        self.history, self.writer = history, writer
        self.folder = serving_folder(history.gateway.state_dir)
        self.server: OnnxServing | None = None

    def renewed(self) -> None:
        """The child exported a new bundle: forecast with it at once (a bundle that does not load
        keeps the last one)."""
        try:
            self.server = OnnxServing(self.folder)
        except Exception:  # the guard's purpose: the bundle is a by-product of training
            log.exception("the exported bundle does not load; forecasts keep the last bundle")
            return
        info = self.server.info
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
