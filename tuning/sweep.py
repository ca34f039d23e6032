"""Ray Tune sweeps of the learning rate and λ around the santa trainer (ASHA on dev MRR).

    python -m tuning.sweep --recipe tiny --data pairs/ --eval-data beir/ \\
        --storage runs/ --name lr-lambda --num-samples 8 --max-steps 200

Every trial is a Tune *function* trainable that builds the santa config from its sampled
parameters and runs a Ray Train V2 ``TorchTrainer`` through :func:`santa.train.trainer.fit`;
the trainer's reports reach Tune through ``TuneReportCallback`` (the V2 way: a Train
callback, not ``Tuner(trainer)``). The trial driver itself asks for almost nothing
(no CPU): the trainer's workers reserve their own resources.

With ``--in-process`` a trial is not a Ray Train run but the same loop on one worker in
the trial's own process (its resources: the worker's CPUs and GPU): many small trials on
one node start without a controller and a worker group each (~20 s a trial), and one
that ASHA stops leaves nothing behind. Local (or shared) storage only.

What lands under ``STORAGE/NAME`` (local or ``s3://``):

- Tune's experiment: ``experiment_state-*.json`` and one folder per trial with
  ``params.json``, ``result.json``, ``progress.csv`` and Tune's TensorBoard events;
- ``runs/NAME-<trial id>/``: each trial's Ray Train run (checkpoints and, on local storage,
  the loop's own ``tensorboard/``; on S3 storage that goes to ``~/santa-runs/<run>/`` of
  the rank-0 worker's node);
- ``best.json``: ``{"checkpoint": URI, "metric", "value", "trial_id", "config", ...}``,
  the file ``santa.load`` and ``ray_jobs.export --best`` follow.

Re-running the same command (same ``--storage`` and ``--name``) restores the experiment:
finished trials are kept, unfinished and errored ones resume, each from its trainer's
latest checkpoint (the trial id, and so the Train run name, is the same).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from typing import Any

from santa.cluster.ray_utils import capacity_of, cluster_capacity, head_placement
from santa.config import SantaConfig
from santa.config.recipes import check_scoder_recipe
from santa.files import storage
from santa.files.layout import RunLayout
from santa.files.layout import checkpoint_uri as layout_checkpoint_uri
from santa.jobs import interrupts
from santa.jobs.errors import exit_with, run_job, with_exit_codes
from santa.jobs.flags import recipe_config, refuse_workers_in_process, run_parser
from santa.jobs.lifecycle import Job
from santa.jobs.preflight import check_beir, check_pairs
from santa.pipeline.report import write_sweep_report
from santa.train.tracking import Tracking, tune_callbacks
from santa.train.warden import group_warden
from tuning.progress import SweepProgress, status_word
from tuning.trials import (
    DEFAULT_LAMBDA_RANGES,
    METRIC,
    MODE,
    OBJECTIVES,
    TIME_ATTR,
    lambda_field,
    objective,
    train_trial,
    trial_config,
    trial_layout,
)

logger = logging.getLogger(__name__)

PROG = "python -m tuning.sweep"
TRIAL_DRIVER_RESOURCES = {"CPU": 0, "memory": 128 * 1024**2}
"""The trial driver only waits on its trainer. Tune refuses an empty request, and even
``{"CPU": 0.01}`` deadlocks a cluster that the workers and Ray Data fill exactly (a 1-CPU
read task no longer fits in the 0.99 CPU left): ask for a little memory instead."""

# --------------------------------------------------------------------------- sizing


def max_concurrent_trials(
    resources: dict[str, float],
    num_workers: int,
    cpus_per_worker: float,
    use_gpu: bool,
) -> int:
    """Trials that fit the cluster at once: its CPUs (and GPUs) over one trial's needs.

    One trial takes ``num_workers × cpus_per_worker`` CPUs (and ``num_workers`` GPUs with
    ``use_gpu``); one CPU of the cluster stays free for the trials' drivers and Ray Train's
    controllers (as ``worker_cpus`` leaves one); at least 1.
    """
    per_trial_cpus = num_workers * cpus_per_worker
    spare = max(0.0, resources.get("CPU", 0) - 1)
    fits = math.floor(spare / per_trial_cpus + 1e-9) if per_trial_cpus else 1
    if use_gpu:
        fits = min(fits, math.floor(resources.get("GPU", 0) / num_workers + 1e-9))
    return max(1, fits)


# --------------------------------------------------------------------------- results


def checkpoint_uri(result, storage_root: str, run_uri: str) -> str:
    """The URI of a trial's final checkpoint: the one its last report carried, else its run's
    latest complete checkpoint."""
    path = (result.metrics or {}).get("checkpoint_path")
    if path:
        return layout_checkpoint_uri(path, storage_root)  # Ray's paths drop the scheme
    from santa.models.checkpoints import latest_checkpoint

    found = latest_checkpoint(run_uri)
    return found.checkpoint_uri or found.model_uri


def trial_statuses(result_grid) -> dict[str, str]:
    """``{trial id: done | error | unfinished}`` from Tune's record of the trials."""
    analysis = getattr(result_grid, "_experiment_analysis", None)
    return {trial.trial_id: status_word(trial) for trial in getattr(analysis, "trials", [])}


def result_rows(result_grid, metric: str = METRIC) -> list[dict[str, Any]]:
    """One row per trial (trial, lr, λ, metric, step, status), best first."""
    statuses = trial_statuses(result_grid)
    rows = []
    for result in result_grid:
        metrics = result.metrics or {}
        config = result.config or {}
        trial = metrics.get("trial_id") or os.path.basename(str(result.path))
        status = "error" if result.error is not None else statuses.get(trial, "done")
        rows.append(
            {
                "trial": trial,
                "lr": config.get("lr"),
                "lambda": config.get("lambda"),
                metric: metrics.get(metric),
                "step": metrics.get(TIME_ATTR),
                "status": status,
            }
        )
    sign = 1 if MODE == "max" else -1
    rows.sort(key=lambda row: (row[metric] is None, -sign * (row[metric] or 0.0)))
    return rows


def format_table(rows: list[dict[str, Any]], metric: str = METRIC) -> str:
    """The results as an aligned text table."""
    header = ["trial", "lr", "λ", metric, "step", "status"]

    def cell(value: Any, digits: str) -> str:
        if value is None:
            return "-"
        return format(value, digits) if isinstance(value, float) else str(value)

    lines = [
        [
            row["trial"],
            cell(row["lr"], ".3g"),
            cell(row["lambda"], ".3f"),
            cell(row[metric], ".4f"),
            cell(row["step"], ""),
            row["status"],
        ]
        for row in rows
    ]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines, strict=True)]
    return "\n".join(
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *lines]
    )


def best_record(result_grid, sweep_root: str, storage_root: str) -> dict[str, Any]:
    """What ``best.json`` holds: the best finished trial's final checkpoint, metric and
    config. Unfinished trials (a sweep cut off) and trials that never reported the metric
    are not candidates: :class:`NoBestTrial` when none is left."""
    statuses = trial_statuses(result_grid)
    finished = [
        result
        for result in result_grid
        if result.error is None
        and isinstance((result.metrics or {}).get(METRIC), int | float)
        and statuses.get((result.metrics or {}).get("trial_id"), "done") == "done"
    ]
    if not finished:
        raise NoBestTrial(f"no finished trial reported {METRIC}")
    sign = 1 if MODE == "max" else -1
    best = max(finished, key=lambda result: sign * float(result.metrics[METRIC]))
    params = best.config
    sweep = params["sweep"]
    trial_id = best.metrics["trial_id"]
    run_uri = trial_layout(sweep, trial_id).root
    config = trial_config(params)
    return {
        "checkpoint": checkpoint_uri(best, storage_root, run_uri),
        "metric": METRIC,
        "mode": MODE,
        "value": best.metrics[METRIC],
        "trial_id": trial_id,
        "step": best.metrics.get(TIME_ATTR),
        "lr": params["lr"],
        "lambda": params.get("lambda"),
        "lambda_field": sweep.get("lambda_field"),
        "objective": sweep.get("objective", "auto"),
        "run": run_uri,
        "sweep": sweep_root,
        "config": {
            "lr": params["lr"],
            "lambda": params.get("lambda"),
            "lambda_field": sweep.get("lambda_field"),
            "santa": config.to_dict(),
        },
    }


class NoBestTrial(RuntimeError):
    """No finished trial reported the metric: there is no best.json to write."""


def describe_sweep(sweep_root: str, progress: dict[str, str]) -> str:
    """What an interrupted sweep kept (for its ``santa: interrupted`` line)."""
    done = sum(1 for status in progress.values() if status == "done")
    unfinished = sum(1 for status in progress.values() if status == "unfinished")
    return (
        f"sweep {sweep_root}: {done} trial{'s' if done != 1 else ''} finished, {unfinished} "
        "unfinished kept with their checkpoints; no best.json written"
    )


class _StatusTracker(SweepProgress):
    """SweepProgress that also records each trial's status for the interruption line."""

    def __init__(self, progress: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.progress = progress

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.progress[trial.trial_id] = "unfinished"
        super().on_trial_start(iteration, trials, trial, **info)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.progress[trial.trial_id] = "done"
        super().on_trial_complete(iteration, trials, trial, **info)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.progress[trial.trial_id] = "error"
        super().on_trial_error(iteration, trials, trial, **info)


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The sweep's command line."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Sweep the learning rate and λ of a santa recipe with Ray Tune (ASHA on "
        "dev MRR); re-running the same --storage/--name resumes the sweep.",
        parents=[
            run_parser(
                overrides_example="train.global_batch_size=64",
                cpus_per_worker_help="CPUs per training worker; 0: what leaves one CPU of the "
                "cluster to Ray Data",
                max_steps_help="steps per trial (ASHA's max_t)",
            )
        ],
    )
    parser.add_argument("--data", required=True, help="preprocessed pairs: local path or s3://")
    parser.add_argument(
        "--eval-data", required=True, help="BEIR dev folder: the metric ASHA ranks trials by"
    )
    parser.add_argument("--eval-split", default="test", help="qrels split of --eval-data")
    parser.add_argument(
        "--storage", required=True, help="sweep storage (Tune's storage_path): local or s3://"
    )
    parser.add_argument("--name", default="sweep", help="sweep name (same name = resume)")
    parser.add_argument("--num-samples", type=int, default=8, help="trials to sample")
    parser.add_argument("--scheduler", choices=("asha", "fifo"), default="asha")
    parser.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="dev evaluation (and checkpoint) every N steps; default: max steps / 4",
    )
    parser.add_argument(
        "--grace-period", type=int, default=None, help="ASHA: steps before stopping a trial"
    )
    parser.add_argument("--reduction-factor", type=float, default=2.0, help="ASHA's η")
    parser.add_argument(
        "--lr-range",
        nargs=2,
        type=float,
        metavar=("LOW", "HIGH"),
        default=None,
        help="log-uniform learning-rate range; default: the recipe's lr / 10 to lr × 10",
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="auto",
        help="what λ weighs: santa (train.mep_weight), scoder (SCodeR's Algorithm 2 as the "
        "trial, λ = scoder.adversarial_weight), dr (no λ); auto: santa or dr by the recipe",
    )
    parser.add_argument(
        "--lambda-range",
        nargs=2,
        type=float,
        metavar=("LOW", "HIGH"),
        default=None,
        help="uniform range of λ (the objective's loss weight); LOW == HIGH: fixed; "
        "default 0 to 2 (scoder: 0 to 1)",
    )
    parser.add_argument(
        "--max-concurrent", type=int, default=0, help="parallel trials; 0: sized to the cluster"
    )
    parser.add_argument("--max-failures", type=int, default=1, help="per trial's trainer")
    parser.add_argument("--seed", type=int, default=None, help="seed of the parameter sampling")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="train each trial in its Tune trial's process on one worker (its CPUs, and a "
        "GPU with --gpu), without Ray Train: many small trials on one node; local storage",
    )
    return with_exit_codes(parser)


def trial_resources(args: argparse.Namespace, cpus: float) -> dict[str, float]:
    """What one trial's process reserves: with ``--in-process`` it trains, so the worker's
    CPUs (and GPU); otherwise it only waits on its trainer (on the head node where there is
    one)."""
    if getattr(args, "in_process", False):
        return {"CPU": cpus, "GPU": 1.0 if args.gpu else 0.0}
    return {**TRIAL_DRIVER_RESOURCES, **head_placement()}


def base_config(args: argparse.Namespace) -> SantaConfig:
    """The recipe with the sweep's own settings and the user's overrides applied."""
    then = [f"train.max_steps={args.max_steps}"] if args.max_steps else []
    if getattr(args, "in_process", False):
        then.append("train.num_workers=1")  # (main refused another --num-workers)
    if args.max_steps and getattr(args, "objective", "auto") == "scoder":
        # Every stage of Algorithm 2 gets the budget (as ray_jobs.scoder --max-steps).
        then += [
            f"scoder.{name}_steps={args.max_steps}"
            for name in ("warmup", "discriminator", "dual_encoder")
        ]
    config = recipe_config(args, then=then)
    if getattr(args, "objective", "auto") == "scoder":
        check_scoder_recipe(args.recipe, config)  # before Ray, not in every trial
    max_steps = config.train.max_steps
    if not max_steps:
        raise ValueError("a sweep needs a step budget: --max-steps N (ASHA's max_t)")
    eval_every = args.eval_every or config.train.eval_every or max(1, max_steps // 4)
    cadence = [f"train.eval_every={eval_every}"]
    if config.train.checkpoint_every is None:
        # Every result Tune sees then comes with the checkpoint it was measured on.
        cadence.append(f"train.checkpoint_every={eval_every}")
    return config.with_overrides(cadence)


def search_space(args: argparse.Namespace, config: SantaConfig, sweep: dict[str, Any]):
    """Tune's param space: log-uniform lr, uniform λ (when the objective has one)."""
    from ray import tune

    lr = config.train.learning_rate
    low, high = args.lr_range or (lr / 10, lr * 10)
    if not 0 < low <= high:
        raise ValueError(f"--lr-range must satisfy 0 < LOW <= HIGH, got {low} {high}")
    space: dict[str, Any] = {"lr": tune.loguniform(low, high) if low < high else low}
    if sweep["lambda_field"]:
        chosen = sweep.get("objective", "auto")
        low_l, high_l = args.lambda_range or DEFAULT_LAMBDA_RANGES[objective(config, chosen)]
        if not 0 <= low_l <= high_l:
            raise ValueError(f"--lambda-range must satisfy 0 <= LOW <= HIGH, got {low_l} {high_l}")
        if objective(config, chosen) == "scoder" and high_l > 1:
            raise ValueError(
                f"SCodeR's λ weighs two losses: --lambda-range within [0, 1], got {high_l}"
            )
        space["lambda"] = tune.uniform(low_l, high_l) if low_l < high_l else low_l
    space["sweep"] = sweep
    return space


def main(argv: list[str] | None = None) -> int:
    """Parse → check → sweep; errors as one line (``santa.jobs.errors.run_job``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_workers_in_process(parser, args, argv)
    return run_job(lambda: run_sweep(args), argv)


def run_sweep(args: argparse.Namespace) -> int:
    """Run (or resume) the sweep of ``args``; the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config = base_config(args)
    storage_root = storage.absolute(args.storage)
    if args.in_process and storage.is_s3(storage_root):
        raise ValueError(
            "--in-process keeps each trial's checkpoints on its node: --storage must be a "
            "local folder (or one every node shares), not s3://"
        )
    if args.in_process and config.negatives.source == "async":
        raise ValueError("--in-process: negatives.source=async needs the miner actor, a Ray run")
    layout = RunLayout.of(storage_root, args.name)
    job = Job("tuning.sweep", run=layout.root, storage=storage_root)  # one writer per sweep
    # Before Ray: a missing --eval-data would otherwise fail every trial, each retried.
    checks = [lambda: check_pairs(args.data), lambda: check_beir(args.eval_data, args.eval_split)]
    with job.running(checks):
        job.start_ray(args.address)
        return _sweep(args, config, storage_root, layout)


def _sweep(args: argparse.Namespace, config: SantaConfig, storage_root: str, layout) -> int:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search import BasicVariantGenerator

    from santa.train.trainer import worker_cpus

    sweep_root = layout.root
    # A trial the cluster can never hold fails here in one line, not in every trial.
    from santa.cluster.resources import check_plan
    from santa.train.trainer import run_plan

    check_plan(run_plan(config, args.cpus_per_worker), job="each trial")

    workers = 1 if args.in_process else args.num_workers  # (base_config's too)
    cpus = worker_cpus(args.cpus_per_worker, workers)
    # Trial drivers only wait: on the head node where the cluster has one (cluster.yaml);
    # trials in process train: the worker's resources.
    trainable = tune.with_resources(train_trial, trial_resources(args, cpus))

    progress: dict[str, str] = {}  # trial id → status, for an interruption's line
    max_t = config.scoder.iterations if args.objective == "scoder" else config.train.max_steps
    tracker = _StatusTracker(progress, metric=METRIC, time_attr=TIME_ATTR, max_t=max_t)
    # MLflow / W&B: Tune's own loggers, one tracked run per trial.
    callbacks = [tracker, *tune_callbacks(Tracking.from_args(args))]
    # On S3 with santa's filesystem: Tune's experiment syncs get santa's timeouts.
    ray_root, filesystem = storage.for_ray(sweep_root)
    ray_storage, _ = storage.for_ray(storage_root)
    if tune.Tuner.can_restore(ray_root, storage_filesystem=filesystem):
        print(f"resuming the sweep at {sweep_root} (its trials, space and limits as first set)")
        # Unfinished trials (running when the sweep was cut off) continue from their latest
        # checkpoint: their Train run names are the trial ids.
        tuner = tune.Tuner.restore(
            ray_root,
            trainable=trainable,
            resume_unfinished=True,
            resume_errored=True,
            storage_filesystem=filesystem,
        )
        # Tune restores the first run's RunConfig (pickled): santa's output settings and a
        # live progress callback again (Tuner.restore takes no run_config).
        restored = tuner._local_tuner.get_run_config()
        restored.verbose = 0
        restored.callbacks = callbacks
    else:
        field = lambda_field(config, args.objective)
        if field is None:
            print(
                f"λ is not swept: the {objective(config)!r} objective of recipe "
                f"{args.recipe!r} has no loss weight (MEP needs a T5 backbone in pretraining)"
            )
        # Sized by what the cluster can grow to (an autoscaler's declared max), not by the
        # head alone at launch: pending trials are what makes the autoscaler add workers.
        capacity = cluster_capacity()
        resources = {key: capacity_of(key, capacity) for key in ("CPU", "GPU")}
        concurrent = args.max_concurrent or max_concurrent_trials(
            resources, workers, cpus, args.gpu
        )
        print(
            f"max_concurrent_trials={concurrent} (cluster up to {resources['CPU']:g} CPU, "
            f"{resources['GPU']:g} GPU; per trial: {workers} workers × "
            f"{cpus:g} CPU{' + 1 GPU' if args.gpu else ''}"
            f"{', in process' if args.in_process else ''})"
        )
        sweep = {
            "name": args.name,
            "root": layout.root,
            "metric": METRIC,
            "lambda_field": field,
            "objective": objective(config, args.objective),
            "recipe": args.recipe,
            "santa": config.to_dict(),
            "run": {
                "data": storage.absolute(args.data),
                "cpus_per_worker": cpus,
                "max_failures": args.max_failures,
                "eval_data": storage.absolute(args.eval_data),
                "eval_split": args.eval_split,
                "in_process": args.in_process,
            },
        }
        space = search_space(args, config, sweep)
        max_steps = config.train.max_steps
        grace = args.grace_period or config.train.eval_every
        if sweep["objective"] == "scoder":  # a SCodeR trial reports once per iteration
            max_steps, grace = config.scoder.iterations, args.grace_period or 1
        if args.scheduler == "asha":
            scheduler = ASHAScheduler(
                time_attr=TIME_ATTR,
                max_t=max_steps,
                grace_period=min(max_steps, grace),
                reduction_factor=args.reduction_factor,
                # A trial at its last step ends by itself, its controller removing its
                # workers' group (a trial stopped earlier: santa.train.warden removes it).
                stop_last_trials=False,
            )
        else:
            scheduler = FIFOScheduler()
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric=METRIC,
                mode=MODE,
                num_samples=args.num_samples,
                scheduler=scheduler,
                # A SearchGenerator ignores TuneConfig's max_concurrent_trials: set it here.
                search_alg=BasicVariantGenerator(random_state=args.seed, max_concurrent=concurrent),
            ),
            # Tune's status boxes (every trial's whole config, redrawn) off: santa prints
            # a line per trial event and its own table.
            run_config=tune.RunConfig(
                name=args.name,
                storage_path=ray_storage,
                storage_filesystem=filesystem,
                verbose=0,
                callbacks=callbacks,
            ),
        )
    # Tune's newer output engine prints its experiment box even at verbose=0; the classic
    # one prints nothing at 0 (RAY_AIR_NEW_OUTPUT=1 in the environment brings it back).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # In a helper thread: Tune's SIGINT handling (a graceful stop that marks cut-off trials
    # finished) stays off; santa's answers, and the experiment Tune keeps saving resumes.
    # Trials that ASHA stops early leave no worker group holding the next trials' CPUs.
    with (
        interrupts.keeping(
            lambda: describe_sweep(sweep_root, progress),
            hint="run the same command to resume the unfinished trials",
        ),
        group_warden(),
    ):
        result_grid = interrupts.call_in_thread(tuner.fit, name="santa-sweep")
    rows = result_rows(result_grid)
    print(format_table(rows))
    print(f"wrote {write_sweep_report(rows, sweep_root, METRIC)}")
    try:
        best = best_record(result_grid, sweep_root, storage_root)
    except NoBestTrial as error:
        print(f"santa: error: no best trial: {error}", file=sys.stderr)
        return 1
    storage.write_json(layout.best, best)
    print(
        f"best: trial {best['trial_id']} {METRIC}={best['value']:.4f} at step {best['step']} "
        f"(lr={best['lr']:.3g}, λ={'-' if best['lambda'] is None else format(best['lambda'], '.3g')}) "
        f"-> {best['checkpoint']}"
    )
    print(f"wrote {layout.best}")
    return 1 if result_grid.num_errors else 0


if __name__ == "__main__":
    exit_with(main())
