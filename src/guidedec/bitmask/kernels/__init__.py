"""Registry of bitmask apply kernels, one module per implementation, imported lazily.

Every kernel module defines ``apply_bitmask_inplace(logits, bitmask, token_mask, d2t) -> None``
with the semantics of :func:`guidedec.bitmask.apply_bitmask`, on inputs that the caller has
already validated and normalised: ``logits`` is a 2-D float tensor ``[B, C]`` with ``B, C >= 1``
(any strides), ``bitmask`` a 2-D int32 tensor ``[B, W]`` with ``W >= 1``, ``token_mask`` ``None``
or a ``[B]`` bool/int32 tensor, ``d2t`` ``None`` or a ``[C]`` integer tensor, all on one device.

Adding a kernel takes one file (``_<name>.py``), one :data:`KERNELS` entry and its name in
:data:`KernelName`; the ``"triton"`` entry is a complete example.

The Triton kernel also runs on CPU tensors through Triton's interpreter, but only when
``TRITON_INTERPRET`` is set to a true value (``1``, ``true``, ``on`` or ``yes``, as Triton reads
it): that is how it is tested without a GPU. ``"auto"`` never picks it for CPU tensors.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

KernelName = Literal["torch", "cpu", "triton"]
KernelFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None], None]


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """Where a kernel lives and which devices it serves.

    Attributes:
        module: import path of the module defining ``apply_bitmask_inplace``.
        devices: device types the kernel accepts; empty means any device.
        auto_for: device types for which ``backend="auto"`` picks this kernel.
        requires: optional dependency named in the error when the import fails.
        interpreter_env: optional environment variable which, set to a true value when the
            backend is resolved, lets the kernel also take CPU tensors (run by an interpreter);
            ``"auto"`` still never picks it for them.
    """

    module: str
    devices: tuple[str, ...] = ()
    auto_for: tuple[str, ...] = ()
    requires: str | None = None
    interpreter_env: str | None = None

    def runs_on(self, device: torch.device) -> bool:
        """Whether the kernel accepts tensors on ``device`` now (the environment is read here)."""
        if not self.devices or device.type in self.devices:
            return True
        return device.type == "cpu" and _env_flag(self.interpreter_env)


KERNELS: dict[str, KernelSpec] = {
    "torch": KernelSpec("guidedec.bitmask.kernels._torch"),
    "cpu": KernelSpec("guidedec.bitmask.kernels._cpu", devices=("cpu",), auto_for=("cpu",)),
    "triton": KernelSpec(
        "guidedec.bitmask.kernels._triton",
        devices=("cuda",),
        auto_for=("cuda",),
        requires="triton",
        interpreter_env="TRITON_INTERPRET",
    ),
}
FALLBACK_KERNEL = "torch"
_TRUE_ENV_VALUES = ("1", "true", "on", "yes")  # what Triton itself accepts for its flags


def _env_flag(name: str | None) -> bool:
    return name is not None and os.environ.get(name, "").strip().lower() in _TRUE_ENV_VALUES


@functools.cache
def _installed(package: str | None) -> bool:
    """Whether ``package`` (if any) can be imported, without importing it."""
    return package is None or importlib.util.find_spec(package) is not None


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map ``backend`` to a registered kernel name for tensors on ``device``.

    ``"auto"`` picks the first kernel whose ``auto_for`` lists ``device.type`` and whose optional
    dependency is installed (so CUDA without Triton keeps the reference), else
    :data:`FALLBACK_KERNEL`. Raises ``ValueError`` for an unknown name or a kernel that does not
    run on ``device`` (see :meth:`KernelSpec.runs_on`).
    """
    if backend == "auto":
        return next(
            (
                name
                for name, spec in KERNELS.items()
                if device.type in spec.auto_for and _installed(spec.requires)
            ),
            FALLBACK_KERNEL,
        )
    spec = KERNELS.get(backend)
    if spec is None:
        choices = ", ".join(repr(name) for name in ("auto", *KERNELS))
        raise ValueError(f"unknown bitmask backend {backend!r}; valid choices: {choices}")
    if not spec.runs_on(device):
        interpreter = (
            f" (or CPU tensors with {spec.interpreter_env}=1)" if spec.interpreter_env else ""
        )
        raise ValueError(
            f"bitmask backend {backend!r} runs on {'/'.join(spec.devices)} tensors{interpreter}, "
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
