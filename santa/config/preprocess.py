"""What a preprocessing run reads and writes (:class:`PreprocessConfig`), apart from the
pipeline that runs it, so its report and the command line need no pipeline."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from santa.data import esci
from santa.data.datasets import DATASETS as REGISTRY
from santa.data.datasets import dataset as dataset_entry
from santa.data.records import PairOptions
from santa.data.schema import CODE_LANGUAGES
from santa.method.entities import PRODUCT_ENTITY_RULES

__all__ = ["DATASETS", "MERGED_SPLIT", "SPLITS", "STAGES", "PreprocessConfig"]

DATASETS = tuple(REGISTRY)  # the registry's names (santa.data.datasets)
STAGES = ("pretrain", "finetune", "eval")
MERGED_SPLIT = "train+test"
SPLITS = ("train", "valid", "test", MERGED_SPLIT)


@dataclass(frozen=True, kw_only=True)
class PreprocessConfig:
    """What to preprocess and how; plain values so it travels as a dict through Ray."""

    dataset: str
    """A dataset of the registry (:mod:`santa.data.datasets`): codesearchnet, advtest, esci,
    source, cosqa, pairs."""
    input: str
    """Local path or s3:// URI of the raw data (a directory or a file)."""
    output: str
    """Local path or s3:// URI; Parquet shards go to ``data/``, BEIR files for ``eval``."""
    stage: str = ""
    """pretrain (SDA + MEP pairs), finetune (query–document pairs) or eval (BEIR); the
    dataset's first stage when empty (pretrain; cosqa: eval; pairs: finetune)."""
    split: str = ""
    """Split to process; default train for pretrain/finetune and test for eval.
    ``train+test`` (code datasets, training stages) takes both: SANTA's Table 5 pretrains
    on CodeSearchNet Python's train and test splits merged."""
    languages: tuple[str, ...] = ()
    """Code languages to keep (all six when empty)."""
    mask: str = "entity"
    """entity (SANTA's MEP) or span (random T5 spans at the same rate, the ablation)."""
    seed: int = 0
    esci_version: str = "small"
    """ESCI task version: small (Task 1, the paper's) or large."""
    locale: str = "us"
    """ESCI product locale."""
    esci_dev_fraction: float = esci.DEV_FRACTION
    """ESCI: share of the train split's queries carved out as ``valid`` (SANTA's 0.125)."""
    esci_dev_seed: int = esci.DEV_SEED
    """ESCI: the seed of that carve (SANTA's ``random_state=10``; :mod:`santa.data.esci`)."""
    esci_pretrain: str = "product"
    """ESCI pretraining pairs: ``product`` (one per product, held-out products left out) or
    ``paper`` (one per Exact judgment, as SANTA's scripts; test products included)."""
    product_entities: str = "scripts"
    """Product entity rule (:data:`santa.method.entities.PRODUCT_ENTITY_RULES`)."""
    max_query_chars: int = 4_096
    max_document_chars: int = 16_384
    skip_tests: bool = False
    """For ``source``: skip test directories."""
    batch_size: int = 256
    lines_per_block: int = 1_000
    """JSON lines per block read, and per parser call."""
    read_part_bytes: int = 4 << 20
    """A JSON lines file is read in one task per this many bytes of it (at most 8; see
    ``JsonLinesDatasource``), so that a few large files keep every parser busy. The parts
    depend on the input alone, not on the cluster: the pairs are written in the same
    order on any cluster, and train the same model."""
    rows_per_file: int = 50_000
    """Pair rows per Parquet file written, at least (the last file may hold fewer):
    small read blocks would otherwise each become a small file, one write task each.
    An output of fewer than ``rows_per_file`` × cluster CPUs rows is split evenly over
    the CPUs instead, so that its files are written in parallel."""
    block_bytes: int = 16 << 20
    """Target size of the blocks read (Ray Data's ``target_max_block_size`` for this
    dataset only): the unit of work a parser call gets. Ray's default (128 MiB) would
    merge the lines of a whole JSON lines file, or many source files, into one block: a
    few large parser calls, and a whole file in a parser's memory at once."""
    num_cpus_per_actor: float = 1.0
    """CPUs of each parser: a pair builder task, or an ESCI judgment-join actor."""
    min_actors: int = 1
    """Lower bound of ESCI's judgment-join actor pool (Ray Data scales it up to
    ``max_actors`` as CPUs free up). The other pairs are built by Ray tasks, with no pool,
    unless this asks for more parsers than the cluster holds now: then they are a pool of
    this many actors at least, which an autoscaling cluster adds nodes for."""
    max_actors: int = 0
    """At most this many parsers at once (pair builder tasks, judgment-join actors); 0
    means one per cluster CPU."""
    options: dict[str, Any] = field(default_factory=dict)
    code_text: str = "raw"
    """Code pairs' texts (:data:`santa.data.records.CODE_TEXTS`): ``raw`` (santa's: code
    without its docstring) or ``tokens`` (SANTA's released code and CodeXGLUE's evaluation:
    the joined code and docstring tokens)."""
    mep_targets: str = "all"
    """Which identifiers code pretraining masks (:data:`santa.data.records.MEP_TARGETS`):
    ``all`` or ``released`` (SANTA's released per-language sample, trailing sentinel)."""
    asst: bool = False
    """pretrain/finetune: also write ASST code–code pairs (kind ``asst``, SCodeR's
    Algorithm 1) of the written code pairs beside them (``santa.data.asst_pairs``)."""

    def __post_init__(self) -> None:
        entry = dataset_entry(self.dataset)
        if not self.stage:
            object.__setattr__(self, "stage", entry.stages[0])
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, not {self.stage!r}")
        if self.stage not in entry.stages:
            raise ValueError(
                f"{self.dataset} has the stage(s) {', '.join(entry.stages)}, not {self.stage}"
            )
        if self.asst and (not entry.asst or self.stage == "eval"):
            raise ValueError(
                "--asst makes code–code training pairs: a code dataset, not --stage eval"
            )
        if self.split and self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {self.split!r}")
        if self.split == MERGED_SPLIT and (self.stage == "eval" or not entry.asst):
            raise ValueError(
                f"--split {MERGED_SPLIT} merges a code dataset's splits for training, not for "
                f"{self.dataset} --stage {self.stage}"
            )
        unknown = set(self.languages) - set(CODE_LANGUAGES)
        if unknown:
            raise ValueError(f"unknown languages {sorted(unknown)}; known: {CODE_LANGUAGES}")
        if self.esci_version not in ("small", "large"):
            raise ValueError("esci_version must be small or large")
        if self.esci_pretrain not in esci.PRETRAIN_RULES:
            raise ValueError(f"esci_pretrain must be one of {esci.PRETRAIN_RULES}")
        if self.product_entities not in PRODUCT_ENTITY_RULES:
            raise ValueError(f"product_entities must be one of {PRODUCT_ENTITY_RULES}")
        if not 0 < self.esci_dev_fraction < 1:
            raise ValueError(f"esci_dev_fraction must be in (0, 1), got {self.esci_dev_fraction}")
        sizes = (self.batch_size, self.lines_per_block, self.read_part_bytes)
        if min(*sizes, self.block_bytes, self.rows_per_file) < 1:
            raise ValueError(
                "batch_size, lines_per_block, read_part_bytes, block_bytes and "
                "rows_per_file must be positive"
            )
        object.__setattr__(self, "languages", tuple(self.languages))

    @property
    def wanted_split(self) -> str:
        """The split this run writes (``train+test``: both)."""
        return self.split or ("test" if self.stage == "eval" else "train")

    @property
    def wanted_splits(self) -> tuple[str, ...]:
        """The splits this run writes."""
        return tuple(self.wanted_split.split("+"))

    def pair_options(self, stage: str | None = None) -> PairOptions:
        """The per-record options for the pair builders."""
        return PairOptions(
            stage=stage or self.stage,
            mask=self.mask,
            seed=self.seed,
            max_query_chars=self.max_query_chars,
            max_document_chars=self.max_document_chars,
            product_entities=self.product_entities,
            code_text=self.code_text,
            mep_targets=self.mep_targets,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        payload = asdict(self)
        payload["languages"] = list(self.languages)
        return payload

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> PreprocessConfig:
        """Rebuild from :meth:`to_dict`, rejecting unknown keys."""
        names = {f.name for f in fields(cls)}
        unknown = set(payload) - names
        if unknown:
            raise ValueError(f"unknown preprocess config keys: {sorted(unknown)}")
        return cls(**payload)
