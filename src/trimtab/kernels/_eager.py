"""What a Triton kernel needs to compute as torch's eager ops do, op for op: the constants a
reference op meets rounded as torch rounds them, IEEE division, and the compile options.

A leaf beside the kernels that use it (it imports only torch and Triton).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
import triton
import triton.language as tl


def pack_constants(
    names: Sequence[str],
    values: Mapping[str, float],
    reciprocals: Mapping[str, str],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A ``[len(names)]`` tensor of ``dtype`` on ``device``: each of ``values`` rounded once to
    ``dtype``, as torch rounds a Python number an op meets, and each slot of ``reciprocals``
    (derived slot -> its divisor's slot) ``1 / divisor`` divided in ``dtype`` on the CPU, as
    torch's host code rounds the reciprocal it multiplies by. Built once per env: copying it to
    the device is not something a captured step may do."""
    want = set(names) - set(reciprocals)
    if set(values) != want:
        raise ValueError(f"constants: need exactly {sorted(want)}, got {sorted(values)}")
    slot = {name: i for i, name in enumerate(names)}
    row = torch.tensor([values.get(name, 0.0) for name in names], dtype=dtype)
    for derived, divisor in reciprocals.items():
        row[slot[derived]] = torch.ones((), dtype=dtype) / row[slot[divisor]]
    return row.to(device)


def torch_divides_by_reciprocal(device: torch.device) -> bool:
    """Whether torch computes ``tensor / number`` on ``device`` as ``tensor * (1 / number)``, the
    reciprocal rounded once on the host (its CUDA kernel does; its CPU kernel divides)."""
    return device.type == "cuda"


def uses_libdevice(device: torch.device) -> bool:
    """Whether a kernel can call the GPU's libdevice functions, which torch's CUDA kernels call
    too (``log1p`` is ``::log1p``, the same CUDA math library function): on CUDA, but not under
    Triton's interpreter, which runs no libdevice call (the kernel then computes from ``tl.log``
    and the like)."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def launch_options() -> dict[str, object]:
    """A launch's compile options for exactly torch's arithmetic: no FMA contraction (torch
    rounds after every multiply and every add) and, on NVIDIA GPUs, libdevice's functions
    without flushing subnormals to zero (torch's are built without it; Triton's HIP backend has
    no such option). The interpreter ignores both."""
    options: dict[str, object] = {"num_warps": 4, "enable_fp_fusion": False}
    if torch.version.hip is None:
        options["enable_reflect_ftz"] = False
    return options


@triton.jit
def div(a, b):
    """torch's division: ``/`` on float32 compiles to an approximate division on NVIDIA GPUs,
    torch's is IEEE (float64 ``/`` is IEEE already, and div_rn takes float32 only)."""
    if a.dtype == tl.float32:
        return tl.math.div_rn(a, b)
    else:
        return a / b
