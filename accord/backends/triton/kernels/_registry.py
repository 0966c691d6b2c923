"""The Triton backend's kernel table, shared by the triton, cuda and rocm backends."""

from ....op_contracts import KernelSet

KERNELS = KernelSet("triton")
