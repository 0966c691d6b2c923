"""A fault to inject into an in-process engine: a model whose forward raises on one
token, as a kernel would on input it cannot take (a failure caused by one request).
A uniquely named module, so tests import it whatever else pytest collected."""

from __future__ import annotations

import pytest

POISON_TOKEN = 777


def poison_the_model(engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every forward of `engine`'s (uni-executor) model whose batch holds
    POISON_TOKEN raise RuntimeError("injected kernel failure")."""
    runner = engine.executor.driver_worker.runner
    real_forward = runner.forward  # the forward every step runs (the model's, or its compiled form)

    def forward(input_ids, *args, **kwargs):
        if bool((input_ids == POISON_TOKEN).any()):
            raise RuntimeError("injected kernel failure")
        return real_forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(runner, "forward", forward)
