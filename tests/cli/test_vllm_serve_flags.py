"""`accord serve` holds to `vllm serve`'s command line (accord/cli/vllm_serve_flags.json,
generated from vLLM's own parser by ci/generate_vllm_serve_flags.py): every vLLM flag
parses; one accord implements is accord's, whole (every alias and negative form);
every other one is classified, noted or refused; a refused one exits 2 naming the
feature, a noted one prints one line and goes on."""

from __future__ import annotations

import argparse

import pytest

from accord.cli.commands.serve import check_vllm_flags, run, server_options
from accord.cli.engine_flags import engine_config
from accord.cli.main import build_parser
from accord.cli.vllm_flags import DEST_PREFIX, NOTED, REFUSED, vllm_serve_flags, vllm_version

FLAGS = vllm_serve_flags()


def serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["serve"]


ACTIONS = serve_parser()._option_string_actions


def test_the_flag_list_is_vllm_0_33s_whole_parser() -> None:
    assert vllm_version() == "0.33.0"
    options = {option for flag in FLAGS for option in flag.options}
    # Spot checks from vLLM's documentation of `vllm serve`.
    assert {"--enable-auto-tool-choice", "--tool-call-parser", "-tp", "--max-model-len", "--enable-prefix-caching",
            "--disable-prefix-caching", "--max-num-seqs", "--enforce-eager", "--disable-log-stats"} <= options
    assert len(FLAGS) > 300


@pytest.mark.parametrize("flag", FLAGS, ids=[flag.options[0] for flag in FLAGS])
def test_every_vllm_flag_is_accords_or_classified(flag) -> None:
    actions = {ACTIONS.get(option) for option in flag.options}
    assert None not in actions, f"accord serve does not parse {[o for o in flag.options if o not in ACTIONS]}"
    assert len(actions) == 1, f"{flag.options} reach different arguments"
    action = actions.pop()
    if action.dest.startswith(DEST_PREFIX):
        classified = [key for key in (flag.dest, *flag.options) if key in NOTED or key in REFUSED]
        assert classified, f"{flag.options[0]} is accepted but neither noted nor refused: classify it in vllm_flags.py"
    else:
        assert all(key not in NOTED and key not in REFUSED for key in (flag.dest, *flag.options)), (
            f"{flag.options[0]} is accord's own flag but still classified in vllm_flags.py"
        )
        takes_values = action.nargs != 0
        assert takes_values == (flag.values != "0"), f"{flag.options[0]}: vLLM's takes {flag.values!r} values"


def test_the_tables_name_only_vllm_flags() -> None:
    known = {flag.dest for flag in FLAGS} | {option for flag in FLAGS for option in flag.options}
    assert sorted((set(NOTED) | set(REFUSED)) - known) == []
    assert [key for key in NOTED if key in REFUSED] == []


def _command_line(flag) -> list[str]:
    value = {"0": [], "1": ["1"], "?": [], "+": ["1"]}[flag.values]
    return ["serve", flag.options[0], *value]


CLASSIFIED = [flag for flag in FLAGS if ACTIONS[flag.options[0]].dest.startswith(DEST_PREFIX)]


@pytest.mark.parametrize("flag", CLASSIFIED, ids=[flag.options[0] for flag in CLASSIFIED])
def test_a_classified_flag_is_noted_or_refused_by_name(flag, capsys: pytest.CaptureFixture[str]) -> None:
    option = flag.options[0]
    args = build_parser().parse_args([*_command_line(flag), "--model", "/no/such/model"])
    refused = (REFUSED.get(option) or REFUSED.get(flag.dest)) is not None and option not in NOTED
    if refused:
        assert run(args) == 2
        error = capsys.readouterr().err.strip()
        assert error == f"accord serve: error: {option}: accord does not support {REFUSED.get(option) or REFUSED[flag.dest]}"
    else:
        verdict = check_vllm_flags(args)
        assert verdict.refusal is None
        assert verdict.notes == [f"{option} has no effect in accord ({NOTED.get(option) or NOTED[flag.dest]})"]


def test_the_two_forms_of_chunked_prefill_differ() -> None:
    enabled = check_vllm_flags(build_parser().parse_args(["serve", "--enable-chunked-prefill"]))
    disabled = check_vllm_flags(build_parser().parse_args(["serve", "--disable-chunked-prefill"]))
    assert enabled.refusal is None and len(enabled.notes) == 1
    assert disabled.refusal == "--disable-chunked-prefill: accord does not support prefill without chunking"


def test_vllm_boolean_forms_reach_accords_engine_flags() -> None:
    args = build_parser().parse_args(["serve", "--disable-prefix-caching", "-ep", "-q", "fp8", "-cc", "0"])
    config = engine_config(args, "/m")
    assert (config.enable_prefix_caching, config.enable_expert_parallel, config.quantization) == (False, True, "fp8")
    assert build_parser().parse_args(["serve", "--no-enable-prefix-caching"]).enable_prefix_caching is False


def test_the_docs_command_line_parses_into_accords_settings() -> None:
    args = build_parser().parse_args([
        "serve", "--model", "m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "4096",
        "--enable-prefix-caching", "--max-num-seqs", "64", "-tp", "2",
    ])
    config = engine_config(args, "m")
    assert (config.max_model_len, config.enable_prefix_caching, config.max_num_seqs) == (4096, True, 64)
    assert config.tensor_parallel_size == 2
    options = server_options(args)
    assert (options.enable_auto_tool_choice, options.tool_call_parser) == (True, "hermes")
    assert check_vllm_flags(args).notes == [] and check_vllm_flags(args).refusal is None


def test_the_api_flags_reach_the_server_options(tmp_path) -> None:
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    args = build_parser().parse_args([
        "serve", "--chat-template", str(template), "--chat-template-content-format", "openai",
        "--default-chat-template-kwargs", '{"enable_thinking": false}', "--max-logprobs", "-1",
        "--disable-auto-tool-choice", "--api-key", "a", "b", "--root-path", "/p", "--enable-force-include-usage",
    ])
    options = server_options(args)
    assert options.chat_template == template.read_text()  # a file's template is read, not passed as its path
    assert (options.chat_template_content_format, options.default_chat_template_kwargs) == ("openai",
                                                                                            {"enable_thinking": False})
    assert (options.max_logprobs, options.enable_auto_tool_choice, options.api_keys) == (-1, False, ("a", "b"))
    assert (options.root_path, options.enable_force_include_usage, options.enable_prompt_tokens_details) == (
        "/p", True, False)


@pytest.mark.parametrize(("given", "dtype"), [
    ("auto", "auto"), ("half", "float16"), ("float16", "float16"), ("bfloat16", "bfloat16"), ("float", "float32"),
    ("float32", "float32"),
])
def test_every_dtype_vllm_takes_parses_into_accords_name(given, dtype) -> None:
    # vLLM's --dtype choices (its ModelDType): half and float are its aliases of float16 and float32.
    config = engine_config(build_parser().parse_args(["serve", "--dtype", given]), "/m")
    assert config.dtype == dtype
