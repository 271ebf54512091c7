"""FeDaL's core-sets (Method, Global Bias Elimination, core-set tuning): a few synthetic windows per
client, learnt so that the model's gradient on them matches its gradient on real mini-batches
(L_match = sum_x ||grad f(C) - grad f(x)||^2, gradient matching after Zhao et al. 2021), then
perturbed in their Fourier magnitudes before upload (``edge_agent.privacy``).

``nearest_window_correlation`` is what an operator reads to choose the noise level: how closely
the best-matching real window of the client follows a core-set series, i.e. what an attacker
holding the core-set could claim to have recovered.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from edge_agent.models.fedal_settings import CoresetSettings
from edge_agent.models.foundation import FoundationModel, masked_mse, patch_mask
from edge_agent.privacy import fourier_magnitude_noise
from edge_agent.seeds import derive_seed
from edge_agent.train import drawn_steps


def mask_batch(shape: tuple[int, ...], patch: int, rate: float, seed: int) -> torch.Tensor:
    """Independent patch masks (B, L, V) for a batch, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(np.stack([patch_mask(shape[1], shape[2], patch, rate, rng) for _ in range(shape[0])]))


def learn_coreset(model: FoundationModel, windows: torch.Tensor, present: torch.Tensor, settings: CoresetSettings,
                  patch: int, rate: float, seed: int) -> torch.Tensor:
    """(K, L, V) core-set for ``windows`` (N, L, V): started from Gaussian noise (never from a real
    window), matched for ``settings.steps`` steps on the masked-reconstruction loss, unmeasured
    variables kept at zero. The model's parameters are not changed."""
    generator = torch.Generator().manual_seed(seed)  # the starting noise, then the real batches
    shape, keep = (settings.size, *windows.shape[1:]), present.float()
    coreset = (torch.randn(shape, generator=generator) * keep).requires_grad_(True)
    params = [p for p in model.parameters() if p.requires_grad]

    def step_loss(pick: torch.Tensor, number: int) -> torch.Tensor:
        with torch.no_grad():
            coreset.mul_(keep)  # the unmeasured variables back to zero after the previous step
        real = windows[pick]
        real_grads = _gradients(model, params, real, present,
                                mask_batch(real.shape, patch, rate, derive_seed(seed, number, 0)), create_graph=False)
        fake_grads = _gradients(model, params, coreset, present,
                                mask_batch(shape, patch, rate, derive_seed(seed, number, 1)), create_graph=True)
        return sum((f - r).pow(2).sum() for f, r in zip(fake_grads, real_grads))

    was_training = model.training
    model.eval()
    drawn_steps(torch.optim.Adam([coreset], lr=settings.lr), len(windows), settings.steps, settings.real_batch, seed,
                step_loss, generator)
    model.train(was_training)
    with torch.no_grad():
        coreset.mul_(keep)
    return coreset.detach()


def _gradients(model: FoundationModel, params: list[torch.nn.Parameter], x: torch.Tensor, present: torch.Tensor,
               masked: torch.Tensor, create_graph: bool) -> tuple[torch.Tensor, ...]:
    with sdpa_kernel(SDPBackend.MATH):  # the fused CPU attention kernels have no second derivative
        loss = masked_mse(model(x.masked_fill(masked, 0.0)), x, masked, present)
    grads = torch.autograd.grad(loss, params, create_graph=create_graph, allow_unused=True)
    return tuple(torch.zeros_like(p) if g is None else (g if create_graph else g.detach()) for p, g in zip(params, grads))


def private_coreset(coreset: torch.Tensor, present: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """The core-set as uploaded: Fourier-magnitude noise along time, unmeasured variables zero."""
    noisy = fourier_magnitude_noise(coreset, sigma, torch.Generator().manual_seed(seed), dim=-2)
    return noisy * present.float()


def nearest_window_correlation(coreset: torch.Tensor, windows: torch.Tensor, present: torch.Tensor) -> float:
    """Mean over core-set series (window x measured variable) of the highest Pearson correlation
    with the same variable in any real window: 1.0 means a real window was handed over."""
    best = []
    for v in torch.nonzero(present).flatten().tolist():
        fake, real = _centred(coreset[..., v]), _centred(windows[..., v])
        best.append((fake @ real.T).max(dim=1).values)
    return float(torch.cat(best).mean()) if best else float("nan")


def _centred(series: torch.Tensor) -> torch.Tensor:
    """Rows centred and scaled to unit norm (constant rows become zero)."""
    centred = series.double() - series.double().mean(dim=1, keepdim=True)
    norm = centred.norm(dim=1, keepdim=True)
    return torch.where(norm > 0, centred / norm.clamp_min(1e-12), torch.zeros_like(centred))
