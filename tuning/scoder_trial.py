"""A SCodeR trial of ``tuning.sweep --objective scoder``: one whole Algorithm 2 run."""

from __future__ import annotations

from typing import Any

from santa import storage
from santa.config import SantaConfig


def train_scoder_trial(config: SantaConfig, sweep: dict[str, Any], name: str) -> None:
    """One SCodeR trial: Algorithm 2 (``ray_jobs.scoder``), reporting dev MRR to Tune after
    every iteration (``step`` counts iterations, so ASHA stops trials between them)."""
    from ray import tune

    from ray_jobs.scoder import run_algorithm
    from tuning.sweep import TIME_ATTR  # here it counts iterations

    run = sweep["run"]

    def report(manifest: dict[str, Any]) -> None:
        metrics = manifest["metrics"]
        if sweep["metric"] not in metrics:
            raise ValueError(f"iteration {metrics['iteration']} reported no {sweep['metric']}")
        tune.report(
            {
                sweep["metric"]: metrics[sweep["metric"]],
                TIME_ATTR: metrics["iteration"],
                "checkpoint_path": manifest["dual_encoder"],
                **{k: v for k, v in metrics.items() if isinstance(v, int | float)},
            }
        )

    run_algorithm(
        config,
        data=run["data"],
        run_uri=storage.join(run["storage"], name),
        recipe=sweep.get("recipe", ""),
        eval_data=run["eval_data"],
        eval_split=run["eval_split"],
        cpus_per_worker=run["cpus_per_worker"],
        on_iteration=report,
    )
