"""The EDM sampler of AF3 (Algorithm 18) over the sharded diffusion module.

``sample`` runs ``steps`` denoising steps for ``samples`` structures at once (the samples are a
batch dimension, as Boltz-2's ``diffusion_samples`` / AF3's multiplicity): per step a centre +
random rotation/translation augmentation (AF3 Alg. 19), noise injection (gamma), one call of
the denoiser, and an Euler step scaled by ``step_scale``.

Sharding: each rank holds the coordinates of its atoms ``x: [S, A, 3]`` (A = N_atoms_pad/P).
The noise, rotations and translations are drawn from one generator seeded identically on
every rank, over ALL the real atoms of the example in their order, and each rank keeps its
own atoms' rows, so a run gives the same coordinates at any cp (padding slots stay at the
origin plus the shared shift and play no part: they are no window's query and every window's
masked key). The centring mean is one all-reduce of
``S·3 + 1`` numbers per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpbench.models.pairformer.modules.cuda_graphs import GraphedDenoiser
from cpbench.models.pairformer.modules.diffusion import DiffusionContext, DiffusionModule
from cpbench.models.pairformer.parallel import comm


@dataclass(frozen=True)
class NoiseSchedule:
    """AF3 / Boltz-2 sampler constants (Angstrom for noise levels)."""

    sigma_data: float = 16.0
    s_max: float = 160.0
    s_min: float = 4e-4
    rho: float = 7.0
    gamma_0: float = 0.8
    gamma_min: float = 1.0
    noise_scale: float = 1.003
    step_scale: float = 1.5
    translation_scale: float = 1.0

    def levels(self, steps: int) -> list[float]:
        """``steps + 1`` noise levels from ``sigma_data·s_max`` down to ``sigma_data·s_min``."""
        a, b = self.s_max ** (1 / self.rho), self.s_min ** (1 / self.rho)
        return [self.sigma_data * (a + k / steps * (b - a)) ** self.rho for k in range(steps + 1)]


def random_rotations(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``[n, 3, 3]`` uniform random rotations (normalised Gaussian quaternions), fp32."""
    w, x, y, z = torch.nn.functional.normalize(torch.randn((n, 4), generator=generator, device=device), dim=-1).unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], dim=-1).view(n, 3, 3)


def centre_random_augmentation(x: torch.Tensor, ctx: DiffusionContext, generator: torch.Generator,
                               schedule: NoiseSchedule) -> torch.Tensor:
    """AF3 Alg. 19 on sharded coordinates ``x: [S, A, 3]``: subtract the mean over the real
    atoms of all ranks (one all-reduce), rotate, translate."""
    n_samples = x.shape[0]
    m = ctx.atom_mask.to(x.dtype)[None, :, None]
    sums = torch.cat([(x * m).sum(1).reshape(-1), m.sum().reshape(1)])  # [S·3 + 1]
    comm.all_reduce_(sums, ctx.atom_layout)  # 2d: atoms are replicated over the grid row
    mean = sums[:-1].view(n_samples, 1, 3) / sums[-1].clamp_min(1)
    rot = random_rotations(n_samples, generator, x.device)
    shift = torch.randn((n_samples, 1, 3), generator=generator, device=x.device) * schedule.translation_scale
    return torch.einsum("sij,saj->sai", rot, x - mean) + shift


def sample(module: DiffusionModule, ctx: DiffusionContext, steps: int, samples: int, seed: int,
           run_steps: int | None = None, run_blocks: int | None = None,
           schedule: NoiseSchedule = NoiseSchedule(), graphs: GraphedDenoiser | None = None) -> torch.Tensor:
    """AF3 Alg. 18: ``steps`` denoising steps for ``samples`` samples.

    Args:
        module, ctx: the denoiser and its ``prepare``d conditioning.
        seed: seeds the sampler's generator (the same on every rank).
        run_steps: stop after this many steps (probe: a step's peak does not depend on how many
            ran before it; the schedule stays that of ``steps``).
        run_blocks: token blocks per denoiser call (probe depth).
        graphs: with ``model.cuda_graphs``, the denoiser calls replay a CUDA graph from the
            second on, where graphs apply (``cuda_graphs.GraphedDenoiser``).
    Returns:
        ``[samples, A, 3]`` fp32 coordinates of this rank's atoms.
    """
    device = ctx.c.device
    generator = torch.Generator(device=device).manual_seed(int(seed))

    real = ctx.atom_mask.to(torch.float32)[None, :, None]

    def noise() -> torch.Tensor:  # drawn over the example's real atoms; this rank's, in its slots
        return torch.randn((samples, ctx.n_real, 3), generator=generator, device=device)[:, ctx.real_index] * real

    def denoise(x_noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return module(x_noisy, t, ctx, run_blocks=run_blocks)

    if graphs is not None:
        denoise = graphs.wrap(denoise, ctx.z_hat, ctx.layout)
    levels = schedule.levels(steps)
    x = levels[0] * noise()
    for k in range(1, (steps if run_steps is None else min(run_steps, steps)) + 1):
        x = centre_random_augmentation(x, ctx, generator, schedule)
        gamma = schedule.gamma_0 if levels[k] > schedule.gamma_min else 0.0
        t_hat = levels[k - 1] * (gamma + 1)
        x_noisy = x + schedule.noise_scale * (t_hat ** 2 - levels[k - 1] ** 2) ** 0.5 * noise()
        t = torch.full((samples,), t_hat, device=device)
        x_denoised = denoise(x_noisy, t)
        x = x_noisy + schedule.step_scale * (levels[k] - t_hat) * (x_noisy - x_denoised) / t_hat
    return x
