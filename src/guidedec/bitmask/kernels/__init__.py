"""Registry of bitmask apply kernels, one module per implementation, imported lazily.

Every kernel module defines ``apply_bitmask_inplace(logits, bitmask, token_mask, d2t) -> None``
with the semantics of :func:`guidedec.bitmask.apply_bitmask`, on inputs that the caller has
already validated and normalised: ``logits`` is a 2-D float tensor ``[B, C]`` with ``B, C >= 1``
(any strides), ``bitmask`` a 2-D int32 tensor ``[B, W]`` with ``W >= 1``, ``token_mask`` ``None``
or a ``[B]`` bool/int32 tensor, ``d2t`` ``None`` or a ``[C]`` integer tensor, all on one device.

Adding a kernel (say Triton for CUDA) takes one file (``_triton.py``), one :data:`KERNELS` entry
(``KernelSpec("guidedec.bitmask.kernels._triton", devices=("cuda",), auto_for=("cuda",),
requires="triton")``) and its name in :data:`KernelName`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

KernelName = Literal["torch", "cpu"]
KernelFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None], None]


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """Where a kernel lives and which devices it serves.

    Attributes:
        module: import path of the module defining ``apply_bitmask_inplace``.
        devices: device types the kernel accepts; empty means any device.
        auto_for: device types for which ``backend="auto"`` picks this kernel.
        requires: optional dependency named in the error when the import fails.
    """

    module: str
    devices: tuple[str, ...] = ()
    auto_for: tuple[str, ...] = ()
    requires: str | None = None


KERNELS: dict[str, KernelSpec] = {
    "torch": KernelSpec("guidedec.bitmask.kernels._torch"),
    "cpu": KernelSpec("guidedec.bitmask.kernels._cpu", devices=("cpu",), auto_for=("cpu",)),
}
FALLBACK_KERNEL = "torch"


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map ``backend`` to a registered kernel name for tensors on ``device``.

    ``"auto"`` picks the first kernel whose ``auto_for`` lists ``device.type``, else
    :data:`FALLBACK_KERNEL`. Raises ``ValueError`` for an unknown name or a kernel that does not
    run on ``device``.
    """
    if backend == "auto":
        return next(
            (name for name, spec in KERNELS.items() if device.type in spec.auto_for),
            FALLBACK_KERNEL,
        )
    spec = KERNELS.get(backend)
    if spec is None:
        choices = ", ".join(repr(name) for name in ("auto", *KERNELS))
        raise ValueError(f"unknown bitmask backend {backend!r}; valid choices: {choices}")
    if spec.devices and device.type not in spec.devices:
        raise ValueError(
            f"bitmask backend {backend!r} runs on {'/'.join(spec.devices)} tensors, "
            f"got tensors on {device}"
        )
    return backend


def load_kernel(name: str) -> KernelFn:
    """Import the kernel registered as ``name`` and return its ``apply_bitmask_inplace``."""
    spec = KERNELS[name]
    try:
        module = importlib.import_module(spec.module)
    except ImportError as exc:
        hint = f" (it needs the optional dependency {spec.requires!r})" if spec.requires else ""
        raise ImportError(f"bitmask backend {name!r} is unavailable{hint}: {exc}") from exc
    kernel: KernelFn = module.apply_bitmask_inplace
    return kernel
