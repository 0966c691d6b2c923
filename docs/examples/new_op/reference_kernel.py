"""The worked example of docs/plugin_authoring.md, file 2 of 3: the reference kernel,
obviously correct, in fp64 and rounded once. In the tree it joins
accord/backends/reference/kernels/elementwise.py (`KERNELS` is the reference's table)."""

from __future__ import annotations

import torch

from accord.backends.reference.kernels import KERNELS


@KERNELS.register("gelu_and_mul")
def gelu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    half = x.shape[1] // 2
    x64 = x.double()
    out.copy_(torch.nn.functional.gelu(x64[:, :half], approximate="tanh") * x64[:, half:])
