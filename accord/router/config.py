"""What `accord router` is started with: its instances by role, the policy, and the
health and affinity settings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RouterConfig:
    """The router's instances and settings; either `backends` (every instance serves
    whole requests) or `prefill` and `decode` (PD mode), checked here."""

    backends: list[str] = field(default_factory=list)
    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)
    policy: str = "round_robin"
    #: Affinity: tokens an instance may hold beyond the least loaded before its keys go elsewhere.
    load_cap: int = 4096
    #: Affinity without a session id hashes this many characters of the prompt's start.
    prefix_chars: int = 256
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    #: Seconds an upstream may take to answer (None: no limit; generation can be long).
    request_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if bool(self.prefill) != bool(self.decode):
            raise ValueError("PD mode needs both --prefill and --decode instances")
        if not self.backends and not self.prefill:
            raise ValueError("give --backend URL (one or more), or --prefill URL and --decode URL")
        if self.backends and self.prefill:
            raise ValueError("give either --backend or --prefill/--decode, not both")
        if self.health_interval_s <= 0 or self.load_cap < 0 or self.prefix_chars < 1:
            raise ValueError("health interval must be positive, load cap non-negative and prefix chars at least 1")

    @property
    def pd_mode(self) -> bool:
        """Whether requests are prefilled on one pool and decoded on another."""
        return bool(self.prefill)
