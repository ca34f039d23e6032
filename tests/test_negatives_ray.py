"""Hard negatives in training: the async miner actor (a Ray run), and the offline table
mined and trained on (in process: the table read by Ray Train workers is the pipeline's
ANCE stage, tests/test_train.py, and the negatives bench's static run)."""

from __future__ import annotations

import json

import pytest

from ray_jobs import finetune, mine_negatives
from santa.negatives.corpus import load_mining_corpus
from santa.negatives.table import read_negatives_table
from santa.train.trainer import RunSpec, fit
from tests.training import stdlib_pair_rows, tiny_config, write_beir, write_pairs


@pytest.fixture(scope="module")
def train_data(tmp_path_factory) -> str:
    return write_pairs(tmp_path_factory.mktemp("neg-pairs"), stdlib_pair_rows()[:-32])


@pytest.fixture(scope="module")
def dev_data(tmp_path_factory) -> str:
    return write_beir(tmp_path_factory.mktemp("neg-dev"), stdlib_pair_rows()[-32:], "valid")


def test_async_tables_are_swapped_in_without_waiting(async_run_on_fake_gpus):
    """Two workers, 60 steps, a refresh asked every 5 (the run: tests/negatives_runs.py,
    on fake GPUs that the shared-GPU test of tests/test_resources.py reads too)."""
    run = async_run_on_fake_gpus
    result = run["result"]
    assert result.error is None, result.error
    metrics = result.metrics
    assert metrics["step"] == 60 and run["state"]["step"] == 60
    assert metrics["negatives_swaps"] >= 2  # the first table and at least one refresh
    assert 0 < metrics["negatives_step"] <= 60  # mined with trained weights, not step 0's
    assert 0 <= metrics["negatives_staleness"] < 60
    assert metrics["negatives_wait_first_s"] > 0
    assert metrics["negatives_wait_s"] == 0  # never blocked after the first table
    assert metrics["negatives_poll_s"] < 0.05 * 60 * metrics["step_time_s"] + 1.0
    assert metrics["miner_restarts"] == 0 and metrics["miner_errors"] == 0
    assert metrics["negatives_refresh_s"] > 0


@pytest.mark.slow
def test_offline_mining_then_finetuning_on_the_table(train_data, dev_data, tmp_path, capsys):
    init = tmp_path / "ckpt"
    warm = fit(
        tiny_config(stage="finetune", max_steps=4, log_every=2, checkpoint_every=4),
        # The warm start in this process (the mining and the finetune job are the test).
        RunSpec.of(data=train_data, storage=str(init), name="warm", in_process=True),
    )
    assert warm.error is None
    checkpoint = warm.checkpoint.path
    output = tmp_path / "negatives"
    capsys.readouterr()  # only the mining job's own output below
    code = mine_negatives.main(
        ["--checkpoint", checkpoint, "--data", train_data, "--output", str(output)]
        + ["--top-k", "20", "--sample", "2"]
    )
    assert code == 0
    corpus = load_mining_corpus(train_data)
    table = read_negatives_table(str(output), corpus)
    assert table.negatives.shape == (corpus.num_queries, 2)
    for query in range(corpus.num_queries):
        assert len(table.of(query)) == 2
        assert not set(table.of(query)) & set(corpus.positives(query).tolist())
    mined = capsys.readouterr().out
    summary = json.loads(mined[mined.index("{") : mined.rindex("}") + 1])
    assert summary["queries"] == corpus.num_queries

    code = finetune.main(
        ["--recipe", "tiny-ci", "--data", train_data, "--storage", str(tmp_path / "ft")]
        # In this process (the mining, the table's reader, the dev evaluation and the best
        # kept checkpoint are the loop's and the job's, not Ray's): ~20 s less.
        + ["--name", "ft", "--max-steps", "6", "--in-process"]
        + ["--init-checkpoint", checkpoint, "--hard-negatives", f"table:{output}"]
        + ["--negatives-per-query", "2"]
        + ["--set", "train.log_every=3", "--set", "train.checkpoint_every=3"]
        + ["--eval-data", dev_data, "--eval-split", "valid", "--set", "train.eval_every=3"]
        + ["--set", "train.keep_best_by=dev_mrr"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "finished at step 6" in out  # a short table, not every metric (the history below)
    history = (tmp_path / "ft" / "ft" / "metrics.jsonl").read_text().splitlines()
    metrics = json.loads(history[-1])
    assert metrics["step"] == 6
    assert metrics["negatives_step"] == 0 and metrics["negatives_filled"] == 0
    assert metrics["negatives_swaps"] == 0  # a static table is never swapped
    # Dev metrics of the final step, on the held-out BEIR split.
    assert 0 < metrics["dev_mrr"] <= 1 and 0 < metrics["dev_ndcg"] <= 1
    assert metrics["dev_eval_s"] > 0
    # train.keep_best_by: the run's result is its best dev checkpoint, and the job says so.
    scored = [json.loads(line) for line in history if "dev_mrr" in json.loads(line)]
    best = max(scored, key=lambda m: (m["dev_mrr"], m["step"]))
    assert [m["step"] for m in scored] == [3, 6]
    assert f"the best dev_mrr ({best['dev_mrr']:.4f}) of the run's checkpoints, at step " in out
    assert f"at step {best['step']})" in out


def test_bad_hard_negative_sources_are_rejected_before_training(train_data, tmp_path, capsys):
    code = finetune.main(
        ["--data", train_data, "--storage", str(tmp_path), "--name", "bad"]
        + ["--hard-negatives", "sometimes"]
    )
    assert code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("santa: error: NegativesConfig.source must be 'none'")
    assert captured.err.count("\n") == 1 and "Ray:" not in captured.out  # before any Ray work
