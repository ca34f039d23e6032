"""``ray_jobs.export --format sentence-transformers``: the folder loads in
sentence-transformers and encodes as santa does (cosine >= 0.9999), T5 is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ray_jobs import export
from santa.config import ModelConfig
from santa.config.recipes import get_recipe, minilm_path
from santa.models.dual_encoder import DualEncoder
from santa.models.encoding import encode_texts

TEXTS = [
    "def read_lines(path):\n    with open(path) as handle:\n        return handle.readlines()",
    "Return the number of seconds since the epoch.",
    "x = [i * i for i in range(10)]  # squares " * 40,  # longer than every length below
    "short",
]


def _agreement(folder: Path, model: DualEncoder, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    ours = encode_texts(model, TEXTS, max_length=max_length, progress=False)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    return cosine, np.stack([np.linalg.norm(ours, axis=1), np.linalg.norm(theirs, axis=1)])


def test_minilm_checkpoint_round_trips(tmp_path, capsys):
    config = get_recipe("minilm")
    model = DualEncoder.from_config(config.model)
    model.save_pretrained(str(tmp_path / "ck" / "model"), santa_config=config)
    out = tmp_path / "st"
    argv = ["--checkpoint", str(tmp_path / "ck"), "--to", str(out)]
    assert export.main([*argv, "--format", "sentence-transformers"]) == 0
    assert "Normalize" in capsys.readouterr().out
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Normalize"]
    length = json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"]
    assert length == min(config.train.max_document_length, 256)
    cosine, _ = _agreement(out, model, length)
    assert cosine.min() >= 0.9999, cosine
    # santa reads the folder back the same way (the layout agrees with santa_config.json).
    again = DualEncoder.from_pretrained(str(out))
    assert again.model_config.pooling == "mean" and again.model_config.similarity == "cosine"
    assert not list(tmp_path.glob(".st.partial-*"))


def test_the_exported_folder_loads_in_sentence_transformers_without_warnings(tmp_path):
    """A santa MiniLM checkpoint has no BERT pooler (santa never uses one): the exported
    folder says so (``add_pooling_layer: false``), so loading it prints no transformers
    LOAD REPORT of ``pooler.dense.*`` MISSING and newly initialised, nothing at all on
    stderr (transformers' own "Loading weights" bar, shown for every model it loads, is
    off here by its variable)."""
    import os
    import subprocess
    import sys

    config = get_recipe("minilm")
    DualEncoder.from_config(config.model).save_pretrained(
        str(tmp_path / "ck" / "model"), santa_config=config
    )
    out = tmp_path / "st"
    argv = ["--checkpoint", str(tmp_path / "ck"), "--to", str(out)]
    assert export.main([*argv, "--format", "sentence-transformers"]) == 0
    module = json.loads((out / "sentence_bert_config.json").read_text())
    assert module["model_args"] == {"add_pooling_layer": False}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRANSFORMERS_", "SANTA_", "PYTHONWARNINGS"))
    }
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    load = (
        "import sys; from sentence_transformers import SentenceTransformer; "
        "print(SentenceTransformer(sys.argv[1], device='cpu').encode(['hi']).shape)"
    )
    done = subprocess.run(
        [sys.executable, "-c", load, str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 384)"
    assert done.stderr == "", done.stderr


def test_cls_pooling_projection_and_dot_product_round_trip(tmp_path):
    from transformers import AutoTokenizer, BertConfig, BertModel

    bert = tmp_path / "bert"
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    BertModel(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    model_config = ModelConfig(
        backbone=str(bert),
        kind="encoder",
        pooling="cls",
        similarity="dot",
        projection_dim=16,
        projection_activation="tanh",
    )
    # A fresh projection (random, seeded) on the plain BERT.
    torch.manual_seed(0)
    model = DualEncoder(BertModel.from_pretrained(bert), model_config, tokenizer)
    model.save_pretrained(str(tmp_path / "model"))
    out = tmp_path / "st"
    argv = ["--checkpoint", str(tmp_path / "model"), "--to", str(out)]
    assert export.main([*argv, "--format", "sentence-transformers"]) == 0
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Dense"]
    settings = json.loads((out / "config_sentence_transformers.json").read_text())
    assert settings["similarity_fn_name"] == "dot"
    cosine, norms = _agreement(out, model, 240)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(norms[0], norms[1], rtol=1e-4)  # no Normalize: same vectors


def test_t5_is_refused_in_one_line(tmp_path, capsys):
    from santa.models.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(TEXTS * 30, vocab_size=600)
    DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer).save_pretrained(str(tmp_path / "m"))
    argv = ["--checkpoint", str(tmp_path / "m"), "--to", str(tmp_path / "st")]
    assert export.main([*argv, "--format", "sentence-transformers"]) == 2
    stderr = capsys.readouterr().err  # also transformers' progress bars
    error = [line for line in stderr.splitlines() if line.startswith("santa:")]
    assert len(error) == 1 and error[0].startswith("santa: error: a T5 model cannot be")
    assert "Traceback" not in stderr
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("flag", ["--format"])
def test_format_flag_is_checked(flag, tmp_path):
    with pytest.raises(SystemExit):
        export.main(["--checkpoint", str(tmp_path), "--to", str(tmp_path / "x"), flag, "onnx"])
