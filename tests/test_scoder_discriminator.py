"""SCodeR's discriminators (cross-encoders over ``[x; y]``), without Ray."""

from __future__ import annotations

import pytest
import torch

from santa.config.recipes import get_recipe, minilm_path
from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from santa.scoder.discriminator import (
    CODE_CODE,
    TEXT_CODE,
    Discriminator,
    DiscriminatorPair,
    discriminator_kind,
)

TEXTS = [
    "return the sum of two numbers",
    "def add(a, b):\n    return a + b",
    "read a file and return its lines",
    "def read_lines(path):\n    with open(path) as f:\n        return f.readlines()",
    "sort a list in place",
    "def sort_items(items):\n    items.sort()\n    return items",
    "print a greeting",
    "def greet(name):\n    print('hello', name)",
]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    """A tiny T5 dual encoder saved as santa does (the discriminators' backbone)."""
    tokenizer = train_tokenizer(TEXTS * 20, vocab_size=400)
    config = get_recipe("tiny").model
    folder = str(tmp_path_factory.mktemp("tiny") / "model")
    DualEncoder.build_tiny(config, tokenizer, seed=0).save_pretrained(folder)
    return folder


def test_pair_kinds_choose_the_discriminator():
    assert discriminator_kind("code_pair") == TEXT_CODE
    assert discriminator_kind("asst") == CODE_CODE


def test_scores_have_one_value_per_candidate(tiny_folder):
    model = Discriminator.from_backbone(tiny_folder, seed=1)
    assert type(model.encoder).__name__ == "T5EncoderModel"  # the encoder stack only
    scores = model.score_lists(
        TEXTS[0:2], [TEXTS[1:4], TEXTS[3:6]], max_first=8, max_length=32
    )  # 2 queries × 3 candidates
    assert scores.shape == (2, 3) and scores.dtype == torch.float32
    encoded = model.tokenize_pairs(TEXTS[:3], TEXTS[3:6], max_first=8, max_length=32)
    flat = model(encoded["input_ids"], encoded["attention_mask"])
    assert flat.shape == (3,)
    stacked = model(
        encoded["input_ids"].reshape(3, 1, -1), encoded["attention_mask"].reshape(3, 1, -1)
    )
    assert stacked.shape == (3, 1) and torch.allclose(stacked[:, 0], flat, atol=1e-5)


@pytest.mark.parametrize("backbone", ["tiny", "minilm"])
def test_pair_input_is_x_then_y_truncated(tiny_folder, backbone):
    """``[x; y]``: x cut to ``max_first`` tokens, y to the rest of ``max_length``, in the
    tokenizer's own pair format (T5: ``x </s> y </s>``; BERT: ``[CLS] x [SEP] y [SEP]``)."""
    location = tiny_folder if backbone == "tiny" else minilm_path()
    model = Discriminator.from_backbone(location)
    tokenizer = model.tokenizer
    query, code = TEXTS[2], TEXTS[3] * 3
    query_ids = tokenizer(query, add_special_tokens=False)["input_ids"]
    code_ids = tokenizer(code, add_special_tokens=False)["input_ids"]
    assert len(query_ids) > 4 and len(code_ids) > 40
    encoded = model.tokenize_pairs([query], [code], max_first=4, max_length=40)
    ids = encoded["input_ids"][0].tolist()
    assert len(ids) == 40 and encoded["attention_mask"][0].tolist() == [1] * 40  # full: no pad
    specials = set(tokenizer.all_special_ids)
    content = [i for i in ids if i not in specials]
    kept_code = 40 - 4 - sum(1 for i in ids if i in specials)
    assert content == query_ids[:4] + code_ids[:kept_code]
    first_special = next(p for p, i in enumerate(ids) if i in specials and p > 0)
    assert [i for i in ids[:first_special] if i not in specials] == query_ids[:4]
    # A short pair is padded, not cut.
    short = model.tokenize_pairs(["add"], ["def add(a, b): pass"], max_first=4, max_length=40)
    assert 0 < int(short["attention_mask"].sum()) < 40


def test_listwise_loss_overfits_a_tiny_set(tiny_folder):
    """The discriminator learns to put each query's own code first (Eq. 6-7)."""
    from santa.method.scoder_losses import discriminator_loss

    torch.manual_seed(0)
    model = Discriminator.from_backbone(tiny_folder, seed=0)
    queries = TEXTS[0::2]
    codes = TEXTS[1::2]
    candidates = [[codes[i]] + [c for j, c in enumerate(codes) if j != i] for i in range(4)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for _ in range(40):
        loss = discriminator_loss(
            model.score_lists(queries, candidates, max_first=12, max_length=48)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[0] > 1.0  # about log(4) at the start
    assert losses[-1] < 0.1 * losses[0]
    final = model.score_lists(queries, candidates, max_first=12, max_length=48)
    assert (final.argmax(dim=1) == 0).all()


def test_pair_saves_and_loads_back(tiny_folder, tmp_path):
    pair = DiscriminatorPair(
        {
            TEXT_CODE: Discriminator.from_backbone(tiny_folder, seed=1),
            CODE_CODE: Discriminator.from_backbone(tiny_folder, seed=2),
        }
    )
    pair.save_pretrained(str(tmp_path / "d"))
    loaded = DiscriminatorPair.from_pretrained(str(tmp_path / "d"))
    assert set(loaded.by_kind) == {TEXT_CODE, CODE_CODE}
    for kind in (TEXT_CODE, CODE_CODE):
        before = (
            pair.by_kind[kind]
            .eval()
            .score_lists(TEXTS[:1], [TEXTS[1:3]], max_first=8, max_length=32)
        )
        after = (
            loaded.by_kind[kind]
            .eval()
            .score_lists(TEXTS[:1], [TEXTS[1:3]], max_first=8, max_length=32)
        )
        assert torch.allclose(before, after, atol=1e-6)
    assert not torch.allclose(
        pair.by_kind[TEXT_CODE].head.weight, pair.by_kind[CODE_CODE].head.weight
    )
    with pytest.raises(FileNotFoundError, match="no discriminators"):
        DiscriminatorPair.from_pretrained(str(tmp_path / "missing"))


@pytest.mark.parametrize("backbone", ["tiny", "minilm"])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_folder, backbone):
    """Recomputing activations in backward (the minilm-scoder recipe's default) changes
    memory, not the gradients; it is on in the encoder's layers after enabling."""
    from santa.method.scoder_losses import discriminator_loss

    location = tiny_folder if backbone == "tiny" else minilm_path()
    queries, codes = TEXTS[0::2], TEXTS[1::2]
    candidates = [codes[i:] + codes[:i] for i in range(4)]
    gradients = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        pair = DiscriminatorPair({TEXT_CODE: Discriminator.from_backbone(location, seed=3)})
        if checkpointing:
            pair.gradient_checkpointing_enable()
        pair.train()
        flags = [getattr(m, "gradient_checkpointing", False) for m in pair.modules()]
        assert any(flags) == checkpointing
        model = pair.by_kind[TEXT_CODE]
        torch.manual_seed(1)  # the same dropout masks in both runs
        loss = discriminator_loss(
            model.score_lists(queries, candidates, max_first=8, max_length=32)
        )
        loss.backward()
        gradients.append(
            {n: p.grad.clone() for n, p in pair.named_parameters() if p.grad is not None}
        )
    plain, checkpointed = gradients
    assert plain.keys() == checkpointed.keys() and len(plain) > 10
    for name, grad in plain.items():
        assert torch.allclose(grad, checkpointed[name], atol=1e-5, rtol=1e-4), name
