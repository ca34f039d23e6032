"""``python -m tuning.sweep`` on a local two-node Ray cluster: best.json, TensorBoard, resume."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import matplotlib.image as plt_image
import pytest

from santa.config.recipes import get_recipe
from santa.files import storage
from santa.files.layout import RUN_SNAPSHOT_FILE
from santa.models.checkpoints import best_checkpoint, latest_checkpoint, load
from tests.training import stdlib_pair_rows, write_beir, write_pairs
from tuning import sweep

# The tiny recipe at test size (tiny-ci), logging every step.
TEST_SIZE = ["train.log_every=1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Training pairs and a held-out BEIR dev set, both from real stdlib functions."""
    rows = stdlib_pair_rows()
    root = tmp_path_factory.mktemp("sweep-data")
    return {
        "train": write_pairs(root / "train", rows[:-32]),
        "dev": write_beir(root / "dev", rows[-32:]),
    }


def sweep_args(data, storage, name, *extra: str, workers: str = "2") -> list[str]:
    sets = [arg for item in TEST_SIZE for arg in ("--set", item)]
    return [
        "--recipe",
        "tiny-ci",
        "--data",
        data["train"],
        "--eval-data",
        data["dev"],
        "--storage",
        str(storage),
        "--name",
        name,
        "--num-workers",
        workers,
        "--cpus-per-worker",
        "0.5",
        "--seed",
        "0",
        *sets,
        *extra,
    ]


# ----------------------------------------------------------------------- without Ray


def test_lambda_field_follows_the_objective():
    tiny = get_recipe("tiny")
    assert sweep.objective(tiny) == "santa" and sweep.lambda_field(tiny) == "train.mep_weight"
    finetune = tiny.with_overrides(["train.stage=finetune"])
    assert sweep.lambda_field(finetune) is None
    minilm = get_recipe("minilm")  # encoder-only: MEP is impossible, λ is not swept
    assert sweep.objective(minilm) == "dr" and sweep.lambda_field(minilm) is None


def test_trial_config_applies_lr_and_lambda():
    base = get_recipe("tiny").to_dict()
    params = {
        "lr": 1.5e-3,
        "lambda": 0.25,
        "sweep": {"santa": base, "lambda_field": "train.mep_weight"},
    }
    config = sweep.trial_config(params)
    assert config.train.learning_rate == 1.5e-3 and config.train.mep_weight == 0.25
    no_lambda = sweep.trial_config({"lr": 2e-4, "sweep": {"santa": base, "lambda_field": None}})
    assert no_lambda.train.mep_weight == get_recipe("tiny").train.mep_weight


def test_max_concurrent_trials_fits_the_cluster():
    fit = sweep.max_concurrent_trials
    assert fit({"CPU": 2}, 2, 0.5, False) == 1  # the test cluster: one at a time
    assert fit({"CPU": 16}, 2, 1.0, False) == 7  # one CPU stays free
    assert fit({"CPU": 64, "GPU": 8}, 2, 1.0, True) == 4  # GPUs bound it
    assert fit({"CPU": 1}, 4, 1.0, False) == 1  # never less than one


def test_base_config_sets_the_eval_cadence():
    args = sweep.build_parser().parse_args(
        ["--data", "d", "--eval-data", "e", "--storage", "s", "--max-steps", "40"]
    )
    config = sweep.base_config(args)
    assert config.train.max_steps == 40
    assert config.train.eval_every == 10 and config.train.checkpoint_every == 10
    args.max_steps = None
    with pytest.raises(ValueError, match="--max-steps"):
        sweep.base_config(args)


def test_results_table_is_sorted_by_the_metric():
    rows = [
        {"trial": "a", "lr": 1e-3, "lambda": 0.5, "dev_mrr": 0.2, "step": 4, "status": "done"},
        {"trial": "b", "lr": 2e-3, "lambda": 1.0, "dev_mrr": 0.4, "step": 4, "status": "done"},
    ]
    table = sweep.format_table(sorted(rows, key=lambda r: -r["dev_mrr"]))
    assert table.splitlines()[0].split() == ["trial", "lr", "λ", "dev_mrr", "step", "status"]
    assert table.splitlines()[1].startswith("b")


# ----------------------------------------------------------------------- on the cluster


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sweep_writes_best_json_tensorboard_and_resumes(
    ray_cluster, data, tmp_path, capsys, monkeypatch
):
    """What a finished sweep writes and what its rerun does, with one trial trained in its
    Tune trial's process (``--in-process``: best.json, the report, TensorBoard and MLflow are
    the sweep's, the same for both kinds of trial). A sweep of Ray Train trials (its sizing
    line, the warden's worker groups, best.json on S3): the killed sweep's test below."""
    # One trial (several trials, their order and resume: the Ctrl-C sweep's test, and the
    # results table's sort order: test_results_table_is_sorted_by_the_metric).
    args = sweep_args(
        data,
        tmp_path,
        "tiny-sweep",
        *("--num-samples", "1", "--max-steps", "4", "--eval-every", "2", "--in-process"),
        workers="1",
    )
    store = f"file://{tmp_path / 'mlruns'}"
    args += ["--address", ray_cluster.address, "--mlflow", store]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for a database
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "1 workers × 0.5 CPU, in process)" in out  # the sizing line
    root = tmp_path / "tiny-sweep"
    best = json.loads((root / "best.json").read_text())
    assert best["metric"] == "dev_mrr" and 0 <= best["value"] <= 1
    assert best["lambda_field"] == "train.mep_weight"
    assert best["config"]["santa"]["train"]["learning_rate"] == best["lr"]
    assert best["config"]["santa"]["train"]["mep_weight"] == best["lambda"]
    assert Path(best["checkpoint"]).is_dir()
    assert Path(best["checkpoint"]).is_relative_to(root / "runs" / f"tiny-sweep-{best['trial_id']}")
    resolved = best_checkpoint(str(root))
    assert resolved.step == best["step"]
    model = load(str(root))  # what santa.load / ray_jobs.export --best read
    assert model.tokenizer is not None and model.model_config.kind == "t5"

    trials = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("train_trial"))
    assert len(trials) == 1
    # Each trial's run folder (.santa-cache beside them: the runs' tokenizer and compile cache)
    runs = sorted(p for p in (root / "runs").iterdir() if not p.name.startswith("."))
    assert len(runs) == 1
    for run in runs:  # the training loop's own event files, one folder per trial
        assert list((run / "tensorboard").glob("events.out.tfevents.*")), run
    for trial in trials:  # and Tune's, beside each trial's params/results
        assert list(trial.glob("events.out.tfevents.*")), trial
        results = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        assert all("dev_mrr" in result for result in results)
    # (A raylet warning of the test session's own cluster may land among the lines.)
    lines = out.splitlines()  # the table's header is the first line that starts "trial "
    start = next(i for i, line in enumerate(lines) if line.startswith("trial "))
    table = [line for line in lines[start:] if "(raylet)" not in line]
    assert table[1].startswith(best["trial_id"])  # best first
    # The sweep's report: the table (best first) and dev MRR over lr × λ, as a page too.
    report = (root / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    first = rows[1]  # after the header
    assert first.startswith(f"| {best['trial_id']} |") and f"{best['value']:.4f}" in first
    assert "![dev_mrr over learning rate × λ](sweep.png)" in report
    assert plt_image.imread(root / "sweep.png").shape[2] in (3, 4)
    assert '<img src="sweep.png"' in (root / "report.html").read_text()
    # MLflow through Tune's own logger: one run per trial, with its dev MRR.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("santa")
    tracked = client.search_runs([experiment.experiment_id])
    assert len(tracked) == 1
    assert max(run.data.metrics["dev_mrr"] for run in tracked) == pytest.approx(best["value"])

    # The same command again: the finished experiment is restored, nothing runs again.
    checkpoints_before = sorted(str(p) for p in (root / "runs").rglob("checkpoint_*"))
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "resuming the sweep" in out
    assert sorted(str(p) for p in (root / "runs").rglob("checkpoint_*")) == checkpoints_before
    assert json.loads((root / "best.json").read_text()) == best


def checkpoints_written(runs: str) -> dict[str, int]:
    """Complete checkpoints (with trainer_state.json) per run under ``runs``."""
    try:
        files = storage.list_files(runs, suffixes=("trainer_state.json",))
    except (storage.StorageError, OSError):  # not there yet
        return {}
    counts: dict[str, int] = {}
    for uri in files:
        run = uri[len(runs) :].strip("/").split("/")[0]
        counts[run] = counts.get(run, 0) + 1
    return counts


@pytest.mark.long(seconds=100)
@pytest.mark.timeout(900)
def test_killed_sweep_on_s3_resumes_its_trials(
    ray_cluster, moto_s3, data, tmp_path, capsys, caplog
):
    """Kill the sweep's driver mid-trial; the same command again finishes the sweep on S3,
    its trial going on from its own checkpoint (one trial: that the trials not yet started
    run after a resume is the Ctrl-C test's, tests/test_interrupts_ray.py). The sweep of
    Ray Train trials: sized for two workers of 0.5 CPU, each trial's worker group shown to
    the sweep's warden."""
    bucket = moto_s3.create_bucket("santa-sweeps")
    name = f"killed-{uuid.uuid4().hex[:6]}"
    args = sweep_args(data, f"{bucket}/sweeps", name, "--num-samples", "1", "--max-steps", "12")
    args += ["--eval-every", "2", "--scheduler", "fifo", "--address", ray_cluster.address]
    caplog.set_level(logging.INFO, logger="santa.train.warden")
    root = f"{bucket}/sweeps/{name}"
    log = tmp_path / "driver.log"
    with open(log, "w") as output:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tuning.sweep", *args],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )
    try:
        # Kill the driver once the first trial has written two of its six checkpoints.
        deadline = time.time() + 420
        while time.time() < deadline and driver.poll() is None:
            if max(checkpoints_written(f"{root}/runs").values(), default=0) >= 2:
                break
            time.sleep(1)
        assert driver.poll() is None, log.read_text()[-3000:]
        written = checkpoints_written(f"{root}/runs")
        assert len(written) == 1 and max(written.values()) >= 2, written
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    assert not storage.exists(f"{root}/best.json")  # it was cut off mid-sweep
    assert "max_concurrent_trials=1" in log.read_text()  # the test cluster: one at a time
    (interrupted,) = written

    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "resuming the sweep" in out
    # The resumed trial's worker group was shown to the sweep's warden (tests/test_warden.py:
    # a trial stopped early leaves none behind), and none was left when the sweep ended.
    (groups,) = [r.args for r in caplog.records if r.msg == "worker groups: %s"]
    assert groups["registered"] >= 1 and groups["watched"] == 0, groups
    best = storage.read_json(f"{root}/best.json")
    assert best["checkpoint"].startswith(f"s3://santa-sweeps/sweeps/{name}/runs/")
    assert best["step"] == 12
    assert len(checkpoints_written(f"{root}/runs")) == 1  # the one trial, no second
    # The interrupted trial went on from its own latest checkpoint, under the same run name.
    final = latest_checkpoint(f"{root}/runs/{interrupted}")
    state = storage.read_json(f"{final.checkpoint_uri}/trainer_state.json")
    assert state["step"] == 12 and state["resumed_at"] and state["resumed_at"][0] >= 2
    model = load(root)  # santa.load follows best.json on S3
    assert model.model_config.kind == "t5"
    files = storage.list_files(root)  # Tune's per-trial event files went to S3 too
    assert len([uri for uri in files if "events.out.tfevents" in uri]) >= 1
    for run in Path("~/santa-runs").expanduser().glob(f"{name}-*"):
        shutil.rmtree(run)  # the trainer's own TensorBoard of S3 runs is kept locally


def test_scoder_objective_sweeps_the_adversarial_weight_in_0_1():
    """``--objective scoder``: λ is SCodeR's weight (Eq. 10), sampled in [0, 1], every stage
    of Algorithm 2 gets the step budget, and a trial's config carries the sampled λ."""
    from ray.tune.search.sample import Float

    base_argv = ["--recipe", "tiny-scoder", "--data", "d", "--eval-data", "e"]
    args = sweep.build_parser().parse_args(
        [*base_argv, "--storage", "s", "--objective", "scoder", "--max-steps", "5"]
    )
    config = sweep.base_config(args)
    assert sweep.objective(config, "scoder") == "scoder"
    assert sweep.objective(config) == "dr"  # auto never guesses SCodeR
    field = sweep.lambda_field(config, "scoder")
    assert field == "scoder.adversarial_weight"
    assert (
        config.scoder.warmup_steps
        == config.scoder.discriminator_steps
        == config.scoder.dual_encoder_steps
        == 5
    )
    space = sweep.search_space(
        args, config, {"lambda_field": field, "objective": "scoder", "santa": config.to_dict()}
    )
    assert isinstance(space["lambda"], Float)
    assert (space["lambda"].lower, space["lambda"].upper) == (0.0, 1.0)
    params = {
        "lr": 3e-4,
        "lambda": 0.7,
        "sweep": {"santa": config.to_dict(), "lambda_field": field, "objective": "scoder"},
    }
    trial = sweep.trial_config(params)
    assert trial.scoder.adversarial_weight == 0.7 and trial.train.learning_rate == 3e-4
    assert trial.train.mep_weight == config.train.mep_weight  # SANTA's λ untouched
    args.lambda_range = [0.0, 1.5]
    with pytest.raises(ValueError, match=r"within \[0, 1\]"):
        sweep.search_space(args, config, {"lambda_field": field, "objective": "scoder"})


@pytest.mark.long(seconds=35)
@pytest.mark.timeout(900)
def test_scoder_sweep_trial_runs_algorithm_2_with_the_sampled_lambda(
    ray_cluster, data, tmp_path, capsys
):
    """A ``--objective scoder`` trial is a whole SCodeR run reporting dev MRR per iteration;
    best.json records its λ as ``scoder.adversarial_weight`` and its dual encoder. The trial
    trains in its own process (``--in-process``: no controller and worker group for each of
    Algorithm 2's stages; the stages on two workers: tests/test_scoder.py's gloo test)."""
    args = sweep_args(
        data,
        tmp_path,
        "scoder-sweep",
        "--recipe",
        "tiny-ci-scoder",
        "--objective",
        "scoder",
        "--num-samples",
        "1",
        "--max-steps",
        "2",
        "--scheduler",
        "fifo",
        "--set",
        "scoder.iterations=1",
        "--in-process",
        workers="1",
    )
    args += ["--address", ray_cluster.address]
    assert sweep.main(args) == 0
    assert "1 workers × 0.5 CPU, in process)" in capsys.readouterr().out  # the sizing line
    root = tmp_path / "scoder-sweep"
    best = json.loads((root / "best.json").read_text())
    assert best["objective"] == "scoder" and best["step"] == 1
    assert best["lambda_field"] == "scoder.adversarial_weight" and 0 <= best["lambda"] <= 1
    assert best["config"]["santa"]["scoder"]["adversarial_weight"] == best["lambda"]
    run = root / "runs" / f"scoder-sweep-{best['trial_id']}"
    manifest = json.loads((run / "iter-1" / "manifest.json").read_text())
    assert best["checkpoint"] == manifest["dual_encoder"] and Path(best["checkpoint"]).is_dir()
    assert manifest["metrics"]["dev_mrr"] == best["value"]
    # Every stage trained in the trial's process: no Ray Train run folder anywhere.
    assert not list(run.rglob(RUN_SNAPSHOT_FILE))
    assert list((run / "warmup").glob("checkpoint_*"))


def test_in_process_sweep_refuses_what_only_ray_trials_do(tmp_path, capsys):
    """``--in-process`` trains one worker per trial on storage its node sees: several workers
    (exit 2) and an s3:// sweep are refused before Ray starts."""
    base = ["--data", "d", "--eval-data", "e", "--max-steps", "4", "--in-process"]
    with pytest.raises(SystemExit) as exited:
        sweep.main([*base, "--storage", str(tmp_path), "--num-workers", "2"])
    assert exited.value.code == 2
    assert "--in-process trains on one worker" in capsys.readouterr().err
    config = sweep.base_config(sweep.build_parser().parse_args([*base, "--storage", "s"]))
    assert config.train.num_workers == 1  # the recipe's 2 workers: one, in the trial
    assert sweep.main([*base, "--storage", "s3://bucket/sweeps"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("santa: error: --in-process keeps each trial's checkpoints"), line
