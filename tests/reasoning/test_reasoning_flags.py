"""`accord serve`'s reasoning flags: vLLM's `--reasoning-parser` is accepted with vLLM's
parser names (it was refused before), `--reasoning-budgets` maps efforts to budgets,
and `--scheduling-policy effort` is an engine choice."""

from __future__ import annotations

import pytest

from accord.cli.commands.serve import check_vllm_flags, server_options
from accord.cli.main import build_parser
from accord.core.config import EngineConfig


def serve(*flags: str):
    return build_parser().parse_args(["serve", *flags])


def test_the_reasoning_parser_and_budgets_reach_the_server_options() -> None:
    args = serve("--reasoning-parser", "qwen3", "--reasoning-budgets", "low=64,high=2048")
    assert check_vllm_flags(args).refusal is None
    options = server_options(args)
    assert options.reasoning_parser == "qwen3"
    assert dict(options.reasoning_budgets) == {"low": 64, "high": 2048}


def test_the_default_budgets_are_low_medium_high() -> None:
    options = server_options(serve())
    assert options.reasoning_parser is None
    assert dict(options.reasoning_budgets) == {"low": 256, "medium": 1024, "high": 4096}


@pytest.mark.parametrize("value", ["low", "extreme=5", "low=-1", "low=many"])
def test_a_malformed_budget_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        serve("--reasoning-budgets", value)
    assert exited.value.code == 2
    assert "is not EFFORT=TOKENS" in capsys.readouterr().err


def test_an_unknown_reasoning_parser_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        serve("--reasoning-parser", "nope")
    assert "deepseek_r1" in capsys.readouterr().err


def test_vllms_reasoning_plugins_stay_refused() -> None:
    assert check_vllm_flags(serve("--reasoning-parser-plugin", "x.py")).refusal is not None


def test_effort_is_a_scheduling_policy() -> None:
    assert serve("--scheduling-policy", "effort").scheduling_policy == "effort"
    assert EngineConfig(model="m", scheduling_policy="effort").scheduling_policy == "effort"
