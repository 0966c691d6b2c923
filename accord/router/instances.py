"""The instances a router sends requests to: their URL, role, health and load, and
the background health check that takes a dead one out of rotation and puts it back
once it answers again."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

import httpx

logger = logging.getLogger("accord.router")

#: What an instance does for the router: everything, the prefill or the decode of PD.
Role = Literal["mixed", "prefill", "decode"]


@dataclass(eq=False)
class Instance:
    """One upstream server and what the router knows of it."""

    url: str
    role: Role = "mixed"
    healthy: bool = True
    #: Requests sent and not yet finished, and their estimated tokens (prompt + max).
    outstanding_requests: int = 0
    outstanding_tokens: int = 0
    requests_total: int = 0
    failures_total: int = 0

    def start(self, tokens: int) -> None:
        """A request of about `tokens` tokens was sent here."""
        self.outstanding_requests += 1
        self.outstanding_tokens += tokens
        self.requests_total += 1

    def finish(self, tokens: int) -> None:
        """A request started with `start(tokens)` ended (answered or failed)."""
        self.outstanding_requests -= 1
        self.outstanding_tokens -= tokens

    def mark_failed(self, reason: str) -> None:
        """The instance could not be reached: out of rotation until a health check passes."""
        self.failures_total += 1
        if self.healthy:
            logger.warning("instance %s (%s) is down: %s", self.url, self.role, reason)
        self.healthy = False


class InstancePool:
    """The instances of one role, and their health checks."""

    def __init__(self, urls: list[str], role: Role) -> None:
        self.instances = [Instance(url.rstrip("/"), role) for url in urls]

    def __bool__(self) -> bool:
        return bool(self.instances)

    @property
    def healthy(self) -> list[Instance]:
        """The instances in rotation."""
        return [instance for instance in self.instances if instance.healthy]

    async def check(self, client: httpx.AsyncClient, timeout_s: float) -> None:
        """GET every instance's /health once; 200 puts it in rotation, anything else
        (or no answer) takes it out."""
        async def probe(instance: Instance) -> None:
            try:
                ok = (await client.get(f"{instance.url}/health", timeout=timeout_s)).status_code == 200
            except httpx.HTTPError as error:
                ok, reason = False, f"{type(error).__name__}: {error}"
            else:
                reason = "/health did not answer 200"
            if ok and not instance.healthy:
                logger.warning("instance %s (%s) is back", instance.url, instance.role)
                instance.healthy = True
            elif not ok:
                instance.mark_failed(reason)

        await asyncio.gather(*(probe(instance) for instance in self.instances))
