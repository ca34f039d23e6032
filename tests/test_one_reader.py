"""House rule: the preprocessed pairs are read in one place (santa.data.published).

Every Parquet read of the library and the benches (``pq.read_table``, ``pq.ParquetFile``,
``pq.ParquetDataset``, ``ray.data.read_parquet``, ``pd.read_parquet``) is in the reader
module, or in the allow-list below, each entry with why it reads something else than the
pairs. A new reader of the pairs elsewhere fails here: use ``santa.data.published``.
"""

from __future__ import annotations

import re
from collections import Counter

from tests.conftest import REPO

READER = "santa/data/published.py"
PARQUET_READ = re.compile(
    r"\b(?:pq\.read_table|pq\.ParquetFile|pq\.ParquetDataset|ray\.data\.read_parquet"
    r"|pd\.read_parquet|pyarrow\.parquet\.read_table)\("
)
# Parquet that is not the preprocessed pairs: how many reads each file has.
ALLOWED = {
    # ESCI's raw input (shopping_queries_dataset_{examples,products}.parquet): the dataset
    # santa preprocesses, not its output.
    "santa/data/plan.py": 2,
    # The index job's own files: its documents and embedding shards (resume checks, the
    # final merge, the searcher's documents).
    "santa/search/shards.py": 3,
    # The hard-negatives table (negatives.parquet) mining writes and training reads.
    "santa/negatives/table.py": 1,
    # The faults bench compares two index jobs' embedding shards.
    "bench/robustness/fault.py": 2,
}


def test_no_module_but_the_reader_reads_parquet_pairs() -> None:
    found: Counter = Counter()
    for folder in ("santa", "ray_jobs", "tuning", "bench"):
        for path in sorted((REPO / folder).rglob("*.py")):
            name = path.relative_to(REPO).as_posix()
            count = len(PARQUET_READ.findall(path.read_text(encoding="utf-8")))
            if count and name != READER:
                found[name] = count
    assert dict(found) == ALLOWED, (
        "Parquet reads outside santa/data/published.py changed: read the preprocessed pairs "
        "with santa.data.published (read_pairs, iter_pairs, pairs_dataset), or allow-list "
        f"another kind of Parquet here with why: {dict(found)}"
    )
    assert PARQUET_READ.search((REPO / READER).read_text(encoding="utf-8"))
