"""The router's /metrics: each instance's health, load and traffic, labelled by its
URL and role, read from the pools when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .instances import Instance, InstancePool

LABELS = ("instance", "role")
#: (name, help, family, value of an instance).
INSTANCE_METRICS = (
    ("accord_router_instance_healthy", "1 while the instance is in rotation.", GaugeMetricFamily,
     lambda i: float(i.healthy)),
    ("accord_router_instance_outstanding_requests", "Requests sent and not finished.", GaugeMetricFamily,
     lambda i: i.outstanding_requests),
    ("accord_router_instance_outstanding_tokens", "Estimated tokens of the outstanding requests.", GaugeMetricFamily,
     lambda i: i.outstanding_tokens),
    ("accord_router_instance_requests", "Requests sent to the instance.", CounterMetricFamily,
     lambda i: i.requests_total),
    ("accord_router_instance_failures", "Times the instance could not be reached.", CounterMetricFamily,
     lambda i: i.failures_total),
)


class PoolCollector:
    """A prometheus collector over the router's pools."""

    def __init__(self, pools: list[InstancePool]) -> None:
        self.pools = pools

    def collect(self) -> Iterator[Metric]:
        """One family per metric, one sample per instance."""
        instances: list[Instance] = [instance for pool in self.pools for instance in pool.instances]
        for name, documentation, family_type, value in INSTANCE_METRICS:
            family = family_type(name, documentation, labels=LABELS)
            for instance in instances:
                family.add_metric([instance.url, instance.role], value(instance))
            yield family


def render(pools: list[InstancePool]) -> bytes:
    """The Prometheus text of the pools' metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(pools))  # type: ignore[arg-type]
    return generate_latest(registry)
