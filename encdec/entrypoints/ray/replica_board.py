"""What the replicas of `encdec serve --ray` share: `/metrics` with every replica's series, and
the graceful shutdown.

Serve's proxy sends a scrape to one replica, whose own registry knows only its own requests.
So each replica sends its metric families and its count of requests in flight to one named
actor, the ReplicaBoard (started by the driver), every PUBLISH_SECONDS, gets back every other
replica's latest, and answers a scrape with its own families, fresh, and those (a scrape never
waits on the board); a board that does not answer is asked again at the next publish. A
replica not heard from for STALE_SECONDS (stopped or dead) drops out, as the series of a
Prometheus target that went away do. Counters stay monotonic per replica; `sum by (...)` in PromQL gives the server's totals.

On SIGTERM the driver marks the board draining; each replica learns it from its next publish
and answers new requests with 503 (as `encdec serve` without Ray does), and the driver waits
until every replica reports nothing in flight (`ReplicaBoard.drained`) before Serve deletes the
app, whose proxy would answer 404 from then on.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Iterator, NamedTuple

import ray
from prometheus_client import generate_latest
from prometheus_client.core import Metric

from encdec.entrypoints.openai.metrics import ServerMetrics
from encdec.entrypoints.openai.middleware import ServerState
from encdec.entrypoints.openai.serving_models import ServedModels

BOARD_NAME, BOARD_NAMESPACE = "encdec-replicas", "encdec"
PUBLISH_SECONDS, STALE_SECONDS = 2.0, 10.0
DRAINING_PUBLISH_SECONDS = 0.2  # while draining, so that the driver sees the last request end soon
BOARD_TIMEOUT_SECONDS = 5.0  # the driver's and the replicas' wait for an answer from the board
logger = logging.getLogger("encdec.server")


class Report(NamedTuple):
    """A replica's latest publish."""
    at: float  # the board's time.monotonic()
    families: list[Metric]
    inflight: int
    draining: bool


@ray.remote(num_cpus=0)
class ReplicaBoard:
    """The latest report of each live replica, and whether the server is shutting down."""

    def __init__(self):
        self.latest: dict[str, Report] = {}
        self.draining = False

    def put(self, replica: str, families: list[Metric], inflight: int,
            draining: bool) -> tuple[bool, dict[str, list[Metric]]]:
        """Record a replica's report; returns whether the server is draining, and the metric
        families of every live replica."""
        self.latest[replica] = Report(time.monotonic(), families, inflight, draining)
        return self.draining, {r: report.families for r, report in self.live().items()}

    def live(self) -> dict[str, Report]:
        now = time.monotonic()
        self.latest = {r: report for r, report in self.latest.items() if now - report.at < STALE_SECONDS}
        return self.latest

    def drain(self) -> None:
        self.draining = True

    def drained(self) -> bool:
        """Every live replica refuses new requests and has none in flight."""
        return all(report.draining and report.inflight == 0 for report in self.live().values())


def start_board():
    """The board, started on the driver (it lives as long as the driver does)."""
    return ReplicaBoard.options(name=BOARD_NAME, namespace=BOARD_NAMESPACE, get_if_exists=True).remote()


def drain(board, timeout: float) -> bool:
    """Have every replica refuse new requests, then wait up to `timeout` s for those in flight;
    False if the board does not answer within BOARD_TIMEOUT_SECONDS (the Ray cluster is gone:
    a signal to the whole process group stopped the local instance's processes too)."""
    deadline = time.monotonic() + timeout
    try:
        ray.get(board.drain.remote(), timeout=BOARD_TIMEOUT_SECONDS)
        while time.monotonic() < deadline and not ray.get(board.drained.remote(), timeout=BOARD_TIMEOUT_SECONDS):
            time.sleep(DRAINING_PUBLISH_SECONDS)
    except ray.exceptions.RayError:  # GetTimeoutError included
        return False
    return True


class ReplicaMetrics(ServerMetrics):
    """A replica's metrics, rendered with every live replica's; its publisher also carries the
    board's drain to the replica's `state`."""

    def __init__(self, models: ServedModels, replica: str, state: ServerState):
        super().__init__(models, state)
        self.replica, self.state = replica, state
        self.board = ray.get_actor(BOARD_NAME, namespace=BOARD_NAMESPACE)
        self.replicas: dict[str, list[Metric]] = {}  # every live replica's families, as of the last publish
        threading.Thread(target=self._publish, name="encdec-replica-board", daemon=True).start()

    def families(self) -> list[Metric]:
        return list(self.registry.collect())

    def _publish(self) -> None:
        while True:
            report = self.board.put.remote(self.replica, self.families(), self.state.inflight, self.state.draining)
            try:
                draining, self.replicas = ray.get(report, timeout=BOARD_TIMEOUT_SECONDS)
            except ray.exceptions.RayError as err:  # GetTimeoutError included: asked again next time
                logger.warning("replica %s: the replica board did not answer: %s", self.replica, err)
            else:
                self.state.draining = self.state.draining or draining
            time.sleep(DRAINING_PUBLISH_SECONDS if self.state.draining else PUBLISH_SECONDS)

    def render(self) -> bytes:
        return generate_latest(ByReplica({**self.replicas, self.replica: self.families()}))


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
