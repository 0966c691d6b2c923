"""vLLM's side of benchmarks/bench_client_overhead.py, run by the python of a vLLM
virtualenv: its openai completions request function (aiohttp) over the same requests,
at most CONCURRENCY in flight; prints wall and CPU seconds and the chunks as one JSON line.

    python vllm_client_overhead.py URL MODEL REQUESTS TOKENS CONCURRENCY
"""

import asyncio
import json
import sys
import time

import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions


async def main(url: str, model: str, requests: int, tokens: int, concurrency: int) -> dict:
    limit = asyncio.Semaphore(concurrency)
    request = RequestFuncInput(prompt=[1, 2, 3], api_url=f"{url}/v1/completions", prompt_len=3, output_len=tokens,
                               model=model, ignore_eos=True)  # fmt: skip
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def one():
            async with limit:
                return await async_request_openai_completions(request_func_input=request, session=session)

        cpu, wall = time.process_time(), time.perf_counter()
        outputs = await asyncio.gather(*(one() for _ in range(requests)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    chunks = sum(1 + len(o.itl) for o in outputs if o.success)
    return {"client": "vLLM bench serve (aiohttp)", "wall_s": wall, "cpu_s": cpu, "chunks": chunks,
            "failed": sum(not o.success for o in outputs)}  # fmt: skip


if __name__ == "__main__":
    url, model, requests, tokens, concurrency = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    print(json.dumps(asyncio.run(main(url, model, requests, tokens, concurrency))))
