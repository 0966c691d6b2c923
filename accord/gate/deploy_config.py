"""deploy.yaml: what `accord serve` takes (EngineConfig's fields, under the same names)
plus a `gate:` section with the rollout gate's thresholds. Unknown keys are refused,
so a misspelt setting can never be silently left at its default.

The parallel layout is part of the deployable event (vLLM's names):
`tensor_parallel_size`, `data_parallel_size`, `enable_expert_parallel` and
`distributed_executor_backend`; the gate runs the engine with them, so profile_run and
the recorded op signatures are every rank's own. `record_op_calls` keeps the ranks'
recorded calls in that folder (by default the gate records into a scratch folder)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..core.config import EngineConfig
from ..entrypoints.model_choice import BUILT_IN_MODEL_NAMES

GATE_SECTION = "gate"
#: Keys holding paths, taken relative to the YAML file's folder (a built-in model's
#: name, such as accord-demo-random, stays a name).
PATH_KEYS = ("model", "tokenizer", "record_op_calls")


class DeployConfigError(ValueError):
    """A deploy.yaml that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class GateSettings:
    """Thresholds and switches of the rollout gate. Determinism and batch invariance
    are reported always and fail the gate only when required."""

    reference: str = "reference"
    seed: int = 0
    #: Also run every op's standard seeded cases, not only the recorded signatures.
    standard_cases: bool = True
    #: Tokens generated per prompt in the greedy comparison and the server checks.
    max_tokens: int = 16
    #: Share of generated tokens that must equal the reference's, position by position.
    min_token_agreement: float = 0.9
    #: Largest |logprob difference| allowed on tokens both backends chose.
    max_logprob_diff: float = 0.1
    #: Fail on ops the backend declares nondeterministic (undeclared ones always fail).
    require_determinism: bool = False
    #: Fail on ops the backend declares batch-variant (undeclared ones always fail).
    require_batch_invariance: bool = False
    #: Fail when the backend declines (unsupported) any case of an op the deploy calls.
    require_all_ops: bool = False
    #: Run the TEST06-style checks through the OpenAI server path.
    server_checks: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise DeployConfigError(f"gate.max_tokens must be positive, got {self.max_tokens}")
        if not 0.0 <= self.min_token_agreement <= 1.0:
            raise DeployConfigError(f"gate.min_token_agreement must be in [0, 1], got {self.min_token_agreement}")
        if self.max_logprob_diff < 0:
            raise DeployConfigError(f"gate.max_logprob_diff must be >= 0, got {self.max_logprob_diff}")


@dataclass(frozen=True)
class DeployConfig:
    """A parsed deploy.yaml: the production engine settings and the gate's settings."""

    engine: EngineConfig
    gate: GateSettings = field(default_factory=GateSettings)

    def as_dict(self) -> dict[str, Any]:
        """The full resolved config, defaults included (what reports record and hash)."""
        return {**dataclasses.asdict(self.engine), GATE_SECTION: dataclasses.asdict(self.gate)}


def _refuse_unknown(keys: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(keys) - known)
    if unknown:
        raise DeployConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def parse_deploy_config(data: Mapping[str, Any], base_dir: Path, where: str = "deploy config") -> DeployConfig:
    """Build a DeployConfig from parsed YAML; relative model and tokenizer paths are
    taken relative to `base_dir` (the YAML file's folder)."""
    if not isinstance(data, Mapping):
        raise DeployConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    engine_keys = {f.name for f in dataclasses.fields(EngineConfig)}
    _refuse_unknown(data, engine_keys | {GATE_SECTION}, where)
    gate_data = data.get(GATE_SECTION) or {}
    _refuse_unknown(gate_data, {f.name for f in dataclasses.fields(GateSettings)}, f"{where}: {GATE_SECTION}")
    engine_data = {k: v for k, v in data.items() if k != GATE_SECTION}
    if "model" not in engine_data:
        raise DeployConfigError(
            f"{where}: 'model' (a model directory, a .gguf file or {', '.join(BUILT_IN_MODEL_NAMES)}) is required"
        )
    for key in PATH_KEYS:
        value = engine_data.get(key)
        if value is not None and not (key == "model" and value in BUILT_IN_MODEL_NAMES):
            engine_data[key] = str((base_dir / str(value)).resolve())
    try:
        return DeployConfig(EngineConfig(**engine_data), GateSettings(**gate_data))
    except (TypeError, ValueError) as error:
        raise DeployConfigError(f"{where}: {error}") from None


def load_deploy_config(path: str | Path) -> DeployConfig:
    """Read and check a deploy.yaml."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise DeployConfigError(f"{path}: cannot read: {error}") from None
    return parse_deploy_config(data or {}, path.parent, str(path))
