"""What crosses between the parts of `accord bench serve`: the settings every request of
a run shares, and what the client saw of one request. Plain data, no HTTP client, so the
command line and the metrics load without aiohttp."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .datasets import SampleRequest

#: The request shapes `--backend` takes (vLLM's names for them).
BACKENDS = ("openai", "openai-chat")
#: Each backend's default `--endpoint`.
DEFAULT_ENDPOINTS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class RequestSettings:
    """What every request of a run shares: the backend's shape, the URL, the model name,
    and the body fields beyond the prompt and its length."""

    backend: str
    api_url: str
    model: str
    ignore_eos: bool = False
    #: Extra body fields (temperature and the like, then --extra-body), sent as given.
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown --backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")

    def body(self, request: SampleRequest) -> dict[str, Any]:
        """The JSON body for `request`, streaming, with the usage chunk asked for."""
        if self.backend == "openai":
            body: dict[str, Any] = {"prompt": request.prompt, "max_tokens": request.expected_output_len}
        else:
            body = {
                "messages": [{"role": "user", "content": request.prompt}],
                "max_completion_tokens": request.expected_output_len,
            }
        body |= {"model": self.model, "stream": True, "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body | self.extra_body


@dataclass
class RequestOutcome:
    """What the client saw of one request: times in seconds from `start_time` (the
    clock's reading when the request was sent), the text, and the token counts the
    server's usage chunk gave (None when it gave none)."""

    prompt_len: int
    start_time: float = 0.0
    success: bool = False
    ttft: float = 0.0
    #: Gaps between successive chunks that carried text, after the first.
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    generated_text: str = ""
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    error: str = ""
