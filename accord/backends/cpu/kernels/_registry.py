"""The cpu backend's kernel table."""

from ....op_contracts import KernelSet

KERNELS = KernelSet("cpu")
