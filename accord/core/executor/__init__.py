"""Executors: how the engine's workers run (in this process, one process per rank, or
on a Ray cluster) behind one interface."""

from .base import Executor, executor_class

__all__ = ["Executor", "executor_class"]
