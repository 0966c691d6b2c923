"""speculative_config as vLLM has it: from Python (LLM/EngineConfig) and from
`--speculative-config JSON`; every bad combination refused at start naming the key, and
the methods accord does not run refused by name."""

from __future__ import annotations

import contextlib
import io

import pytest

from accord.cli.engine_flags import engine_config
from accord.cli.main import build_parser
from accord.core.config import EngineConfig
from accord.core.spec_decode.config import SpeculativeConfig


def config(**spec: object) -> SpeculativeConfig | None:
    return EngineConfig(model="m", speculative_config=spec).speculative


def test_an_ngram_config_takes_vllms_keys() -> None:
    spec = config(method="ngram", num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=5)
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        "ngram", 4, 2, 5)


def test_adaptive_speculation_is_opt_in() -> None:
    assert not config(method="suffix", num_speculative_tokens=8).adaptive_num_speculative_tokens
    assert config(method="suffix", num_speculative_tokens=8, adaptive_num_speculative_tokens=True).adaptive_num_speculative_tokens


def test_no_config_means_no_speculation() -> None:
    assert EngineConfig(model="m").speculative is None


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "'lookahead'"),
        ({"method": "lookup", "num_speculative_tokens": 2}, "speculative_config.method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": "3"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
         "prompt_lookup_max"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min"),
        ({"method": "suffix", "num_speculative_tokens": 2, "suffix_decoding_min_token_prob": 2}, "min_token_prob"),
        ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}, "disable_by_batch_size"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model"),
        ({"method": "mtp", "num_speculative_tokens": 2, "model": "d"}, "speculative_config.model"),
        ({"method": "draft_model", "num_speculative_tokens": 2, "model": 3}, "speculative_config.model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "d"}, "speculative_config.model"),
        ({"method": "draft_model", "num_speculative_tokens": 2, "model": "d", "draft_tensor_parallel_size": 2},
         "draft_tensor_parallel_size"),
        ({"method": "ngram", "num_speculative_tokens": 2, "adaptive_num_speculative_tokens": 1},
         "adaptive_num_speculative_tokens"),
    ],
)
def test_a_bad_combination_is_refused_naming_the_key(spec: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        EngineConfig(model="m", speculative_config=spec)


def test_a_draft_model_config_takes_vllms_keys() -> None:
    spec = config(method="draft_model", num_speculative_tokens=3, model="/draft", draft_tensor_parallel_size=1)
    assert (spec.method, spec.model, spec.num_speculative_tokens, spec.num_lookahead_tokens) == (
        "draft_model", "/draft", 3, 3)


def test_a_method_accord_does_not_run_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="method 'medusa' is not supported"):
        EngineConfig(model="m", speculative_config={"method": "medusa", "num_speculative_tokens": 2})


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_an_eagle_config_takes_the_heads_directory_in_model(method: str) -> None:
    spec = config(method=method, num_speculative_tokens=3, model="/head")
    assert (spec.method, spec.model, spec.num_lookahead_tokens) == (method, "/head", 3)
    with pytest.raises(ValueError, match=f"speculative_config.model is required with method '{method}'"):
        config(method=method, num_speculative_tokens=3)


def test_the_flag_takes_json() -> None:
    args = build_parser().parse_args(
        ["serve", "--speculative-config", '{"method": "suffix", "num_speculative_tokens": 5}'])
    assert engine_config(args, "/m").speculative == SpeculativeConfig("suffix", 5)


@pytest.mark.parametrize("text", ["{method: ngram}", '["ngram"]'])
def test_the_flag_refuses_what_is_not_a_json_object(text: str) -> None:
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--speculative-config", text])
    assert "--speculative-config" in errors.getvalue()


@pytest.mark.parametrize("extra", [{"method": "mtp"}, {"method": "eagle3", "model": "/head"}])
def test_a_head_on_several_ranks_is_refused(extra: dict) -> None:
    with pytest.raises(ValueError, match=f"'{extra['method']}' with tensor_parallel_size"):
        EngineConfig(model="m", tensor_parallel_size=2, speculative_config={**extra, "num_speculative_tokens": 1})
