"""`encdec serve --ray`: the server's FastAPI app (`build_app`) as a Ray Serve deployment.

Each replica loads the models of `encdec serve` (one engine per model per replica) and serves
the same app, streaming included; Serve's proxy listens on --host/--port and routes each request
to a replica; `/metrics` shows every replica's series, and SIGTERM drains every replica as
`encdec serve` drains itself (`replica_board`). A replica that dies is replaced by Serve, and
requests go to the others meanwhile. Each replica takes the requests its engines run and queue
(`max_ongoing_requests`), so that past `--max-waiting-requests` it refuses them (429) as
`encdec serve` does, rather than Serve holding them back, and probes and scrapes besides, which
would otherwise wait behind busy requests. With `--autoscale MIN,MAX` Serve adds and removes
replicas so that each has about TARGET_ONGOING_REQUESTS requests in flight.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import threading
from typing import TYPE_CHECKING, Any, Sequence

import torch

if TYPE_CHECKING:
    from encdec.entrypoints.openai.serving_models import ServedNames

APP_NAME = "encdec"
REPLICAS, CPUS_PER_REPLICA = 1, 1.0  # the defaults of --replicas and --cpus-per-replica
PROXY_CHECK_SECONDS = 30  # Serve's proxy readiness and health checks (Ray's defaults: 5 s and 10 s)
TARGET_ONGOING_REQUESTS = 16  # per replica under --autoscale: where a CPU engine's throughput levels off
PROBE_ROOM = 8  # requests a replica takes past its engines' queues: probes, scrapes, refusals
UNBOUNDED_QUEUE = 10_000  # an engine's queue without --max-waiting-requests, as Serve counts it


class EncdecReplica:
    """One replica: the served models and the app over them (bound at replica start)."""

    def __init__(self, models: Sequence[str], names: ServedNames, max_waiting_requests: Any,
                 engine_options: dict[str, Any], app_options: dict[str, Any], threads: int, log_level: str):
        from ray import serve

        from encdec.entrypoints.openai.api_server import build_app, configure_logging
        from encdec.entrypoints.openai.middleware import ServerState
        from encdec.entrypoints.openai.serving_models import ServedModels, load_models
        from encdec.entrypoints.ray.replica_board import ReplicaMetrics
        from encdec.worker.cpu_memory import use_one_arena

        configure_logging(log_level)  # where the requests' and the engines' log lines are written
        torch.set_num_threads(threads)
        use_one_arena()  # as `encdec serve` does
        served = ServedModels(load_models(models, names, max_waiting_requests, engine_options))
        state = ServerState()
        metrics = ReplicaMetrics(served, serve.get_replica_context().replica_id.unique_id, state)
        # Serve's proxy sends the request id back (the client's, else its own): not a second header
        self.encdec_app = build_app(served, state, **app_options, metrics=metrics, echo_request_id=False)

    def __serve_build_asgi_app__(self):
        return self.encdec_app


def add_ray_options(p: argparse.ArgumentParser) -> None:
    """`encdec serve`'s options for Ray Serve."""
    from encdec.entrypoints.transcribe_args import non_negative_float, positive_int

    g = p.add_argument_group("Ray Serve (the ray extra)")
    g.add_argument("--ray", action="store_true", help="serve through Ray Serve, one engine per replica")
    scale = g.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=positive_int, default=REPLICAS,
                       help=f"with --ray: replicas (default: {REPLICAS})")
    scale.add_argument("--autoscale", type=replica_range, default=None, metavar="MIN,MAX",
                       help=f"with --ray: let Serve scale between MIN and MAX replicas, aiming at "
                            f"{TARGET_ONGOING_REQUESTS} requests in flight per replica")
    g.add_argument("--cpus-per-replica", type=non_negative_float, default=CPUS_PER_REPLICA,
                   help=f"with --ray: CPUs Ray reserves per replica; torch threads: the whole CPUs "
                        f"(default: {CPUS_PER_REPLICA:g})")
    g.add_argument("--ray-address", default=None,
                   help="with --ray: Ray cluster to join (auto: the one `ray start` began; "
                        "default: a local instance)")


def ray_options_without_ray(args: argparse.Namespace) -> list[str]:
    """The Ray Serve options given to a server that runs without --ray (they would do nothing)."""
    if args.ray:
        return []
    given = {"--replicas": args.replicas != REPLICAS, "--autoscale": args.autoscale is not None,
             "--cpus-per-replica": args.cpus_per_replica != CPUS_PER_REPLICA,
             "--ray-address": args.ray_address is not None}
    return [flag for flag, set_ in given.items() if set_]


def replica_range(value: str) -> tuple[int, int]:
    """`MIN,MAX` replicas, 0 <= MIN <= MAX, 1 <= MAX."""
    low, _, high = value.partition(",")
    if not (low.isdigit() and high.isdigit() and int(low) <= int(high) and int(high) >= 1):
        raise argparse.ArgumentTypeError(f"expected MIN,MAX replicas with 0 <= MIN <= MAX and "
                                         f"MAX >= 1, got {value!r}")
    return int(low), int(high)


def initial_replicas(args: argparse.Namespace) -> tuple[int, str]:
    """How many replicas the deployment starts with, and the flags that ask for them."""
    if args.autoscale is None:
        return args.replicas, f"--replicas {args.replicas}"
    low, high = args.autoscale
    return max(low, 1), f"--autoscale {low},{high} (starting {max(low, 1)})"


def replica_options(args: argparse.Namespace) -> dict[str, Any]:
    """How many replicas Serve runs: --replicas, or an autoscaling range with --autoscale."""
    if args.autoscale is None:
        return {"num_replicas": args.replicas}
    low, high = args.autoscale
    return {"num_replicas": "auto", "autoscaling_config": {
        "min_replicas": low, "initial_replicas": initial_replicas(args)[0], "max_replicas": high,
        "target_ongoing_requests": min(TARGET_ONGOING_REQUESTS, args.max_num_seqs)}}


def max_ongoing_requests(args: argparse.Namespace) -> int:
    """Requests a replica takes at once: what its engines run and queue, and PROBE_ROOM."""
    return len(args.models) * (args.max_num_seqs + (args.max_waiting_requests or UNBOUNDED_QUEUE)) + PROBE_ROOM


def application(args: argparse.Namespace):
    """The Serve application `encdec serve --ray` runs, from its parsed arguments."""
    from ray import serve

    from encdec.entrypoints.openai.metrics import log_stats_interval
    from encdec.entrypoints.openai.serving_models import engine_options

    deployment = serve.deployment(
        serve.ingress()(EncdecReplica), name="EncdecReplica", **replica_options(args),
        max_ongoing_requests=max_ongoing_requests(args), graceful_shutdown_timeout_s=args.shutdown_timeout,
        ray_actor_options={"num_cpus": args.cpus_per_replica})
    app_options = dict(api_key=args.api_key, max_upload_mb=args.max_upload_mb,
                       max_audio_seconds=args.max_audio_seconds,
                       max_audio_seconds_in_flight=args.max_audio_seconds_in_flight,
                       allowed_origins=args.allowed_origins, request_body_timeout=args.request_body_timeout,
                       stats_interval=log_stats_interval(args.disable_log_stats),
                       log_requests=not args.disable_log_requests)
    return deployment.bind(args.models, args.served_model_names, args.max_waiting_requests,
                           engine_options(args), app_options,
                           max(1, math.floor(args.cpus_per_replica)), args.log_level)


def deploy(args: argparse.Namespace):
    """Start Serve's proxy on --host/--port in the current Ray session and run the app on it;
    returns once every replica is up, with the metrics board, which lives while its caller
    holds it."""
    from ray import serve

    from encdec.entrypoints.ray.replica_board import start_board

    board = start_board()
    tls = {name: os.path.abspath(path) for name in ("ssl_keyfile", "ssl_certfile")
           if (path := getattr(args, name)) is not None}  # read by the proxy, from its own directory
    serve.start(http_options={"host": args.host, "port": args.port, **tls})
    serve.run(application(args), name=APP_NAME, route_prefix="/")
    return board


def deploy_failure(err: Exception) -> str:
    """Why `deploy` failed with `err`, on one line: the replicas' error in Serve's status of the
    app (`root_cause`), else `err`'s."""
    from ray import serve

    from encdec.entrypoints.ray.cluster import root_cause

    status = serve.status().applications.get(APP_NAME)
    reports = [deployment.message for deployment in status.deployments.values()] if status else []
    return root_cause("\n".join([str(err), *reports]))


def run_ray_server(args: argparse.Namespace) -> int:
    """`encdec serve --ray`: deploy, then serve until SIGINT or SIGTERM, then drain. Replicas
    that need more CPUs than a local instance has are refused (on a cluster, warned about: it
    may grow); replicas that fail to start, or a signal while they start, stop the server
    before it serves."""
    import ray
    from ray import serve

    from encdec.entrypoints.cli_messages import error, warn
    from encdec.entrypoints.openai.api_server import (announce, configure_logging, listening_socket,
                                                     server_url)
    from encdec.entrypoints.ray.cluster import RayNotStarted, start_ray, unschedulable
    from encdec.entrypoints.ray.replica_board import drain

    configure_logging(args.log_level)
    with listening_socket(args.host, args.port) as sock:  # a port in use fails now; 0 picks one
        args.port = sock.getsockname()[1]
    # Serve kills a proxy that misses its 5 s readiness check three times running, which a loaded
    # two-core machine loading the models can make it do (seen in CI); a local instance's
    # processes inherit these
    for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        os.environ.setdefault(name, str(PROXY_CHECK_SECONDS))
    try:
        start_ray(args.ray_address)
    except RayNotStarted as err:
        error(str(err))
        return 1
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(sig: int, _) -> None:
        signals.append(sig)
        starting = board is None and not stop.is_set()
        stop.set()
        if starting or len(signals) > 1:
            raise KeyboardInterrupt  # out of the wait for the replicas, or (a second signal) the drain

    board = None
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which sets its own
        signal.signal(sig, on_signal)
    logger = logging.getLogger("encdec.server")
    try:
        count, asked = initial_replicas(args)
        problem = unschedulable(count, args.cpus_per_replica, asked)
        if problem and args.ray_address is None:
            error(f"{problem} (the server could never start)")
            return 2
        if problem:
            warn(f"{problem}: the server starts once it has them")
        try:
            board = deploy(args)
        except KeyboardInterrupt:
            logger.info("stopped while the replicas were starting")
            serve.shutdown()
            return 1
        except (RuntimeError, ray.exceptions.RayError) as err:
            error(f"the replicas could not start: {deploy_failure(err)}")
            serve.shutdown()
            return 1
        replicas = args.replicas if args.autoscale is None else "%d-%d" % args.autoscale
        announce(f"serving on {server_url(args.host, args.port, args.ssl_certfile is not None)} with "
                 f"{replicas} replicas")
        stop.wait()
        logger.info("shutting down: refusing new requests; waiting up to %g s for those in flight",
                    args.shutdown_timeout)
        try:
            if not drain(board, args.shutdown_timeout):
                logger.warning("the Ray cluster does not answer; stopping without draining")
                return 1
            serve.delete(APP_NAME)  # what is still in flight gets Serve's graceful shutdown
            serve.shutdown()
        except KeyboardInterrupt:  # a local instance's replicas end with it, a cluster's app stays
            logger.warning("a second signal: stopping at once%s",
                           "" if args.ray_address is None else f" ('serve delete {APP_NAME}' removes the app)")
            return 128 + signals[-1]
    finally:
        ray.shutdown()
    return 0
