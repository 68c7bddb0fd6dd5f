"""The Ray cluster as `encdec batch` and `encdec serve --ray` see it: whether the replicas a job
or a deployment asks for can ever all start, and what a failure inside it comes down to."""
from __future__ import annotations

import re
from typing import Optional

# the last line of a Python traceback: "ValueError: ...", "ray.exceptions.RayTaskError: ..."
_EXCEPTION_LINE = re.compile(r"^((?:\w+\.)*)(\w*(?:Error|Exception)): (.+)$", re.MULTILINE)


class RayNotStarted(RuntimeError):
    """Ray could not be started or reached; the message says why, on one line."""


def start_ray(address: Optional[str], **options) -> None:
    """`ray.init` of the cluster at `address` (None: a new local instance, whatever cluster
    `ray start` left named in Ray's files or RAY_ADDRESS names: one that has died since would be
    waited for), without the dashboard; RayNotStarted if it fails (a raylet that misses Ray's
    start-up deadline on a loaded machine, an address where no cluster answers)."""
    import ray

    try:
        ray.init(address=address or "local", include_dashboard=False, **options)
    except Exception as err:  # Ray raises several kinds, none of them ours
        where = f"at --ray-address {address}" if address else "on this machine"
        reason = str(err).strip().split("\n", 1)[0]
        raise RayNotStarted(f"Ray did not start {where}: {type(err).__name__}: {reason}") from None


def unschedulable(replicas: int, cpus_per_replica: float, asked: str) -> Optional[str]:
    """Why `replicas` actors of `cpus_per_replica` CPUs each (`asked`: the flags that ask for
    them) can never all start on the connected Ray cluster: more CPUs than it has; else None."""
    import ray

    needed, total = replicas * cpus_per_replica, ray.cluster_resources().get("CPU", 0)
    if needed <= total:
        return None
    return (f"{asked} x --cpus-per-replica {cpus_per_replica:g} need {needed:g} CPUs; the Ray "
            f"cluster has {total:g}")


def root_cause(report: str) -> str:
    """What a Ray failure `report` (an error's text, with the tracebacks of the actors it
    carries) comes down to, on one line: the last exception that is not Ray's own, as
    "ValueError: ..."; else the report's first line."""
    causes = [f"{name}: {message}" for module, name, message in _EXCEPTION_LINE.findall(report)
              if not module.startswith("ray.")]
    return causes[-1] if causes else report.strip().split("\n", 1)[0]
