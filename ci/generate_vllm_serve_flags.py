"""Write accord/cli/vllm_serve_flags.json: every flag of `vllm serve`, read from vLLM's
own argument parser, so accord's test (tests/cli/test_vllm_serve_flags.py) holds
`accord serve` to vLLM's command line and a new vLLM flag fails that test rather
than a user's deployment.

vLLM builds its parser from its config dataclasses at run time, so the list comes from
running vLLM's `make_arg_parser`, not from reading the file as text. That needs vLLM's
Python source and its import-time dependencies, not a GPU or its compiled kernels.
To regenerate, for a new vLLM version:

    pip download --no-deps vllm==0.33.0 -d /tmp/vllm            # the wheel holds the source
    mkdir /tmp/vllm/src && unzip -q /tmp/vllm/vllm-*.whl 'vllm/*' -x '*.so' -d /tmp/vllm/src
    python3 -m venv --system-site-packages /tmp/vllm/env
    /tmp/vllm/env/bin/pip install cbor2 pyzmq aiohttp openai-harmony msgspec pybase64 \\
        cachetools uvloop partial-json-parser xgrammar
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=/tmp/vllm/src /tmp/vllm/env/bin/python \\
        ci/generate_vllm_serve_flags.py 0.33.0 > accord/cli/vllm_serve_flags.json

Each entry: the destination name, every option string (aliases and `--no-` forms
included), the argparse group it sits in (vLLM groups by config class), and how many
values it takes ("0", "1", "?" or "+").
"""

from __future__ import annotations

import argparse
import json
import sys


def _arity(action: argparse.Action) -> str:
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return "0"
    if action.nargs in (None, 1):
        return "1"
    if action.nargs == "?":
        return "?"
    return "+"  # "+", "*" and N: argparse takes several values


def vllm_serve_flags() -> list[dict[str, object]]:
    """Every optional argument of `vllm serve`, in vLLM's parser order."""
    sys.argv = ["vllm"]  # vLLM's help text generation reads sys.argv
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    group_of = {id(action): group.title for group in parser._action_groups for action in group._group_actions}
    flags = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flags.append({
            "dest": action.dest,
            "options": list(action.option_strings),
            "group": group_of.get(id(action)) or "options",
            "values": _arity(action),
        })
    return flags


def main() -> None:
    """Print the JSON document for the vLLM version named on the command line."""
    version = sys.argv[1] if len(sys.argv) > 1 else "unknown"
    document = {"vllm_version": version, "flags": vllm_serve_flags()}
    print(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
