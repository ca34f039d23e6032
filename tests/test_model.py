"""DualEncoder: T5 decoder-0 embeddings, one-pass MEP, encoder-only pooling, save/load."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch
from transformers import (
    AutoModel,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    BertConfig,
    BertModel,
    PreTrainedTokenizerBase,
)

from santa.config import ModelConfig, SantaConfig, TrainConfig
from santa.config.recipes import get_recipe, minilm_path
from santa.files import storage
from santa.method.losses import contrastive_loss
from santa.models.dual_encoder import SANTA_CONFIG_FILE, DualEncoder
from santa.models.tokenizer import train_tokenizer

CORPUS = [
    'def add_one(value):\n    """Add one to a value."""\n    return value + 1\n',
    "class HttpClient:\n    def get(self, key):\n        return self.cache[key]\n",
    "Return the number of items in the container.",
    "A stainless steel water bottle that keeps drinks cold.",
]
MASKED_DOCS = [
    "def <extra_id_0>(<extra_id_1>):\n    return <extra_id_1> + 1",
    "class <extra_id_0>:\n    def get(self, <extra_id_1>):\n        return self.cache[<extra_id_1>]",
    "steel <extra_id_0>",
]
TARGETS = [
    "<extra_id_0> add_one <extra_id_1> value",
    "<extra_id_0> HttpClient <extra_id_1> key",
    "",
]
UNMASKED_DOCS = [
    "def add_one(value):\n    return value + 1",
    "class HttpClient:\n    def get(self, key):\n        return self.cache[key]",
    "steel bottle",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return train_tokenizer(CORPUS * 50, vocab_size=1000)


@pytest.fixture(scope="module")
def tiny(tokenizer: PreTrainedTokenizerBase) -> DualEncoder:
    return DualEncoder.build_tiny(ModelConfig(), tokenizer, seed=0).eval()


def batch(
    tokenizer: PreTrainedTokenizerBase, texts: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    return encoded.input_ids, encoded.attention_mask


# --------------------------------------------------------------------------- T5


def test_tiny_model_size(tokenizer: PreTrainedTokenizerBase) -> None:
    model = DualEncoder.build_tiny(ModelConfig(), tokenizer)
    config = model.backbone.config
    assert (config.d_model, config.num_layers, config.num_heads, config.d_ff) == (128, 2, 4, 256)
    assert config.vocab_size == len(tokenizer)
    assert config.decoder_start_token_id == tokenizer.pad_token_id == 0
    assert model.embedding_dim == 128


def test_build_tiny_is_seeded(tokenizer: PreTrainedTokenizerBase) -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    first = DualEncoder.build_tiny(ModelConfig(), tokenizer, seed=5)
    torch.manual_seed(123)
    second = DualEncoder.build_tiny(ModelConfig(), tokenizer, seed=5)
    assert torch.equal(torch.rand(1), before)  # the caller's RNG stream is untouched
    other = DualEncoder.build_tiny(ModelConfig(), tokenizer, seed=6)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(first.backbone.shared.weight, other.backbone.shared.weight)


def test_t5_embedding_is_last_decoder_state_at_position_zero(tiny, tokenizer) -> None:
    input_ids, attention_mask = batch(tokenizer, UNMASKED_DOCS)
    embeddings = tiny.encode(input_ids, attention_mask)  # (3, 128)
    start = torch.full((len(input_ids), 1), tiny.backbone.config.decoder_start_token_id)
    # The slow way: the full seq2seq forward with every hidden state returned.
    output = tiny.backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=start,
        output_hidden_states=True,
    )
    torch.testing.assert_close(embeddings, output.decoder_hidden_states[-1][:, 0])
    assert embeddings.shape == (3, 128)


def test_padding_does_not_change_t5_embeddings(tiny, tokenizer) -> None:
    input_ids, attention_mask = batch(tokenizer, UNMASKED_DOCS)
    alone = tiny.encode(*batch(tokenizer, UNMASKED_DOCS[2:]))
    torch.testing.assert_close(tiny.encode(input_ids, attention_mask)[2:], alone)


def test_single_pass_mep_gives_encode_embedding_and_seq2seq_loss(tiny, tokenizer) -> None:
    input_ids, attention_mask = batch(tokenizer, MASKED_DOCS)
    labels, _ = batch(tokenizer, TARGETS)  # padded with <pad> = 0
    embeddings, loss = tiny.encode_with_mep(input_ids, attention_mask, labels)
    # Decoder position 0 is causal: it cannot see the labels, so it is encode()'s state.
    torch.testing.assert_close(embeddings, tiny.encode(input_ids, attention_mask))
    # The loss is transformers' own seq2seq cross-entropy with padding as -100.
    reference = tiny.backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        labels=labels.masked_fill(labels == tokenizer.pad_token_id, -100),
    ).loss
    torch.testing.assert_close(loss, reference)
    # Padding the labels further changes nothing, and -100 padding is accepted too.
    longer = torch.nn.functional.pad(labels, (0, 4), value=tokenizer.pad_token_id)
    torch.testing.assert_close(tiny.encode_with_mep(input_ids, attention_mask, longer)[1], loss)
    as_ignore = labels.masked_fill(labels == tokenizer.pad_token_id, -100)
    torch.testing.assert_close(tiny.encode_with_mep(input_ids, attention_mask, as_ignore)[1], loss)


def test_forward_single_pass_and_two_pass(tokenizer) -> None:
    queries = batch(tokenizer, ["add one to a value", "an http client", "a bottle"])
    masked = batch(tokenizer, MASKED_DOCS)
    unmasked = batch(tokenizer, UNMASKED_DOCS)
    labels, _ = batch(tokenizer, TARGETS)
    hard = batch(tokenizer, CORPUS[:3] * 2)
    inputs = {
        "query_input_ids": queries[0],
        "query_attention_mask": queries[1],
        "document_input_ids": unmasked[0],
        "document_attention_mask": unmasked[1],
        "masked_document_input_ids": masked[0],
        "masked_document_attention_mask": masked[1],
        "mep_labels": labels,
        "hard_negative_input_ids": hard[0],
        "hard_negative_attention_mask": hard[1],
    }
    for embed_unmasked, expected_docs in ((False, masked), (True, unmasked)):
        config = ModelConfig(embed_unmasked_document=embed_unmasked)
        model = DualEncoder.build_tiny(config, tokenizer).eval()
        output = model(**inputs)
        torch.testing.assert_close(output.query_embeddings, model.encode(*queries))
        torch.testing.assert_close(output.doc_embeddings, model.encode(*expected_docs))
        torch.testing.assert_close(output.hard_negative_embeddings, model.encode(*hard))
        torch.testing.assert_close(output.mep_loss, model.encode_with_mep(*masked, labels)[1])
    # Fine-tuning: no MEP inputs, documents from document_*.
    output = model(*queries, *unmasked)
    assert output.mep_loss is None and output.hard_negative_embeddings is None
    torch.testing.assert_close(output.doc_embeddings, model.encode(*unmasked))


def test_training_step_backpropagates_through_both_losses(tokenizer) -> None:
    model = DualEncoder.build_tiny(ModelConfig(), tokenizer)
    queries = batch(tokenizer, ["add one", "http client", "a bottle"])
    masked = batch(tokenizer, MASKED_DOCS)
    labels, _ = batch(tokenizer, TARGETS)
    output = model(*queries, masked_document_input_ids=masked[0],
                   masked_document_attention_mask=masked[1], mep_labels=labels)  # fmt: skip
    loss = contrastive_loss(output.query_embeddings, output.doc_embeddings) + output.mep_loss
    loss.backward()
    assert model.backbone.lm_head.weight.grad is not None  # tied to the shared embedding
    assert all(p.grad is not None for p in model.backbone.encoder.parameters())


def test_gradient_checkpointing_gives_the_same_gradients(tokenizer) -> None:
    queries = batch(tokenizer, ["add one", "http client", "a bottle"])
    docs = batch(tokenizer, UNMASKED_DOCS)
    gradients = []
    for checkpointing in (False, True):
        model = DualEncoder.build_tiny(
            ModelConfig(gradient_checkpointing=checkpointing), tokenizer, seed=1
        )
        model.train()
        assert model.is_gradient_checkpointing == checkpointing
        # Same dropout masks in both runs: checkpointing replays the RNG state on recompute.
        torch.manual_seed(0)
        output = model(*queries, *docs)
        contrastive_loss(output.query_embeddings, output.doc_embeddings).backward()
        gradients.append(model.backbone.shared.weight.grad)
    torch.testing.assert_close(gradients[0], gradients[1])


def test_similarity_follows_the_config(tokenizer) -> None:
    queries, docs = torch.randn(2, 8), torch.randn(3, 8)
    dot = DualEncoder.build_tiny(ModelConfig(), tokenizer)
    torch.testing.assert_close(dot.similarity(queries, docs), queries @ docs.T)
    cosine = DualEncoder.build_tiny(ModelConfig(similarity="cosine", temperature=0.5), tokenizer)
    expected = torch.nn.functional.cosine_similarity(queries[:, None], docs[None], dim=-1) / 0.5
    torch.testing.assert_close(cosine.similarity(queries, docs), expected)


# --------------------------------------------------------------------------- save / load


def test_save_and_load_local(tiny, tokenizer, tmp_path) -> None:
    santa_config = SantaConfig(model=tiny.model_config, train=TrainConfig(learning_rate=3e-4))
    tiny.save_pretrained(str(tmp_path), santa_config=santa_config)
    assert (tmp_path / "model.safetensors").is_file()
    saved = json.loads((tmp_path / SANTA_CONFIG_FILE).read_text())
    assert SantaConfig.from_dict(saved) == santa_config

    loaded = DualEncoder.from_pretrained(str(tmp_path)).eval()
    assert loaded.model_config == tiny.model_config
    input_ids, attention_mask = batch(tokenizer, UNMASKED_DOCS)
    assert torch.equal(
        loaded.encode(input_ids, attention_mask), tiny.encode(input_ids, attention_mask)
    )
    assert loaded.tokenizer(UNMASKED_DOCS).input_ids == tokenizer(UNMASKED_DOCS).input_ids

    # Plain transformers reads the folder too.
    plain = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(plain.shared.weight, tiny.backbone.shared.weight)
    assert AutoTokenizer.from_pretrained(tmp_path)(CORPUS).input_ids == tokenizer(CORPUS).input_ids


def test_save_and_load_s3(tiny, tokenizer, moto_s3) -> None:
    uri = moto_s3.create_bucket("santa-models") + "/runs/tiny/checkpoint"
    tiny.save_pretrained(uri)
    names = {path.rsplit("/", 1)[-1] for path in storage.list_files(uri)}
    assert {"config.json", "model.safetensors", "tokenizer.json", SANTA_CONFIG_FILE} <= names
    loaded = DualEncoder.from_pretrained(uri).eval()
    input_ids, attention_mask = batch(tokenizer, UNMASKED_DOCS)
    assert torch.equal(
        loaded.encode(input_ids, attention_mask), tiny.encode(input_ids, attention_mask)
    )
    assert loaded.model_config == tiny.model_config
    with pytest.raises(storage.StorageError, match="no model"):
        DualEncoder.from_pretrained(moto_s3.create_bucket("santa-empty") + "/nothing")


def test_from_config_builds_tiny_or_loads(tiny, tokenizer, tmp_path) -> None:
    built = DualEncoder.from_config(ModelConfig(), tokenizer, seed=0).eval()
    input_ids, attention_mask = batch(tokenizer, UNMASKED_DOCS)
    torch.testing.assert_close(
        built.encode(input_ids, attention_mask), tiny.encode(input_ids, attention_mask)
    )
    with pytest.raises(ValueError, match="needs a tokenizer"):
        DualEncoder.from_config(ModelConfig())
    tiny.save_pretrained(str(tmp_path))
    loaded = DualEncoder.from_config(ModelConfig(backbone=str(tmp_path)))
    assert loaded.model_config.backbone == str(tmp_path)
    assert loaded.tokenizer is not None


# --------------------------------------------------------------------------- encoder-only


def tiny_bert(pooling: str) -> DualEncoder:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    model_config = ModelConfig(backbone="tiny-bert", kind="encoder", pooling=pooling)
    return DualEncoder(BertModel(config), model_config).eval()


def test_encoder_only_mean_and_cls_pooling() -> None:
    input_ids = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])
    attention_mask = (input_ids != 0).long()
    mean_model = tiny_bert("mean")
    states = mean_model.backbone(
        input_ids=input_ids, attention_mask=attention_mask
    ).last_hidden_state
    expected_mean = torch.stack([states[0, :3].mean(0), states[1].mean(0)])
    torch.testing.assert_close(mean_model.encode(input_ids, attention_mask), expected_mean)
    # Mask-aware: the padded row equals the same row without padding.
    alone = mean_model.encode(input_ids[:1, :3], attention_mask[:1, :3])
    torch.testing.assert_close(mean_model.encode(input_ids, attention_mask)[:1], alone)

    cls_model = tiny_bert("cls")
    torch.testing.assert_close(cls_model.encode(input_ids, attention_mask), states[:, 0])
    assert cls_model.embedding_dim == 32
    # BERT's pooler is dropped: it feeds no embedding, and DDP needs every parameter used.
    assert cls_model.backbone.pooler is None


def test_encoder_only_rejects_mep() -> None:
    model = tiny_bert("mean")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="encoder-only backbones train with the SDA/DR loss only"):
        model.encode_with_mep(ids, torch.ones_like(ids), ids)


def test_kind_must_match_the_backbone(tiny) -> None:
    with pytest.raises(ValueError, match="T5-family"):
        DualEncoder(tiny_bert("mean").backbone, ModelConfig(backbone="bert", kind="t5"))
    with pytest.raises(ValueError, match="encoder-only backbone"):
        DualEncoder(tiny.backbone, ModelConfig(backbone="t5", kind="encoder"))


def test_encoder_only_save_load_with_plain_automodel(tmp_path) -> None:
    model = tiny_bert("cls")
    model.save_pretrained(str(tmp_path))
    loaded = DualEncoder.from_pretrained(str(tmp_path))
    assert loaded.model_config.pooling == "cls" and loaded.tokenizer is None
    ids = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(
        loaded.encode(ids, torch.ones_like(ids)), model.encode(ids, torch.ones_like(ids))
    )
    assert isinstance(AutoModel.from_pretrained(tmp_path), BertModel)


def test_real_minilm_loads_offline() -> None:
    model = DualEncoder.from_pretrained(minilm_path()).eval()  # config inferred from the folder
    assert model.model_config.kind == "encoder" and model.model_config.pooling == "mean"
    # The recipe loads the same folder the same way; it only adds a training temperature.
    recipe = DualEncoder.from_config(get_recipe("minilm").model).model_config
    assert recipe == dataclasses.replace(model.model_config, temperature=0.05)
    assert (recipe.similarity, recipe.max_seq_length) == ("cosine", 256)
    sentences = ["A man is eating food.", "A man eats a meal.", "The stock market fell sharply."]
    encoded = model.tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        embeddings = model.encode(encoded.input_ids, encoded.attention_mask)
    assert embeddings.shape == (3, 384) and torch.isfinite(embeddings).all()
    cosine = (
        torch.nn.functional.normalize(embeddings, dim=-1)
        @ torch.nn.functional.normalize(embeddings, dim=-1).T
    )
    assert cosine[0, 1] > 0.6 > cosine[0, 2]  # a real sentence encoder, not random weights
    with pytest.raises(ValueError, match="encoder-only"):
        model.encode_with_mep(encoded.input_ids, encoded.attention_mask, encoded.input_ids)


def test_encoder_only_checkpoints_load_without_a_pooler_report(tmp_path) -> None:
    """santa drops BERT's pooler and saves none: loading its checkpoint must not make
    transformers rebuild one and report ``pooler.dense.*`` as newly initialized."""
    original = DualEncoder.from_pretrained(minilm_path())
    original.save_pretrained(str(tmp_path / "saved"))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    library_logger = logging.getLogger("transformers")  # it does not propagate to root
    library_logger.addHandler(handler)
    try:
        loaded = DualEncoder.from_pretrained(str(tmp_path / "saved"))
    finally:
        library_logger.removeHandler(handler)
    reports = [record.getMessage() for record in records]
    assert not any("pooler" in message for message in reports), reports
    assert getattr(loaded.backbone, "pooler", None) is None
    ids = original.tokenize(["def add(a, b): return a + b"], 32)
    torch.testing.assert_close(
        loaded.encode(ids.input_ids, ids.attention_mask),
        original.encode(ids.input_ids, ids.attention_mask),
    )
