"""Finds backends: the built-ins and every package in the `accord.backends` entry point
group, all through one pluggy plugin manager."""

from __future__ import annotations

import logging
from collections.abc import Collection
from functools import lru_cache

import pluggy

from ..op_contracts import CONTRACTS
from . import builtin
from .base import Backend
from .hookspecs import ENTRY_POINT_GROUP, PROJECT, BackendSpec

logger = logging.getLogger("accord.backends")


class UnknownBackendError(LookupError):
    """A backend name nobody registered; the message lists the ones that exist."""


class BackendUnavailableError(RuntimeError):
    """A registered backend that cannot run on this host; the message says why."""


def plugin_manager(load_entry_points: bool = True) -> pluggy.PluginManager:
    """A plugin manager with the built-ins and, unless told not to, installed plugins."""
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(BackendSpec)
    manager.register(builtin, name="accord-builtin")
    if load_entry_points:
        manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return manager


class BackendRegistry:
    """Every backend that registered, by name."""

    def __init__(self, manager: pluggy.PluginManager | None = None) -> None:
        manager = manager or plugin_manager()
        self._backends: dict[str, Backend] = {}
        for backends in manager.hook.accord_backends():
            for backend in backends:
                if backend.name in self._backends:
                    raise ValueError(f"two plugins register a backend named {backend.name!r}")
                self._backends[backend.name] = backend

    def names(self) -> list[str]:
        """Registered names, built-ins first in priority order, then plugins."""
        return sorted(self._backends, key=lambda n: -self._backends[n].priority)

    def all(self) -> list[Backend]:
        return [self._backends[n] for n in self.names()]

    def get(
        self, name: str, *, require_available: bool = True, required_ops: Collection[str] | None = None
    ) -> Backend:
        """The backend called `name`; `auto` picks the available one of highest priority
        with a kernel for each of `required_ops` (every contract when None)."""
        if name == "auto":
            return self.auto(required_ops)
        backend = self._backends.get(name)
        if backend is None:
            raise UnknownBackendError(f"Unsupported backend: {name}. Supported items: {self.names()}")
        if require_available:
            availability = backend.availability()
            if not availability.available:
                raise BackendUnavailableError(f"backend '{name}' is unavailable: {availability.reason}")
        return backend

    def auto(self, required_ops: Collection[str] | None = None) -> Backend:
        """The available backend with the highest priority whose kernels cover
        `required_ops` (the ops the model to serve calls; every contract when None), so a
        plugin lacking an op the model never calls stays eligible; backends passed over
        (lacking a required op, or not for serving) are logged."""
        passed_over = []
        for backend in self.all():
            availability = backend.availability()
            if not availability.available:
                continue
            if not availability.auto_selectable:
                passed_over.append(f"{backend.name} ({availability.reason})")
                continue
            missing = missing_kernels(backend, required_ops)
            if missing:
                passed_over.append(f"{backend.name} (no kernel for {', '.join(missing)})")
                continue
            if passed_over:
                logger.warning("--backend auto chose %s, passing over: %s", backend.name, "; ".join(passed_over))
            return backend
        detail = f"; passed over: {'; '.join(passed_over)}" if passed_over else ""
        raise BackendUnavailableError(f"no backend is available{detail}")


def missing_kernels(backend: Backend, required_ops: Collection[str] | None = None) -> list[str]:
    """The contracts among `required_ops` (every contract when None) that `backend` has
    no kernel for (loads its kernel table)."""
    ops = set(backend.kernels().ops())
    return sorted(name for name in (CONTRACTS if required_ops is None else required_ops) if name not in ops)


@lru_cache(maxsize=1)
def default_registry() -> BackendRegistry:
    """The process-wide registry (built once: entry point discovery is not free)."""
    return BackendRegistry()


def get_backend(name: str = "auto", required_ops: Collection[str] | None = None) -> Backend:
    """Shorthand for `default_registry().get(name, required_ops=required_ops)`."""
    return default_registry().get(name, required_ops=required_ops)
