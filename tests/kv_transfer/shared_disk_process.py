"""An engine with a disk KV tier on a shared `disk_path`, run in a process of its own
for the shared disk tier's tests, answering its parent over a pipe."""

from __future__ import annotations

from multiprocessing.connection import Connection

import torch

from accord import LLM
from accord.core.sampling_params import SamplingParams
from pipe_process import PipeProcess  # (this directory is on sys.path)


def _counters(llm: LLM) -> dict:
    engine = llm.llm_engine
    tier, manager = engine.scheduler.kv_connector, engine.scheduler.block_manager
    return {"computed_prompt_tokens": engine.stats.computed_prompt_tokens, "blocks_adopted": tier.blocks_adopted,
            "blocks_loaded_from_disk": tier.blocks_loaded_from_disk, "blocks_demoted": tier.blocks_demoted,
            "free_blocks": manager.num_free_blocks, "num_blocks": manager.num_blocks}


def serve_tier(model_dir: str, engine_args: dict, kv_transfer_config: dict, conn: Connection) -> None:
    """Answer ("generate", prompt, max_tokens) with the prompt's greedy token ids,
    ("counters",) with the engine's counters, ("stop",) by returning; sends its disk
    directory's name once ready."""
    torch.set_num_threads(1)  # as the tests' own engines (tiny models, a shared host)
    llm = LLM(model_dir, kv_transfer_config=kv_transfer_config, **engine_args)
    conn.send(llm.llm_engine.scheduler.kv_connector.instance_dir)
    while True:
        command, *args = conn.recv()
        if command == "stop":
            return
        if command == "counters":
            conn.send(_counters(llm))
        elif command == "generate":
            prompt, max_tokens = args
            greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            conn.send(llm.generate([prompt], greedy)[0].outputs[0].token_ids)


class TierProcess(PipeProcess):
    """`serve_tier` in a spawned process; `instance_dir` is its disk directory."""

    def __init__(self, model_dir: str, engine_args: dict, kv_transfer_config: dict) -> None:
        super().__init__(serve_tier, model_dir, engine_args, kv_transfer_config)
        self.instance_dir: str = self.ready
