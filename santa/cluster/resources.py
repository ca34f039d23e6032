"""A job's resource plan, checked against the cluster before anything is submitted.

A request Ray can never place waits forever: Ray Train retries the worker group without
end, a Ray Data read task that finds no CPU left beside the trainers never runs, an actor
asking for a GPU on a cluster without one stays pending. So every training entry
(pretrain/finetune, the pipeline, SCodeR, a sweep) writes down what it will ask for — its
:class:`ResourcePlan`: the trainers, the hard-negative miner and its encoder actors, Ray
Data's share — and :func:`check_plan` compares it with the cluster before the first
submission:

- a plan that can never be met (no autoscaler and the nodes cannot hold it; or more than
  the autoscaler's declared max; or one request larger than every node type) raises
  :class:`ResourceError`, one line naming what was asked and what the cluster has;
- a plan the present nodes cannot hold but an autoscaler can grow to is printed once
  (what the job waits for) and goes ahead: the pending requests are what makes the
  autoscaler add nodes, and Ray Train's start retries are bounded
  (:data:`WORKER_GROUP_START_RETRIES`).

Plain Python over ``ray.nodes()`` and the autoscaler's config; nothing is reserved.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "Bundle",
    "ClusterShape",
    "ResourceError",
    "ResourcePlan",
    "check_plan",
    "cluster_shape",
    "describe_resources",
    "fits",
    "trainer_gpus",
    "training_plan",
]

# Resources the plan may name (others in ray.nodes(), such as node:<ip>, memory or
# object_store_memory, are not asked for by santa's jobs).
_EPSILON = 1e-9


_ANNOUNCED: set[str] = set()


class ResourceError(ValueError):
    """A resource plan the cluster can never hold (bad input: exit code 2)."""


@dataclass(frozen=True)
class Bundle:
    """``count`` identical requests (a training worker, an encoder actor, a data task)."""

    what: str
    """What asks, as the error line names it (``training worker``, ``miner encoder``)."""
    resources: dict[str, float]
    """One request, e.g. ``{"CPU": 1, "GPU": 0.75}``; zero amounts are dropped."""
    count: int = 1

    def __post_init__(self) -> None:
        cleaned = {key: float(value) for key, value in self.resources.items() if value}
        object.__setattr__(self, "resources", cleaned)
        if self.count < 0 or any(value < 0 for value in cleaned.values()):
            raise ValueError(f"a resource request must not be negative: {self}")

    def describe(self) -> str:
        """``2 training workers × {1 CPU, 1 GPU}``."""
        what = self.what if self.count == 1 else f"{self.what}s"
        return f"{self.count} {what} × {{{describe_resources(self.resources)}}}"


@dataclass(frozen=True)
class ResourcePlan:
    """Everything a job asks Ray for at once."""

    bundles: tuple[Bundle, ...]

    def items(self) -> list[tuple[str, dict[str, float]]]:
        """Every single request, largest first (GPU, then CPU, then the rest)."""
        singles = [
            (bundle.what, bundle.resources)
            for bundle in self.bundles
            for _ in range(bundle.count)
            if bundle.resources
        ]
        return sorted(
            singles,
            key=lambda item: (
                -item[1].get("GPU", 0.0),
                -item[1].get("CPU", 0.0),
                -sum(item[1].values()),
            ),
        )

    def total(self) -> dict[str, float]:
        """The sum of every request, by resource."""
        total: dict[str, float] = {}
        for bundle in self.bundles:
            for key, value in bundle.resources.items():
                total[key] = total.get(key, 0.0) + bundle.count * value
        return total

    def describe(self) -> str:
        """``2 training workers × {1 CPU} + 1 miner × {1 GPU} (2 CPUs, 1 GPU in all)``."""
        parts = " + ".join(bundle.describe() for bundle in self.bundles if bundle.count)
        return f"{parts} ({describe_resources(self.total())} in all)"


@dataclass(frozen=True)
class ClusterShape:
    """What the cluster has and can grow to."""

    nodes: tuple[dict[str, float], ...]
    """Each alive node's total resources."""
    node_types: tuple[dict[str, float], ...] = ()
    """The node types an autoscaler can add (their resources), when its config is known."""
    capacity: dict[str, float] = field(default_factory=dict)
    """What the cluster can grow to (``ray_utils.cluster_capacity``)."""
    autoscaler: bool = False
    """Whether an autoscaler can add nodes."""

    def present(self) -> dict[str, float]:
        """The alive nodes' resources, summed."""
        total: dict[str, float] = {}
        for node in self.nodes:
            for key, value in node.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def describe(self, keys: Iterable[str]) -> str:
        """``2 CPUs, 0 GPUs on 1 node, no autoscaler`` for the resources a plan names."""
        keys = sorted(set(keys) | {"CPU", "GPU"}, key=_resource_order)
        present = self.present()
        count = len(self.nodes)
        text = (
            f"{describe_resources({key: present.get(key, 0.0) for key in keys}, zeros=True)}"
            f" on {count} node{'s' if count != 1 else ''}"
        )
        if not self.autoscaler:
            return text + ", no autoscaler"
        limit = {key: self.capacity.get(key, 0.0) for key in keys}
        return text + f", an autoscaler up to {describe_resources(limit, zeros=True)}"


def describe_resources(resources: dict[str, float], zeros: bool = False) -> str:
    """``1 CPU, 0.75 GPU`` (CPU and GPU first; ``inf`` as "no limit")."""
    parts = []
    for key in sorted(resources, key=_resource_order):
        value = resources[key]
        if not value and not zeros:
            continue
        amount = "unlimited" if math.isinf(value) else f"{value:g}"
        name = key if key not in ("CPU", "GPU") or value == 1 else f"{key}s"
        parts.append(f"{amount} {name}")
    return ", ".join(parts) or "nothing"


def _resource_order(key: str) -> tuple[int, str]:
    return ({"CPU": 0, "GPU": 1}.get(key, 2), key)


# --------------------------------------------------------------------------- the plan


def trainer_gpus(config) -> float:
    """GPUs one training worker asks for: 1, or what is left of its GPU beside the
    hard-negative encoder actors that share it (``--miner-gpus 0.25``: 0.75).

    With ``async`` hard negatives and a fractional ``negatives.encoder_gpus``, each
    worker's GPU takes its share of the encoder actors
    (``ceil(encoder_actors / num_workers)`` of them), so that a node with one GPU runs a
    trainer and an encoder; 0 without ``train.use_gpu``.
    """
    train, negatives = config.train, config.negatives
    if not train.use_gpu:
        return 0.0
    share = negatives.encoder_gpus
    if negatives.source != "async" or not 0 < share < 1:
        return 1.0
    per_gpu = math.ceil(negatives.encoder_actors / train.num_workers)
    rest = 1.0 - per_gpu * share
    return round(rest, 6) if rest > _EPSILON else 1.0


def training_plan(
    config,
    *,
    cpus_per_worker: float,
    miner_gpus: float = 0.0,
    miner_resources: dict[str, float] | None = None,
) -> ResourcePlan:
    """What a training run asks for: its workers (which read their own rows: no Ray Data
    task runs beside them), and with ``async`` hard negatives the miner actor and its
    encoder actors."""
    train, negatives = config.train, config.negatives
    worker = {"CPU": cpus_per_worker, "GPU": trainer_gpus(config)}
    bundles = [Bundle("training worker", worker, train.num_workers)]
    if negatives.source == "async":
        bundles.append(Bundle("miner", {"GPU": miner_gpus, **(miner_resources or {})}))
        encoder = {"CPU": negatives.encoder_cpus, "GPU": negatives.encoder_gpus}
        bundles.append(Bundle("miner encoder actor", encoder, negatives.encoder_actors))
    return ResourcePlan(tuple(bundles))


# --------------------------------------------------------------------------- the cluster


def _schedulable(resources: dict[str, Any]) -> dict[str, float]:
    """The resources a plan may ask for (not node:<ip>, memory or the object store)."""
    return {
        key: float(value)
        for key, value in resources.items()
        if not key.startswith("node:") and key not in ("memory", "object_store_memory")
    }


def autoscaler_node_types() -> list[dict[str, float]]:
    """The resources of each node type the autoscaler's config declares (empty: unknown)."""
    from santa.cluster.ray_utils import autoscaling_config_path

    path = autoscaling_config_path()
    if not path:
        return []
    try:
        import yaml

        with open(path) as handle:
            config = yaml.safe_load(handle) or {}
    except (OSError, ValueError, TypeError) as error:
        logger.warning("could not read the autoscaler config %s: %s", path, error)
        return []
    head = config.get("head_node_type")
    types = config.get("available_node_types") or {}
    return [
        {key: float(value) for key, value in (node_type.get("resources") or {}).items()}
        for name, node_type in types.items()
        if name != head and int(node_type.get("max_workers", 0)) > 0
    ]


def cluster_shape() -> ClusterShape:
    """The connected cluster: its alive nodes, the autoscaler's node types and limits."""
    import ray

    from santa.cluster.ray_utils import cluster_capacity

    nodes = tuple(
        _schedulable(node.get("Resources") or {}) for node in ray.nodes() if node.get("Alive")
    )
    capacity = _schedulable(cluster_capacity())
    present: dict[str, float] = {}
    for node in nodes:
        for key, value in node.items():
            present[key] = present.get(key, 0.0) + value
    node_types = tuple(autoscaler_node_types())
    grows = bool(node_types) or any(
        value > present.get(key, 0.0) + _EPSILON for key, value in capacity.items()
    )
    return ClusterShape(nodes=nodes, node_types=node_types, capacity=capacity, autoscaler=grows)


def fits(items: list[tuple[str, dict[str, float]]], nodes: Iterable[dict[str, float]]) -> bool:
    """Whether every request can be placed on these nodes at once (first fit, largest
    first: what Ray's scheduler manages for requests this small)."""
    free = [dict(node) for node in nodes]
    for _, request in items:
        for node in free:
            if all(node.get(key, 0.0) + _EPSILON >= value for key, value in request.items()):
                for key, value in request.items():
                    node[key] = node.get(key, 0.0) - value
                break
        else:
            return False
    return True


def _fits_one(request: dict[str, float], nodes: Iterable[dict[str, float]]) -> bool:
    return any(
        all(node.get(key, 0.0) + _EPSILON >= value for key, value in request.items())
        for node in nodes
    )


def never_fits(plan: ResourcePlan, cluster: ClusterShape) -> str | None:
    """Why the cluster can never hold ``plan`` (None: it can, now or once it grows)."""
    shapes = [*cluster.nodes, *cluster.node_types]
    for what, request in plan.items():
        if shapes and not _fits_one(request, shapes):
            largest = "no node" if not cluster.autoscaler else "no node or node type"
            return f"{largest} has {{{describe_resources(request)}}} for one {what}"
    total = plan.total()
    limit = cluster.capacity if cluster.autoscaler else cluster.present()
    short = [key for key, value in total.items() if value > limit.get(key, 0.0) + _EPSILON]
    if short:
        amounts = ", ".join(f"{key} ({total[key]:g} > {limit.get(key, 0.0):g})" for key in short)
        return f"more {amounts} than the cluster " + (
            "can grow to" if cluster.autoscaler else "has"
        )
    if not cluster.autoscaler and not fits(plan.items(), cluster.nodes):
        return "the requests do not fit on its nodes together"
    return None


def check_plan(
    plan: ResourcePlan,
    cluster: ClusterShape | None = None,
    *,
    job: str = "",
    announce: bool = True,
) -> str:
    """Fail fast when ``plan`` can never run here; say once what it waits for.

    Returns ``"fits"`` (the present nodes hold it) or ``"waits"`` (an autoscaler must add
    nodes first; the line saying so is printed unless ``announce`` is False). Raises :class:`ResourceError` with one
    line naming what was asked and what the cluster has when it can never run.
    """
    cluster = cluster or cluster_shape()
    keys = plan.total().keys()
    job = f"{job} " if job else ""
    reason = never_fits(plan, cluster)
    if reason is not None:
        raise ResourceError(
            f"{job}asks for {plan.describe()}; the cluster has {cluster.describe(keys)}: {reason}"
        )
    if fits(plan.items(), cluster.nodes):
        return "fits"
    line = (
        f"santa: waiting for the autoscaler: {job}asks for {plan.describe()}; the cluster has "
        f"{cluster.describe(keys)}"
    )
    # Once per plan in a process (a pipeline checks its stages up front and again at each).
    if announce and plan.describe() not in _ANNOUNCED:
        _ANNOUNCED.add(plan.describe())
        print(line, flush=True)
    return "waits"
