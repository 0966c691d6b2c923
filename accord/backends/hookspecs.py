"""The pluggy hook a backend package implements to register its backends.

A third-party package exposes a module under the `accord.backends` entry point group;
that module implements `accord_backends()` with `@hookimpl` and returns its Backend
instances. Built-ins register the same way, so they have no privileged path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .base import Backend

PROJECT = "accord"
ENTRY_POINT_GROUP = "accord.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendSpec:
    """Hook specifications for backend plugins."""

    @hookspec
    def accord_backends(self) -> "list[Backend]":
        """Return the backends this plugin provides (constructing them must not import
        a vendor runtime: that happens lazily when a backend is used)."""
