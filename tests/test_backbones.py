"""sentence-transformers folders load as their authors built them (pooling, Dense,
Normalize → cosine, max_seq_length, lower-casing), in every spelling of their configs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from santa.config import ModelConfig
from santa.config.recipes import minilm_path
from santa.models.backbones import read_sentence_transformers_layout
from santa.models.dual_encoder import DualEncoder

sentence_transformers = pytest.importorskip("sentence_transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = [
    "Parse A JSON file and RETURN its Contents",
    "def read(path):\n    with open(path) as f:\n        return json.load(f)",
    "x " * 300,  # longer than every max_seq_length below
    "short",
]


def _tiny_bert(folder: Path) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _santa_embeddings(model: DualEncoder, texts: list[str], max_length: int) -> np.ndarray:
    model.eval()
    with torch.inference_mode():
        batch = model.tokenize(texts, max_length)
        return model.encode(batch["input_ids"], batch["attention_mask"]).numpy()


def _build_st(tmp_path: Path, *, pooling: str, dense: bool, normalize: bool, lower: bool):
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers 6 moved the modules (the old path warns, then goes away)
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    bert = _tiny_bert(tmp_path / "bert")
    modules = [
        models.Transformer(str(bert), max_seq_length=24, do_lower_case=lower),
        models.Pooling(32, pooling_mode=pooling),
    ]
    if dense:
        modules.append(models.Dense(32, 16, activation_function=torch.nn.Tanh()))
    if normalize:
        modules.append(models.Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(str(tmp_path / "st"))
    return model, tmp_path / "st"


@pytest.mark.parametrize(
    ("pooling", "dense", "normalize", "lower"),
    [("mean", True, True, True), ("cls", False, False, False), ("mean", True, False, False)],
)
def test_sentence_transformers_folder_encodes_like_sentence_transformers(
    tmp_path: Path, pooling: str, dense: bool, normalize: bool, lower: bool
) -> None:
    st_model, folder = _build_st(
        tmp_path, pooling=pooling, dense=dense, normalize=normalize, lower=lower
    )
    model = DualEncoder.from_pretrained(str(folder))
    config = model.model_config
    assert config.pooling == pooling
    assert config.max_seq_length == 24
    assert config.projection_dim == (16 if dense else None)
    assert config.similarity == "cosine"  # sentence-transformers' default similarity
    expected = st_model.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=False)
    got = _santa_embeddings(model, TEXTS, max_length=512)
    if normalize:
        got = got / np.linalg.norm(got, axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_projection_survives_a_santa_save(tmp_path: Path) -> None:
    st_model, folder = _build_st(tmp_path, pooling="mean", dense=True, normalize=True, lower=True)
    model = DualEncoder.from_pretrained(str(folder))
    model.save_pretrained(str(tmp_path / "saved"))
    again = DualEncoder.from_pretrained(str(tmp_path / "saved"))
    assert again.model_config == model.model_config
    np.testing.assert_allclose(
        _santa_embeddings(again, TEXTS, 512), _santa_embeddings(model, TEXTS, 512), atol=1e-6
    )


def test_minilm_folder_declares_mean_cosine_and_256_tokens() -> None:
    layout = read_sentence_transformers_layout(minilm_path())
    assert layout is not None
    assert layout.model_fields == {"similarity": "cosine", "max_seq_length": 256, "pooling": "mean"}
    model = DualEncoder.from_pretrained(minilm_path())
    assert model.token_limit(512) == 256 and model.token_limit(50) == 50


def test_both_pooling_spellings_are_read(tmp_path: Path) -> None:
    """sentence-transformers 6 writes {"pooling_mode": "mean"}; older ones the booleans."""
    for name, pooling_config in {
        "new": {"embedding_dimension": 8, "pooling_mode": "mean"},
        "old": {"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True},
        "old_cls": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
    }.items():
        folder = tmp_path / name
        (folder / "1_Pooling").mkdir(parents=True)
        (folder / "modules.json").write_text(
            json.dumps(
                [
                    {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                    {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                ]
            )
        )
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
        layout = read_sentence_transformers_layout(folder)
        assert layout.model_fields["pooling"] == ("cls" if name == "old_cls" else "mean")


def test_unsupported_modules_fail_naming_the_folder(tmp_path: Path) -> None:
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [{"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        )
    )
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "max"}))
    with pytest.raises(ValueError, match=r"1_Pooling.*pooling 'max' is not supported"):
        read_sentence_transformers_layout(tmp_path)


def test_plain_folder_keeps_the_defaults(tmp_path: Path) -> None:
    folder = _tiny_bert(tmp_path / "bert")
    assert read_sentence_transformers_layout(folder) is None
    config = DualEncoder.from_pretrained(str(folder)).model_config
    assert (config.pooling, config.similarity, config.max_seq_length) == ("cls", "dot", None)


def test_projection_is_encoder_only() -> None:
    with pytest.raises(ValueError, match="projection_dim is for encoder-only"):
        ModelConfig(kind="t5", projection_dim=8)
