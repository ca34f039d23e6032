"""What the driver can check in a second is checked before Ray starts (issue 33): a corrupt
``--init-checkpoint``, a missing ``--hard-negatives table:``, languages of a flat folder, a
corrupt ESCI file — each one line naming the file and why, exit 2, no ``Ray:`` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from santa.models.weights import model_folder_problem, safetensors_problem
from tests.datagen import other_language_records
from tests.training import stdlib_pair_rows, write_pairs

REPO = Path(__file__).resolve().parents[1]


def _job(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def _in_process(monkeypatch, capfd, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module *args`` as a library call (``main(argv)``): the same checks and
    line, without a Python of its own to start (~5 s each with torch); what it printed
    (file descriptors 1 and 2) and returned. It must not start Ray."""
    import importlib

    started = _no_ray(monkeypatch)
    capfd.readouterr()
    code = importlib.import_module(module).main(list(args))
    out, err = capfd.readouterr()
    assert started == [], err
    return subprocess.CompletedProcess([module, *args], code, out, err)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A tiny santa model folder (config.json, model.safetensors, tokenizer)."""
    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer

    texts = [row["query"] for row in stdlib_pair_rows()] + [
        r["document"] for r in stdlib_pair_rows()
    ]
    tokenizer = train_tokenizer(texts, vocab_size=500)
    model = DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0)
    root = tmp_path_factory.mktemp("model") / "model"
    model.save_pretrained(str(root), santa_config=get_recipe("tiny"))
    return root


def _corrupt_copy(model_folder: Path, target: Path, keep_bytes: int) -> Path:
    import shutil

    shutil.copytree(model_folder, target)
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:keep_bytes])
    return target


def test_a_whole_model_folder_has_no_problem(model_folder: Path) -> None:
    assert model_folder_problem(str(model_folder)) is None


def test_safetensors_cut_short_is_named_with_its_reason(model_folder: Path, tmp_path: Path) -> None:
    import pyarrow.fs as pafs

    header_cut = _corrupt_copy(model_folder, tmp_path / "header", keep_bytes=40)
    reason = safetensors_problem(pafs.LocalFileSystem(), str(header_cut / "model.safetensors"))
    assert reason is not None and reason.startswith("invalid header length")
    size = (model_folder / "model.safetensors").stat().st_size
    data_cut = _corrupt_copy(model_folder, tmp_path / "data", keep_bytes=size - 100)
    file_uri, reason = model_folder_problem(str(data_cut))
    assert file_uri.endswith("model.safetensors") and "cut short" in reason
    (data_cut / "config.json").write_text("{not json")
    file_uri, reason = model_folder_problem(str(data_cut))
    assert file_uri.endswith("config.json") and "not valid JSON" in reason


def test_finetune_with_a_corrupt_init_checkpoint_fails_before_ray(
    model_folder: Path, tmp_path: Path
) -> None:
    corrupt = _corrupt_copy(model_folder, tmp_path / "ckpt" / "model", keep_bytes=40)
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    started = time.monotonic()
    proc = _job(
        "ray_jobs.finetune", "--data", data, "--storage", str(tmp_path / "runs"), "--name", "ft",
        "--init-checkpoint", str(corrupt), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("santa: error: cannot load --init-checkpoint ")
    assert f"{corrupt}/model.safetensors: invalid header length" in lines[0]
    assert "Ray:" not in proc.stdout and time.monotonic() - started < 60
    assert not (tmp_path / "runs" / "ft").exists() or not any((tmp_path / "runs" / "ft").iterdir())


@pytest.mark.parametrize("keep", ["header", "data"])
def test_a_corrupt_model_folder_is_named_when_it_loads(
    model_folder: Path, tmp_path: Path, keep: str
) -> None:
    """Loading (evaluate, export, index, a worker's init) names the broken file and why,
    whatever the library raised: safetensors' own SafetensorError for a header cut short."""
    from santa.models.dual_encoder import DualEncoder

    size = (model_folder / "model.safetensors").stat().st_size
    corrupt = _corrupt_copy(
        model_folder, tmp_path / "model", keep_bytes=40 if keep == "header" else size - 100
    )
    with pytest.raises(ValueError, match=r"^cannot load checkpoint .*model\.safetensors: "):
        DualEncoder.from_pretrained(str(corrupt))


def test_evaluate_with_a_corrupt_checkpoint_names_the_file(
    model_folder: Path, tmp_path: Path, monkeypatch, capfd
) -> None:
    from bench.corpora import write_beir

    corrupt = _corrupt_copy(model_folder, tmp_path / "model", keep_bytes=40)
    beir = write_beir(tmp_path / "beir", stdlib_pair_rows()[-24:])
    proc = _in_process(
        monkeypatch, capfd, "ray_jobs.evaluate", "--checkpoint", str(corrupt), "--data",
        str(beir), "--baseline", "none",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"santa: error: cannot load checkpoint {corrupt}/model.safetensors: invalid header "
        f"length {_header_length(corrupt)} for a file of 40 bytes (the file is cut short or "
        "not safetensors)"
    ]


def test_a_job_without_ray_keeps_library_lines_off_its_output(evaluate_cli_run) -> None:
    """evaluate on a small set never starts Ray: faiss's loader lines and transformers'
    weight-loading bar (into a pipe) still go to its log file, not the output (conftest's
    ``evaluate_cli_run``, progress bars not turned off)."""
    proc = evaluate_cli_run["proc"]
    assert proc.returncode == 0, proc.stderr
    assert "faiss" not in proc.stderr.lower() and "Loading weights" not in proc.stderr, proc.stderr
    assert "| model |" in proc.stdout
    assert not any(line.startswith("Ray:") for line in proc.stdout.splitlines())


def _header_length(folder: Path) -> int:
    import struct

    return struct.unpack("<Q", (folder / "model.safetensors").read_bytes()[:8])[0]


def test_a_missing_hard_negatives_table_fails_before_ray(
    tmp_path: Path, monkeypatch, capfd
) -> None:
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    common = ["--data", data, "--storage", str(tmp_path / "runs"), "--name", "ft"]
    proc = _in_process(
        monkeypatch, capfd, "ray_jobs.finetune", *common,
        "--hard-negatives", f"table:{tmp_path / 'no-table'}",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-table" in lines[0], proc.stderr
    assert "Ray:" not in proc.stdout
    (tmp_path / "empty-table").mkdir()
    proc = _in_process(
        monkeypatch, capfd, "ray_jobs.finetune", *common,
        "--hard-negatives", f"table:{tmp_path / 'empty-table'}",
    )  # fmt: skip
    assert proc.returncode == 2 and "holds no hard-negatives table" in proc.stderr, proc.stderr


def test_languages_of_a_flat_folder_are_read_from_its_records(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    records = other_language_records("ruby", 5)
    (flat / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = _job(
        "ray_jobs.preprocess", "--dataset", "codesearchnet", "--input", str(flat),
        "--output", str(tmp_path / "out"), "--languages", "python", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"santa: error: no python files under {flat} (languages found: ruby)"
    ]
    assert not (tmp_path / "out").exists()


def test_a_split_missing_from_the_input_is_named_before_ray(tmp_path: Path) -> None:
    folder = tmp_path / "csn" / "ruby"
    folder.mkdir(parents=True)
    records = other_language_records("ruby", 5)
    (folder / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = _job(
        "ray_jobs.preprocess", "--dataset", "codesearchnet", "--input", str(tmp_path / "csn"),
        "--output", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"santa: error: no train files under {tmp_path / 'csn'} (splits found: valid; choose "
        "one with --split)"
    ]
    assert "Ray:" not in proc.stdout
    assert not (tmp_path / "out").exists()


def test_a_corrupt_esci_file_is_named(tmp_path: Path) -> None:
    from tests.datagen import write_esci

    write_esci(tmp_path / "esci")
    products = tmp_path / "esci" / "shopping_queries_dataset_products.parquet"
    products.write_bytes(products.read_bytes()[:-200])
    proc = _job(
        "ray_jobs.preprocess", "--dataset", "esci", "--input", str(tmp_path / "esci"),
        "--output", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(products) in lines[0], proc.stderr
    assert "Ray:" not in proc.stdout


def _no_ray(monkeypatch) -> list:
    """Record any start of Ray (none is expected)."""
    from santa.cluster import ray_utils

    started: list = []
    monkeypatch.setattr(ray_utils, "init_ray", lambda *a, **k: started.append(a) or "")
    return started


def test_a_recipe_without_scoders_negatives_is_refused_before_ray(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """``ray_jobs.scoder --recipe tiny`` (no hard negatives per query) failed ~4 minutes in,
    after the warm-up, on the discriminators' scores of shape (8, 1): now one line and exit
    2 before Ray starts, naming the recipes that fit; the sweep's SCodeR objective too."""
    from ray_jobs import scoder
    from tuning import sweep

    started = _no_ray(monkeypatch)
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    argv = ["--recipe", "tiny", "--data", data, "--storage", str(tmp_path / "runs")]
    assert scoder.main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "santa: error: recipe 'tiny' has no hard negatives per query (negatives.per_query=0), "
        "which SCodeR's listwise examples need; recipes for SCodeR: minilm-scoder, "
        "tiny-ci-scoder, tiny-scoder, unixcoder-scoder (or --set negatives.per_query=N)"
    )
    beir = tmp_path / "beir"  # never read: the recipe is refused first
    argv = ["--recipe", "tiny", "--data", data, "--eval-data", str(beir), "--objective", "scoder"]
    assert sweep.main([*argv, "--storage", str(tmp_path / "sweeps"), "--max-steps", "4"]) == 2
    assert "recipes for SCodeR: minilm-scoder" in capsys.readouterr().err
    assert started == [] and not (tmp_path / "runs").exists()


def test_a_recipe_that_is_no_pipelines_is_refused_naming_those_that_are(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """``ray_jobs.pipeline --recipe tiny-scoder`` named a recipe 'tiny-scoder-finetune' it
    could not find; now the line says what the pipeline takes, before Ray and the corpus."""
    from ray_jobs import pipeline

    started = _no_ray(monkeypatch)
    argv = ["--recipe", "tiny-scoder", "--storage", str(tmp_path / "runs")]
    assert pipeline.main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("santa: error: recipe 'tiny-scoder' is not a pipeline's")
    assert line.endswith(
        "recipes for the pipeline: codet5-base-adv, codet5-base-adv-table2, "
        "codet5-base-code, codet5-base-codesearch, minilm, qwen2.5-coder-1.5b-lora-fsdp, "
        "t5-base-esci, t5-base-product, tiny, tiny-ci, tiny-decoder"
    )
    assert started == [] and not (tmp_path / "runs").exists()


def test_mep_on_an_encoder_only_backbone_names_the_recipes_that_train_it(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """``--recipe minilm --set train.mep_weight=1``: one line before Ray, with the recipes
    that do train MEP (a T5 backbone)."""
    from ray_jobs import pretrain

    started = _no_ray(monkeypatch)
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    argv = ["--recipe", "minilm", "--data", data, "--storage", str(tmp_path / "runs")]
    assert pretrain.main([*argv, "--name", "r", "--set", "train.mep_weight=1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("santa: error: recipe 'minilm': MEP (train.mep_weight=1.0) needs a T5")
    assert line.endswith(
        "; recipes with MEP: codet5-base-adv, codet5-base-adv-table2, codet5-base-code, "
        "codet5-base-codesearch, t5-base-esci, t5-base-product, tiny, tiny-ci"
    )
    assert started == []
