"""The counting Llama the speculative decoding tests run (target and draft), written by
transformers. A uniquely named module, so tests import it whatever else pytest collected."""

from __future__ import annotations

from pathlib import Path

import torch

from engine_models import MAX_POSITIONS, write_tokenizer

#: How much the layers add to the residual stream: small enough that the embedding
#: mostly decides the next token (count on), large enough that it sometimes does not.
LAYER_SCALE = 0.04


def write_counting_llama(directory: Path, num_layers: int, seed: int, extra_vocab: int = 0) -> Path:
    """A counting Llama of `num_layers` layers from random weights of `seed`, its
    vocabulary the demo tokenizer's plus `extra_vocab` unused ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir()
    vocab_size, bos_id, eos_id = write_tokenizer(directory)
    config = LlamaConfig(
        vocab_size=vocab_size + extra_vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS, bos_token_id=bos_id,
        eos_token_id=eos_id, initializer_range=0.2, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        # Row v of the head is token v-1's embedding: the head's best answer to token t is t + 1.
        model.lm_head.weight.copy_(torch.roll(embed, shifts=1, dims=0))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(LAYER_SCALE)
    model.save_pretrained(directory)
    return directory


def profile_worker(model_dir: Path, speculative: dict | None, max_num_seqs: int, token_budget: int):
    """A cpu-backend worker of `model_dir` (with `speculative`'s drafter) whose
    profile_run batch is `token_budget` tokens over `max_num_seqs` sequences."""
    from accord.backends import get_backend
    from accord.core.config import EngineConfig
    from accord.core.worker.worker import Worker

    config = EngineConfig(model=str(model_dir), max_model_len=64, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=token_budget, speculative_config=speculative)
    return Worker(config, lambda: get_backend("cpu"))


class Calls:
    """Records the positional arguments of every call of `owner.<method>` (patched on
    the instance, still calling the original)."""

    def __init__(self, owner: object, method: str = "forward") -> None:
        self.args: list[tuple] = []
        original = getattr(owner, method)

        def recording(*args, **kwargs):
            self.args.append(args)
            return original(*args, **kwargs)

        setattr(owner, method, recording)

    def shapes(self, index: int) -> list[tuple[int, ...]]:
        """The shape of argument `index` (a tensor) in each call."""
        return [tuple(args[index].shape) for args in self.args]


def drafts_never_pay(scheduler, monkeypatch) -> list[bool]:
    """Make adaptive speculation see each draft cost a plain step (never worth it),
    whatever the host's step times; returns the list each step's result appends to:
    whether it brought drafts."""
    observe = scheduler._adaptive.observe_step
    monkeypatch.setattr(scheduler._adaptive, "observe_step", lambda n, drafts, _: observe(n, drafts, 1.0 + drafts))
    drafted: list[bool] = []
    apply = scheduler.update_from_output

    def recording(step, result, seconds=None):
        drafted.append(bool(result.draft_token_ids))
        return apply(step, result, seconds)

    monkeypatch.setattr(scheduler, "update_from_output", recording)
    return drafted
