"""The model a run starts from when it is the tiny recipe's: a T5 built from the config with
a tokenizer trained on the run's own data (kept in the storage's cache folder, so stages,
resumed runs and trials on the same corpus train it once), saved once under the run
folder. A Ray run builds it in its rank-0 worker, which imports the model's libraries
anyway (the driver then never does: seconds of every job's start)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile

from santa.config import SantaConfig
from santa.data.published import pair_files
from santa.files import storage
from santa.files.layout import CacheLayout
from santa.files.outputs import read_manifest

logger = logging.getLogger(__name__)

TOKENIZER_SAMPLE_ROWS = 20_000


def build_tiny_model(config: SantaConfig, data_uri: str, cache: CacheLayout, init_uri: str) -> None:
    """Build the tiny recipe's random model for the corpus ``data_uri`` and save it at
    ``init_uri`` (LoRA adapters, ``model.lora_rank``, are added on it by every worker)."""
    from santa.models.dual_encoder import DualEncoder

    tokenizer = corpus_tokenizer(data_uri, config.model.tiny_vocab_size, cache)
    base = dataclasses.replace(config.model, lora_rank=0)
    model = DualEncoder.build_tiny(base, tokenizer, seed=config.train.seed)
    model.save_pretrained(init_uri, santa_config=config)
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("built a tiny %s with %d parameters at %s", base.kind, parameters, init_uri)


def read_texts(data_uri: str, limit: int = TOKENIZER_SAMPLE_ROWS) -> list[str]:
    """Query and document texts of the first ``limit`` pairs (to train a tokenizer)."""
    from santa.data.published import iter_pairs

    texts: list[str] = []
    for table in iter_pairs(data_uri, ["query", "document"]):
        for column in ("query", "document"):
            texts.extend(table.column(column).to_pylist())
        if len(texts) >= 2 * limit:
            break
    if not texts:
        raise ValueError(f"no training pairs under {data_uri}")
    return texts[: 2 * limit]


def tokenizer_key(data_uri: str, vocab_size: int) -> str:
    """Which corpus (its files, their sizes, its publish) and vocabulary a tokenizer is for."""
    files = pair_files(data_uri)
    manifest = read_manifest(data_uri) or {}
    payload = {
        "data": storage.absolute(data_uri),
        "publish": (manifest.get("manifest") or {}).get("run_id"),
        "files": [
            [uri.rsplit("/", 1)[-1], size]
            for uri, size in zip(files, storage.file_sizes(files), strict=True)
        ],
        "vocab_size": vocab_size,
        "sample_rows": TOKENIZER_SAMPLE_ROWS,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return f"v{vocab_size}-{digest[:16]}"


def corpus_tokenizer(data_uri: str, vocab_size: int, cache: CacheLayout):
    """The tiny recipe's tokenizer for a corpus: trained once, then kept in the cache
    folder beside the runs, so the stages, resumed runs and trials on the same data load
    it instead of training it again."""
    from transformers import AutoTokenizer

    from santa.models.tokenizer import train_tokenizer

    folder = cache.tokenizer(tokenizer_key(data_uri, vocab_size))
    with tempfile.TemporaryDirectory(prefix="santa-tokenizer-") as local:
        if storage.exists(storage.join(folder, "tokenizer.json")):
            storage.download_dir(folder, local, what="tokenizer")
            logger.info("reusing the tokenizer trained for %s (%s)", data_uri, folder)
            return AutoTokenizer.from_pretrained(local)
        tokenizer = train_tokenizer(read_texts(data_uri), vocab_size=vocab_size)
        tokenizer.save_pretrained(local)
        # Whole or not at all: the marker file (tokenizer.json) goes up last.
        names = sorted(os.listdir(local), key=lambda name: name == "tokenizer.json")
        for name in names:
            with open(os.path.join(local, name), "rb") as handle:
                storage.write_bytes(storage.join(folder, name), handle.read())
        return tokenizer
