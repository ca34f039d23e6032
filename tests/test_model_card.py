"""The model card every export writes (README.md): its metadata parses with huggingface_hub,
the folder loads with sentence-transformers, the evaluation table is the run's own, and the
usage snippet runs as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ray_jobs import export
from santa.config.recipes import get_recipe
from santa.eval import EvalConfig, evaluate
from santa.models.dual_encoder import DualEncoder
from tests.training import stdlib_pair_rows, write_beir

CHECKPOINT = "checkpoint_2026-01-01_00-00-10.000001"


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory) -> dict:
    """A pipeline-shaped run: RUN/finetune/<checkpoint>/model (MiniLM), its evaluation in
    RUN/eval/finetune (santa's evaluator with BM25) and RUN/report.json."""
    root = tmp_path_factory.mktemp("run")
    config = get_recipe("minilm")
    checkpoint = root / "finetune" / CHECKPOINT
    DualEncoder.from_config(config.model).save_pretrained(
        str(checkpoint / "model"), santa_config=config
    )
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 10}))
    beir = write_beir(tmp_path_factory.mktemp("beir"), stdlib_pair_rows()[:40])
    metrics = evaluate(
        str(checkpoint / "model"), beir, EvalConfig(output=str(root / "eval" / "finetune"))
    )
    report = {
        "name": "run",
        "recipe": "minilm",
        "run": str(root),
        "data": {"train": str(root / "data" / "pretrain"), "dev": "", "test": beir},
        "stages": [
            {
                "stage": "finetune",
                "checkpoint": str(checkpoint),
                "learning_rate": 2e-5,
                "hard_negatives": "none",
                "final_metrics": {"step": 10},
            }
        ],
    }
    (root / "report.json").write_text(json.dumps(report))
    return {"root": root, "checkpoint": checkpoint, "metrics": metrics, "beir": beir}


def _card(folder: Path):
    from huggingface_hub import ModelCard

    card = ModelCard.load(folder / "README.md")
    return card, card.data.to_dict()


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def test_sentence_transformers_export_has_a_card_with_the_runs_evaluation(pipeline_run, tmp_path):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "minilm-csn"
    argv = ["--checkpoint", str(pipeline_run["checkpoint"]), "--to", str(out)]
    assert export.main([*argv, "--format", "sentence-transformers"]) == 0
    card, meta = _card(out)
    assert meta["library_name"] == "sentence-transformers"
    assert meta["pipeline_tag"] == "sentence-similarity"
    assert meta["license"] == "apache-2.0"  # the shipped MiniLM folder's own card says so
    assert {"santa", "dense-retrieval", "sentence-transformers"} <= set(meta["tags"])
    text = card.text
    # Titled by the run and its stage, not the folder; the base named by its hub id (from
    # the shipped MiniLM folder's own card), not by a path inside a virtualenv.
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert text.lstrip().startswith("# santa: run (finetune stage)\n")
    assert "site-packages" not in text
    assert "Recipe `minilm`" in text and "(step 10)" in text
    # The evaluation table is this run's: every system with its MRR@100 as evaluated.
    for system, label in (("model", "this model"), ("bm25", "bm25")):
        value = pipeline_run["metrics"][system]["mrr@100"]
        assert re.search(rf"\| {re.escape(label)} \|[^\n]*{value:.4f}", text), (system, value)
    assert pipeline_run["beir"] in text
    # The folder loads with sentence-transformers, and both snippets run as written.
    model = SentenceTransformer(str(out), device="cpu")
    assert model.encode(["a query"]).shape == (1, 384)
    blocks = _python_blocks(text)
    assert len(blocks) == 2
    for block in blocks:
        scope: dict = {}
        exec(block, scope)  # noqa: S102 - the card's own snippets
    assert np.asarray(scope["model"].similarity(scope["embeddings"][:1], scope["embeddings"][1:]))


def test_hf_export_of_an_unevaluated_checkpoint_says_how_to_evaluate(pipeline_run, tmp_path):
    import santa

    config = get_recipe("tiny")
    from santa.models.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["def f(x): return x", "add one to a value"] * 20, vocab_size=400)
    source = tmp_path / "other" / CHECKPOINT
    DualEncoder.build_tiny(config.model, tokenizer, seed=0).save_pretrained(
        str(source / "model"), santa_config=config
    )
    out = tmp_path / "tiny-export"
    assert export.main(["--checkpoint", str(source), "--to", str(out)]) == 0
    card, meta = _card(out)
    assert meta["library_name"] == "transformers" and "base_model" not in meta
    assert card.text.lstrip().startswith("# santa: other\n")  # the training run's name
    assert "not evaluated" in card.text and "python -m ray_jobs.evaluate --checkpoint" in card.text
    (block,) = _python_blocks(card.text)
    scope: dict = {}
    exec(block, scope)  # noqa: S102
    assert scope["scores"].shape == (1, 1)
    assert santa.load(str(out)).embedding_dim == scope["q"].shape[1]

    # --eval names an evaluation: its table goes into the card.
    again = tmp_path / "with-eval"
    argv = ["--checkpoint", str(source), "--to", str(again)]
    assert export.main([*argv, "--eval", str(pipeline_run["root"] / "eval" / "finetune")]) == 0
    assert "| this model |" in (again / "README.md").read_text()
    missing = ["--checkpoint", str(source), "--to", str(tmp_path / "x"), "--eval", str(tmp_path)]
    assert export.main(missing) == 2
    assert not (tmp_path / "x").exists()


def test_base_model_is_a_hub_id_read_from_the_base_folder(tmp_path):
    """A local base folder names its hub id in its card (the id its snippets load whose
    last part is the card's title) or, without a card, in its config's ``_name_or_path``;
    a card that names only other models gives none (its ``base_model`` is the base's
    base)."""
    from santa.config.recipes import minilm_path
    from santa.models.card import base_model_id

    assert base_model_id(str(minilm_path())) == "sentence-transformers/all-MiniLM-L6-v2"
    assert base_model_id("Salesforce/codet5-base") == "Salesforce/codet5-base"
    assert base_model_id("tiny-t5") is None

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"_name_or_path": "org/base-model"}))
    assert base_model_id(str(bare)) == "org/base-model"
    (bare / "config.json").write_text(json.dumps({"_name_or_path": "/home/me/model"}))
    assert base_model_id(str(bare)) is None

    carded = tmp_path / "carded"
    carded.mkdir()
    (carded / "README.md").write_text(
        "---\nbase_model: org/its-base\n---\n\n# my-model\n\n"
        "Fine-tuned from `org/its-base`: AutoModel.from_pretrained('org/its-base')\n"
    )
    assert base_model_id(str(carded)) is None
    (carded / "README.md").write_text("# my-model\n\nSentenceTransformer('me/My-Model')\n")
    assert base_model_id(str(carded)) == "me/My-Model"
