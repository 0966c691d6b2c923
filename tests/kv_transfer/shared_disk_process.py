"""An engine with a disk KV tier on a shared `disk_path`, run in a process of its own
for the shared disk tier's tests, answering its parent over a pipe."""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection

import torch

from accord import LLM
from accord.core.sampling_params import SamplingParams


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


class TierProcess:
    """`serve_tier` in a spawned process, driven over a pipe."""

    def __init__(self, model_dir: str, engine_args: dict, kv_transfer_config: dict) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve_tier, args=(model_dir, engine_args, kv_transfer_config, child))
        self.process.start()
        if not self.conn.poll(120):
            self.kill()
            raise RuntimeError("the tier process did not start")
        self.instance_dir: str = self.conn.recv()

    def call(self, *command: object) -> object:
        """Send `command`, return the process's answer."""
        self.conn.send(command)
        return self.conn.recv()

    def kill(self) -> None:
        """SIGKILL the process (a crash: nothing of its own runs on the way out)."""
        self.process.kill()
        self.process.join()

    def stop(self) -> None:
        """Let the process return, killing it if it does not within 30 s."""
        if self.process.is_alive():
            self.conn.send(("stop",))
            self.process.join(30)
        if self.process.is_alive():
            self.kill()
