"""Backend plugins: the hookspecs, the Backend base class, the built-ins and discovery."""

from .base import Availability, Backend, ToleranceOverride
from .hookspecs import ENTRY_POINT_GROUP, hookimpl
from .registry import BackendRegistry, BackendUnavailableError, UnknownBackendError, default_registry, get_backend

__all__ = [
    "Availability",
    "Backend",
    "BackendRegistry",
    "BackendUnavailableError",
    "ENTRY_POINT_GROUP",
    "ToleranceOverride",
    "UnknownBackendError",
    "default_registry",
    "get_backend",
    "hookimpl",
]
