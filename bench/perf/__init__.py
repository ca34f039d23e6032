"""Speed, memory and scaling benchmarks."""
