"""Failure isolation: when a step raises because of some of its requests, find those
requests and fail only them (finish_reason "error"), keeping the others' results."""

from __future__ import annotations

import logging

from ..errors import EngineDeadError
from ..executor import Executor
from ..sched.output import ModelRunnerOutput, RequestUpdate, SchedulerOutput
from ..sched.scheduler import Scheduler

logger = logging.getLogger("accord.engine")


def isolate_failure(
    executor: Executor, schedulers: list[Scheduler], steps: list[SchedulerOutput], error: Exception
) -> tuple[list[ModelRunnerOutput | None], list[RequestUpdate]]:
    """Fail the requests that made `steps` (one per replica) raise `error`: their final
    updates, and the others' results. With one replica the step runs again in halves
    until the failing requests are found; with several (some replicas already advanced
    their requests) every request of the step fails."""
    for scheduler, step in zip(schedulers, steps):
        scheduler.step_failed(step)
    if len(steps) > 1:
        logger.error("a data-parallel step failed (%s); failing its requests", error)
        message = f"{type(error).__name__}: {error}"
        failed = [
            update
            for scheduler, step in zip(schedulers, steps)
            for update in scheduler.fail(step.num_scheduled_tokens, message)
        ]
        return [None] * len(steps), failed
    step = steps[0]
    if step.is_empty:
        raise error  # nothing ran for a request: the runner itself failed
    logger.warning("a step of %d requests failed (%s); isolating the cause", len(step.num_scheduled_tokens), error)
    merged, failures = ModelRunnerOutput(), {}
    ids = list(step.num_scheduled_tokens)
    parts = [ids[: len(ids) // 2], ids[len(ids) // 2 :]] if len(ids) > 1 else []
    if not parts:
        failures[ids[0]] = error
    while parts:
        part = parts.pop()
        if not part:
            continue
        try:
            _merge(merged, executor.execute_subset(part))
        except EngineDeadError:
            raise
        except Exception as part_error:  # noqa: BLE001
            if len(part) == 1:
                failures[part[0]] = part_error
            else:
                parts += [part[: len(part) // 2], part[len(part) // 2 :]]
    failed = []
    for req_id, req_error in failures.items():
        logger.error("request sample %s failed its step: %s", req_id, req_error)
        failed += schedulers[0].fail([req_id], f"{type(req_error).__name__}: {req_error}")
    return [merged], failed


def _merge(into: ModelRunnerOutput, part: ModelRunnerOutput) -> None:
    into.req_ids += part.req_ids
    into.sampled_token_ids += part.sampled_token_ids
    into.logprobs += part.logprobs
    into.top_logprobs += part.top_logprobs
    into.prompt_logprobs.update(part.prompt_logprobs)
    into.draft_token_ids.update(part.draft_token_ids)
