"""The worked example of docs/plugin_authoring.md ("Adding an op"): the three files of
docs/examples/new_op (contract, reference kernel, conformance cases) are all the
registry needs. With them in place (in a process of its own, so this suite's registry
stays as it is) the dispatcher serves the op on the reference backend, matching the
formula computed here, and a plugin's kernel for it passes conformance against the
reference, its illegal calls refused."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "new_op"

SCRIPT = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from accord.op_contracts import CONTRACTS, KernelSet, OpDispatcher
import contract                                    # file 1: the contract
CONTRACTS.update({c.name: c for c in contract.CONTRACTS})
import reference_kernel                            # file 2: the reference kernel
import cases                                       # file 3: the cases
from accord.conformance.cases import GENERATORS
GENERATORS.update(cases.CASES)
from accord.backends import get_backend
from accord.backends.reference import ReferenceBackend
from accord.conformance.runner import ConformanceRunner

PLUGIN = KernelSet("plugin")

@PLUGIN.register("gelu_and_mul")
def gelu_and_mul(x, out):
    # The contract's formula, written out (not torch's gelu), in fp64, rounded once.
    g, up = x[:, : x.shape[1] // 2].double(), x[:, x.shape[1] // 2 :].double()
    out.copy_(0.5 * g * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (g + 0.044715 * g**3))) * up)

class Plugin(ReferenceBackend):
    name = "plugin"
    def load_kernels(self):
        return PLUGIN

x = torch.tensor([[-1.5, 0.25, 2.0, 3.0]])
served = OpDispatcher(get_backend("reference")).gelu_and_mul(x).tolist()
report = ConformanceRunner(Plugin(), get_backend("reference")).run_op("gelu_and_mul")
print(json.dumps({"served": served, "statuses": [r.status.value for r in report]}))
"""


@pytest.mark.slow
def test_the_examples_three_files_are_what_a_new_op_needs() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(EXAMPLE)], capture_output=True, text=True, cwd=ROOT, check=True
    )
    outcome = json.loads(result.stdout.splitlines()[-1])
    expected = [_gelu_tanh(-1.5) * 2.0, _gelu_tanh(0.25) * 3.0]
    assert all(abs(g - w) <= 1e-6 * abs(w) for g, w in zip(outcome["served"][0], expected)), outcome["served"]
    statuses = outcome["statuses"]
    assert set(statuses) == {"pass", "refused"}, statuses
    assert statuses.count("pass") == 6  # every float dtype at both shapes


def _gelu_tanh(value: float) -> float:
    return 0.5 * value * (1 + math.tanh(math.sqrt(2 / math.pi) * (value + 0.044715 * value**3)))
