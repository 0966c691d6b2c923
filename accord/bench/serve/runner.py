"""One rung of `accord bench serve`: warm-up requests (excluded from every figure), the
prefix cache reset when asked, then the measured requests sent at their arrival times,
at most `max_concurrency` in flight, with a progress bar."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from .arrivals import arrival_times
from .client import send_request
from .request_types import RequestOutcome, RequestSettings
from .datasets import SampleRequest
from .http_session import HttpSession
from .server_info import reset_prefix_cache


@dataclass(frozen=True)
class RungSpec:
    """How one rung sends its requests."""

    request_rate: float
    burstiness: float = 1.0
    max_concurrency: int | None = None
    #: The arrivals' seed (the prompts are drawn before, with their own).
    seed: int = 0
    reset_prefix_cache: bool = False
    progress: bool = True
    label: str = ""


@dataclass(frozen=True)
class RungRun:
    """What one rung measured: each measured request's outcome, the wall time from the
    first send to the last answer, the warm-up outcomes, and the prefix cache's state."""

    outcomes: list[RequestOutcome]
    duration_s: float
    warmups: list[RequestOutcome]
    prefix_cache: str


async def run_rung(
    http: HttpSession,
    settings: RequestSettings,
    requests: Sequence[SampleRequest],
    warmups: Sequence[SampleRequest],
    spec: RungSpec,
    base_url: str,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RungRun:
    """Run the warm-ups one at a time, reset the prefix cache if asked, then send each
    request at its arrival time (`arrival_times`), under the concurrency cap."""
    warmed = [await send_request(http, settings, request, clock) for request in warmups]
    prefix_cache = await reset_prefix_cache(http, base_url) if spec.reset_prefix_cache else "not reset (no --reset-prefix-cache)"
    limit = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else contextlib.nullcontext()
    bar = tqdm(total=len(requests), desc=spec.label or f"rate {spec.request_rate}", unit="req", disable=not spec.progress)

    async def one(request: SampleRequest) -> RequestOutcome:
        async with limit:
            outcome = await send_request(http, settings, request, clock)
        bar.update()
        return outcome

    start = clock()
    tasks = []
    for request, at in zip(requests, arrival_times(len(requests), spec.request_rate, spec.burstiness, spec.seed)):
        if (wait := start + at - clock()) > 0:
            await sleep(wait)
        tasks.append(asyncio.create_task(one(request)))
    outcomes = list(await asyncio.gather(*tasks))
    duration = clock() - start
    bar.close()
    return RungRun(outcomes, duration, warmed, prefix_cache)
