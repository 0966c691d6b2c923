"""The rollout gate for one deploy config: preflight, then the production engine built
(which runs profile_run at the configured maxima) and a fixed prompt set generated
greedily (under the base model and each LoRA adapter the deploy serves, in one batch)
while every op call is recorded, the same prompts on the reference backend for
comparison, the server-path checks, and finally op conformance for the ops the config
called, at the recorded signatures plus the standard cases."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence, TypeVar

import torch

from ..backends import Backend, default_registry
from ..core.engine.llm_engine import LLMEngine
from ..core.outputs import CompletionOutput
from ..op_contracts.recording import read_recordings
from ..core.sampling_params import SamplingParams
from ..entrypoints import LLM
from ..conformance.case import Case
from ..conformance.cases import cases_for
from ..core.lora.request import LoRARequest
from ..server.lora_modules import LoRAModulePath
from .adapters import served_adapter
from .deploy_config import DeployConfig, GateSettings
from .deploy_model import open_deploy_model
from .preflight import preflight_checks
from .recording import Recording, recorded_cases
from .reports import Check, CheckStatus, GateReport, ServedAdapter
from .reports.environment import capture_environment
from .reports.samples import sample_outputs
from ..conformance.results import CaseResult, ConformanceReport, Status
from ..conformance.runner import ConformanceRunner, OpProgress
from .server_checks import server_checks
from .smoke import PASSAGE, Prompt, compare_streams, prompt_set

#: The engine settings of a single-rank engine (the reference run's layout).
SINGLE_RANK = {"tensor_parallel_size": 1, "data_parallel_size": 1, "enable_expert_parallel": False,
               "distributed_executor_backend": None}
#: Stage lines for the terminal ("profile_run at ...").
Say = Callable[[str], None]
T = TypeVar("T")


def _quiet(_line: str) -> None:
    """The default: say nothing."""


@dataclasses.dataclass
class _Stages:
    """What the model-level stages produced, for the op stage and the report."""

    checks: list[Check]
    recording: Recording
    #: The LoRA adapters the engine accepted and the prompts ran under.
    adapters: tuple[ServedAdapter, ...] = ()


def run_gate(
    config: DeployConfig,
    *,
    ops: Sequence[str] | None = None,
    say: Say = _quiet,
    progress: OpProgress | None = None,
) -> GateReport:
    """Run the whole gate for `config`; `ops` narrows op conformance (bisecting).
    Backends come from the default registry, where the engine finds them too; the model
    is found as `accord serve` finds it. Raises DeployConfigError when the model cannot
    be read, and the registry's errors when a backend cannot be had."""
    registry = default_registry()
    backend = registry.get(config.engine.backend)
    reference = registry.get(config.gate.reference)
    opened = open_deploy_model(config)
    config = opened.config
    environment = capture_environment(backend, config.as_dict())
    checks = preflight_checks(config, backend, opened.model)
    for check in checks:
        say(f"preflight {check.name}: {check.status.value} {check.message}")
    if any(check.status is CheckStatus.FAIL for check in checks):
        return GateReport(environment, None, tuple(checks))
    stages = _model_stages(config, backend, say)
    wanted = [op for op in stages.recording.ops_called if ops is None or op in ops]
    say(f"op conformance for the {len(wanted)} ops this config calls")
    # Kernels run as the engine runs them: under inference_mode. A workspace a kernel
    # cached while the engine generated is an inference tensor, which no other mode may
    # write (the cpu backend's cannot be); production only calls kernels in this mode.
    with torch.inference_mode():
        conformance, cases = _op_conformance(
            backend, reference, config.gate, wanted, stages.recording.cases, progress, config.engine.batch_invariant)
        samples = sample_outputs(backend, reference, cases, conformance.results)
    checks += [*stages.checks, *requirement_checks(config.gate, conformance.results),
               batch_invariant_mode_check(config.engine.batch_invariant)]
    return GateReport(environment, conformance, tuple(checks), samples, stages.recording.signatures, stages.adapters)


class _StageFailed(Exception):
    """A model-level stage broke; carries the failed check that says how."""

    def __init__(self, check: Check) -> None:
        super().__init__(check.message)
        self.check = check


def _guarded(
    name: str, group: str, action: Callable[[], T], figures: Mapping[str, float | int | None] | None = None
) -> T:
    """Run one stage; any exception becomes a failed check (a crash is the finding)."""
    try:
        return action()
    except Exception as error:  # noqa: BLE001 - whatever breaks a stage is what the gate reports
        message = f"{type(error).__name__}: {error}"
        raise _StageFailed(Check(name, group, CheckStatus.FAIL, message, figures or {})) from error


def _model_stages(config: DeployConfig, backend: Backend, say: Say) -> _Stages:
    """profile_run, the recorded greedy generation, the reference comparison and the
    server checks. A broken stage fails its check and stops the later ones, which
    would only fail for the same reason; the ops recorded up to then still run.

    The production engine runs the deploy's parallel layout; each of its ranks records
    its own calls (profile_run's included) through its dispatcher's hook into a folder
    (the deploy's `record_op_calls`, else a scratch one), read back once the engine has
    stopped."""
    checks: list[Check] = []
    adapters: tuple[LoRARequest, ...] = ()
    served: tuple[ServedAdapter, ...] = ()
    maxima = {
        "max_num_seqs": config.engine.max_num_seqs,
        "max_num_batched_tokens": config.engine.max_num_batched_tokens,
    }
    with _recording_folder(config.engine.record_op_calls) as folder:
        settings = {**dataclasses.asdict(config.engine), "record_op_calls": folder}
        try:
            say(f"profile_run at max_num_seqs={maxima['max_num_seqs']} "
                f"max_num_batched_tokens={maxima['max_num_batched_tokens']} on {_layout(config)}")
            llm = _guarded("profile_run", "deploy", lambda: LLM(**settings), maxima)
            try:
                checks.append(Check("profile_run", "deploy", CheckStatus.PASS, "", maxima))
                if config.lora_modules:
                    adapters, served = _guarded("lora adapters", "deploy",
                                                lambda: _serve_adapters(llm.llm_engine, config.lora_modules))  # noqa: F821 - as below
                    checks.append(Check("lora adapters", "deploy", CheckStatus.PASS,
                                        "serving " + ", ".join(f"'{a.name}' (rank {a.rank})" for a in served),
                                        {"adapters": len(served)}))
                prompts = _prompts(llm, config, adapters)
                say(f"greedy generation of {len(prompts)} prompts on '{backend.name}', recording op calls")
                got = _guarded("greedy generation", "deploy", lambda: _greedy(llm, prompts, config.gate.max_tokens))  # noqa: F821 - called at once, before the `del llm` below
                if config.gate.server_checks:
                    say("server-path checks (first streamed token, terminal EOS, usage)")
                    base = [prompt for prompt in prompts if prompt.adapter is None]
                    checks += _guarded("server checks", "server",
                                       lambda: server_checks(llm.llm_engine, base, config.gate.max_tokens))  # noqa: F821 - as above
                else:
                    checks.append(Check("server checks", "server", CheckStatus.SKIPPED, "gate.server_checks is false"))
                reference = _reference_settings(config, prompts, llm.llm_engine)
            finally:
                llm.llm_engine.shutdown()
                del llm
            say(f"the same prompts on '{config.gate.reference}'")
            want = _guarded("reference generation", "deploy",
                            lambda: _greedy_once(reference, prompts, config.gate.max_tokens))
            checks += _comparison_checks(config.gate, prompts, got, want, adapters)
        except _StageFailed as failed:
            checks.append(failed.check)
            say(f"{failed.check.name}: FAILED {failed.check.message}")
        recording = recorded_cases(read_recordings(folder), config.gate.seed)
    if recording.too_large:
        say(f"{recording.too_large} calls were too large to record; their ops still run their standard cases")
    return _Stages(checks, recording, served)


@contextmanager
def _recording_folder(kept: str | None) -> Iterator[str]:
    """The folder the ranks record into: `kept` (the deploy's, left in place after the
    run), else a scratch folder removed after."""
    if kept is not None:
        yield kept
        return
    with tempfile.TemporaryDirectory(prefix="accord-gate-calls-") as folder:
        yield folder


def _layout(config: DeployConfig) -> str:
    """The parallel layout in words, for the stage line."""
    engine = config.engine
    ranks = engine.tensor_parallel_size * engine.data_parallel_size
    return (f"{ranks} rank{'s' if ranks > 1 else ''} (tp={engine.tensor_parallel_size}, dp={engine.data_parallel_size}"
            f"{', expert parallel' if engine.enable_expert_parallel else ''}, {engine.executor_backend} executor)")


def _reference_settings(config: DeployConfig, prompts: Sequence[Prompt], engine: LLMEngine) -> dict[str, object]:
    """The production settings on the reference backend, in one rank, with a KV cache of
    just the blocks the prompt set needs rather than the production budget: the
    production engine's may not be freed yet (the server stack's caches can hold it),
    and greedy tokens do not depend on how many blocks are spare. One rank, because the
    golden answer must not share the parallel code the deploy is checked for (a wrong
    expert-parallel combine would agree with itself), and the reference backend runs
    on the host, where the ranks would share the same memory anyway. It records nothing:
    its calls are the golden's, not the deploy's. It chunks prompts with the production
    engine's token budget (the configured or the measured one)."""
    block_size, max_model_len = config.engine.block_size, engine.max_model_len
    per_prompt = sum(-(-(len(p.token_ids) + config.gate.max_tokens) // block_size) for p in prompts)
    blocks = max(per_prompt, -(-max_model_len // block_size)) + 1
    return {**dataclasses.asdict(config.engine), **SINGLE_RANK, "backend": config.gate.reference,
            "max_num_batched_tokens": engine.config.max_num_batched_tokens, "max_model_len": max_model_len,
            "kv_cache_memory": None, "num_gpu_blocks_override": blocks, "record_op_calls": None}


def _serve_adapters(
    engine: LLMEngine, modules: Sequence[LoRAModulePath]
) -> tuple[tuple[LoRARequest, ...], tuple[ServedAdapter, ...]]:
    """The deploy's adapters added as the server adds its `--lora-modules` at start-up
    (its ServedAdapters: the engine checks each, ids 1, 2, ... in order), and what the
    report records of each; the first one refused fails the check, named."""
    from ..server.errors import OpenAIError  # the server stack loads only for LoRA deploys
    from ..server.lora_adapters import ServedAdapters

    served = ServedAdapters(engine, ())
    for module in modules:
        try:
            served.add(module)
        except OpenAIError as error:
            raise ValueError(f"adapter '{module.name}' ({module.path}): {error.message}") from None
    return tuple(served), tuple(served_adapter(request) for request in served)


def _prompts(llm: LLM, config: DeployConfig, adapters: Sequence[LoRARequest]) -> list[Prompt]:
    """The prompt set under the base model, then again under each adapter (one batch,
    so a step mixes adapters as a serving step does)."""
    engine = llm.llm_engine
    passage = engine.tokenizer.encode(PASSAGE, add_special_tokens=False)
    room = engine.max_model_len - config.gate.max_tokens
    # The budget in force: the configured one, or the one measured at start-up.
    base = prompt_set(passage, engine.config.max_num_batched_tokens, room)
    return [*base, *(dataclasses.replace(prompt, label=f"{prompt.label} [{adapter.lora_name}]", adapter=adapter)
                     for adapter in adapters for prompt in base)]


def _greedy(llm: LLM, prompts: Sequence[Prompt], max_tokens: int) -> list[CompletionOutput]:
    """Greedy streams of fixed length (EOS ignored, so both backends produce as many
    tokens) with the chosen token's logprob."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": list(p.token_ids)} for p in prompts], params, use_tqdm=False,
                           lora_request=[p.adapter for p in prompts])
    return [output.outputs[0] for output in outputs]


def _greedy_once(settings: Mapping[str, object], prompts: Sequence[Prompt], max_tokens: int) -> list[CompletionOutput]:
    """`_greedy` on an engine built for it and stopped after (its ranks freed at once)."""
    llm = LLM(**settings)
    try:
        return _greedy(llm, prompts, max_tokens)
    finally:
        llm.llm_engine.shutdown()


def _comparison_checks(
    gate: GateSettings, prompts: Sequence[Prompt], got: Sequence[CompletionOutput], want: Sequence[CompletionOutput],
    adapters: Sequence[LoRARequest],
) -> list[Check]:
    """One comparison for the base model's prompts and one per adapter's, so the
    report says which adapter diverges."""
    checks = []
    for adapter in (None, *adapters):
        chosen = [index for index, prompt in enumerate(prompts) if prompt.adapter == adapter]
        suffix = "" if adapter is None else f" under adapter '{adapter.lora_name}'"
        checks.append(_comparison_check(gate, [prompts[i] for i in chosen], [got[i] for i in chosen],
                                        [want[i] for i in chosen], suffix))
    return checks


def _comparison_check(
    gate: GateSettings, prompts: Sequence[Prompt], got: Sequence[CompletionOutput], want: Sequence[CompletionOutput],
    suffix: str = "",
) -> Check:
    comparison = compare_streams(prompts, got, want)
    figures = {
        "token_agreement": comparison.agreement,
        "max_logprob_diff": comparison.max_logprob_diff,
        "tokens_compared": comparison.tokens_compared,
        "first_divergence_position": comparison.first_divergence[1] if comparison.first_divergence else None,
    }
    problems = []
    if comparison.agreement < gate.min_token_agreement:
        problems.append(
            f"token agreement {comparison.agreement:.3f} < gate.min_token_agreement {gate.min_token_agreement}"
        )
    if comparison.max_logprob_diff > gate.max_logprob_diff:
        problems.append(
            f"max |logprob diff| {comparison.max_logprob_diff:.3g} > gate.max_logprob_diff {gate.max_logprob_diff}"
        )
    where = comparison.first_divergence
    message = "; ".join(problems) or "token streams agree"
    if where is not None:
        message += f" (first divergence: prompt '{where[0]}' at token {where[1]})"
    return Check(f"greedy comparison with the reference{suffix}", "deploy",
                 CheckStatus.FAIL if problems else CheckStatus.PASS, message, figures)


def _op_conformance(
    backend: Backend,
    reference: Backend,
    gate: GateSettings,
    ops: Sequence[str],
    recorded: Mapping[str, list[Case]],
    progress: OpProgress | None,
    batch_invariant: bool = False,
) -> tuple[ConformanceReport, list[Case]]:
    """Each op's recorded calls, then (unless turned off) its standard cases, on the
    kernels the engine runs (the batch-invariant ones in that mode)."""
    runner = ConformanceRunner(backend, reference, gate.seed, batch_invariant=batch_invariant)
    started = time.perf_counter()
    results: list[CaseResult] = []
    cases: list[Case] = []
    for op in ops:
        op_started = time.perf_counter()
        op_cases = [*recorded.get(op, []), *(cases_for(op, gate.seed) if gate.standard_cases else [])]
        op_results = [runner.run_case(case) for case in op_cases]
        cases += op_cases
        results += op_results
        if progress is not None:
            progress(op, op_results, time.perf_counter() - op_started)
    report = ConformanceReport(backend.name, reference.name, gate.seed, tuple(results), time.perf_counter() - started)
    return report, cases


def requirement_checks(gate: GateSettings, results: Sequence[CaseResult]) -> list[Check]:
    """Determinism, batch invariance and support over the op results: always reported
    (`warn` naming the ops that break them, which the backend declared: undeclared ones
    already failed their cases), failing the gate only where the config requires."""
    return [
        _property_check("all ops supported", "every case of the ops this deploy calls runs",
                        {r.op for r in results if r.status is Status.UNSUPPORTED}, gate.require_all_ops,
                        switch="gate.require_all_ops"),
        _property_check("determinism", "two identical calls give identical bits",
                        {r.op for r in results if r.deterministic is False}, gate.require_determinism),
        _property_check("batch invariance", "a row's output does not depend on its batch mates",
                        {r.op for r in results if r.batch_invariant is False}, gate.require_batch_invariance),
    ]


def batch_invariant_mode_check(on: bool) -> Check:
    """The report's line for `engine.batch_invariant` (`--batch-invariant`): on or off,
    and what that means for temperature-0 output."""
    if on:
        message = ("on: every op ran its batch-invariant kernel, each row case checked bit for bit at several row "
                   "counts; temperature-0 output does not depend on the batch")
    else:
        message = "off: temperature-0 output may depend on batch composition (set engine.batch_invariant to turn it on)"
    return Check("batch-invariant mode", "requirements", CheckStatus.PASS, message, {"on": int(on)})


def _property_check(name: str, meaning: str, violating: set[str], required: bool, switch: str = "") -> Check:
    figures = {"ops_violating": len(violating)}
    if not violating:
        return Check(name, "requirements", CheckStatus.PASS, f"every checked op: {meaning}", figures)
    listed = ", ".join(sorted(violating))
    if required:
        return Check(name, "requirements", CheckStatus.FAIL, f"required, but not true of: {listed}", figures)
    switch = switch or f"gate.require_{name.replace(' ', '_')}"
    return Check(name, "requirements", CheckStatus.WARN,
                 f"not true of: {listed} (reported only; set {switch} to fail on it)", figures)
