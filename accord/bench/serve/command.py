"""`accord bench serve`: load an OpenAI-compatible server with streamed requests and
report TTFT, TPOT, ITL and end-to-end latency, throughput and goodput under vLLM's `bench
serve` flag names and result-JSON keys, so existing scripts and dashboards read it.

`--request-rate 1,2,4,inf` (or `--sweep`) runs one rung per rate in turn, each on its
own seeded prompts, prints one table, and writes sweep.json, sweep.png and sweep.html to
--result-dir (the picture needs matplotlib: `pip install 'accord[bench]'`). Each rung
starts with `--num-warmups` requests of its own that no figure includes; the prefix
cache's state, the server's /version and /v1/models answers, the seeds and the flags are
recorded in every result. Token counts are the server's (`stream_options.include_usage`)
where it reports them, else the tokenizer's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ... import __version__
from .datasets import DATASET_NAMES, DatasetSpec, TextTokenizer, sample_requests
from .metrics import PERCENTILE_METRICS, compute_metrics, detailed_lists, parse_goodput, parse_list
from .request_types import BACKENDS, DEFAULT_ENDPOINTS, RequestSettings
from .sweep import DEFAULT_SWEEP, operating_point, parse_rates, rate_in_json, render_table

#: The per-request lists a result keeps only under --save-detailed (vLLM's rule).
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "generated_texts", "errors")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accord bench serve`'s flags: vLLM's names and defaults, unless noted."""
    target = parser.add_argument_group("server")
    target.add_argument("--backend", default="openai", choices=BACKENDS, help="request shape (default: openai)")
    target.add_argument("--base-url", help="server base URL (default: http://HOST:PORT)")
    target.add_argument("--host", default="127.0.0.1")
    target.add_argument("--port", type=int, default=8000)
    target.add_argument("--endpoint", help="API path (default: /v1/completions, or /v1/chat/completions for openai-chat)")
    target.add_argument("--model", help="model id in the requests (default: the first of the server's /v1/models)")
    target.add_argument("--served-model-name", help="name sent in the requests when it differs from --model")
    target.add_argument(
        "--tokenizer",
        help="tokenizer for the prompts and for counting tokens the server reports no usage for: a Hugging Face "
        "directory, a GGUF file, or accord-demo-random (default: --model, when that is a path)",
    )
    data = parser.add_argument_group("dataset")
    data.add_argument("--dataset-name", default="random", choices=DATASET_NAMES)
    data.add_argument("--dataset-path", help="the file of --dataset-name sharegpt or custom")
    data.add_argument("--num-prompts", type=int, default=1000, help="measured requests per rung (default: 1000)")
    data.add_argument("--random-input-len", type=int, default=1024)
    data.add_argument("--random-output-len", type=int, default=128)
    data.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform in len * (1 -/+ ratio)")
    data.add_argument("--random-prefix-len", type=int, default=0, help="random tokens shared by every prompt")
    data.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    data.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    data.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    data.add_argument("--prefix-repetition-output-len", type=int, default=128)
    data.add_argument("--sharegpt-output-len", type=int, help="output length (default: the conversation's answer)")
    data.add_argument("--custom-output-len", type=int, default=256)
    load = parser.add_argument_group("load")
    load.add_argument(
        "--request-rate",
        help="requests a second, Poisson (or gamma, --burstiness); inf sends all at once; a comma-separated list "
        "(1,2,4,inf) runs a sweep (default: inf)",
    )
    load.add_argument("--sweep", action="store_true", help=f"sweep the rates {','.join(f'{r:g}' for r in DEFAULT_SWEEP)}")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 Poisson, <1 burstier")
    load.add_argument("--max-concurrency", type=int, help="most requests in flight at once (default: no cap)")
    load.add_argument(
        "--num-warmups", type=int, default=1, help="warm-up requests per rung, excluded from the figures (default: 1)"
    )
    load.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the arrivals")
    load.add_argument(
        "--reset-prefix-cache",
        action="store_true",
        help="POST /reset_prefix_cache after each rung's warm-up (where the server offers it); the state is recorded",
    )
    load.add_argument("--disable-tqdm", action="store_true", help="no progress bars")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--ignore-eos", action="store_true", help="generate every requested token")
    sampling.add_argument("--temperature", type=float)
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--top-k", type=int)
    sampling.add_argument("--min-p", type=float)
    sampling.add_argument("--extra-body", type=json.loads, help="JSON object merged into every request body")
    report = parser.add_argument_group("report")
    report.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs, e.g. ttft:2000 tpot:100 e2el:20000")
    report.add_argument(
        "--percentile-metrics",
        default="ttft,tpot,itl,e2el",
        help=f"of {','.join(PERCENTILE_METRICS)} (default: all four; vLLM's leaves out e2el, which the operating "
        "point uses)",
    )
    report.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles (default: 99)")
    report.add_argument("--label", help="names the result (default: --backend)")
    report.add_argument("--metadata", nargs="*", metavar="KEY=VALUE", help="recorded in the result as given")
    report.add_argument("--save-result", action="store_true", help="write each rung's result JSON")
    report.add_argument("--save-detailed", action="store_true", help="keep the per-request lists in the result")
    report.add_argument("--result-dir", help="where results (and a sweep's files) go (default: the current folder)")
    report.add_argument("--result-filename", help="a single rung's result file name (default: vLLM's pattern)")


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, checked before the first request: where to send, the
    rates, the dataset and what to report (the model may still come from the server)."""

    base_url: str
    rates: list[float]
    dataset: DatasetSpec
    metrics: list[str]
    percentiles: list[float]
    slos_ms: dict[str, float]


def request_settings(args: argparse.Namespace, base_url: str, model: str) -> RequestSettings:
    """What every request sends to a server serving `model`: the endpoint, the name, and
    the sampling flags and --extra-body as body fields."""
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "min_p": args.min_p}
    return RequestSettings(
        backend=args.backend,
        api_url=base_url + (args.endpoint or DEFAULT_ENDPOINTS[args.backend]),
        model=args.served_model_name or model,
        ignore_eos=args.ignore_eos,
        extra_body={k: v for k, v in sampling.items() if v is not None} | (args.extra_body or {}),
    )


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The run `args` ask for; ValueError on bad flags."""
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    if args.request_rate is not None:
        rates = parse_rates(args.request_rate)
    else:
        rates = list(DEFAULT_SWEEP) if args.sweep else [math.inf]
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {args.num_prompts}")
    dataset = DatasetSpec(
        name=args.dataset_name,
        path=args.dataset_path,
        random_input_len=args.random_input_len,
        random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio,
        random_prefix_len=args.random_prefix_len,
        prefix_repetition_prefix_len=args.prefix_repetition_prefix_len,
        prefix_repetition_suffix_len=args.prefix_repetition_suffix_len,
        prefix_repetition_num_prefixes=args.prefix_repetition_num_prefixes,
        prefix_repetition_output_len=args.prefix_repetition_output_len,
        sharegpt_output_len=args.sharegpt_output_len,
        custom_output_len=args.custom_output_len,
    )
    metrics = parse_list(args.percentile_metrics, PERCENTILE_METRICS)
    try:
        percentiles = [float(p) for p in parse_list(args.metric_percentiles)]
    except ValueError:
        raise ValueError(f"--metric-percentiles takes numbers, comma-separated; got {args.metric_percentiles!r}") from None
    return Plan(base_url, rates, dataset, metrics, percentiles, parse_goodput(args.goodput))


def load_tokenizer_for(name: str | None, explicit: bool) -> TextTokenizer | None:
    """The tokenizer `name` names (a path, or the demo model's name), None when there is
    none to load; an `explicit` --tokenizer that names nothing is an error."""
    from ...core.model_loader.source import load_tokenizer
    from ...entrypoints.model_choice import choose_model

    if name is None:
        return None
    path = Path(choose_model(name).path)
    if not path.exists():
        if explicit:
            raise ValueError(f"--tokenizer {name}: no such directory or GGUF file")
        return None
    return load_tokenizer(path)


def result_filename(args: argparse.Namespace, model: str, rate: float, date: str, several: bool) -> Path:
    """Where a rung's result goes: --result-filename for a single rung, else vLLM's
    pattern `{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json`, in --result-dir."""
    concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
    name = f"{args.label or args.backend}-{rate}qps{concurrency}-{model.split('/')[-1]}-{date}.json"
    if args.result_filename and not several:
        name = args.result_filename
    return Path(args.result_dir or ".") / name


def rung_header(args: argparse.Namespace, model: str, rate: float, date: str) -> dict[str, Any]:
    """The keys vLLM writes before a result's figures, and accord's record of how the
    rung was run (seeds, warm-ups, the client)."""
    header: dict[str, Any] = {
        "date": date,
        "endpoint_type": args.backend,
        "backend": args.backend,
        "label": args.label,
        "model_id": model,
        "tokenizer_id": args.tokenizer or model,
        "num_prompts": args.num_prompts,
        "request_rate": rate_in_json(rate),
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
    }
    for item in args.metadata or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--metadata takes KEY=VALUE, got {item!r}")
        header[key.strip()] = value.strip()
    return header


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run every rung against the server; the sweep document (its `rungs` are the
    per-rung results)."""
    from .http_session import AiohttpSession  # the `bench` extra's HTTP client: imported only to measure
    from .runner import RungSpec, run_rung
    from .server_info import first_model, server_info

    headers = {"Authorization": f"Bearer {key}"} if (key := os.environ.get("OPENAI_API_KEY")) else {}
    plan = plan_from_args(args)
    base_url = plan.base_url
    async with AiohttpSession(args.max_concurrency, headers) as http:
        info = await server_info(http, base_url)
        model = args.model or first_model(info)
        if model is None:
            raise ValueError(f"{base_url}/v1/models lists no model ({info['models']}); give --model")
        settings = request_settings(args, base_url, model)
        tokenizer = load_tokenizer_for(args.tokenizer or args.model, explicit=args.tokenizer is not None)
        count_tokens = (lambda text: len(tokenizer.encode(text, add_special_tokens=False))) if tokenizer else None
        date = datetime.now().strftime("%Y%m%d-%H%M%S")
        rungs = []
        for index, rate in enumerate(plan.rates):
            # Each rung draws its own prompts (and warm-ups), so no rung finds another's
            # prefixes cached; the seeds are recorded.
            prompt_seed = args.seed + 1000 * index
            requests = sample_requests(plan.dataset, args.num_prompts, tokenizer, prompt_seed)
            warmups = sample_requests(plan.dataset, args.num_warmups, tokenizer, prompt_seed + 1) if args.num_warmups else []
            label = f"rung {index + 1}/{len(plan.rates)}: {rate:g} req/s"
            spec = RungSpec(rate, args.burstiness, args.max_concurrency, prompt_seed, args.reset_prefix_cache,
                            not args.disable_tqdm, label)  # fmt: skip
            run = await run_rung(http, settings, requests, warmups, spec, base_url)
            result = rung_header(args, model, rate, date)
            result |= compute_metrics(run.outcomes, run.duration_s, plan.metrics, plan.percentiles, plan.slos_ms, count_tokens)
            result |= {
                "seed": prompt_seed,
                "num_warmups": len(run.warmups),
                "warmups_failed": sum(not o.success for o in run.warmups),
                "prefix_cache": run.prefix_cache,
                "server": info,
                "client": f"accord {__version__} bench serve",
            }
            if args.save_detailed:
                result |= detailed_lists(run.outcomes, count_tokens)
            errors = [o.error for o in run.outcomes if not o.success]
            if errors:
                print(f"{label}: {len(errors)} failed; the first: {errors[0]}", file=sys.stderr)
            if args.save_result:
                path = result_filename(args, model, rate, date, several=len(plan.rates) > 1)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(result))
            rungs.append(result)
    return {
        "label": args.label or args.backend,
        "base_url": base_url,
        "model_id": model,
        "date": date,
        "goodput_slos_ms": plan.slos_ms,
        "server": info,
        "flags": {name: value for name, value in vars(args).items() if name != "func"},
        "rungs": rungs,
        "operating_point": operating_point(rungs),
    }


def run(args: argparse.Namespace) -> int:
    """`accord bench serve`: the rungs, the table, and a sweep's files."""
    try:
        sweep = asyncio.run(run_bench(args))
    except ModuleNotFoundError as error:
        if error.name != "aiohttp":
            raise
        print("accord bench serve needs aiohttp: pip install 'accord[bench]'", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"accord bench serve: {error}", file=sys.stderr)
        return 2
    print(render_table(sweep))
    if len(sweep["rungs"]) > 1:
        from ..plot import write_sweep_files

        for path in write_sweep_files(sweep, Path(args.result_dir or ".")):
            print(f"wrote {path}")
    return 0
