"""Engine flags derived from `EngineConfig` (accord.core.config): one per field, with
vLLM's name, the field's type, choices, default and help, so the command line never
disagrees with the engine and a new engine argument needs no change here; and the
parsed flags back into an EngineConfig. A module of its own so the serve command and
the launcher it starts both read it without importing each other."""

from __future__ import annotations

import argparse
import json

from ..core.config import EngineConfig, EngineSetting, engine_settings


class EnableDisableAction(argparse.BooleanOptionalAction):
    """A boolean flag as vLLM spells it: `--enable-x` is turned off by `--disable-x`
    (and `--disable-x` on by `--enable-x`); argparse's `--no-` forms stay accepted."""

    _OPPOSITES = (("--enable-", "--disable-"), ("--disable-", "--enable-"))

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]
        self._negative = {option for option in self.option_strings if option not in option_strings}
        opposites = [
            opposite + option.removeprefix(prefix)
            for option in option_strings for prefix, opposite in self._OPPOSITES if option.startswith(prefix)
        ]
        self._negative.update(opposites)
        self.option_strings = [*self.option_strings, *opposites]

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[no-untyped-def]
        setattr(namespace, self.dest, option_string not in self._negative)


def add_engine_flags(group: argparse._ArgumentGroup) -> None:
    """Add one flag per engine argument, and `--model` (optional: the launcher picks one)."""
    group.add_argument(
        "--model", default=None,
        help="Hugging Face model directory, GGUF file, or accord-demo-random (default: SmolLM2-135M-Instruct)",
    )
    for setting in engine_settings():
        if not setting.required:  # the model: optional here, the launcher picks one
            group.add_argument(setting.flag, *setting.info.aliases, **engine_flag_options(setting))


def engine_flag_options(setting: EngineSetting) -> dict[str, object]:
    """argparse's options for one engine argument: its type (a boolean is a
    `--flag/--no-flag` pair), choices, default and help."""
    default = setting.info.default_help or ("%(default)s" if setting.default is not None else "none")
    options: dict[str, object] = {
        "dest": setting.name, "default": setting.default, "help": f"{setting.info.help} (default: {default})",
    }
    if setting.kind is bool:
        options["action"] = EnableDisableAction
    else:
        options["type"] = json_object if setting.kind is dict else setting.kind
        options["metavar"] = setting.flag.removeprefix("--").replace("-", "_").upper()
    if setting.choices is not None:
        options["choices"] = setting.choices
    return options


def json_object(text: str) -> dict:
    """A dict-valued engine argument's flag value: a JSON object (checked by EngineConfig)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text}")
    return value


def engine_arguments(args: argparse.Namespace) -> dict[str, object]:
    """The engine arguments the parsed flags give, by EngineConfig field name (the model
    aside): what `accord.LLM(model, **arguments)` takes."""
    return {setting.name: getattr(args, setting.name) for setting in engine_settings() if not setting.required}


def engine_config(args: argparse.Namespace, model_dir: str) -> EngineConfig:
    """The engine configuration the parsed flags describe, for the model in `model_dir`."""
    return EngineConfig(model=model_dir, **engine_arguments(args))
