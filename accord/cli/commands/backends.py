"""`accord backends`: every registered backend, available or not, and why not."""

from __future__ import annotations

import argparse

from ...backends import default_registry


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "backends",
        help="list backends, their availability and why not",
        description="List every registered backend (built-in and plugin), whether it can run here, and why not.",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = []
    for backend in default_registry().all():
        availability = backend.availability()
        status = "available" if availability.available else "unavailable"
        rows.append((backend.name, backend.device_type, str(backend.priority), status, availability.reason or backend.description))
    widths = [max(len(row[i]) for row in rows + [("backend", "device", "priority", "status", "")]) for i in range(4)]
    header = ("backend", "device", "priority", "status", "notes")
    for row in [header, *rows]:
        print("  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)))
    return 0
