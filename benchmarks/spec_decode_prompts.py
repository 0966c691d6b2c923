"""A small seeded prompt set where the answer repeats text of the prompt, for the
speculative decoding benchmark: editing a given code block, summarising with
quotations, and a multi-turn chat that quotes its earlier turns. The same seed gives
the same conversations (names, numbers and sentences are drawn from fixed lists)."""

from __future__ import annotations

import random

_NAMES = ["total", "count", "items", "result", "values", "buffer", "offset", "limit", "scale", "index"]
_FUNCS = ["parse_rows", "merge_totals", "load_config", "clean_text", "sum_prices", "rank_users"]
_SENTENCES = [
    "The committee approved the new budget after a long debate about maintenance costs.",
    "Rail traffic on the northern line will be reduced for six weeks while the bridge is repaired.",
    "Local schools reported that attendance rose by four percent compared with last year.",
    "The museum will open a new wing dedicated to early photography in the spring.",
    "Farmers in the valley expect a smaller harvest because of the dry summer.",
    "The city council voted to extend the opening hours of public libraries on weekends.",
    "A new cycling path will connect the university campus with the central station.",
    "Energy prices fell slightly in the last quarter, easing pressure on households.",
]


def _code_block(rng: random.Random) -> tuple[str, str, str]:
    name, other = rng.sample(_NAMES, 2)
    func = rng.choice(_FUNCS)
    lines = [f"def {func}(rows, {name}=0):", f"    \"\"\"Return the {name} of the rows.\"\"\""]
    for step in range(rng.randint(5, 8)):
        lines.append(f"    for row in rows[{step}::{rng.randint(2, 5)}]:")
        lines.append(f"        {name} = {name} + row * {rng.randint(2, 9)}")
    lines.append(f"    return {name}")
    return "\n".join(lines), name, other


def code_editing(rng: random.Random) -> list[dict[str, str]]:
    code, name, other = _code_block(rng)
    return [{"role": "user", "content": f"Here is a Python function:\n\n```python\n{code}\n```\n\n"
             f"Rewrite the whole function with the variable `{name}` renamed to `{other}`. "
             "Reply with the complete code only."}]


def quoting_summary(rng: random.Random) -> list[dict[str, str]]:
    text = " ".join(rng.sample(_SENTENCES, 5))
    return [{"role": "user", "content": f"Article:\n{text}\n\nSummarise the article in three bullet points, "
             "quoting the most important sentences word for word."}]


def multi_turn_quoting(rng: random.Random) -> list[dict[str, str]]:
    first, second = rng.sample(_SENTENCES, 2)
    return [
        {"role": "user", "content": f"Remember this sentence: {first}"},
        {"role": "assistant", "content": f"I will remember it: {first}"},
        {"role": "user", "content": f"And this one: {second}"},
        {"role": "assistant", "content": f"Noted: {second}"},
        {"role": "user", "content": "Repeat both sentences exactly, the first one first, then explain each."},
    ]


KINDS = {"code editing": code_editing, "quoting summary": quoting_summary, "multi-turn quoting": multi_turn_quoting}


def prompt_set(seed: int = 0, per_kind: int = 2) -> list[tuple[str, list[dict[str, str]]]]:
    """(kind, conversation) pairs: `per_kind` of each kind, drawn from `seed`."""
    rng = random.Random(seed)
    return [(kind, make(rng)) for _ in range(per_kind) for kind, make in KINDS.items()]
