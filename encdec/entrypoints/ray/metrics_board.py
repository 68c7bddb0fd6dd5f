"""`/metrics` of `encdec serve --ray`: the series of every replica, each labelled by its replica.

Serve's proxy sends a scrape to one replica, whose own registry knows only its own requests.
So each replica sends its metric families to one named actor, the MetricsBoard (started by the
driver), every PUBLISH_SECONDS, and answers a scrape with its own families, fresh, and the
latest of every other replica. A replica not heard from for STALE_SECONDS (stopped or dead)
drops out, as the series of a Prometheus target that went away do. Counters stay monotonic per
replica; `sum by (...)` in PromQL gives the server's totals.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator

import ray
from prometheus_client import generate_latest
from prometheus_client.core import Metric

from encdec.entrypoints.openai.metrics import ServerMetrics
from encdec.entrypoints.openai.serving_models import ServedModels

BOARD_NAME, BOARD_NAMESPACE = "encdec-metrics", "encdec"
PUBLISH_SECONDS, STALE_SECONDS = 2.0, 10.0


@ray.remote(num_cpus=0)
class MetricsBoard:
    """The latest metric families of each replica."""

    def __init__(self):
        self.latest: dict[str, tuple[float, list[Metric]]] = {}

    def put(self, replica: str, families: list[Metric]) -> None:
        self.latest[replica] = (time.monotonic(), families)

    def get(self) -> dict[str, list[Metric]]:
        now = time.monotonic()
        self.latest = {r: entry for r, entry in self.latest.items() if now - entry[0] < STALE_SECONDS}
        return {replica: families for replica, (_, families) in self.latest.items()}


def start_board():
    """The board, started on the driver (it lives as long as the driver does)."""
    return MetricsBoard.options(name=BOARD_NAME, namespace=BOARD_NAMESPACE, get_if_exists=True).remote()


class ReplicaMetrics(ServerMetrics):
    """A replica's metrics, rendered with every live replica's."""

    def __init__(self, models: ServedModels, replica: str):
        super().__init__(models)
        self.replica = replica
        self.board = ray.get_actor(BOARD_NAME, namespace=BOARD_NAMESPACE)
        threading.Thread(target=self._publish, name="encdec-metrics", daemon=True).start()

    def families(self) -> list[Metric]:
        return list(self.registry.collect())

    def _publish(self) -> None:
        while True:
            self.board.put.remote(self.replica, self.families())
            time.sleep(PUBLISH_SECONDS)

    def render(self) -> bytes:
        replicas = ray.get(self.board.get.remote(), timeout=10)
        replicas[self.replica] = self.families()
        return generate_latest(ByReplica(replicas))


class ByReplica:
    """A collector of each family's samples from all replicas, with a `replica` label."""

    def __init__(self, replicas: dict[str, list[Metric]]):
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for replica, families in sorted(self.replicas.items()):
            for family in families:
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
                into.samples += [s._replace(labels={**s.labels, "replica": replica}) for s in family.samples]
        yield from merged.values()
