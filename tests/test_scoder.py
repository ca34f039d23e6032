"""SCodeR's Algorithm 2 (``ray_jobs.scoder``) and its parts."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest

from santa.data.asst_pairs import asst_row
from santa.files import storage
from santa.negatives.corpus import load_mining_corpus
from santa.negatives.table import NegativesTable, read_negatives_table
from santa.scoder.examples import (
    LISTWISE_SCHEMA,
    build_listwise_rows,
    is_heldout,
    read_listwise,
    write_listwise,
)
from santa.scoder.soft_labels import summarize_scores
from tests.training import stdlib_pair_rows, write_beir, write_pairs


def scoder_pairs(root: Path) -> str:
    """Docstring–code pairs of real stdlib functions plus their ASST code–code pairs."""
    rows = stdlib_pair_rows()[:-32]
    asst = [row for row in (asst_row(r, seed=0) for r in rows) if not isinstance(row, str)]
    asst = [dict(row, drop_reason="", row_key="", dedup_key="") for row in asst]
    assert len(asst) > 20
    return write_pairs(root, rows + asst)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    return scoder_pairs(tmp_path_factory.mktemp("scoder-pairs"))


# ----------------------------------------------------------------------- without Ray


def test_listwise_rows_put_the_positive_first_and_sample_mined_negatives(pairs, tmp_path):
    import numpy as np

    corpus = load_mining_corpus(pairs, str(tmp_path / "rows"))
    rng = random.Random(0)
    pool = np.full((corpus.num_queries, 6), -1, dtype=np.int64)
    for query in range(corpus.num_queries):
        drawn = [
            d for d in rng.sample(range(corpus.num_docs), 6) if d not in corpus.positives(query)
        ]
        pool[query, : len(drawn)] = drawn
    table = NegativesTable(negatives=pool)

    def listwise(seed: int, **options) -> list[dict]:
        return list(
            build_listwise_rows(corpus, table, n=3, seed=seed, heldout_fraction=0.2, **options)
        )

    rows = listwise(1, block=50)  # several blocks: streamed
    assert len(rows) == len(corpus.training_rows)
    assert [row["query_id"] for row in rows] == corpus.query_ids(corpus.query_of_training_row)
    kinds = {row["kind"] for row in rows}
    assert kinds == {"text_code", "code_code"}
    for row, query, own in zip(
        rows, corpus.query_of_training_row, corpus.doc_of_training_row, strict=True
    ):
        assert len(row["candidates"]) == 4
        assert row["candidates"][0] == corpus.doc_texts([own])[0]  # the positive first
        negatives = row["candidates"][1:]
        assert all(text in corpus.doc_texts(table.of(int(query))) for text in negatives)
        assert row["heldout"] == is_heldout(row["query_id"], 0.2)
    assert 0 < sum(row["heldout"] for row in rows) < len(rows)
    train = listwise(1, include="train")
    assert len(train) == sum(not row["heldout"] for row in rows) and not any(
        row["heldout"] for row in train
    )
    # Seeded: the same rows again (whatever the block); another seed draws others somewhere.
    assert listwise(1) == rows
    assert listwise(2) != rows
    # An empty pool is topped up with random documents that are not positives.
    empty = NegativesTable(negatives=np.full((corpus.num_queries, 1), -1, dtype=np.int64))
    topped = list(build_listwise_rows(corpus, empty, n=3, seed=1, heldout_fraction=0.0))
    assert all(len(row["candidates"]) == 4 for row in topped)
    assert write_listwise(iter(rows), str(tmp_path / "examples")) == len(rows)
    assert read_listwise(str(tmp_path / "examples")).num_rows == len(rows)


def test_score_summary_is_heldout_accuracy_and_entropy():
    table = pa.table(
        {
            "kind": ["text_code", "text_code", "text_code", "code_code"],
            "heldout": [True, True, False, True],
            "scores": [[5.0, 0.0], [0.0, 5.0], [0.0, 0.0], [1.0, 1.0]],
        }
    )
    summary = summarize_scores(table)
    assert summary["heldout_accuracy_text_code"] == 0.5  # the third row is not held out
    assert summary["heldout_accuracy_code_code"] == 1.0  # a tie ranks the positive first
    assert math.isclose(summary["soft_label_entropy_code_code"], math.log(2))
    assert summary["soft_label_entropy"] < math.log(2)


def test_dual_encoder_scores_each_query_against_its_own_candidates():
    import torch

    from santa.method.losses import similarity_scores
    from santa.scoder.objectives import own_candidate_scores

    queries = torch.randn(3, 5)
    candidates = torch.randn(3, 4, 5)  # 3 queries × (positive + 3 negatives)
    every = similarity_scores(queries, candidates.reshape(12, 5))  # (3, 12)
    own = own_candidate_scores(every, 4)
    expected = torch.einsum("bd,bcd->bc", queries, candidates)
    assert own.shape == (3, 4) and torch.allclose(own, expected, atol=1e-5)
    with pytest.raises(ValueError, match="expected 3 × 5"):
        own_candidate_scores(every, 5)


# ----------------------------------------------------------------------- on Ray


def test_offline_soft_labels_are_the_discriminators_scores(ray_cluster, tmp_path):
    """The Ray Data actor pool writes, per example, what D_φ / D_ψ score in-process."""
    import torch

    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer
    from santa.scoder.discriminator import Discriminator, DiscriminatorPair
    from santa.scoder.soft_labels import write_soft_labels

    texts = [row["query"] for row in stdlib_pair_rows()[:20]]
    codes = [row["document"] for row in stdlib_pair_rows()[:20]]
    tokenizer = train_tokenizer(texts + codes, vocab_size=600)
    backbone = str(tmp_path / "backbone")
    DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer).save_pretrained(backbone)
    pair = DiscriminatorPair(
        {
            "text_code": Discriminator.from_backbone(backbone, seed=1),
            "code_code": Discriminator.from_backbone(backbone, seed=2),
        }
    )
    pair.save_pretrained(str(tmp_path / "discriminators"))
    rows = [
        {
            "query_id": f"q{i}",
            "kind": "code_code" if i % 3 == 0 else "text_code",
            "query": codes[i][:80] if i % 3 == 0 else texts[i],
            "candidates": [codes[i], codes[(i + 1) % 20], codes[(i + 2) % 20]],
            "heldout": i % 4 == 0,
        }
        for i in range(20)
    ]
    write_listwise(rows, str(tmp_path / "examples"))
    write_soft_labels(
        str(tmp_path / "examples"),
        str(tmp_path / "discriminators"),
        str(tmp_path / "soft"),
        max_first=16,
        max_length=64,
    )
    scored = read_listwise(str(tmp_path / "soft")).to_pylist()
    assert sorted(row["query_id"] for row in scored) == sorted(row["query_id"] for row in rows)
    pair.eval()
    for row in scored:
        with torch.no_grad():
            expected = pair.by_kind[row["kind"]].score_lists(
                [row["query"]], [row["candidates"]], max_first=16, max_length=64
            )[0]
        assert torch.allclose(torch.tensor(row["scores"]), expected, atol=1e-4)


def job_args(data: str, dev: str, runs: Path, *extra: str) -> list[str]:
    sets = ["train.log_every=3"]
    return [
        "--recipe",
        "tiny-ci-scoder",
        "--data",
        data,
        "--eval-data",
        dev,
        "--storage",
        str(runs),
        "--name",
        "tiny",
        "--max-steps",
        "4",
        # Every stage in the test's process (fit_in_process, one worker): what Algorithm 2
        # does is tested here; its stages on two workers in the gloo test below, a whole
        # SCodeR trial of a sweep in tests/test_sweep.py.
        "--in-process",
        "--cpus-per-worker",
        "0.5",
        *[item for key in sets for item in ("--set", key)],
        *extra,
    ]


@pytest.mark.long(seconds=160)
@pytest.mark.timeout(1800)
def test_tiny_scoder_iterates_refreshes_negatives_and_resumes(ray_cluster, pairs, tmp_path, capsys):
    """Two iterations of Algorithm 2 with the tiny recipe (offline soft labels); a rerun
    with a third iteration skips the warm-up and the two done iterations and adds the third,
    with online soft labels (the discriminators run in the training workers)."""
    from ray_jobs import scoder
    from santa.models.dual_encoder import DualEncoder
    from santa.scoder.discriminator import DiscriminatorPair

    dev = write_beir(tmp_path / "dev", stdlib_pair_rows()[-32:], "test")
    runs = tmp_path / "runs"
    assert scoder.main(job_args(pairs, dev, runs)) == 0
    out = capsys.readouterr().out
    run = runs / "tiny"
    manifests = [json.loads((run / f"iter-{i}" / "manifest.json").read_text()) for i in (1, 2)]
    # Negatives refreshed between the iterations, with iteration 1's dual encoder.
    corpus = load_mining_corpus(pairs)
    tables = [read_negatives_table(m["negatives"], corpus).negatives for m in manifests]
    assert tables[0].shape == tables[1].shape and tables[0].tolist() != tables[1].tolist()
    assert "[iter 1] mining" in out and "[iter 2] mining" in out
    history = [json.loads(line) for line in (run / "scoder_metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in history] == [1, 2]
    for metrics in history:
        for key in ("heldout_accuracy_text_code", "heldout_accuracy_code_code"):
            assert 0.0 <= metrics[key] <= 1.0
        assert 0.0 < metrics["soft_label_entropy"] <= math.log(metrics["candidates"]) + 1e-6
        for key in ("discriminator_loss", "dual_encoder_loss", "loss_adv", "loss_distill"):
            assert math.isfinite(metrics[key])
        assert metrics["dual_encoder_step"] == 4 and 0.0 <= metrics["dev_mrr"] <= 1.0
        assert all(metrics[k] > 0 for k in ("mine_s", "discriminators_s", "dual_encoder_s"))
    assert "D_φ acc" in out and "L_distill" in out  # the table at the end
    # Checkpoints of G_θ, D_φ and D_ψ load back.
    DualEncoder.from_pretrained(manifests[1]["dual_encoder"])
    loaded = DiscriminatorPair.from_pretrained(manifests[1]["discriminators"])
    assert set(loaded.by_kind) == {"text_code", "code_code"}
    soft = read_listwise(str(run / "iter-2" / "soft_labels"))
    assert soft.column("scores").type == pa.list_(pa.float32())

    args = job_args(pairs, dev, runs, "--iterations", "3", "--soft-labels", "online")
    assert scoder.main(args) == 0
    out = capsys.readouterr().out
    assert "[warmup] done in an earlier run: skipped" in out
    assert "[iter 1] done in an earlier run: skipped" in out
    assert "[iter 2] done in an earlier run: skipped" in out
    assert "[iter 3] mining" in out and "[iter 1] mining" not in out
    third = json.loads((run / "iter-3" / "manifest.json").read_text())
    assert third["metrics"]["iteration"] == 3 and third["soft_labels"] == "online"
    assert not (run / "iter-3" / "soft_labels").exists()  # nothing precomputed
    assert 0.0 <= third["metrics"]["heldout_accuracy_text_code"] <= 1.0
    assert math.isfinite(third["metrics"]["loss_distill"])
    assert storage.exists(third["dual_encoder"])
    report = json.loads((run / "report.json").read_text())
    assert [m["iteration"] for m in report["iterations"]] == [1, 2, 3]


def test_job_errors_are_one_line_before_any_ray_work(tmp_path, capsys):
    from ray_jobs import scoder

    base = ["--storage", str(tmp_path / "runs"), "--name", "bad"]
    assert scoder.main(["--data", str(tmp_path / "missing"), *base]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("santa: error: ") and str(tmp_path / "missing") in line
    (tmp_path / "empty" / "data").mkdir(parents=True)
    assert scoder.main(["--data", str(tmp_path / "empty"), *base]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"santa: error: --data {tmp_path / 'empty'} holds no preprocessed pairs "
        "(expected data/*.parquet, as ray_jobs.preprocess writes them)"
    ]
    bad_lambda = ["--data", str(tmp_path), *base, "--set", "scoder.adversarial_weight=1.5"]
    assert scoder.main(bad_lambda) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["santa: error: ScoderConfig.adversarial_weight must be in [0, 1], got 1.5"]
    two_in_process = ["--data", str(tmp_path), *base, "--in-process", "--num-workers=2"]
    with pytest.raises(SystemExit) as exited:
        scoder.main(two_in_process)
    assert exited.value.code == 2
    assert "--in-process trains on one worker: drop --num-workers" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing written, no Ray started


def write_stage_inputs(
    folder: Path, kinds: tuple[str, ...] = ("text_code",), layers: int | None = None
) -> str:
    """What SCodeR's stages train on, under ``folder``: a tiny backbone (returned; ``layers``
    per stack, the recipe's by default), discriminators on it (``discriminators``, one per
    kind) and 48 listwise examples with offline soft labels (``examples``), the kinds
    taking turns."""
    import dataclasses

    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer
    from santa.scoder.discriminator import Discriminator, DiscriminatorPair

    rows = stdlib_pair_rows()[:48]
    texts, codes = [r["query"] for r in rows], [r["document"] for r in rows]
    tokenizer = train_tokenizer(texts + codes, vocab_size=600)
    backbone = str(folder / "backbone")
    model_config = get_recipe("tiny").model
    if layers is not None:
        model_config = dataclasses.replace(model_config, tiny_num_layers=layers)
    DualEncoder.build_tiny(model_config, tokenizer).save_pretrained(backbone)
    DiscriminatorPair(
        {kind: Discriminator.from_backbone(backbone, seed=1 + n) for n, kind in enumerate(kinds)}
    ).save_pretrained(str(folder / "discriminators"))
    examples = [
        {
            "query_id": f"q{i}",
            "kind": kinds[i % len(kinds)],
            "query": texts[i] if kinds[i % len(kinds)] == "text_code" else codes[(i + 3) % 48],
            "candidates": [codes[i], codes[(i + 1) % 48], codes[(i + 2) % 48]],
            "heldout": False,
            "scores": [2.0, 0.5, 0.1],
        }
        for i in range(48)
    ]
    schema = pa.schema([*LISTWISE_SCHEMA, ("scores", pa.list_(pa.float32()))])
    (folder / "examples" / "data").mkdir(parents=True)
    pa.parquet.write_table(
        pa.Table.from_pylist(examples, schema=schema), folder / "examples" / "data" / "a.parquet"
    )
    return backbone


def stage_config(*overrides: str):
    """tiny-scoder at the size of :func:`write_stage_inputs`' examples, 3 steps."""
    from santa.config.recipes import get_recipe

    return get_recipe("tiny-scoder").with_overrides(
        [
            "train.global_batch_size=8",
            "train.max_query_length=24",
            "train.max_document_length=64",
            "scoder.max_pair_length=80",
            "train.max_steps=3",
            "train.log_every=1",
            *overrides,
        ]
    )


def test_scoder_stages_train_on_two_gloo_workers(tmp_path):
    """Algorithm 2's stages as a cluster runs them on two workers (DDP over gloo, the loop
    without Ray; what Ray Train adds is every objective's alike): D_φ and D_ψ, each batch's
    rows of one kind or both (a head without rows in a batch: DDP's unused parameters),
    then G_θ with ``λ·L_adv + (1 − λ)·L_distill``. Both ranks take every step and the
    checkpoints load. (The stages on one worker: the compiled test below and ray_jobs.scoder
    --in-process; a whole SCodeR trial: tests/test_sweep.py.)"""
    from santa.models.dual_encoder import DualEncoder
    from santa.scoder.discriminator import DiscriminatorPair
    from santa.train.loop_config import LoopConfig
    from tests.training import train_on_ranks

    backbone = write_stage_inputs(tmp_path, kinds=("text_code", "code_code"))
    config = stage_config("train.checkpoint_every=3", "train.num_workers=2")

    def train(objective: str, start: str, name: str) -> list[dict]:
        loop = LoopConfig(
            santa=config,
            init_model=start,
            objective=objective,
            data_uri=str(tmp_path / "examples"),
            row_cache=str(tmp_path / "rows"),
        )
        ranks = train_on_ranks(2, loop, str(tmp_path / name), str(tmp_path / f"{name}-out"))
        for rank in ranks:
            assert [r["step"] for r in rank["reports"]] == [1, 2, 3]
            assert math.isfinite(rank["reports"][-1]["loss"])
        # The global batch split between the ranks, no row on both.
        for first, second in zip(ranks[0]["rows"], ranks[1]["rows"], strict=True):
            assert first and second and not set(first) & set(second)
        return ranks

    discriminators = train("discriminators", str(tmp_path / "discriminators"), "d")
    assert 0.0 <= discriminators[0]["reports"][-1]["accuracy"] <= 1.0
    loaded = DiscriminatorPair.from_pretrained(
        str(tmp_path / "d" / "checkpoint_000003" / "discriminators")
    )
    assert set(loaded.by_kind) == {"text_code", "code_code"}

    dual = train("dual_encoder", backbone, "g")
    assert math.isfinite(dual[0]["reports"][-1]["loss_distill"])
    DualEncoder.from_pretrained(str(tmp_path / "g" / "checkpoint_000003" / "model"))


@pytest.mark.slow
def test_scoder_stages_run_in_the_one_loop_compiled_and_fall_back_past_a_broken_checkpoint(
    tmp_path, capsys
):
    """SCodeR's stages are objectives of santa's one worker loop (here without Ray: a local
    session): they run under ``train.compile=always`` and resume, like SANTA's, from the
    newest checkpoint that loads."""
    from santa.models.dual_encoder import DualEncoder
    from santa.scoder.discriminator import DiscriminatorPair
    from santa.train.loop import WorkerTrainer, run_worker
    from santa.train.loop_config import LoopConfig
    from santa.train.session import LocalSession

    # One layer a stack: the three trainers each compile, and Dynamo's time grows with the
    # graph.
    backbone = write_stage_inputs(tmp_path, layers=1)
    config = stage_config(
        "train.checkpoint_every=1",
        "train.compile=always",
        "train.compile_backend=aot_eager",
        "train.num_workers=1",
    )

    def train(objective: str, start: str, root: str, stop: int = 0) -> LocalSession:
        session = LocalSession(checkpoint_root=str(tmp_path / root))
        loop = LoopConfig(
            santa=config,
            init_model=start,
            objective=objective,
            data_uri=str(tmp_path / "examples"),
            stop_at_step=stop,
            row_cache=str(tmp_path / "rows"),
        )
        run_worker(WorkerTrainer(loop, session))
        return session

    first = train("discriminators", str(tmp_path / "discriminators"), "d", stop=2)
    assert [r["step"] for r in first.reports] == [1, 2]
    assert 0.0 <= first.reports[-1]["accuracy"] <= 1.0 and math.isfinite(first.reports[-1]["loss"])
    newest = Path(first.checkpoints()[0])
    optimizer = newest / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    capsys.readouterr()
    second = train("discriminators", str(tmp_path / "discriminators"), "d")
    assert [r["step"] for r in second.reports] == [2, 3]  # the broken step-2 checkpoint skipped
    state = json.loads((newest.parent / "checkpoint_000003" / "trainer_state.json").read_text())
    assert state["resumed_at"] == [1]
    DiscriminatorPair.from_pretrained(str(newest.parent / "checkpoint_000003" / "discriminators"))

    dual = train("dual_encoder", backbone, "g")
    assert [r["step"] for r in dual.reports] == [1, 2, 3]
    assert math.isfinite(dual.reports[-1]["loss_distill"])
    assert dual.reports[-1]["soft_label_entropy"] > 0
    DualEncoder.from_pretrained(str(Path(dual.checkpoints()[0], "model")))
