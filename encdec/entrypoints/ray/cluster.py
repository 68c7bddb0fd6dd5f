"""Whether the replicas a job or a deployment asks for can ever all start on the Ray cluster."""
from __future__ import annotations

from typing import Optional


def unschedulable(replicas: int, cpus_per_replica: float, asked: str) -> Optional[str]:
    """Why `replicas` actors of `cpus_per_replica` CPUs each (`asked`: the flags that ask for
    them) can never all start on the connected Ray cluster: more CPUs than it has; else None."""
    import ray

    needed, total = replicas * cpus_per_replica, ray.cluster_resources().get("CPU", 0)
    if needed <= total:
        return None
    return (f"{asked} x --cpus-per-replica {cpus_per_replica:g} need {needed:g} CPUs; the Ray "
            f"cluster has {total:g}")
