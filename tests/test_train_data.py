"""Ray Data's tokenize tasks: the tokenizer.json path gives transformers' ids and masks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from santa.train.data import JsonTokenizer, _json_tokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]

TEXTS = [
    "def get_value(self, key):\n    return self._data[key]",
    "Return the value stored under KEY, or raise KeyError.",
    "",
    "ünïcödé  and\ttabs\nand newlines   " * 3,
    "a very long document " * 200,  # truncated
    "[CLS] <pad> </s> <extra_id_0> special-looking text",
    "x",
]


def minilm_folder() -> str:
    from santa.config.recipes import minilm_path

    return minilm_path()  # a core dependency: its absence is a failure, not a skip


def tiny_folder(tmp_path: Path) -> str:
    from santa.models.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(TEXTS * 10, vocab_size=400)
    tokenizer.save_pretrained(tmp_path / "tiny")
    return str(tmp_path / "tiny")


def assert_same_as_transformers(folder: str, lengths=(2, 8, 50, 240)) -> None:
    from transformers import AutoTokenizer

    light = load_tokenizer.__wrapped__(folder)
    assert isinstance(light, JsonTokenizer)
    reference = AutoTokenizer.from_pretrained(folder)
    for max_length in lengths:
        expected = reference(
            TEXTS, max_length=max_length, truncation=True, padding="max_length", return_tensors="np"
        )
        ids, mask = light.encode(TEXTS, max_length)
        assert ids.dtype == mask.dtype == np.int64
        np.testing.assert_array_equal(ids, expected["input_ids"], err_msg=f"{folder} {max_length}")
        np.testing.assert_array_equal(mask, expected["attention_mask"])


def test_bert_tokenizer_json_matches_transformers() -> None:
    assert_same_as_transformers(minilm_folder())


def test_byte_level_bpe_tokenizer_json_matches_transformers(tmp_path) -> None:
    assert_same_as_transformers(tiny_folder(tmp_path))


def test_left_padding_and_truncation_sides_are_honoured(tmp_path) -> None:
    folder = Path(tiny_folder(tmp_path))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.update(padding_side="left", truncation_side="left")
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    assert_same_as_transformers(str(folder), lengths=(8, 240))


def test_other_tokenizers_go_through_transformers(tmp_path) -> None:
    """A class not known to be its tokenizer.json, or a folder without one: transformers."""
    folder = Path(tiny_folder(tmp_path))
    assert isinstance(_json_tokenizer(str(folder)), JsonTokenizer)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**settings, "tokenizer_class": "LlamaTokenizer"})
    )
    assert _json_tokenizer(str(folder)) is None
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "tokenizer.json").unlink()
    assert _json_tokenizer(str(folder)) is None


def test_tokenize_task_imports_neither_transformers_nor_torch(tmp_path) -> None:
    """What a fresh Ray Data worker pays to tokenize a batch of a santa model folder."""
    folder = tiny_folder(tmp_path)
    probe = (
        "import sys, pyarrow as pa\n"
        "from santa.train.data import tokenize_pairs\n"
        "table = pa.table({'query': ['find a key'], 'document': ['def get(k): return k']})\n"
        f"out = tokenize_pairs(table, tokenizer_path={folder!r}, max_query_length=8,"
        " max_document_length=16, max_target_length=8, with_mep=False, with_document=True)\n"
        "print(out['document_input_ids'].shape,"
        " sorted(m for m in ('transformers', 'torch') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(1, 16) []"
