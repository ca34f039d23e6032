"""santa's benchmarks: scripts, not timed tests (figures in ``bench/RESULTS.md``).

- ``bench/perf/``: speed, memory and scaling (training loop, preprocessing, encoding,
  mining, GPU MFU, against sentence-transformers);
- ``bench/quality/``: retrieval quality (the paper's ablation, transfer to web queries,
  SCodeR, against sentence-transformers);
- ``bench/robustness/``: fault injection against the job command lines;
- ``bench/common.py``: the harness every script uses (machine report, result JSON,
  tables, figures); ``bench/corpora.py``: the data they build; ``bench/results.py``:
  renders the tables of ``bench/RESULTS.md`` from ``bench/results/*.json``.

Run a script from the repository root, as a file or as a module:
``python bench/perf/gpu.py`` or ``python -m bench.perf.gpu``.
"""
