"""Decoder LLMs as embedders (``kind="decoder"``) and LoRA: last-token pooling whatever the
padding, the EOS and prefixes the same in training and encoding, MEP refused, and the tiny
decoder with LoRA trained on the plain loop: only its adapters move, a resumed run repeats
the uninterrupted one bit for bit, and its export (adapters merged) encodes in
sentence-transformers as santa does."""

from __future__ import annotations

import copy
import dataclasses
import json

import pyarrow as pa
import pytest
import torch

from santa.config import SantaConfig
from santa.config.recipes import get_recipe
from santa.models import checkpoints
from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from santa.train.data import tokenization_settings, tokenize_pairs
from santa.train.loop_config import LoopConfig
from tests.training import stdlib_pair_rows, train_on_ranks, write_pairs

QUERIES = ["read a file line by line", "sort a list", "x"]
DOCUMENTS = ["def read_lines(path):\n    return open(path).read().splitlines()", "pass"]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return stdlib_pair_rows()[:48]


@pytest.fixture(scope="module")
def tokenizer(rows):
    texts = [r["query"] for r in rows] + [r["document"] for r in rows]
    return train_tokenizer(texts, vocab_size=get_recipe("tiny-ci-decoder").model.tiny_vocab_size)


def tiny_decoder(tokenizer, **model) -> DualEncoder:
    """The test-size tiny decoder, with its own copy of the tokenizer (a test sets its
    padding side)."""
    config = dataclasses.replace(get_recipe("tiny-ci-decoder").model, **model)
    return DualEncoder.build_tiny(config, copy.deepcopy(tokenizer), seed=0).eval()


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_pooling_reads_the_real_tokens_whatever_the_padding_side(tokenizer, pooling) -> None:
    """Right- and left-padded batches embed alike, and each text as it embeds alone (no
    padding at all): its last state (an EOS, kept when the text is cut) or its mean."""
    model = tiny_decoder(tokenizer, pooling=pooling)
    texts = [DOCUMENTS[0] * 3, *QUERIES]
    embedded = {}
    with torch.no_grad():
        for side in ("right", "left"):
            model.tokenizer.padding_side = side
            batch = model.tokenize(texts, max_length=16)
            assert (batch["input_ids"][:, 0] == tokenizer.pad_token_id).any() == (side == "left")
            embedded[side] = model.encode(batch["input_ids"], batch["attention_mask"])
        torch.testing.assert_close(embedded["left"], embedded["right"], atol=1e-5, rtol=1e-5)
        for row, text in enumerate(texts):
            ids = model.tokenize([text], max_length=16)["input_ids"]  # (1, length): no padding
            assert ids[0, -1] == tokenizer.eos_token_id  # also for the text cut to 16
            states = model.backbone(input_ids=ids).last_hidden_state[0]  # (length, dim)
            alone = states[-1] if pooling == "last" else states.mean(dim=0)
            torch.testing.assert_close(embedded["right"][row], alone, atol=1e-5, rtol=1e-5)


def test_training_input_and_encoding_tokenize_a_backbone_alike(tokenizer, tmp_path) -> None:
    """A backbone folder whose tokenizer adds no EOS (as Qwen2's and Llama's): the training
    collator and the model's own tokenizer both append it and put the prefixes first."""
    model = tiny_decoder(tokenizer)
    folder = tmp_path / "backbone"
    model.save_pretrained(str(folder))
    plain = json.loads((folder / "tokenizer.json").read_text())
    plain["post_processor"] = None  # the tokenizer of a hub decoder: no EOS of its own
    (folder / "tokenizer.json").write_text(json.dumps(plain))
    loaded = DualEncoder.from_pretrained(str(folder))
    config = SantaConfig(model=loaded.model_config, train=get_recipe("tiny-ci-decoder").train)
    settings = tokenization_settings(config)
    batch = pa.table({"query": QUERIES[:2], "document": DOCUMENTS})
    collated = tokenize_pairs(batch, tokenizer_path=str(folder), **settings)
    for role, texts, key, length in (
        ("query", QUERIES[:2], "query", settings["max_query_length"]),
        ("document", DOCUMENTS, "document", settings["max_document_length"]),
    ):
        encoded = loaded.tokenize(texts, length, padding="max_length", role=role)
        assert collated[f"{key}_input_ids"].tolist() == encoded["input_ids"].tolist()
        first = tokenizer.decode(encoded["input_ids"][0], skip_special_tokens=False)
        assert first.startswith(config.model.prefix(role) + texts[0][:4])  # right padding
        assert tokenizer.eos_token in first


def test_mep_on_a_decoder_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError) as refused:
        get_recipe("tiny-decoder").with_overrides(["train.mep_weight=1"])
    message = str(refused.value)
    assert "\n" not in message
    assert "T5's objective" in message and "model.kind='decoder'" in message
    assert "set train.mep_weight=0" in message


@pytest.fixture(scope="module")
def lora_run(rows, tokenizer, tmp_path_factory) -> dict:
    """The tiny decoder with LoRA (and Matryoshka prefixes) on the plain loop: 4 steps
    uninterrupted, and the same run stopped at step 2 and resumed."""
    work = tmp_path_factory.mktemp("lora")
    config = get_recipe("tiny-ci-decoder").with_overrides(
        [
            "model.lora_rank=4",
            "model.lora_alpha=8",
            "model.lora_target_modules=q_proj,v_proj,down_proj",
            "train.matryoshka_dims=64,16",
            "train.max_steps=4",
            "train.log_every=1",
            "train.checkpoint_every=2",
        ]
    )
    base = dataclasses.replace(config.model, lora_rank=0)
    DualEncoder.build_tiny(base, tokenizer, seed=0).save_pretrained(
        str(work / "init"), santa_config=config
    )

    def loop(stop_at_step: int = 0) -> LoopConfig:
        return LoopConfig(
            santa=config,
            init_model=str(work / "init"),
            data_uri=write_pairs(work / "pairs", rows),
            stop_at_step=stop_at_step,
            row_cache=str(work / "rows"),
        )

    whole = train_on_ranks(1, loop(), str(work / "whole"), str(work / "o1"))
    train_on_ranks(1, loop(stop_at_step=2), str(work / "resumed"), str(work / "o2"))
    resumed = train_on_ranks(1, loop(), str(work / "resumed"), str(work / "o3"))
    return {"work": work, "config": config, "whole": whole[0], "resumed": resumed[0]}


def test_lora_trains_only_its_adapters_and_checkpoints_only_them(lora_run) -> None:
    from safetensors.torch import load_file

    work = lora_run["work"]
    folder = work / "whole" / "checkpoint_000004" / "model"
    names = {p.name for p in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert "model.safetensors" not in names  # the base stays where it was
    trained = DualEncoder.from_pretrained(str(folder))
    init = DualEncoder.from_pretrained(str(work / "init")).state_dict()
    trainable, _ = trained.backbone.get_nb_trainable_parameters()
    saved = load_file(str(folder / "adapter_model.safetensors"))
    assert sum(t.numel() for t in saved.values()) == trainable > 0
    moved = 0
    for name, value in trained.state_dict().items():
        if "lora_" in name:
            moved += not torch.equal(value, torch.zeros_like(value)) and "lora_B" in name
            continue
        base_name = name.replace("base_model.model.", "").replace("base_layer.", "")
        assert torch.equal(value, init[base_name]), name  # frozen: not one bit changed
    assert moved == 3 * 2  # every B of q_proj, v_proj and down_proj, in both layers


def test_lora_checkpoint_resumes_bit_exactly(lora_run) -> None:
    whole, resumed = lora_run["whole"], lora_run["resumed"]
    assert resumed["rows"] == whole["rows"][2:]
    assert [r["loss"] for r in resumed["reports"]] == [r["loss"] for r in whole["reports"][2:]]
    work = lora_run["work"]
    final = [
        DualEncoder.from_pretrained(str(work / run / "checkpoint_000004" / "model")).state_dict()
        for run in ("whole", "resumed")
    ]
    for name, value in final[0].items():
        assert torch.equal(value, final[1][name]), name


def test_export_merges_the_adapters_and_encodes_in_sentence_transformers_as_santa(
    lora_run, tmp_path
) -> None:
    from sentence_transformers import SentenceTransformer

    from santa.models.encoding import encode_texts
    from santa.models.export import export_model

    checkpoint = lora_run["work"] / "whole" / "checkpoint_000004"
    resolved = checkpoints.resolve_checkpoint(str(checkpoint))
    target, written = export_model(
        resolved, str(tmp_path / "st"), sentence_transformers=True, dim=16
    )
    names = {p.name for p in target.iterdir()}
    assert "model.safetensors" in names and "adapter_config.json" not in names
    assert written["prompts"] == {"query": "query: ", "document": "passage: "}
    assert written["pooling"] == "last" and written["truncate_dim"] == 16
    assert "Trained with LoRA (rank 4, alpha 8.0" in (target / "README.md").read_text()

    santa_model = checkpoints.load(str(checkpoint))
    st_model = SentenceTransformer(str(target), device="cpu")
    length = st_model.max_seq_length
    for role, texts, encode in (
        ("query", QUERIES, st_model.encode_query),
        ("document", DOCUMENTS, st_model.encode_document),
    ):
        ours = torch.from_numpy(
            encode_texts(santa_model, texts, max_length=length, role=role, progress=False)
        )
        theirs = torch.as_tensor(encode(texts, convert_to_numpy=True))
        assert theirs.shape == (len(texts), 16)
        # Cosine model: sentence-transformers normalises then cuts; scores normalise again.
        torch.testing.assert_close(
            torch.nn.functional.normalize(theirs, dim=1),
            torch.nn.functional.normalize(ours[:, :16], dim=1),
            atol=1e-5,
            rtol=1e-4,
        )
