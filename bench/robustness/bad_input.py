"""The faults bench's bad-input cases: bad input met before a job starts (bad paths, a
missing bucket and refused credentials on moto's S3 server, a silent S3 endpoint, bad
files, a corrupt checkpoint, a locked run). ``bench/robustness/faults.py`` runs them.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from bench.robustness.fault import TINY, Fault, free_port


def build_faults(work: Path, moto: str, auth_moto: str, silent: str) -> list[Fault]:
    """Every fault: its inputs built under ``work``, S3 on the three endpoints given."""
    from bench.corpora import (
        other_language_records,
        stdlib_pair_rows,
        stdlib_python_records,
        write_beir,
        write_csn_layout,
        write_pairs,
    )
    from santa.files import storage

    s3 = {
        "AWS_ENDPOINT_URL": moto,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    bad_keys = {**s3, "AWS_ENDPOINT_URL": auth_moto, "AWS_ACCESS_KEY_ID": "AKIABADKEY0000000000"}
    hanging = {**s3, "AWS_ENDPOINT_URL": silent}
    closed = {**s3, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    os.environ.update(s3)
    import boto3

    boto3.client("s3", endpoint_url=moto, region_name="us-east-1").create_bucket(Bucket="faults")

    pairs = write_pairs(work / "pairs", stdlib_pair_rows()[:160])
    beir = write_beir(work / "beir", stdlib_pair_rows()[-24:])
    (work / "empty").mkdir()
    (work / "a-file").write_text("not a folder")
    csn = work / "csn"
    write_csn_layout(csn, languages=("ruby",))
    arrays = work / "arrays"
    arrays.mkdir()
    (arrays / "data.json").write_text(json.dumps(other_language_records("ruby", 5)))
    jsonl_array = work / "jsonl-array"
    jsonl_array.mkdir()
    (jsonl_array / "train.jsonl").write_text(
        json.dumps(other_language_records("ruby", 5), indent=1)
    )
    truncated = work / "truncated" / "python" / "final" / "jsonl" / "train"
    truncated.mkdir(parents=True)
    whole = gzip.compress(
        "".join(json.dumps(r) + "\n" for r in stdlib_python_records(limit=200)).encode()
    )
    (truncated / "python_train_0.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])
    big = work / "big" / "python" / "final" / "jsonl" / "train"
    big.mkdir(parents=True)
    (big / "python_train_0.jsonl.gz").write_bytes(
        gzip.compress(
            "".join(json.dumps(r) + "\n" for r in stdlib_python_records(limit=400)).encode()
        )
    )
    # A previous complete output, to be kept whole by the interrupted run.
    previous = work / "previous"
    from santa.files.outputs import staged_output

    with staged_output(str(previous)) as staged:
        storage.write_bytes(storage.join(staged.staging, "data", "part-0.parquet"), b"kept")
        staged.publish({"rows_written": 1, "config": {"dataset": "codesearchnet"}})
    runs = work / "runs"

    def pre(*args: str) -> list[str]:
        return ["ray_jobs.preprocess", "--dataset", "codesearchnet", *args]

    out = work / "out"
    faults = [
        Fault(
            "preprocess: --input missing",
            pre("--input", str(work / "nope"), "--output", str(out)),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: --output under a file",
            pre("--input", str(csn), "--output", str(work / "a-file" / "out")),
            2,
            watch=[work / "a-file"],
        ),
        Fault(
            "preprocess: --input empty folder",
            pre("--input", str(work / "empty"), "--output", str(out)),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: S3 bucket missing",
            pre("--input", str(csn), "--output", "s3://no-such-bucket/out"),
            2,
            env=s3,
        ),
        Fault(
            "preprocess: S3 credentials refused",
            pre("--input", str(csn), "--output", "s3://faults/out"),
            2,
            env=bad_keys,
        ),
        Fault(
            "preprocess: S3 endpoint silent",
            pre("--input", str(csn), "--output", "s3://faults/out"),
            1,
            env=hanging,
        ),
        Fault(
            "preprocess: S3 endpoint closed port",
            pre("--input", str(csn), "--output", "s3://faults/out"),
            1,
            env=closed,
        ),
        Fault(
            "preprocess: bad SANTA_S3_READ_TIMEOUT",
            pre("--input", str(csn), "--output", "s3://faults/out"),
            2,
            env={**s3, "SANTA_S3_READ_TIMEOUT": "soon"},
        ),
        Fault(
            "preprocess: JSON array (.json)",
            pre("--input", str(arrays), "--output", str(out)),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: .jsonl holding one JSON array",
            pre("--input", str(jsonl_array), "--output", str(out)),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: --languages python on Ruby input",
            pre("--input", str(csn), "--output", str(out), "--languages", "python"),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: cosqa file missing",
            [
                "ray_jobs.preprocess",
                "--dataset",
                "cosqa",
                "--input",
                str(work / "cosqa.json"),
                "--output",
                str(out),
                "--stage",
                "eval",
            ],
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: truncated .jsonl.gz",
            pre(
                "--input",
                str(work / "truncated"),
                "--output",
                str(work / "trunc-out"),
                "--address",
                "local",
            ),
            0,
            success_line="dropped  corrupt_file",
        ),
        Fault(
            "preprocess: Ctrl-C mid-run",
            pre("--input", str(work / "big"), "--output", str(previous), "--address", "local"),
            130,
            watch=[previous],
            interrupt_after="Ray:",
            check=lambda: not list(work.glob("previous.tmp-*")),
        ),
        Fault(
            "preprocess: re-run after Ctrl-C",
            pre("--input", str(work / "big"), "--output", str(previous), "--address", "local"),
            0,
            success_line="rows written",
            check=lambda: (
                (previous / "report.json").is_file()
                and not (previous / "data" / "part-0.parquet").exists()
            ),
        ),
    ]
    train = ["--storage", str(runs), "--name", "r", *TINY]
    faults += [
        Fault(
            "pretrain: --data missing",
            ["ray_jobs.pretrain", "--data", str(work / "nope"), *train],
            2,
            watch=[runs],
        ),
        Fault(
            "pretrain: --data without pairs",
            ["ray_jobs.pretrain", "--data", str(work / "empty"), *train],
            2,
            watch=[runs],
        ),
        Fault(
            "pretrain: --storage bucket missing",
            [
                "ray_jobs.pretrain",
                "--data",
                pairs,
                "--storage",
                "s3://no-such-bucket/runs",
                "--name",
                "r",
                *TINY,
            ],
            2,
            env=s3,
        ),
        Fault(
            "pretrain: --eval-data missing",
            ["ray_jobs.pretrain", "--data", pairs, "--eval-data", str(work / "no-dev"), *train],
            2,
            watch=[runs],
        ),
        Fault(
            "pretrain: --max-steps 0",
            ["ray_jobs.pretrain", "--data", pairs, *train, "--max-steps", "0"],
            2,
            watch=[runs],
        ),
        Fault(
            "finetune: --init-checkpoint mistyped",
            [
                "ray_jobs.finetune",
                "--data",
                pairs,
                *train,
                "--init-checkpoint",
                str(work / "runs-typo" / "model"),
            ],
            2,
            watch=[runs],
        ),
        Fault(
            "pretrain: run locked by another job",
            [
                "ray_jobs.pretrain",
                "--data",
                pairs,
                "--storage",
                str(work / "locked"),
                "--name",
                "busy",
                *TINY,
            ],
            2,
            watch=[work / "locked"],
        ),
        Fault(
            "pretrain: 2 steps (setup for the next)",
            ["ray_jobs.pretrain", "--data", pairs, *train, "--max-steps", "2"],
            0,
            success_line="checkpoint:",
        ),
        Fault(
            "pretrain: corrupt latest checkpoint, re-run",
            ["ray_jobs.pretrain", "--data", pairs, *train, "--max-steps", "3"],
            0,
            success_line="cannot be loaded",
        ),
    ]
    evaluate = ["ray_jobs.evaluate", "--baseline", "none"]
    faults += [
        Fault(
            "evaluate: --checkpoint missing",
            [*evaluate, "--checkpoint", str(work / "nope"), "--data", beir],
            2,
        ),
        Fault(
            "evaluate: --data missing",
            [*evaluate, "--checkpoint", str(runs / "r"), "--data", str(work / "nope")],
            2,
        ),
        Fault(
            "evaluate: --data not BEIR",
            [*evaluate, "--checkpoint", str(runs / "r"), "--data", str(work / "empty")],
            2,
        ),
        Fault(
            "evaluate: --output bucket missing",
            [
                *evaluate,
                "--checkpoint",
                str(runs / "r"),
                "--data",
                beir,
                "--output",
                "s3://no-such-bucket/eval",
            ],
            2,
            env=s3,
        ),
        Fault(
            "export: --latest run missing",
            ["ray_jobs.export", "--latest", str(work / "nope"), "--to", str(work / "exported")],
            2,
            check=lambda: not (work / "exported").exists(),
        ),
        Fault(
            "export: S3 credentials refused",
            ["ray_jobs.export", "--latest", "s3://faults/runs/r", "--to", str(work / "exported")],
            2,
            env=bad_keys,
            check=lambda: not (work / "exported").exists(),
        ),
        Fault(
            "export: S3 endpoint silent",
            ["ray_jobs.export", "--latest", "s3://faults/runs/r", "--to", str(work / "exported")],
            1,
            env=hanging,
            check=lambda: not (work / "exported").exists(),
        ),
        Fault(
            "mine_negatives: --data missing",
            [
                "ray_jobs.mine_negatives",
                "--checkpoint",
                str(runs / "r"),
                "--data",
                str(work / "nope"),
                "--output",
                str(work / "neg"),
            ],
            2,
            check=lambda: not (work / "neg").exists(),
        ),
        Fault(
            "mine_negatives: --output under a file",
            [
                "ray_jobs.mine_negatives",
                "--checkpoint",
                str(runs / "r"),
                "--data",
                pairs,
                "--output",
                str(work / "a-file" / "neg"),
            ],
            2,
            watch=[work / "a-file"],
        ),
        Fault(
            "sweep: --eval-data missing",
            [
                "tuning.sweep",
                "--data",
                pairs,
                "--eval-data",
                str(work / "no-dev"),
                "--storage",
                str(work / "sweeps"),
                "--max-steps",
                "2",
            ],
            2,
            check=lambda: not (work / "sweeps").exists(),
        ),
        Fault(
            "sweep: --storage bucket missing",
            [
                "tuning.sweep",
                "--data",
                pairs,
                "--eval-data",
                beir,
                "--storage",
                "s3://no-such-bucket/sweeps",
                "--max-steps",
                "2",
            ],
            2,
            env=s3,
        ),
        Fault(
            "pipeline: --storage under a file",
            ["ray_jobs.pipeline", "--storage", str(work / "a-file" / "runs"), "--name", "p"],
            2,
            watch=[work / "a-file"],
        ),
    ]
    return faults
