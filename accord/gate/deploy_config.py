"""deploy.yaml: what `accord serve` takes (EngineConfig's fields, under the same names)
plus a `gate:` section with the rollout gate's thresholds. Unknown keys are refused,
so a misspelt setting can never be silently left at its default.

The parallel layout is part of the deployable event (vLLM's names):
`tensor_parallel_size`, `data_parallel_size`, `enable_expert_parallel` and
`distributed_executor_backend`; the gate runs the engine with them, so profile_run and
the recorded op signatures are every rank's own. `record_op_calls` keeps the ranks'
recorded calls in that folder (by default the gate records into a scratch folder).

`lora_modules` lists the LoRA adapters the deploy serves, as `accord serve
--lora-modules` takes them (`name=path`, or a mapping with `name`, `path` and
optionally `base_model_name`); the gate generates under each and compares each with
the reference."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..core.config import EngineConfig
from ..entrypoints.model_choice import BUILT_IN_MODEL_NAMES
from ..server.lora_modules import LoRAModulePath, parse_lora_module

GATE_SECTION = "gate"
#: The served adapters: a serve setting that is not the engine's.
LORA_MODULES = "lora_modules"
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
    lora_modules: tuple[LoRAModulePath, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The full resolved config, defaults included (what reports record and hash)."""
        return {**dataclasses.asdict(self.engine), LORA_MODULES: [dataclasses.asdict(m) for m in self.lora_modules],
                GATE_SECTION: dataclasses.asdict(self.gate)}


def _refuse_unknown(keys: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(keys) - known)
    if unknown:
        raise DeployConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def parse_deploy_config(data: Mapping[str, Any], base_dir: Path, where: str = "deploy config") -> DeployConfig:
    """Build a DeployConfig from parsed YAML; relative model, tokenizer and adapter
    paths are taken relative to `base_dir` (the YAML file's folder)."""
    if not isinstance(data, Mapping):
        raise DeployConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    engine_keys = {f.name for f in dataclasses.fields(EngineConfig)}
    _refuse_unknown(data, engine_keys | {GATE_SECTION, LORA_MODULES}, where)
    gate_data = data.get(GATE_SECTION) or {}
    _refuse_unknown(gate_data, {f.name for f in dataclasses.fields(GateSettings)}, f"{where}: {GATE_SECTION}")
    engine_data = {k: v for k, v in data.items() if k not in (GATE_SECTION, LORA_MODULES)}
    modules = _lora_modules(data.get(LORA_MODULES) or [], base_dir, where)
    if modules and not engine_data.get("enable_lora"):
        raise DeployConfigError(f"{where}: {LORA_MODULES} needs enable_lora: true")
    if "model" not in engine_data:
        raise DeployConfigError(
            f"{where}: 'model' (a model directory, a .gguf file or {', '.join(BUILT_IN_MODEL_NAMES)}) is required"
        )
    for key in PATH_KEYS:
        value = engine_data.get(key)
        if value is not None and not (key == "model" and value in BUILT_IN_MODEL_NAMES):
            engine_data[key] = str((base_dir / str(value)).resolve())
    try:
        return DeployConfig(EngineConfig(**engine_data), GateSettings(**gate_data), modules)
    except (TypeError, ValueError) as error:
        raise DeployConfigError(f"{where}: {error}") from None


def _lora_modules(entries: Any, base_dir: Path, where: str) -> tuple[LoRAModulePath, ...]:
    """`lora_modules` entries as serve's `--lora-modules` reads them (a `name=path`
    string, or a mapping), each path taken from the YAML file's folder; a name given
    twice is refused, as the server refuses loading it twice."""
    if not isinstance(entries, list):
        raise DeployConfigError(f"{where}: {LORA_MODULES} must be a list of name=path entries or mappings")
    modules = []
    for entry in entries:
        if isinstance(entry, Mapping):
            _refuse_unknown(entry, {"name", "path", "base_model_name"}, f"{where}: {LORA_MODULES} entry")
            if "name" not in entry or "path" not in entry:
                raise DeployConfigError(f"{where}: {LORA_MODULES} entry {dict(entry)!r} needs name and path")
            module = LoRAModulePath(str(entry["name"]), str(entry["path"]), entry.get("base_model_name"))
        else:
            try:
                module = parse_lora_module(str(entry))
            except ValueError as error:
                raise DeployConfigError(f"{where}: {LORA_MODULES}: {error}") from None
        modules.append(dataclasses.replace(module, path=str((base_dir / module.path).resolve())))
    names = [module.name for module in modules]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DeployConfigError(f"{where}: {LORA_MODULES} names {', '.join(repeated)} more than once")
    return tuple(modules)


def load_deploy_config(path: str | Path) -> DeployConfig:
    """Read and check a deploy.yaml."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise DeployConfigError(f"{path}: cannot read: {error}") from None
    return parse_deploy_config(data or {}, path.parent, str(path))
