"""What `accord bench serve` sends and when: gamma arrivals (all at once for inf; mean
gap 1/rate, the last at count/rate; burstiness sets the spread), the datasets' seeded
prompts and lengths, and flags refused with a clear message."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from accord.bench.serve.arrivals import arrival_times
from accord.bench.serve.datasets import DatasetSpec, length_range, sample_requests
from accord.bench.serve.metrics import parse_goodput, parse_list
from accord.bench.serve.sweep import parse_rates


class WordTokenizer:
    """One token per whitespace-separated word; ids are word numbers in a 1000-word vocabulary."""

    vocab_size = 1000

    def encode(self, text, add_special_tokens=True):
        return [int(w[1:]) if w.startswith("w") and w[1:].isdigit() else 999 for w in text.split()]

    def decode(self, token_ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in token_ids)


def test_an_infinite_rate_sends_everything_at_once():
    assert arrival_times(5, math.inf, 1.0, seed=0) == [0.0] * 5


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_arrivals_end_at_count_over_rate_and_burstiness_sets_the_spread(burstiness):
    times = arrival_times(4000, 8.0, burstiness, seed=3)
    assert times[-1] == pytest.approx(4000 / 8.0)
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    assert all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / 8.0, rel=1e-9)
    # A gamma gap of shape k has a coefficient of variation of 1/sqrt(k).
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)
    assert arrival_times(4000, 8.0, burstiness, seed=3) == times


@pytest.mark.parametrize("rate, burstiness, message", [(0.0, 1.0, "--request-rate"), (2.0, 0.0, "--burstiness")])
def test_a_nonpositive_rate_or_burstiness_is_refused(rate, burstiness, message):
    with pytest.raises(ValueError, match=message):
        arrival_times(3, rate, burstiness, seed=0)


def test_random_prompts_are_ids_of_seeded_lengths_within_the_range():
    spec = DatasetSpec(random_input_len=100, random_output_len=20, random_range_ratio=0.25, random_prefix_len=5)
    requests = sample_requests(spec, 200, WordTokenizer(), seed=1)
    assert length_range(100, 0.25) == (75, 125) and length_range(20, 0.25) == (15, 25)
    assert all(80 <= r.prompt_len <= 130 and r.prompt_len == len(r.prompt) for r in requests)
    assert all(15 <= r.expected_output_len <= 25 for r in requests)
    assert len({tuple(r.prompt[:5]) for r in requests}) == 1  # the shared prefix
    assert all(3 <= i < 1000 for r in requests for i in r.prompt)
    assert sample_requests(spec, 200, WordTokenizer(), seed=1) == requests
    assert sample_requests(spec, 200, WordTokenizer(), seed=2) != requests


def test_prefix_repetition_prompts_share_few_prefixes():
    spec = DatasetSpec(name="prefix_repetition", prefix_repetition_prefix_len=8, prefix_repetition_suffix_len=4,
                       prefix_repetition_num_prefixes=3, prefix_repetition_output_len=9)  # fmt: skip
    requests = sample_requests(spec, 12, WordTokenizer(), seed=0)
    assert len({tuple(r.prompt[:8]) for r in requests}) == 3
    assert len({tuple(r.prompt[8:]) for r in requests}) == 12
    assert all(r.prompt_len == 12 and r.expected_output_len == 9 for r in requests)


def test_sharegpt_takes_the_first_turn_and_the_answers_length(tmp_path):
    conversations = [
        {"conversations": [{"from": "human", "value": f"w1 w2 w3 w4 w{i}"}, {"from": "gpt", "value": "w5 " * (4 + i)}]}
        for i in range(6)
    ] + [{"conversations": [{"from": "human", "value": "w1"}, {"from": "gpt", "value": "w1 w2 w3 w4"}]}]  # too short
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    requests = sample_requests(DatasetSpec(name="sharegpt", path=str(path)), 6, WordTokenizer(), seed=0)
    assert sorted(r.expected_output_len for r in requests) == [4, 5, 6, 7, 8, 9]
    assert all(r.prompt_len == 5 and r.prompt.startswith("w1 w2 w3 w4") for r in requests)
    with pytest.raises(ValueError, match="6 usable prompts; --num-prompts asks for 7"):
        sample_requests(DatasetSpec(name="sharegpt", path=str(path)), 7, WordTokenizer(), seed=0)


def test_custom_reads_a_prompt_a_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"w{i} w{i}"}) for i in range(4)) + "\n")
    requests = sample_requests(DatasetSpec(name="custom", path=str(path), custom_output_len=7), 4, None, seed=0)
    assert sorted(r.prompt for r in requests) == [f"w{i} w{i}" for i in range(4)]
    assert all(r.expected_output_len == 7 and r.prompt_len == 0 for r in requests)


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="sharegpt"), "--dataset-path"),
    (dict(name="random", path="x.json"), "--dataset-path is for sharegpt or custom"),
    (dict(name="nope"), "unknown dataset"),
    (dict(random_range_ratio=1.0), "--random-range-ratio"),
])
def test_bad_dataset_flags_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DatasetSpec(**kwargs)


def test_a_drawn_dataset_without_a_tokenizer_says_which_flag_to_give():
    with pytest.raises(ValueError, match="--tokenizer"):
        sample_requests(DatasetSpec(), 1, None, seed=0)


def test_flag_values_parse_and_bad_ones_are_refused():
    assert parse_rates("1,2.5,inf") == [1.0, 2.5, math.inf]
    assert parse_goodput(["ttft:2000", "tpot:100", "e2el:1e4"]) == {"ttft": 2000.0, "tpot": 100.0, "e2el": 10000.0}
    assert parse_list("ttft, itl", ("ttft", "itl")) == ["ttft", "itl"]
    for bad, call in ((["itl:5"], parse_goodput), (["ttft"], parse_goodput), (["ttft:-1"], parse_goodput),
                      ("1,x", parse_rates), ("0", parse_rates)):  # fmt: skip
        with pytest.raises(ValueError):
            call(bad)
    with pytest.raises(ValueError, match="'p99' is not one of"):
        parse_list("p99", ("ttft",))
