"""SANTA's training input: the preprocessed pairs' rows (:mod:`santa.train.rows`) → each
batch tokenized as it is collated, on the worker, ahead of its step
(:mod:`santa.train.epochs`): the tokenizer-independent text columns become fixed-length id
arrays. Nothing is tokenized before the first step, and nothing is kept after its step.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa

from santa.data.kinds import embedded_document, is_training_row, row_kind, training_mask
from santa.data.published import pair_files
from santa.files import storage
from santa.train.rows import RowSource

# Fixed-length padding keeps every batch the same shape (no recompilation, simple
# all-gather); lengths are small enough that dynamic padding would buy little.
IGNORE_INDEX = -100
# String columns carried beside the tensors (hard negatives are looked up by query id, and
# a query's own document is never drawn as its filler negative).
ID_COLUMNS = ("query_id", "doc_id")


# Tokenizer classes whose fast tokenizer is their tokenizer.json alone (checked against
# transformers in tests/test_train_data.py): for these, Ray Data's tokenize tasks load the
# file with `tokenizers` and never import transformers, which imports torch (seconds and
# hundreds of MB in every fresh data worker process).
TOKENIZER_JSON_CLASSES = frozenset(
    {
        "BertTokenizer",
        "BertTokenizerFast",
        "PreTrainedTokenizerFast",
        "TokenizersBackend",
    }
)


class JsonTokenizer:
    """A model folder's ``tokenizer.json`` through the ``tokenizers`` library: the ids and
    masks transformers' fast tokenizer gives for ``truncation=True,
    padding="max_length"``, without transformers."""

    def __init__(self, path: str, pad_token: str, padding_side: str, truncation_side: str):
        from tokenizers import Tokenizer

        self.path = path
        self._tokenizer = Tokenizer.from_file(path)
        self.pad_token = pad_token
        self.pad_id = self._tokenizer.token_to_id(pad_token)
        if self.pad_id is None:
            raise ValueError(f"pad token {pad_token!r} is not in {path}")
        self.padding_side, self.truncation_side = padding_side, truncation_side
        self._by_length: dict[int, Any] = {}

    def encode(self, texts: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """Ids and attention mask, ``(len(texts), max_length)`` int64 each."""
        tokenizer = self._by_length.get(max_length)
        if tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self._tokenizer.to_str())
            tokenizer.enable_truncation(
                max_length, strategy="longest_first", direction=self.truncation_side
            )
            tokenizer.enable_padding(
                direction=self.padding_side,
                pad_id=self.pad_id,
                pad_token=self.pad_token,
                length=max_length,
            )
            self._by_length[max_length] = tokenizer
        encodings = tokenizer.encode_batch(list(texts), add_special_tokens=True)
        ids = np.array([e.ids for e in encodings], dtype=np.int64).reshape(-1, max_length)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return ids, mask.reshape(-1, max_length)


def _json_tokenizer(folder: str, append_eos: bool = False) -> JsonTokenizer | None:
    """The folder's tokenizer without transformers, when its class allows; else None."""
    import os

    files = [os.path.join(folder, name) for name in ("tokenizer.json", "tokenizer_config.json")]
    if not all(os.path.isfile(path) for path in files):
        return None
    with open(files[1], encoding="utf-8") as handle:
        settings = json.load(handle)
    pad = settings.get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
    if settings.get("tokenizer_class") not in TOKENIZER_JSON_CLASSES or not pad:
        return None
    tokenizer = JsonTokenizer(
        files[0],
        pad_token=pad,
        padding_side=settings.get("padding_side", "right"),
        truncation_side=settings.get("truncation_side", "right"),
    )
    if append_eos:
        from santa.models.decoder import append_eos_to_backend

        eos = settings.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        eos_id = tokenizer._tokenizer.token_to_id(eos) if eos else None
        if eos_id is None:
            raise ValueError(f"{folder}: the tokenizer has no EOS token to append")
        append_eos_to_backend(tokenizer._tokenizer, eos, eos_id)
    return tokenizer


@functools.lru_cache(maxsize=4)
def load_tokenizer(location: str, append_eos: bool = False):
    """A tokenizer from a local folder, an ``s3://`` model folder or a hub name (cached):
    the folder's ``tokenizer.json`` alone where that is the whole tokenizer
    (:class:`JsonTokenizer`), else transformers' ``AutoTokenizer``. ``append_eos``: every
    sequence ends with the EOS token (a decoder's, :mod:`santa.models.decoder`)."""
    import os

    if storage.is_s3(location):
        local_dir = tempfile.mkdtemp(prefix="santa-tokenizer-")
        storage.download_dir(location, local_dir, what="tokenizer")
        location = local_dir
    if os.path.isdir(location):
        light = _json_tokenizer(location, append_eos)
        if light is not None:
            return light
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    if tokenizer.pad_token is None:  # Llama's: decoders pad with their EOS
        tokenizer.pad_token = tokenizer.eos_token
    if append_eos:
        from santa.models.decoder import append_eos as add_eos

        add_eos(tokenizer)
    return tokenizer


def _encode(tokenizer, texts: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(tokenizer, JsonTokenizer):
        return tokenizer.encode(texts, max_length)
    encoded = tokenizer(
        texts,
        max_length=max_length,
        truncation=True,
        padding="max_length",
        return_tensors="np",
    )
    return encoded["input_ids"].astype(np.int64), encoded["attention_mask"].astype(np.int64)


def tokenization_settings(config) -> dict[str, Any]:
    """What the streaming tokenizer produces for this config."""
    with_mep = config.train.uses_mep
    limit = config.model.max_seq_length or None  # the backbone's own (sentence-transformers)
    return {
        "max_query_length": min(config.train.max_query_length, limit or 1 << 30),
        "max_document_length": min(config.train.max_document_length, limit or 1 << 30),
        "max_target_length": config.train.max_target_length,
        "with_mep": with_mep,
        "with_document": (not with_mep) or config.model.embed_unmasked_document,
        "lowercase": config.model.lowercase,
        "query_prefix": config.model.query_prefix,
        "document_prefix": config.model.document_prefix,
        "append_eos": config.model.is_decoder and config.model.append_eos,
    }


def tokenize_pairs(
    batch: pa.Table,
    *,
    tokenizer_path: str,
    max_query_length: int,
    max_document_length: int,
    max_target_length: int,
    with_mep: bool,
    with_document: bool,
    lowercase: bool = False,
    query_prefix: str = "",
    document_prefix: str = "",
    append_eos: bool = False,
) -> dict[str, np.ndarray]:
    """Ray Data function: a batch of pair rows → id/mask arrays for the model.

    Outputs ``query_*`` always, ``document_*`` when the unmasked document is embedded, and
    ``masked_*`` plus ``labels`` (pad → -100) for Masked Entity Prediction. Queries and
    documents get the model's prefixes (``DualEncoder.prepare_texts``).
    """
    tokenizer = load_tokenizer(tokenizer_path, append_eos)
    kinds: list[str] = []
    if "dataset" in batch.column_names:
        kinds = pair_kinds(batch)
        keep = [
            is_training_row(kind, label)
            for kind, label in zip(kinds, batch.column("label").to_pylist(), strict=True)
        ]
        if not all(keep):
            batch = batch.filter(pa.array(keep))
            kinds = [kind for kind, kept in zip(kinds, keep, strict=True) if kept]
    columns = batch.to_pydict()
    if query_prefix:
        columns["query"] = [query_prefix + text for text in columns["query"]]
    if document_prefix and "masked_document" in columns:
        columns["masked_document"] = [document_prefix + t for t in columns["masked_document"]]
    if lowercase:
        for key in ("query", "document", "masked_document"):
            if key in columns:
                columns[key] = [text.lower() for text in columns[key]]
    out: dict[str, np.ndarray] = {}
    for key in ID_COLUMNS:
        if key in columns:
            out[key] = np.asarray(columns[key], dtype=object)  # (batch,) strings
    out["query_input_ids"], out["query_attention_mask"] = _encode(
        tokenizer, columns["query"], max_query_length
    )  # (batch, max_query_length)
    if with_document:
        documents = columns["document"]
        if kinds and "title" in columns:  # ESCI judgments embed title + text, as evaluation
            documents = [
                embedded_document(kind, title, document)
                for kind, title, document in zip(kinds, columns["title"], documents, strict=True)
            ]
        if document_prefix:
            prefix = document_prefix.lower() if lowercase else document_prefix
            documents = [prefix + text for text in documents]
        out["document_input_ids"], out["document_attention_mask"] = _encode(
            tokenizer, documents, max_document_length
        )  # (batch, max_document_length)
    if with_mep:
        out["masked_input_ids"], out["masked_attention_mask"] = _encode(
            tokenizer, columns["masked_document"], max_document_length
        )
        labels, label_mask = _encode(tokenizer, columns["mep_target"], max_target_length)
        # A pair with no entity (an empty target) trains SDA only: no MEP label at all.
        no_entity = np.array([not target for target in columns["mep_target"]])[:, None]
        out["labels"] = np.where(
            (label_mask == 1) & ~no_entity, labels, IGNORE_INDEX
        )  # (batch, max_target)
    return out


def pair_kinds(batch: pa.Table | pa.RecordBatch) -> list[str]:
    """Each pair row's kind (:func:`santa.data.kinds.row_kind`: its ``kind`` column, else
    inferred from the dataset and the MEP target)."""
    given = (
        batch.column("kind").to_pylist()
        if "kind" in batch.column_names
        else [None] * batch.num_rows
    )
    return [
        row_kind(kind, dataset, target)
        for kind, dataset, target in zip(
            given,
            batch.column("dataset").to_pylist(),
            batch.column("mep_target").to_pylist(),
            strict=True,
        )
    ]


def training_pair_mask(batch: pa.RecordBatch) -> np.ndarray:
    """Which pair rows train (:func:`santa.data.kinds.is_training_row`): all but ESCI's
    non-Exact judgments."""
    return training_mask(batch)


PAIR_COLUMNS = (
    "dataset",
    "label",
    "query_id",
    "doc_id",
    "query",
    "title",
    "document",
    "masked_document",
    "mep_target",
)


def pairs_source(data_uri: str) -> RowSource:
    """The training pairs of the preprocess output ``data_uri``: its training rows, the
    columns the collator reads (``kind`` where the corpus has it)."""
    return RowSource(
        files=tuple(pair_files(data_uri)),
        columns=PAIR_COLUMNS,
        optional=("kind",),
        filter_name="training_pairs",
        keep=training_pair_mask,
    )


class PairCollator:
    """A batch of pair rows (a Table) → the model's id arrays (:func:`tokenize_pairs`).

    Its :meth:`cache_key` names what it computes, so that the node's token cache
    (:mod:`santa.train.tokens`) keeps its ids across epochs and runs; the id columns are
    passed through from the rows.
    """

    passthrough = ID_COLUMNS

    def __init__(self, tokenizer_path: str, settings: dict[str, Any]) -> None:
        self.tokenizer_path, self.settings = tokenizer_path, settings

    def __call__(self, rows: pa.Table) -> dict[str, np.ndarray]:
        return tokenize_pairs(rows, tokenizer_path=self.tokenizer_path, **self.settings)

    def cache_key(self) -> str | None:
        """What this collator computes from a row: the tokenizer as loaded, the settings
        (lengths, prefixes, case) and the code that collates; None for a tokenizer that
        cannot be named (a slow one), which is not cached."""
        tokenizer = load_tokenizer(self.tokenizer_path, self.settings.get("append_eos", False))
        named = tokenizer_fingerprint(tokenizer)
        if named is None:
            return None
        payload = {"tokenizer": named, "settings": self.settings, "code": _collating_code()}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def tokenizer_fingerprint(tokenizer) -> str | None:
    """A digest of everything that decides ``tokenizer``'s ids and masks (its vocabulary,
    normalizer, pre-tokenizer, post-processor, special tokens, padding and truncation
    sides), or None when it has no serialized form (a slow tokenizer)."""
    if isinstance(tokenizer, JsonTokenizer):
        backend, pad = tokenizer._tokenizer, tokenizer.pad_token
    else:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        pad = tokenizer.pad_token
    described = json.dumps(
        [
            type(tokenizer).__name__,
            pad,
            tokenizer.padding_side,
            tokenizer.truncation_side,
        ]
    )
    # Truncation and padding as the last call left them on the backend are not the
    # tokenizer's: each encode sets its own (the sides are named above).
    serialized = json.loads(backend.to_str())
    serialized.pop("truncation", None)
    serialized.pop("padding", None)
    digest = hashlib.sha256(json.dumps(serialized, sort_keys=True).encode())
    digest.update(described.encode())
    return digest.hexdigest()


@functools.cache
def _collating_code() -> str:
    """A digest of the source that turns rows into ids (this module, the rows' kinds): an
    edit there is another token cache, never stale ids."""
    import inspect

    from santa.data import kinds

    digest = hashlib.sha256()
    for module in (sys.modules[__name__], kinds):
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()


def query_groups(files: tuple[str, ...]):
    """The units of ``train.epoch_unit="query"``: each query's training rows (its Exact
    judgments) as a group, in the order queries first appear, leaving out queries without
    a judged negative (a non-Exact judgment anywhere in ``files``), as SANTA's
    ``build_product.py`` drops them. ``(offsets, members)`` for
    :class:`santa.train.order.EpochPlan`."""

    def groups(rows) -> tuple[np.ndarray, np.ndarray]:
        import pyarrow.compute as pc

        from santa.data.published import iter_parquet

        with_negatives: set[str] = set()
        for table in iter_parquet(
            files, ["dataset", "label", "query_id", "mep_target"], optional=["kind"]
        ):
            trains = training_pair_mask(table)
            ids = table.column("query_id").to_pylist()
            with_negatives.update(q for q, t in zip(ids, trains, strict=True) if not t)
        queries = rows.columns(["query_id"]).column("query_id").combine_chunks()
        encoded = pc.dictionary_encode(queries)
        codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        kept_query = np.array(
            [q in with_negatives for q in encoded.dictionary.to_pylist()], dtype=bool
        )
        rows_kept = np.flatnonzero(kept_query[codes])
        order = rows_kept[np.argsort(codes[rows_kept], kind="stable")]
        renumbered = np.cumsum(kept_query) - 1  # query code → unit number
        sizes = np.bincount(renumbered[codes[order]], minlength=int(kept_query.sum()))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return offsets, order.astype(np.int64)

    return groups


def pair_data(loop) -> Any:
    """SANTA's training data (``LoopConfig`` → ``TrainingData``): the preprocessed pairs'
    training rows, each batch tokenized for the run's model as it is collated; with
    ``train.epoch_unit="query"``, an epoch of one example per query."""
    import dataclasses

    from santa.train.loop_config import TrainingData

    source = pairs_source(loop.data_uri)
    units = "rows"
    if loop.santa.train.epoch_unit == "query":
        source = dataclasses.replace(
            source, filter_name="training_pairs+query_groups", groups=query_groups(source.files)
        )
        units = "groups"
    return TrainingData(
        source=source,
        collate=PairCollator(loop.init_model, tokenization_settings(loop.santa)),
        units=units,
    )
