"""Experiment tracking: MLflow and Weights & Biases, beside santa's own metrics.jsonl and
TensorBoard.

One tracked run per training run (a pretrain or finetune job, each pipeline stage, each
SCodeR phase): the driver opens it before Ray Train starts (the config as parameters), rank
0 logs every logged step's metrics into it, and the driver closes it with the final
metrics, the evaluation table where the job evaluated, and the model folder as an artifact.
A run resumed under the same name continues the same tracked run (MLflow: the run tagged
with the santa run's URI; W&B: an id derived from it). A Tune sweep logs one run per trial
through Tune's own ``MLflowLoggerCallback`` / ``WandbLoggerCallback``
(:func:`tune_callbacks`).

Neither package is a dependency of santa: ``pip install 'santa[tracking]'`` (MLflow with
what its database stores need, and W&B). Settings come from the flags (``--mlflow [URI]``,
``--mlflow-artifacts URI``, ``--wandb [PROJECT]``) and the packages' own environment
variables (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ``WANDB_PROJECT``,
``WANDB_MODE=offline``, ``WANDB_DIR``, ...), which are handed to the workers.

A local MLflow store (``sqlite:///...``, a folder) is opened before Ray starts, so a store
that cannot be used is one line in seconds, not an error after the cluster came up; a
``sqlite:`` store keeps its artifacts beside the database (``mlartifacts/``), not in the
``./mlruns`` of whatever folder the job ran from.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

__all__ = [
    "Tracking",
    "TrackingError",
    "WorkerTracker",
    "add_tracking_flags",
    "finish_tracking",
    "tracking_warning",
    "tune_callbacks",
]

RUN_TAG = "santa.run"
DEFAULT_EXPERIMENT = "santa"
# How long a job that ends early (Ctrl-C, an error) waits for the tracking server to mark
# its run; MLflow's client retries for minutes on its own.
END_EARLY_WAIT_S = 10.0
ENV_PREFIXES = ("MLFLOW_", "WANDB_")
# MLflow's database stores (``mlflow.store.db.db_types``; ``sqlite+pysqlite:`` counts too)
# need SQLAlchemy and alembic, which mlflow-skinny does not install.
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
DATABASE_PACKAGES = {"sqlalchemy": "SQLAlchemy", "alembic": "alembic"}
ARTIFACTS_BESIDE_DATABASE = "mlartifacts"
"""The folder beside a ``sqlite:`` store's file that holds its runs' artifacts (the name
``mlflow server`` gives its own artifact folder)."""


class TrackingError(ValueError):
    """A tracking backend cannot be used (not installed, bad URI); the message says what to do."""


def add_tracking_flags(parser) -> None:
    """``--mlflow [URI]`` and ``--wandb [PROJECT]`` (values default to the packages' env)."""
    parser.add_argument(
        "--mlflow",
        nargs="?",
        const="env",
        default=None,
        metavar="URI",
        help="log to MLflow (URI: a tracking server, sqlite:///PATH.db or a folder; default "
        "MLFLOW_TRACKING_URI); experiment: MLFLOW_EXPERIMENT_NAME or 'santa'",
    )
    parser.add_argument(
        "--mlflow-artifacts",
        default="",
        metavar="URI",
        help="where a new MLflow experiment keeps its runs' artifacts (a folder or s3://; "
        f"default: a sqlite: store's folder's {ARTIFACTS_BESIDE_DATABASE}/, else the store's own)",
    )
    parser.add_argument(
        "--wandb",
        nargs="?",
        const="env",
        default=None,
        metavar="PROJECT",
        help="log to Weights & Biases (default project WANDB_PROJECT or 'santa'; "
        "WANDB_MODE=offline works without an account)",
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _flatten(prefix: str, value: Any, into: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, into)
    else:
        into[prefix] = value
    return into


def _run_id(run_uri: str) -> str:
    """A W&B run id for a santa run: the same name (and storage) resumes the same run."""
    return "santa-" + hashlib.sha1(run_uri.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Tracking:
    """Where a job's runs are tracked; travels to the workers as a plain dict."""

    mlflow_uri: str = ""
    experiment: str = DEFAULT_EXPERIMENT
    wandb_project: str = ""
    env: dict[str, str] = field(default_factory=dict)
    """The driver's ``MLFLOW_*`` / ``WANDB_*`` variables, set in the workers too."""
    mlflow_artifacts: str = ""
    """Where a new experiment keeps its artifacts ("": the store's default)."""
    mlflow_run_id: str = ""
    wandb_run_id: str = ""
    run_name: str = ""

    @classmethod
    def from_args(cls, args) -> Tracking:
        """From ``--mlflow`` / ``--wandb`` and the environment; checks the packages now."""
        mlflow_flag, wandb_flag = getattr(args, "mlflow", None), getattr(args, "wandb", None)
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
        mlflow_uri, artifacts = "", getattr(args, "mlflow_artifacts", "") or ""
        if mlflow_flag is not None:
            mlflow_uri = env.get("MLFLOW_TRACKING_URI", "") if mlflow_flag == "env" else mlflow_flag
            if not mlflow_uri:
                raise TrackingError("--mlflow needs a URI (or MLFLOW_TRACKING_URI)")
            _require("mlflow")
            _require_store_packages(mlflow_uri)
            mlflow_uri = absolute_store_uri(mlflow_uri)
            artifacts = _absolute_path(artifacts) or default_artifacts(mlflow_uri)
        elif artifacts:
            raise TrackingError("--mlflow-artifacts needs --mlflow")
        project = ""
        if wandb_flag is not None:
            project = env.get("WANDB_PROJECT", "santa") if wandb_flag == "env" else wandb_flag
            _require("wandb")
        experiment = env.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT)
        tracking = cls(
            mlflow_uri=mlflow_uri,
            experiment=experiment,
            wandb_project=project,
            env=env,
            mlflow_artifacts=artifacts,
        )
        if mlflow_uri and is_local_store(mlflow_uri):
            tracking.check_mlflow_store()
        return tracking

    def check_mlflow_store(self) -> None:
        """Open the MLflow store and the experiment now (creating a ``sqlite:`` database
        and the experiment where they are new): a store that cannot be used is one line
        naming it, before any Ray work."""
        try:
            self._mlflow_experiment_id(self._mlflow_client())
        except TrackingError:
            raise
        except Exception as error:  # noqa: BLE001 - MLflow's errors are of many kinds
            lines = str(error).strip().splitlines()
            why = lines[0] if lines else type(error).__name__
            raise TrackingError(f"cannot use the MLflow store {self.mlflow_uri}: {why}") from error

    @property
    def active(self) -> bool:
        return bool(self.mlflow_uri or self.wandb_project)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any] | None) -> Tracking:
        return cls(**(payload or {}))

    # ------------------------------------------------------------------ the driver

    def begin(self, *, run_uri: str, name: str, params: dict[str, Any]) -> Tracking:
        """Open (or find again) the tracked run of the santa run at ``run_uri``; returns
        the settings with its ids, for the workers and :meth:`finish`."""
        if not self.active:
            return self
        mlflow_run_id = ""
        flat = {k: v for k, v in _flatten("", params, {}).items() if v not in (None, "")}
        if self.mlflow_uri:
            client = self._mlflow_client()
            experiment_id = self._mlflow_experiment_id(client)
            found = client.search_runs(
                [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_uri}'", max_results=1
            )
            if found:
                mlflow_run_id = found[0].info.run_id
                client.update_run(mlflow_run_id, status="RUNNING")
            else:
                run = client.create_run(experiment_id, tags={RUN_TAG: run_uri}, run_name=name)
                mlflow_run_id = run.info.run_id
                from mlflow.entities import Param

                params_list = [Param(k, str(v)[:6000]) for k, v in sorted(flat.items())]
                for start in range(0, len(params_list), 100):
                    client.log_batch(mlflow_run_id, params=params_list[start : start + 100])
        return Tracking(
            **{
                **self.to_dict(),
                "mlflow_run_id": mlflow_run_id,
                "wandb_run_id": _run_id(run_uri) if self.wandb_project else "",
                "run_name": name,
            }
        )

    def finish(
        self,
        *,
        metrics: dict[str, Any] | None = None,
        evaluation: dict[str, dict[str, Any]] | None = None,
        model_dir: str | None = None,
        failed: bool = False,
        config: dict[str, Any] | None = None,
    ) -> None:
        """Close the tracked run: final metrics, the evaluation table (``{system:
        metrics}``), the model folder (local) as an artifact."""
        if not self.active:
            return
        final = {f"final/{k}": v for k, v in (metrics or {}).items() if _number(v)}
        for system, values in (evaluation or {}).items():
            for key, value in values.items():
                if _number(value) and key != "num_queries":
                    final[f"test/{system}/{key}"] = value
        # The training is done by now: a tracking server that fails here costs a warning,
        # not the job.
        try:
            if self.mlflow_uri and self.mlflow_run_id:
                self._mlflow_finish(final, evaluation, model_dir, failed)
            if self.wandb_project and self.wandb_run_id:
                self._wandb_finish(final, evaluation, model_dir, config)
        except Exception as error:  # noqa: BLE001 - see above
            tracking_warning(f"could not close the tracked run {self.run_name!r}", error)

    def end_early(self, status: str) -> None:
        """Mark the tracked run ``KILLED`` (Ctrl-C) or ``FAILED`` (an error ended the job)
        instead of leaving it ``RUNNING``; a resume under the same name reopens it. At most
        a few seconds: a tracking server that does not answer costs a warning, not the
        interrupt."""
        if not (self.mlflow_uri and self.mlflow_run_id):
            return
        import threading

        def terminate() -> None:
            try:
                self._mlflow_client().set_terminated(self.mlflow_run_id, status=status)
            except Exception as error:  # noqa: BLE001 - the job is ending anyway
                tracking_warning(f"could not mark the tracked run {self.run_name!r}", error)

        closing = threading.Thread(target=terminate, name="santa-tracking-end", daemon=True)
        closing.start()
        closing.join(END_EARLY_WAIT_S)

    def _mlflow_client(self):
        _require("mlflow")
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.mlflow_uri)

    def _mlflow_experiment_id(self, client) -> str:
        """The experiment's id, created (with its artifact location) where it is new."""
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is not None:
            return experiment.experiment_id
        return client.create_experiment(
            self.experiment, artifact_location=self.mlflow_artifacts or None
        )

    def _mlflow_finish(self, final, evaluation, model_dir, failed) -> None:
        import time

        from mlflow.entities import Metric

        client = self._mlflow_client()
        now = int(time.time() * 1000)
        batch = [Metric(_mlflow_key(k), float(v), now, 0) for k, v in sorted(final.items())]
        for start in range(0, len(batch), 500):
            client.log_batch(self.mlflow_run_id, metrics=batch[start : start + 500])
        if evaluation:
            client.log_text(self.mlflow_run_id, json.dumps(evaluation, indent=2), "evaluation.json")
        if model_dir:
            client.log_artifacts(self.mlflow_run_id, model_dir, "model")
        client.set_terminated(self.mlflow_run_id, status="FAILED" if failed else "FINISHED")

    def _wandb_finish(self, final, evaluation, model_dir, config) -> None:
        run = self._wandb_init(config=config)
        try:
            if final:
                run.summary.update(final)
            if evaluation:
                import wandb

                columns = sorted({k for v in evaluation.values() for k in v if k != "by_language"})

                table = wandb.Table(columns=["system", *columns])
                for system, values in evaluation.items():
                    table.add_data(system, *[values.get(c) for c in columns])
                run.log({"evaluation": table})
            if model_dir:
                import wandb

                artifact = wandb.Artifact(f"model-{self.wandb_run_id}", type="model")
                artifact.add_dir(model_dir)
                run.log_artifact(artifact)
        finally:
            run.finish()

    def _wandb_init(self, config: dict[str, Any] | None = None, worker: bool = False):
        """This run's W&B run (resumed where it exists), in this process."""
        import wandb

        _set_env(self.env)
        kwargs = {
            "project": self.wandb_project,
            "id": self.wandb_run_id,
            "name": self.run_name or None,
            "resume": "allow",
            "config": config or None,
            # WANDB_DIR as the job set it: wandb reads its settings once per process, and a
            # process that runs a second job (a notebook, a test) would write to the first's.
            "dir": os.environ.get("WANDB_DIR") or None,
        }
        if worker:  # Ray's integration: API key handling, fork start method
            from ray.air.integrations.wandb import setup_wandb

            kwargs.pop("config")
            return setup_wandb(config=config, rank_zero_only=False, **kwargs)
        return wandb.init(**kwargs)


class WorkerTracker:
    """Rank 0's side: every logged step's metrics into the tracked run."""

    def __init__(self, tracking: Tracking, config: dict[str, Any] | None = None) -> None:
        self.tracking = tracking
        _set_env(tracking.env)  # the driver's MLFLOW_* / WANDB_*, here too
        self._mlflow = tracking._mlflow_client() if tracking.mlflow_run_id else None
        # A resumed run repeats the steps after its checkpoint: MLflow keeps a metric's
        # history as logged, so those steps are not logged twice.
        self._logged_to = self._last_logged_step() if self._mlflow is not None else 0
        self._wandb = (
            tracking._wandb_init(config=config, worker=True) if tracking.wandb_run_id else None
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Log one step's metrics; a tracking server that fails turns logging off for the
        rest of the run with one warning (training goes on)."""
        try:
            self._log(metrics, step)
        except Exception as error:  # noqa: BLE001 - tracking must never stop training
            tracking_warning("experiment tracking is off for the rest of this run", error)
            self._mlflow = None
            self.close()

    def _last_logged_step(self) -> int:
        """The last step this run's MLflow history holds (0 for a new run)."""
        run_id = self.tracking.mlflow_run_id
        keys = [
            k
            for k in self._mlflow.get_run(run_id).data.metrics
            if not k.startswith(("final/", "test/"))
        ]
        # "loss" is logged at every logged step; other keys (dev metrics) at some.
        keys = ["loss"] if "loss" in keys else keys
        history = [m.step for k in keys for m in self._mlflow.get_metric_history(run_id, k)]
        return max(history, default=0)

    def _log(self, metrics: dict[str, Any], step: int) -> None:
        values = {k: float(v) for k, v in metrics.items() if _number(v) and k != "step"}
        if self._mlflow is not None and int(step) > self._logged_to:
            import time

            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            batch = [Metric(_mlflow_key(k), v, now, int(step)) for k, v in sorted(values.items())]
            self._mlflow.log_batch(self.tracking.mlflow_run_id, metrics=batch)
        if self._wandb is not None:
            self._wandb.log(values, step=int(step))

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def tracking_warning(what: str, error: BaseException) -> None:
    """One ``santa: warning:`` line for a tracking failure that does not stop the job."""
    print(f"santa: warning: {what}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


def _mlflow_key(key: str) -> str:
    """MLflow keys allow letters, digits, ``_ - . / space``: ``mrr@100`` → ``mrr_at_100``."""
    return key.replace("@", "_at_").replace("(", "").replace(")", "")


def _set_env(env: dict[str, str]) -> None:
    """Set the driver's ``MLFLOW_*`` / ``WANDB_*`` in this process where they are not set
    (a worker)."""
    for key, value in env.items():
        os.environ.setdefault(key, value)


def _require(package: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise TrackingError(
            f"--{package} needs the {package} package: pip install 'santa[tracking]' "
            f"(or pip install {package})"
        )


def _store_scheme(uri: str) -> str:
    """``sqlite`` for ``sqlite:///x.db`` and ``sqlite+pysqlite:///x.db``; ``""`` for a path."""
    scheme = urlparse(uri).scheme.split("+")[0].lower()
    return "" if len(scheme) == 1 else scheme  # a Windows drive letter is a path


def _require_store_packages(uri: str) -> None:
    """A database store needs SQLAlchemy and alembic (not in mlflow-skinny): without them
    MLflow fails only when the first run is opened, after Ray started."""
    if _store_scheme(uri) not in DATABASE_SCHEMES:
        return
    missing = [name for module, name in DATABASE_PACKAGES.items() if not _find(module)]
    if missing:
        raise TrackingError(
            f"--mlflow {uri} needs {' and '.join(missing)} (MLflow's database store): "
            f"pip install 'santa[tracking]' (or pip install {' '.join(missing).lower()})"
        )


def _find(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def is_local_store(uri: str) -> bool:
    """A store on this machine (a ``sqlite:`` file, a folder): cheap to open before Ray."""
    return _store_scheme(uri) in ("", "file", "sqlite")


def _absolute_path(path: str) -> str:
    """A local path made absolute (an ``s3://`` or other URI as it is)."""
    if not path or "://" in path:
        return path
    return os.path.abspath(os.path.expanduser(path))


def absolute_store_uri(uri: str) -> str:
    """``uri`` with a relative local path made absolute: Ray Train's workers run in a
    folder of their own, where ``sqlite:///mlflow.db`` would name another database."""
    scheme = _store_scheme(uri)
    if scheme == "":
        return _absolute_path(uri)
    if scheme != "sqlite":
        return uri
    head, sep, rest = uri.partition(":///")  # sqlite:///rel.db, sqlite:////abs.db
    path, mark, query = rest.partition("?")
    if not sep or not path or path == ":memory:" or os.path.isabs(path):
        return uri
    return f"{head}:///{os.path.abspath(os.path.expanduser(path))}{mark}{query}"


def default_artifacts(uri: str) -> str:
    """Where a new experiment of the store at ``uri`` keeps artifacts: beside a ``sqlite:``
    file (MLflow's own default is ``./mlruns`` of the current folder); "" for other stores,
    which have their own (a folder store, a server's artifact root)."""
    if _store_scheme(uri) != "sqlite":
        return ""
    path = uri.partition(":///")[2].partition("?")[0]
    if not path or path == ":memory:":
        return ""
    return os.path.join(os.path.dirname(path), ARTIFACTS_BESIDE_DATABASE)


def tune_callbacks(tracking: Tracking) -> list:
    """Tune's own loggers for a sweep: one MLflow / W&B run per trial."""
    callbacks = []
    if tracking.mlflow_uri:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        class SantaMLflowLogger(MLflowLoggerCallback):
            """Tune's MLflow logger with santa's metric names made MLflow names."""

            def log_trial_result(self, iteration: int, trial, result: dict) -> None:
                renamed = {_mlflow_key(str(k)): v for k, v in result.items()}
                super().log_trial_result(iteration, trial, renamed)

        _set_env(tracking.env)
        callbacks.append(
            SantaMLflowLogger(
                tracking_uri=tracking.mlflow_uri,
                experiment_name=tracking.experiment,
                save_artifact=False,
            )
        )
    if tracking.wandb_project:
        from ray.air.integrations.wandb import WandbLoggerCallback

        _set_env(tracking.env)
        callbacks.append(WandbLoggerCallback(project=tracking.wandb_project, log_config=True))
    return callbacks


def finish_tracking(
    tracked: Tracking,
    result,
    config=None,
    layout=None,
    *,
    evaluation: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Close a training run's tracked run: its final metrics and its final checkpoint's
    model folder (downloaded first when on S3); a failed run is marked failed."""
    if not tracked.active:
        return
    from santa.files import storage
    from santa.files.layout import checkpoint_model

    metrics = dict(getattr(result, "metrics", None) or {})
    checkpoint = getattr(result, "checkpoint", None)
    finish = {
        "metrics": metrics,
        "evaluation": evaluation,
        "failed": getattr(result, "error", None) is not None,
        "config": config.to_dict() if config is not None else None,
    }
    if checkpoint is None or layout is None:
        tracked.finish(**finish)
        return
    model_uri = checkpoint_model(layout.checkpoint_uri(checkpoint))
    if not storage.is_s3(model_uri):
        tracked.finish(**finish, model_dir=model_uri)
        return
    with tempfile.TemporaryDirectory(prefix="santa-artifact-") as local:
        storage.download_dir(model_uri, local, what="model")
        tracked.finish(**finish, model_dir=local)
