"""`accord router`: the command that starts the router (its parser and its run)."""

from __future__ import annotations

import argparse

from .config import RouterConfig
from .policies import POLICIES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `accord router` to the CLI."""
    parser = subparsers.add_parser(
        "router", help="OpenAI-compatible router over several accord instances (policies, PD disaggregation)",
        description="Route OpenAI requests over accord serve instances: --backend URL (repeat) with a --policy, "
        "or PD mode with --prefill URL and --decode URL (docs/disaggregation.md).",
    )
    parser.add_argument("--backend", action="append", default=[], metavar="URL", help="an instance serving whole requests")
    parser.add_argument("--prefill", action="append", default=[], metavar="URL", help="a prefill instance (PD mode)")
    parser.add_argument("--decode", action="append", default=[], metavar="URL", help="a decode instance (PD mode)")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="round_robin",
                        help="instance order per request (default: round_robin)")
    parser.add_argument("--load-cap", type=int, default=4096,
                        help="affinity: estimated tokens an instance may hold beyond the least loaded (default: 4096)")
    parser.add_argument("--health-interval", type=float, default=2.0, help="seconds between health checks (default: 2)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    parser.set_defaults(func=run)


def router_config(args: argparse.Namespace) -> RouterConfig:
    """The router configuration the parsed flags describe (ValueError when inconsistent)."""
    return RouterConfig(backends=args.backend, prefill=args.prefill, decode=args.decode, policy=args.policy,
                        load_cap=args.load_cap, health_interval_s=args.health_interval)


def run(args: argparse.Namespace) -> int:
    """Start the router and serve until interrupted; 2 for a bad instance list."""
    import uvicorn

    from .app import build_app

    try:
        config = router_config(args)
    except ValueError as error:
        print(f"accord router: {error}")
        return 2
    uvicorn.run(build_app(config), host=args.host, port=args.port, log_level="warning")
    return 0
