"""SamplingParams and EngineConfig refuse bad settings with a ValueError naming the field."""

from __future__ import annotations

import pytest

from accord import SamplingParams
from accord.core.config import EngineConfig


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"n": 0}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"logprobs": -1}, "logprobs"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_sampling_params_name_the_field(settings: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**settings)


def test_a_single_stop_string_becomes_a_list() -> None:
    assert SamplingParams(stop="###").stop == ["###"]


def test_children_of_a_seeded_request_get_distinct_reproducible_seeds() -> None:
    params = SamplingParams(n=3, seed=10, stop_token_ids=[7])
    children = [params.for_child(i, eos_token_ids={2}) for i in range(3)]
    assert [c.seed for c in children] == [10, 11, 12]
    assert all(c.n == 1 and c.all_stop_token_ids == {2, 7} for c in children)


def test_ignore_eos_leaves_only_the_explicit_stop_tokens() -> None:
    assert SamplingParams(ignore_eos=True, stop_token_ids=[7]).for_child(0, {2}).all_stop_token_ids == {7}


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"block_size": 0}, "block_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_invalid_engine_config_names_the_field(settings: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(model="unused", **settings)
