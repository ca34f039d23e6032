"""The dataset registry (santa.data.datasets): every dataset the preprocess job accepts is an
entry, and every entry preprocesses through the one dispatch (run_preprocess), from Python
as from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from santa.config.preprocess import STAGES, PreprocessConfig
from santa.data.beir import load_beir
from santa.data.cleaning import split_for_key
from santa.data.datasets import DATASETS, check_inputs, dataset, run_preprocess
from santa.data.published import read_pairs
from santa.files.outputs import read_manifest
from tests.datagen import write_advtest, write_csn_layout, write_esci_splits


def test_every_entry_names_functions_that_exist_and_stages_the_config_takes():
    from ray_jobs import preprocess
    from santa.data.plan import run_plan

    for entry in DATASETS.values():
        assert entry.about and set(entry.stages) <= set(STAGES), entry
        for field in ("run", "check", "default_input", "summary"):
            if getattr(entry, field):
                assert callable(entry.function(field)), (entry.name, field)
        # The config takes each of its stages and defaults to the first.
        config = PreprocessConfig(dataset=entry.name, input="in", output="out")
        assert config.stage == entry.stages[0]
    plan = {name for name, entry in DATASETS.items() if entry.function("run") is run_plan}
    assert plan == {"codesearchnet", "advtest", "esci", "source"}
    config, _, _ = preprocess.parse_args(["--dataset", "source", "--output", "o"])
    assert config.input == dataset("source").function("default_input")()
    with pytest.raises(ValueError, match=r"dataset must be one of \('codesearchnet', "):
        PreprocessConfig(dataset="imagenet", input="in", output="out")
    with pytest.raises(ValueError, match="cosqa has the stage"):
        PreprocessConfig(dataset="cosqa", input="in", output="out", stage="pretrain")
    with pytest.raises(ValueError, match="--asst makes code–code training pairs"):
        PreprocessConfig(dataset="esci", input="in", output="out", asst=True)


def test_the_job_offers_exactly_the_registry(capsys):
    from ray_jobs import preprocess

    with pytest.raises(SystemExit):
        preprocess.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "{" + ",".join(DATASETS) + "}" in out
    with pytest.raises(SystemExit):
        preprocess.parse_args(
            ["--dataset", "pairs", "--input", "i", "--output", "o", "--stage", "eval"]
        )
    assert "pairs has the stage(s) finetune, pretrain, not eval" in capsys.readouterr().err


def _inputs(root: Path) -> dict[str, tuple[str, str]]:
    """A small input of each dataset and the stage to run it at (eval where it has one: no
    NLTK tagger needed, the smallest output)."""
    write_csn_layout(root / "csn", languages=("ruby",))
    write_advtest(root / "advtest")
    write_esci_splits(root / "esci")
    (root / "src").mkdir()
    # A file of the test split (a source tree's split is its file path's hash).
    name = next(f"util_{i}.py" for i in range(100) if split_for_key(f"util_{i}.py") == "test")
    (root / "src" / name).write_text(
        'def add(a, b):\n    """Add two numbers and return the sum."""\n    return a + b\n'
    )
    cosqa = [
        {"idx": f"q{i}", "doc": f"python read file {i}", "code": f"def f{i}(): pass", "label": 1}
        for i in range(6)
    ]
    (root / "cosqa.json").write_text(json.dumps(cosqa))
    lines = [{"query": f"query {i}", "positive": f"def f{i}(): return {i}"} for i in range(5)]
    (root / "pairs.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return {  # source first: the smallest input of the Ray Data plan
        "source": (str(root / "src"), "eval"),
        "codesearchnet": (str(root / "csn"), "eval"),
        "advtest": (str(root / "advtest"), "eval"),
        "esci": (str(root / "esci"), "eval"),
        "cosqa": (str(root / "cosqa.json"), "eval"),
        "pairs": (str(root / "pairs.jsonl"), "finetune"),
    }


def test_every_registry_dataset_preprocesses_through_run_preprocess(tmp_path, ray_cluster):
    inputs = _inputs(tmp_path / "in")
    assert set(inputs) == set(DATASETS), "a new dataset needs an input here"
    ran = set()
    for name, (input_uri, stage) in inputs.items():
        output = str(tmp_path / "out" / name)
        config = PreprocessConfig(dataset=name, input=input_uri, output=output, stage=stage)
        check_inputs(config)  # each dataset's own checks accept its input
        function = dataset(name).function("run")
        if function in ran:
            # The same function (the Ray Data plan) ran on an earlier dataset here; each
            # dataset's own runs are in test_pipeline.py and test_esci_data.py.
            continue
        ran.add(function)
        report = run_preprocess(config)
        manifest = read_manifest(output)
        assert manifest is not None and manifest["config"]["dataset"] == name, name
        if stage == "eval":
            beir = load_beir(output)
            assert beir.queries and beir.corpus, name
        else:
            assert read_pairs(output).num_rows == report["rows_written"] == 5
        assert dataset(name).function("summary")(report)  # what the job prints
