"""One trial of a santa sweep: the Ray Tune function trainable and what it needs.

Every trial builds the santa config from its sampled parameters and runs the one worker
loop through :func:`santa.train.trainer.fit` (a Ray Train V2 ``TorchTrainer``), its reports
reaching Tune through ``TuneReportCallback`` (the V2 way: a Train callback, not
``Tuner(trainer)``); a SCodeR trial runs Algorithm 2 and reports after every iteration.
A sweep ``--in-process`` trains each trial in the trial's own process on one worker
(:func:`santa.train.trainer.fit_in_process`, the resources the trial reserved), its
reports going to Tune as they are made: no controller or worker group per trial.
"""

from __future__ import annotations

import time
from typing import Any

from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback

from santa.config import SantaConfig
from santa.files.layout import RunLayout

METRIC = "dev_mrr"
MODE = "max"
TIME_ATTR = "step"

# The weight λ of each training objective, as a santa config field; None: it has none.
LAMBDA_FIELDS: dict[str, str | None] = {
    "santa": "train.mep_weight",  # L = L_SDA + λ·L_MEP
    "dr": None,  # SDA/DR contrastive loss only: encoder-only backbones, fine-tuning
    "scoder": "scoder.adversarial_weight",  # L = λ·L_adv + (1 − λ)·L_distill (SCodeR Eq. 10)
}
OBJECTIVES = ("auto", *LAMBDA_FIELDS)
# λ's range when --lambda-range is not given; SCodeR's λ mixes two losses: [0, 1].
DEFAULT_LAMBDA_RANGES = {"santa": (0.0, 2.0), "dr": (0.0, 2.0), "scoder": (0.0, 1.0)}


def objective(config: SantaConfig, requested: str = "auto") -> str:
    """Which objective a trial trains: ``requested``, or for ``auto`` what ``config`` trains
    with santa's trainer: ``santa`` (SDA + λ·MEP) or ``dr`` (no λ). ``scoder`` (Algorithm 2,
    ``ray_jobs.scoder``) is only ever asked for."""
    if requested != "auto":
        if requested not in LAMBDA_FIELDS:
            raise ValueError(f"unknown objective {requested!r}; objectives are {OBJECTIVES}")
        return requested
    if config.model.kind == "t5" and config.train.stage == "pretrain":
        return "santa"
    return "dr"


def lambda_field(config: SantaConfig, requested: str = "auto") -> str | None:
    """The config field λ sweeps for this config's objective, or None when there is none."""
    return LAMBDA_FIELDS[objective(config, requested)]


def trial_layout(sweep: dict[str, Any], trial_id: str) -> RunLayout:
    """The Ray Train run of one trial (the sweep layout's own, ``RunLayout.trial``): unique,
    and the same again on restore."""
    return RunLayout(sweep["root"]).trial(trial_id)


def trial_config(params: dict[str, Any]) -> SantaConfig:
    """The santa config of one trial: the base config with the sampled lr (and λ)."""
    base = SantaConfig.from_dict(params["sweep"]["santa"])
    overrides = [f"train.learning_rate={params['lr']!r}"]
    field = params["sweep"].get("lambda_field")
    if field and "lambda" in params:
        overrides.append(f"{field}={params['lambda']!r}")
    return base.with_overrides(overrides)


class EvalReportCallback(TuneReportCallback):
    """``TuneReportCallback`` that forwards only the reports carrying the metric.

    The loop also reports at every ``log_every`` step without dev metrics; Tune's strict
    metric check (and ASHA) want the metric in every result, so those stay with Train
    (and the run's TensorBoard). Rank 0's metrics are the ones forwarded.
    """

    def __init__(self, metric: str = METRIC):
        super().__init__()
        self.metric = metric

    def after_report(self, run_context, metrics, checkpoint):
        if metrics and self.metric in metrics[0]:
            super().after_report(run_context, metrics, checkpoint)


def eval_report_forwarder(metric: str = METRIC):
    """For a trial in process: each report carrying ``metric`` goes to Tune with the folder
    its checkpoint was kept in (``checkpoint_path``, as ``TuneReportCallback`` adds it)."""
    from ray import tune

    def forward(metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        if metric in metrics:
            kept = {CHECKPOINT_PATH_KEY: checkpoint_dir} if checkpoint_dir else {}
            tune.report({**metrics, **kept})

    return forward


def trial_run(sweep: dict[str, Any], layout: RunLayout):
    """The Ray Train run of one trial: the sweep's run settings, in the trial's folder
    (``trial_layout``'s, as is)."""
    from santa.train.trainer import RunSpec

    return RunSpec(layout=layout, **sweep["run"])


def train_trial(params: dict[str, Any]) -> None:
    """The Tune function trainable: one santa training run with the trial's parameters."""
    from ray import tune

    from santa.train.trainer import fit

    sweep = params["sweep"]
    config = trial_config(params)
    layout = trial_layout(sweep, tune.get_context().get_trial_id())
    if sweep.get("objective") == "scoder":
        train_scoder_trial(config, sweep, layout)
        return
    spec = trial_run(sweep, layout)
    if spec.in_process:
        from santa.train.trainer import fit_in_process

        # (It raises what ends the run: the trial errors, as a Ray trial's result.error.)
        fit_in_process(config, spec, on_report=eval_report_forwarder(sweep["metric"]))
        return
    result = fit(config, spec, callbacks=[EvalReportCallback(sweep["metric"])])
    wait_for_forwarded_reports()
    if result.error is not None:
        raise result.error


def wait_for_forwarded_reports(timeout_s: float = 120.0, settle_s: float = 1.0) -> None:
    """Return once the trial's actor has taken the run's last forwarded report.

    Ray 2.60's function trainable deadlocks otherwise: ``EvalReportCallback`` hands each
    report to the trial through a one-slot actor queue that the trial's main thread moves
    into a one-slot thread queue; when the trial function returns, Tune puts its own
    closing result into that thread queue, and if the run's last report (the final dev
    metric) was still in the actor queue the main thread then blocks putting it behind the
    closing result, forever (seen: a resumed sweep's trial hung after its last step, and
    the next trial never started). Waiting here until both queues are empty, twice
    ``settle_s`` apart, lets the main thread finish the hand-over first.
    """
    from ray.train._internal.session import get_session

    session = get_session()
    forwarded = getattr(session, "_inter_actor_queue", None)
    if session is None or forwarded is None:
        return  # nothing forwarded through the actor queue

    def drained() -> bool:
        return forwarded.empty() and session.result_queue.empty()

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if drained():
            time.sleep(settle_s)
            if drained():
                return
        time.sleep(0.1)


def train_scoder_trial(config: SantaConfig, sweep: dict[str, Any], layout: RunLayout) -> None:
    """One SCodeR trial: Algorithm 2, reporting dev MRR to Tune after every iteration
    (``step`` counts iterations, so ASHA stops trials between them)."""
    from ray import tune

    from santa.scoder.algorithm import run_algorithm

    run = sweep["run"]

    def report(manifest: dict[str, Any]) -> None:
        metrics = manifest["metrics"]
        if sweep["metric"] not in metrics:
            raise ValueError(f"iteration {metrics['iteration']} reported no {sweep['metric']}")
        tune.report(
            {
                sweep["metric"]: metrics[sweep["metric"]],
                TIME_ATTR: metrics["iteration"],
                CHECKPOINT_PATH_KEY: manifest["dual_encoder"],
                **{k: v for k, v in metrics.items() if isinstance(v, int | float)},
            }
        )

    run_algorithm(
        config,
        data=run["data"],
        layout=layout,
        recipe=sweep.get("recipe", ""),
        eval_data=run["eval_data"],
        eval_split=run["eval_split"],
        cpus_per_worker=run["cpus_per_worker"],
        on_iteration=report,
        in_process=run.get("in_process", False),
    )
