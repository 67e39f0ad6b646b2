"""Which module first produces inf or NaN: the reference adapter with a finiteness check after
every module's forward.

    model._target_=nan_hunt.HookedPairformerAdapter   (with PYTHONPATH=scripts:.)

Every module's floating outputs are reduced to their largest magnitude (``amax``/``amin``: no
temporary the size of the tensor, so a near-limit step still fits); the first module whose output
is not finite raises ``NonFiniteModule`` naming it, whether its inputs were finite, and the largest
magnitudes seen before it. ``CPBENCH_NAN_HUNT_OUT=FILE`` also writes every module's largest
magnitude, in the order they ran, as JSON lines.
"""

from __future__ import annotations

import json
import os

import torch
from torch import nn

from cpbench.models.pairformer.adapter import PairformerAdapter


class NonFiniteModule(RuntimeError):
    """A module's output held inf or NaN."""


def _absmax(value) -> float | None:
    tensors = [value] if isinstance(value, torch.Tensor) else [
        t for t in (value if isinstance(value, (tuple, list)) else []) if isinstance(t, torch.Tensor)]
    tensors = [t for t in tensors if t.is_floating_point() and t.numel()]
    if not tensors:
        return None
    return max(float(torch.maximum(t.amax().float().abs(), t.amin().float().abs())) for t in tensors)


class HookedPairformerAdapter(PairformerAdapter):
    def build_model(self, mesh, device) -> nn.Module:
        model = super().build_model(mesh, device)
        seen: list[tuple[str, float | None]] = []
        out_path = os.environ.get("CPBENCH_NAN_HUNT_OUT")

        def hook(name):
            def check(module, inputs, output):
                m = _absmax(output)
                seen.append((name, m))
                if out_path:
                    with open(out_path, "a") as f:
                        f.write(json.dumps({"module": name, "absmax": m}) + "\n")
                if m is not None and not torch.isfinite(torch.tensor(m)):
                    inputs_m = _absmax(list(inputs))
                    largest = sorted((x for x in seen[:-1] if x[1] is not None), key=lambda x: -x[1])[:3]
                    raise NonFiniteModule(f"{name} ({type(module).__name__}): output {m}, inputs absmax {inputs_m}; "
                                          f"{len(seen) - 1} modules before it finite, largest {largest}")
            return check

        for name, module in model.named_modules():
            if name:
                module.register_forward_hook(hook(name))
        return model
