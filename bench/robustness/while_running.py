"""The faults bench's cases while a job runs (issues 33 and 40): Ctrl-C, `ray job stop`,
a killed worker, driver or miner, S3 going silent, two writers, hard negatives that never
come, a lost node; Ctrl-C of index and export, two writers into export, index and
mine_negatives, S3 stopped while Ray Data reads. ``bench/robustness/faults.py`` runs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

from bench.robustness.fault import (
    RUN_TINY,
    TINY,
    Fault,
    FirstWriter,
    _ctrl_c_twice,
    _descendant,
    _exists,
    _finished,
    _job_stop,
    _kept,
    _kill_process,
    _killpg,
    _lock_free,
    _same_embeddings,
    _session_of,
    _when,
    corrupt_model,
    lost_node,
    tiny_model,
)
from bench.robustness.lost_node import ELASTIC_STEPS


class RunningCase:
    """What the faults while jobs run share: their folders, the inputs some of them need (a
    ghost table, a corrupt model, a flat Ruby folder, a cut ESCI file, earlier outputs to
    keep, a corpus whose refresh outlasts a short stage), the command builders and the
    actions that stop or resume things."""

    def __init__(self, work: Path, moto: str, pausable, pausable_url: str) -> None:
        from bench.corpora import other_language_records, stdlib_pair_rows, write_esci, write_pairs
        from santa.cluster.reaper import session_processes
        from santa.files import storage
        from santa.files.outputs import staged_output
        from santa.negatives.table import write_id_table

        pairs, beir = str(work / "pairs"), str(work / "beir")
        runs = work / "running"
        s3 = {
            "AWS_ENDPOINT_URL": moto,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        paused = {**s3, "AWS_ENDPOINT_URL": pausable_url, "SANTA_S3_READ_TIMEOUT": "3"}
        import boto3

        boto3.client("s3", endpoint_url=pausable_url, region_name="us-east-1").create_bucket(
            Bucket="paused"
        )

        def train(name: str, *extra: str, job: str = "ray_jobs.pretrain") -> list[str]:
            return [job, "--data", pairs, "--storage", str(runs), "--name", name, *RUN_TINY, *extra]

        # Inputs some faults need: a ghost table, a corrupt model, a flat Ruby folder, ESCI.
        ghost = {str(stdlib_pair_rows()[0]["query_id"]): ["no-such-doc"]}
        write_id_table(ghost, None, str(work / "ghost-table"))
        flat = work / "flat-ruby"
        flat.mkdir()
        flat.joinpath("part.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in other_language_records("ruby", 5))
        )
        write_esci(work / "esci")
        products = work / "esci" / "shopping_queries_dataset_products.parquet"
        products.write_bytes(products.read_bytes()[:-200])
        previous_eval = work / "previous-eval"
        with staged_output(str(previous_eval), tool="evaluate") as staged:
            storage.write_bytes(storage.join(staged.staging, "metrics.json"), b"{}")
            staged.publish({"systems": ["model"]})
        previous_neg = work / "previous-neg"
        with staged_output(str(previous_neg), tool="mine_negatives") as staged:
            storage.write_bytes(storage.join(staged.staging, "negatives.parquet"), b"kept")
            staged.publish({"queries": 0})
        corrupt_model(work / "corrupt-model")
        # A corpus whose refresh (encoding every document) outlasts a short stage.
        copies = [
            dict(row, id=f"{row['id']}-{k}", doc_id=f"{row['doc_id']}-{k}")
            | {"query_id": f"{row['query_id']}-{k}", "document": f"{row['document']} # {k}"}
            for k in range(40)
            for row in stdlib_pair_rows()
        ]
        big_pairs = write_pairs(work / "big-pairs", copies)
        session: dict[str, str] = {}
        holders = contextlib.ExitStack()

        def hold_busy() -> None:  # another preprocess writing into the output
            from santa.files.outputs import claim_output

            holders.enter_context(claim_output(str(work / "busy-out"), "preprocess"))

        def release_busy() -> None:
            holders.close()

        def kill_driver(proc, head) -> None:
            session["dir"] = _session_of(head)
            proc.kill()

        def ray_gone() -> bool:
            deadline = time.time() + 60
            while time.time() < deadline and session_processes(
                session.get("dir") or "/nonexistent"
            ):
                time.sleep(1)
            return bool(session.get("dir")) and not session_processes(session["dir"])

        def stop_s3(proc, head) -> None:
            os.kill(pausable.pid, signal.SIGSTOP)

        def resume_s3() -> None:
            os.kill(pausable.pid, signal.SIGCONT)

        evaluate = ["ray_jobs.evaluate", "--checkpoint", str(runs / "cut"), "--data", beir]
        sweep = [
            "tuning.sweep", "--data", pairs, "--eval-data", beir, "--storage", str(work / "sweeps"),
            "--name", "cut", "--num-samples", "2", "--max-steps", "4", "--eval-every", "2",
            "--scheduler", "fifo", "--max-concurrent", "1", "--seed", "0", *TINY,
        ]  # fmt: skip
        step = "[train] step "
        self.__dict__.update(
            {name: value for name, value in locals().items() if name not in ("self", "moto")}
        )


def interrupt_faults(case: RunningCase) -> list[Fault]:
    """Ctrl-C and ``ray job stop`` of each kind of job, and the re-runs after them."""
    work = case.work
    runs = case.runs
    pairs = case.pairs
    beir = case.beir
    train = case.train
    step = case.step
    evaluate = case.evaluate
    sweep = case.sweep
    previous_eval = case.previous_eval
    previous_neg = case.previous_neg
    return [
        Fault(
            "pretrain: Ctrl-C mid-run (process group)",
            train("cut", "--max-steps", "8"),
            130,
            at_line=f"{step}5/",
            action=_killpg(signal.SIGINT),
            check=lambda: _kept(runs / "cut"),
            running=True,
        ),
        Fault(
            "pretrain: re-run after Ctrl-C",
            train("cut", "--max-steps", "8"),
            0,
            success_line="checkpoint:",
            check=lambda: _finished(runs / "cut", 8),
            running=True,
        ),
        Fault(
            "pretrain: ray job stop (SIGTERM) mid-run",
            train("stopped", "--max-steps", "8"),
            130,
            at_line=f"{step}3/",
            action=_job_stop,
            check=lambda: _kept(runs / "stopped"),
            running=True,
        ),
        Fault(
            "pretrain: Ctrl-C twice",
            train("twice", "--max-steps", "8"),
            130,
            at_line=f"{step}3/",
            action=_ctrl_c_twice,
            check=lambda: _kept(runs / "twice"),
            running=True,
        ),
        Fault(
            "finetune: Ctrl-C mid-run",
            train("ft-cut", "--max-steps", "8", job="ray_jobs.finetune"),
            130,
            at_line=f"{step}3/",
            action=_killpg(signal.SIGINT),
            check=lambda: _kept(runs / "ft-cut"),
            running=True,
        ),
        Fault(
            "pipeline: Ctrl-C mid-stage",
            [
                "ray_jobs.pipeline",
                "--data",
                pairs,
                "--eval-data",
                beir,
                "--storage",
                str(runs),
                "--name",
                "pipe",
                "--max-steps",
                "4",
                "--baseline",
                "none",
                *RUN_TINY,
            ],  # fmt: skip
            130,
            at_line="[train] step 3/",
            action=_killpg(signal.SIGINT),
            check=lambda: _lock_free(runs / "pipe"),
            running=True,
        ),
        Fault(
            "sweep: Ctrl-C before a trial's first result",
            sweep,
            130,
            at_line="[sweep] trial",
            action=_killpg(signal.SIGINT),
            check=lambda: not (work / "sweeps" / "cut" / "best.json").exists(),
            running=True,
        ),
        Fault(
            "sweep: re-run after Ctrl-C",
            sweep,
            0,
            success_line="wrote ",
            check=lambda: (
                json.loads((work / "sweeps" / "cut" / "best.json").read_text())["step"] == 4
            ),
            running=True,
        ),
        Fault(
            "evaluate: Ctrl-C mid-run keeps the output",
            [*evaluate, "--output", str(previous_eval)],
            130,
            action=_killpg(signal.SIGINT, pause_s=0.0),
            delay_s=4.0,
            watch=[previous_eval],
            running=True,
        ),
        Fault(
            "mine_negatives: Ctrl-C mid-run keeps the output",
            [
                "ray_jobs.mine_negatives",
                "--checkpoint",
                str(runs / "cut"),
                "--data",
                pairs,
                "--output",
                str(previous_neg),
            ],  # fmt: skip
            130,
            at_line="mining",
            action=_killpg(signal.SIGINT, pause_s=0.2),
            watch=[previous_neg],
            running=True,
        ),
        Fault(
            "preprocess: ray job stop (SIGTERM) mid-run",
            [
                "ray_jobs.preprocess",
                "--dataset",
                "codesearchnet",
                "--input",
                str(work / "big"),
                "--output",
                str(work / "previous"),
                "--address",
                "local",
            ],  # fmt: skip
            130,
            at_line="Ray:",
            action=_job_stop,
            watch=[work / "previous"],
            running=True,
        ),
    ]


def process_faults(case: RunningCase) -> list[Fault]:
    """A killed training worker, driver or miner; negatives that never come; a bad table."""
    work = case.work
    runs = case.runs
    train = case.train
    step = case.step
    big_pairs = case.big_pairs
    kill_driver = case.kill_driver
    ray_gone = case.ray_gone
    return [
        Fault(
            "pretrain: kill -9 a training worker",
            train("worker", "--max-steps", "8", "--max-failures", "1"),
            0,
            at_line=f"{step}5/",
            action=_kill_process("ray::RayTrainWorker"),
            success_line="santa: warning: a training worker died",
            check=lambda: _finished(runs / "worker", 8),
            running=True,
        ),
        Fault(
            "pretrain: kill -9 a training worker, --max-failures 0",
            train("worker0", "--max-steps", "8", "--max-failures", "0"),
            1,
            at_line=f"{step}3/",
            action=_kill_process("ray::RayTrainWorker"),
            check=lambda: _kept(runs / "worker0"),
            running=True,
        ),
        Fault(
            "pretrain: kill -9 the driver (its local Ray goes too)",
            train("driver", "--max-steps", "8"),
            -9,
            at_line=f"{step}2/",
            action=kill_driver,
            check=ray_gone,
            running=True,
        ),
        Fault(
            "finetune: kill -9 the miner actor",
            train(
                "miner",
                "--max-steps",
                "60",
                "--hard-negatives",
                "async",
                "--set",
                "negatives.refresh_every=5",
                "--set",
                "negatives.wait_for_first=true",
                "--set",
                "train.checkpoint_every=60",
                job="ray_jobs.finetune",
            ),  # fmt: skip
            0,
            at_line=f"{step}10/",
            action=_kill_process("ray::HardNegativeMiner"),
            success_line="santa: warning: the hard-negative miner died",
            check=lambda: _finished(runs / "miner", 60),
            running=True,
        ),
        Fault(
            "finetune: async negatives that never come",
            [
                "ray_jobs.finetune",
                "--data",
                big_pairs,
                "--storage",
                str(runs),
                "--name",
                "never",
                *RUN_TINY,
                "--max-steps",
                "4",
                "--hard-negatives",
                "async",
                "--set",
                "negatives.refresh_every=1000",
            ],
            0,
            success_line="santa: warning: hard negatives: no table arrived",
            check=lambda: _finished(runs / "never", 4),
            running=True,
        ),
        Fault(
            "finetune: a table naming unknown documents (fails in the worker)",
            train(
                "ghost",
                "--max-steps",
                "4",
                "--hard-negatives",
                f"table:{work / 'ghost-table'}",
                job="ray_jobs.finetune",
            ),  # fmt: skip
            2,
            check=lambda: _lock_free(runs / "ghost"),
            running=True,
        ),
    ]


def plan_faults(case: RunningCase) -> list[Fault]:
    """What is checked before Ray: a plan that cannot run, inputs cut short or mismatched."""
    work = case.work
    runs = case.runs
    beir = case.beir
    train = case.train
    flat = case.flat
    return [
        Fault(
            "pretrain: --gpu on a machine without one",
            train("no-gpu", "--gpu"),
            2,
            watch=[runs / "no-gpu"],
        ),
        Fault(
            "pretrain: 3 workers of 1 CPU on a 2-CPU cluster (plan cannot be placed)",
            train("starved", "--num-workers", "3", "--cpus-per-worker", "1"),
            2,
            watch=[runs / "starved"],
        ),
        Fault(
            "finetune: --init-checkpoint cut short",
            train(
                "corrupt", "--init-checkpoint", str(work / "corrupt-model"), job="ray_jobs.finetune"
            ),
            2,
            watch=[runs / "corrupt"],
        ),
        Fault(
            "finetune: --hard-negatives table: missing",
            train(
                "notable", "--hard-negatives", f"table:{work / 'no-table'}", job="ray_jobs.finetune"
            ),
            2,
            watch=[runs / "notable"],
        ),
        Fault(
            "preprocess: --languages python on a flat Ruby folder",
            ["ray_jobs.preprocess", "--dataset", "codesearchnet", "--input", str(flat)]
            + ["--output", str(work / "flat-out"), "--languages", "python"],
            2,
            check=lambda: not (work / "flat-out").exists(),
        ),
        Fault(
            "preprocess: ESCI products cut short",
            ["ray_jobs.preprocess", "--dataset", "esci", "--input", str(work / "esci")]
            + ["--output", str(work / "esci-out")],
            2,
            check=lambda: not (work / "esci-out").exists(),
        ),
        Fault(
            "evaluate: checkpoint cut short",
            ["ray_jobs.evaluate", "--checkpoint", str(work / "corrupt-model"), "--data", beir]
            + ["--baseline", "none"],
            2,
        ),
    ]


def writer_faults(case: RunningCase) -> list[Fault]:
    """One writer per output: another tool's output, a re-run, a second writer."""
    work = case.work
    runs = case.runs
    evaluate = case.evaluate
    previous_eval = case.previous_eval
    hold_busy = case.hold_busy
    release_busy = case.release_busy
    return [
        Fault(
            "evaluate: --output holding a preprocess output",
            [*evaluate, "--output", str(work / "previous"), "--baseline", "none"],
            2,
            watch=[work / "previous"],
        ),
        Fault(
            "evaluate: re-run into its own output leaves no stale file",
            [*evaluate, "--output", str(previous_eval), "--baseline", "none"],
            0,
            success_line="output:",
            check=lambda: (
                sorted(p.name for p in previous_eval.iterdir())
                == ["info.json", "metrics.json", "metrics.md", "report.json", "run.model.trec"]
            ),
            running=True,
        ),
        Fault(
            "export: --to holding a training run",
            ["ray_jobs.export", "--latest", str(runs / "cut"), "--to", str(runs / "worker")]
            + ["--overwrite"],
            2,
            check=lambda: _finished(runs / "worker", 8),
        ),
        Fault(
            "preprocess: a second job into an output in use",
            [
                "ray_jobs.preprocess",
                "--dataset",
                "codesearchnet",
                "--input",
                str(work / "big"),
                "--output",
                str(work / "busy-out"),
            ],  # fmt: skip
            2,
            before=hold_busy,
            after=release_busy,
            check=lambda: not (work / "busy-out").exists(),
            running=True,
        ),
    ]


def s3_faults(case: RunningCase) -> list[Fault]:
    """S3 going silent mid-training, and the re-run once it answers."""
    pairs = case.pairs
    step = case.step
    paused = case.paused
    stop_s3 = case.stop_s3
    resume_s3 = case.resume_s3
    return [
        Fault(
            "pretrain: S3 silent mid-training (moto stopped)",
            [
                "ray_jobs.pretrain",
                "--data",
                pairs,
                "--storage",
                "s3://paused/runs",
                "--name",
                "r",
                *RUN_TINY,
                "--max-steps",
                "8",
                "--max-failures",
                "0",
            ],  # fmt: skip
            1,
            env=paused,
            at_line=f"{step}3/",
            action=stop_s3,
            after=resume_s3,
            running=True,
            timeout_s=600,
        ),
        Fault(
            "pretrain: re-run once S3 answers again",
            [
                "ray_jobs.pretrain",
                "--data",
                pairs,
                "--storage",
                "s3://paused/runs",
                "--name",
                "r",
                *RUN_TINY,
                "--max-steps",
                "8",
            ],  # fmt: skip
            0,
            env=paused,
            success_line="checkpoint: s3://paused/runs/r/",
            running=True,
        ),
    ]


def lost_node_faults(case: RunningCase) -> list[Fault]:
    """A node lost from a two-node cluster, with a fixed and an elastic worker count."""
    work = case.work
    return [
        Fault(
            "pretrain: lost node, fixed size (waits 2 x 20 s, ends)",
            lost_node("fixed", work),
            1,
            running=True,
            santa_lines=2,
            timeout_s=1500,
        ),
        Fault(
            "pretrain: lost node, --num-workers 1-2 (goes on, grows back)",
            lost_node("elastic", work),
            0,
            success_line="training is back to 2 of 1-2 workers",
            check=lambda: _finished(work / "lost-elastic" / "elastic", ELASTIC_STEPS),
            running=True,
            timeout_s=1500,
        ),
    ]


def build_running_faults(work: Path, moto: str, pausable, pausable_url: str) -> list[Fault]:
    """The faults while jobs run (after :func:`build_faults`, whose data they reuse), case
    by case."""
    case = RunningCase(work, moto, pausable, pausable_url)
    return [
        *interrupt_faults(case),
        *process_faults(case),
        *plan_faults(case),
        *writer_faults(case),
        *s3_faults(case),
        *lost_node_faults(case),
    ]


# ============================================================================ issue 40
# Point 9's faults: Ctrl-C of index and export, two writers into export, index and
# mine_negatives, S3 silent while Ray Data reads. (Ctrl-C of mine_negatives, the miner killed
# mid-ANCE and an async stage too short for any table are the rows above.)


def build_more_running_faults(work: Path, pausable, pausable_url: str) -> list[Fault]:
    """Issue 40's faults (after :func:`build_running_faults`, whose inputs they reuse)."""
    import boto3

    from santa.files.layout import output_lock

    pairs, big_pairs, model = str(work / "pairs"), str(work / "big-pairs"), work / "tiny-model"
    tiny_model(model)
    # A model folder of 640 MB (a padding file), so that its export copy takes a while.
    big_model = work / "big-model"
    shutil.copytree(model, big_model)
    block = os.urandom(64 << 20)
    with open(big_model / "padding.bin", "wb") as padding:
        for _ in range(10):
            padding.write(block)
    # The JSON lines of a CodeSearchNet layout on the S3 server that is stopped.
    s3 = {
        "AWS_ENDPOINT_URL": pausable_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = boto3.client("s3", endpoint_url=pausable_url, region_name="us-east-1")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket="paused")
    body = work / "big" / "python" / "final" / "jsonl" / "train" / "python_train_0.jsonl.gz"
    for k in range(4):
        key = f"csn/python/final/jsonl/train/python_train_{k}.jsonl.gz"
        client.put_object(Bucket="paused", Key=key, Body=body.read_bytes())

    exported, idx_whole, idx_cut, neg = (
        work / "exported", work / "idx-whole", work / "idx-cut", work / "neg-first"
    )  # fmt: skip
    export = ["ray_jobs.export", "--checkpoint", str(model), "--to", str(exported)]
    first_export = FirstWriter(export, Path(output_lock(str(exported))))

    def index(output: Path) -> list[str]:
        return [
            "ray_jobs.index", "--checkpoint", str(model), "--corpus", big_pairs,
            "--output", str(output), "--shard-size", "1000", "--actors", "1",
        ]  # fmt: skip

    first_index = FirstWriter(index(idx_whole), Path(output_lock(str(idx_whole))))
    mine = ["ray_jobs.mine_negatives", "--checkpoint", str(model), "--data", pairs]
    mine += ["--output", str(neg)]
    first_mine = FirstWriter(mine, Path(output_lock(str(neg))))

    def stop_s3(proc, head) -> None:
        os.kill(pausable.pid, signal.SIGSTOP)

    def resume_s3() -> None:
        os.kill(pausable.pid, signal.SIGCONT)

    read = ["ray_jobs.preprocess", "--dataset", "codesearchnet", "--input", "s3://paused/csn"]
    read += ["--output", str(work / "s3-read-out"), "--address", "local"]
    write = ["ray_jobs.preprocess", "--dataset", "codesearchnet", "--input", str(work / "big")]
    write += ["--output", "s3://paused/write-out", "--address", "local"]

    def nothing_published() -> bool:
        listed = client.list_objects_v2(Bucket="paused", Prefix="write-out/")
        return not any(item["Key"].endswith("report.json") for item in listed.get("Contents", []))

    return [
        Fault(
            "export: a second job into an output in use (the first finishes)",
            export,
            2,
            before=first_export.start,
            after=first_export.finish,
            check=lambda: first_export.finished(exported / "model.safetensors"),
            running=True,
        ),
        Fault(
            "export: Ctrl-C mid-copy keeps the output",
            ["ray_jobs.export", "--checkpoint", str(big_model), "--to", str(exported)]
            + ["--overwrite"],
            130,
            action=_when(_exists(work, ".exported.partial-*"), _killpg(signal.SIGINT, 0.0)),
            watch=[exported],
            check=lambda: not list(work.glob(".exported.partial-*")),
            running=True,
        ),
        Fault(
            "index: a second job into an output in use (the first finishes)",
            index(idx_whole),
            2,
            before=first_index.start,
            after=first_index.finish,
            check=lambda: first_index.finished(idx_whole / "report.json"),
            running=True,
            timeout_s=900,
        ),
        Fault(
            "index: Ctrl-C mid-encode (a shard written)",
            index(idx_cut),
            130,
            action=_when(
                _exists(work, "idx-cut.partial-*/embeddings/*.parquet"),
                _killpg(signal.SIGINT, 0.0),
            ),
            check=lambda: not (idx_cut / "report.json").exists() and _lock_free(idx_cut),
            running=True,
        ),
        Fault(
            "index: re-run after Ctrl-C",
            index(idx_cut),
            0,
            success_line="[index] resuming",
            check=lambda: (idx_cut / "report.json").is_file(),
            resume=lambda: _same_embeddings(idx_cut, idx_whole),
            running=True,
        ),
        Fault(
            "mine_negatives: a second job into an output in use (the first finishes)",
            mine,
            2,
            before=first_mine.start,
            after=first_mine.finish,
            check=lambda: first_mine.finished(neg / "report.json"),
            running=True,
        ),
        Fault(
            "preprocess: S3 silent during a Ray Data read (moto stopped)",
            read,
            1,
            env=s3,
            action=_when(_descendant("build_code_pairs"), stop_s3),
            after=resume_s3,
            check=lambda: not (work / "s3-read-out").exists(),
            running=True,
        ),
        Fault(
            "preprocess: re-run once S3 answers again",
            read,
            0,
            env=s3,
            success_line="rows written",
            check=lambda: (work / "s3-read-out" / "report.json").is_file(),
            running=True,
        ),
        Fault(
            "preprocess: S3 silent during Ray Data's Parquet upload (moto stopped)",
            write,
            1,
            env=s3,
            # The task that writes the Parquet files to S3 has started (its first S3 call).
            action=_when(_descendant("Write"), stop_s3),
            after=resume_s3,
            check=nothing_published,
            running=True,
        ),
    ]
