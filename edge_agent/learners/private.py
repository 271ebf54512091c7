"""Fed-GAME's client side (sections 2.2 (1) and (3), 2.4): a persistent private model beside a copy
of the global one. The private model never takes the global state; it trains with FedProx's
proximal term towards it, and its upload minus the global state it trained from is the
difference dW_i the coordinator averages and personalizes. The round's personalized difference
dW^_i then moves the selected tensors of the private model (eq. 2):

    theta_i <- theta_i^up + eta_p * ((theta_g + dW^_i) - theta_i^up) = theta_i^up + eta_p (dW^_i - dW_i)

with theta_i^up the uploaded state, theta_g the global state it trained from and eta_p the
personalized step (our reading of eq. 2, whose symbols our copy of the paper lost: eta_p = 1
makes the private layer the global one plus the personalized difference). The step is computed
from what was uploaded, not added to the current state, so a personal message delivered twice
(a coordinator re-sends its last one after a restart) changes nothing the second time.
"""

from __future__ import annotations

from edge_agent.tensors import Layout, TensorDict, check_layout

ANCHOR, UPLOADED = "fedgame.anchor.", "fedgame.uploaded."


class PrivateModel:
    """What a Fed-GAME client remembers of its last upload, to apply the personalized difference."""

    def __init__(self, step: float):
        self.step = step
        self.anchor: TensorDict = {}
        self.uploaded: TensorDict = {}

    def record(self, anchor: TensorDict, uploaded: TensorDict) -> None:
        """The global state a round trained from and the shared state it uploaded."""
        self.anchor = {k: v.detach().clone() for k, v in anchor.items()}
        self.uploaded = {k: v.detach().clone() for k, v in uploaded.items()}

    def personalized(self, message: TensorDict, shared: Layout) -> TensorDict:
        """The selected tensors' new values from the round's personalized differences (eq. 2);
        ``message`` must name tensors of the shared layout with their shapes and dtypes."""
        if not self.uploaded:
            raise ValueError("a personalized difference arrived before this gateway uploaded anything")
        if not message:
            raise ValueError("the personalized difference names no tensor")
        unknown = sorted(set(message) - set(shared))
        if unknown:
            raise ValueError(f"personalized difference: {unknown[:3]} are not tensors of the shared model")
        check_layout(message, {name: shared[name] for name in message}, "personalized difference")
        return {name: (self.uploaded[name].double() + self.step * (
            delta.double() - (self.uploaded[name].double() - self.anchor[name].double()))).to(delta.dtype)
            for name, delta in message.items()}

    def state(self) -> TensorDict:
        return {**{ANCHOR + k: v for k, v in self.anchor.items()}, **{UPLOADED + k: v for k, v in self.uploaded.items()}}

    def restore(self, state: TensorDict, shared: Layout) -> None:
        """Reinstall ``state()``; nothing recorded yet is an empty state."""
        anchor = {k[len(ANCHOR):]: v for k, v in state.items() if k.startswith(ANCHOR)}
        uploaded = {k[len(UPLOADED):]: v for k, v in state.items() if k.startswith(UPLOADED)}
        if anchor or uploaded:
            check_layout(anchor, shared, "private model's anchor")
            check_layout(uploaded, shared, "private model's upload")
        self.record(anchor, uploaded)

