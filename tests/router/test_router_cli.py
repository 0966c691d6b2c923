"""`accord router`'s command line: the instance lists it takes and those it refuses."""

from __future__ import annotations

import pytest

from accord.cli.main import build_parser, main
from accord.router.cli import router_config


def test_pd_flags_build_a_pd_config() -> None:
    args = build_parser().parse_args(["router", "--prefill", "http://p:8100", "--decode", "http://d:8200",
                                      "--decode", "http://d2:8200", "--policy", "least_outstanding"])
    config = router_config(args)
    assert config.pd_mode and config.decode == ["http://d:8200", "http://d2:8200"]
    assert config.policy == "least_outstanding"


@pytest.mark.parametrize("flags, message", [
    ([], "give --backend URL"),
    (["--prefill", "http://p:1"], "needs both --prefill and --decode"),
    (["--backend", "http://b:1", "--prefill", "http://p:1", "--decode", "http://d:1"], "not both"),
])
def test_an_inconsistent_instance_list_exits_2_naming_the_problem(flags, message, capsys) -> None:
    assert main(["router", *flags]) == 2
    assert message in capsys.readouterr().out
