"""Retrieval-quality benchmarks: ablations, transfer, comparisons at equal budget."""
