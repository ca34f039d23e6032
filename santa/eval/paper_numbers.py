"""The papers' published numbers, each with its paper, table, row and column.

Transcribed from ``../shared/papers/santa.md`` (Li et al., Findings of ACL 2023) and
``scoder.md`` (Li et al., Findings of EMNLP 2022). Values are as printed: percentages
(MRR x 100, NDCG x 100). ``bench/paper.py`` prints them beside santa's own numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CODESEARCH_LANGUAGES",
    "SETTINGS",
    "TABLE1_SIZES",
    "TABLE7_SIZES",
    "PaperNumber",
    "numbers_for",
]

# Table 6's column order (and SCodeR Table 1's).
CODESEARCH_LANGUAGES = ("ruby", "javascript", "go", "python", "java", "php")
SETTINGS = ("codesearch", "adv", "esci-2", "esci-4")


@dataclass(frozen=True)
class PaperNumber:
    """One published number and exactly where it is printed."""

    value: float
    """As printed (a percentage)."""
    paper: str
    """``SANTA`` or ``SCodeR``."""
    table: str
    row: str
    column: str
    """A language (lower case), ``overall``, ``adv``, ``two-class`` or ``four-class``."""
    metric: str

    @property
    def source(self) -> str:
        """``SANTA Table 6, SANTA (Hard Negative)``: where the number is printed."""
        return f"{self.paper} {self.table}, {self.row}"


def _codesearch_row(paper: str, table: str, row: str, values: tuple[float, ...]) -> list:
    """A CodeSearch row: six languages in Table 6's order, then the overall mean."""
    columns = (*CODESEARCH_LANGUAGES, "overall")
    return [
        PaperNumber(v, paper, table, row, c, "MRR") for v, c in zip(values, columns, strict=True)
    ]


_NUMBERS: list[PaperNumber] = [
    # SANTA Table 6 (Appendix A.4): CodeSearch MRR per language and overall; Adv MRR.
    *_codesearch_row(
        "SANTA", "Table 6", "zero-shot SANTA", (72.6, 62.4, 88.9, 70.0, 68.6, 62.8, 70.9)
    ),
    *_codesearch_row(
        "SANTA", "Table 6", "SANTA (Hard Negative)", (74.7, 68.6, 91.8, 73.7, 73.7, 68.6, 75.2)
    ),
    *_codesearch_row(
        "SANTA",
        "Table 6",
        "CodeRetriever (Hard Negative)",
        (75.1, 69.8, 92.3, 74.0, 74.9, 69.1, 75.9),
    ),
    PaperNumber(48.1, "SANTA", "Table 6", "zero-shot SANTA", "adv", "MRR"),
    PaperNumber(48.6, "SANTA", "Table 6", "SANTA (Hard Negative)", "adv", "MRR"),
    # SANTA Table 2: Adv MRR ("Code"), ESCI small NDCG@100 two- and four-class ("Product").
    PaperNumber(46.1, "SANTA", "Table 2", "zero-shot SANTA", "adv", "MRR"),
    PaperNumber(47.3, "SANTA", "Table 2", "SANTA (Inbatch)", "adv", "MRR"),
    PaperNumber(47.5, "SANTA", "Table 2", "SANTA (Hard Negative)", "adv", "MRR"),
    PaperNumber(70.21, "SANTA", "Table 2", "zero-shot T5", "two-class", "NDCG@100"),
    PaperNumber(71.25, "SANTA", "Table 2", "zero-shot T5", "four-class", "NDCG@100"),
    PaperNumber(76.38, "SANTA", "Table 2", "zero-shot SANTA", "two-class", "NDCG@100"),
    PaperNumber(77.14, "SANTA", "Table 2", "zero-shot SANTA", "four-class", "NDCG@100"),
    PaperNumber(80.76, "SANTA", "Table 2", "SANTA (Inbatch)", "two-class", "NDCG@100"),
    PaperNumber(81.41, "SANTA", "Table 2", "SANTA (Inbatch)", "four-class", "NDCG@100"),
    PaperNumber(82.59, "SANTA", "Table 2", "SANTA (Hard Negative)", "two-class", "NDCG@100"),
    PaperNumber(83.15, "SANTA", "Table 2", "SANTA (Hard Negative)", "four-class", "NDCG@100"),
    # SCodeR Table 1: CSN (CodeSearch) MRR per language and average, AdvTest MRR.
    *_codesearch_row("SCodeR", "Table 1", "SCodeR", (77.5, 72.0, 92.7, 74.2, 74.8, 69.2, 76.7)),
    PaperNumber(45.5, "SCodeR", "Table 1", "SCodeR", "adv", "MRR"),
]

# SANTA Table 7: CodeSearch queries (dev, test) and candidate codes per language.
TABLE7_SIZES = {
    "python": {"valid": 13_914, "test": 14_918, "codebase": 43_827},
    "php": {"valid": 12_982, "test": 14_014, "codebase": 52_660},
    "go": {"valid": 7_325, "test": 8_122, "codebase": 28_120},
    "java": {"valid": 5_183, "test": 10_955, "codebase": 40_347},
    "javascript": {"valid": 3_885, "test": 3_291, "codebase": 13_981},
    "ruby": {"valid": 1_400, "test": 1_261, "codebase": 4_360},
}

# SANTA Table 1: Adv's query-code pairs (a query is ranked against every function of its
# split) and ESCI small's queries and judged products (US), per split.
TABLE1_SIZES = {
    "adv": {
        "queries": {"train": 251_820, "valid": 9_604, "test": 19_210},
        "candidates": {"valid": 9_604, "test": 19_210},
    },
    "esci": {
        "queries": {"train": 18_277, "valid": 2_611, "test": 8_956},
        "candidates": {"train": 367_946, "valid": 51_706, "test": 181_701},
    },
}

_COLUMNS = {"adv": ("adv",), "esci-2": ("two-class",), "esci-4": ("four-class",)}


def numbers_for(setting: str) -> list[PaperNumber]:
    """The published numbers a ``bench/paper.py`` setting compares with."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    columns = _COLUMNS.get(setting, (*CODESEARCH_LANGUAGES, "overall"))
    return [number for number in _NUMBERS if number.column in columns]
