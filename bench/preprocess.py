"""Benchmark: preprocessing records/s, single process without Ray vs Ray Data on 1 and 2 CPUs.

    python bench/preprocess.py [--records 20000] [--workdir /tmp/santa-bench]

The corpus is real code: CodeSearchNet-format records of documented functions from this
interpreter's standard library, topped up from its site-packages until ``--records`` is
reached, written as gzipped JSON-lines shards. Every mode runs the same per-record work
(parse, validate, docstring removal, entity extraction, masking; stage pretrain). Ray
timings exclude Ray's start-up (reported separately) and include the pipeline's own
accounting passes (held-out check, duplicates, Parquet write).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from santa.data.records import (  # noqa: E402
    DropRow,
    PairOptions,
    build_code_pair,
    normalize_codesearchnet,
    parse_json_line,
)
from santa.data.source import SourceRecords, default_source_root  # noqa: E402
from santa.entities import extract_code_entities  # noqa: E402


def build_corpus(workdir: Path, records: int, shards: int = 16) -> list[Path]:
    """Write ``records`` CSN-format records as ``shards`` .jsonl.gz files (cached)."""
    corpus = workdir / "corpus"
    marker = corpus / f"done-{records}"
    if marker.exists():
        return sorted(corpus.glob("*.jsonl.gz"))
    corpus.mkdir(parents=True, exist_ok=True)
    for old in corpus.glob("*"):
        old.unlink()
    count = 0
    with contextlib.ExitStack() as stack:
        handles = [
            stack.enter_context(gzip.open(corpus / f"shard_{i:02d}.jsonl.gz", "wt"))
            for i in range(shards)
        ]
        for root in (default_source_root(), sysconfig.get_paths()["purelib"]):
            for record in SourceRecords(root, languages=["python"], skip_tests=False):
                record["partition"] = ""  # one split: every record is read and processed
                handles[count % shards].write(json.dumps(record) + "\n")
                count += 1
                if count >= records:
                    break
            if count >= records:
                break
    marker.touch()
    print(f"corpus: {count:,} records in {shards} shards under {corpus}", flush=True)
    return sorted(corpus.glob("*.jsonl.gz"))


def run_single_process(files: list[Path]) -> dict:
    """The same per-record work in one Python process, no Ray."""
    options = PairOptions()
    started = time.perf_counter()
    rows = written = 0
    for path in files:
        with gzip.open(path, "rb") as handle:
            for line in handle:
                rows += 1
                try:
                    record = normalize_codesearchnet(parse_json_line(line))
                    build_code_pair(record, "codesearchnet", options)
                    written += 1
                except DropRow:
                    pass
    seconds = time.perf_counter() - started
    return {"mode": "single process", "rows": rows, "written": written, "seconds": seconds}


def run_ray(files: list[Path], cpus: int, workdir: Path) -> dict:
    """Run the Ray Data pipeline in a fresh process with a local Ray of ``cpus`` CPUs."""
    code = f"""
import json, time, ray
t0 = time.perf_counter()
ray.init(address="local", num_cpus={cpus}, include_dashboard=False, log_to_driver=False)
startup = time.perf_counter() - t0
from santa.data.pipeline import PreprocessConfig, run_preprocess
t1 = time.perf_counter()
report = run_preprocess(PreprocessConfig(dataset="codesearchnet", input={str(files[0].parent)!r},
                        output={str(workdir / f"out-{cpus}")!r}))
seconds = time.perf_counter() - t1
print("RESULT" + json.dumps({{"rows": report["rows_read"], "written": report["rows_written"],
      "seconds": seconds, "startup": startup}}))
"""
    env = dict(os.environ, RAY_DATA_DISABLE_PROGRESS_BARS="1")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
    )
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    if proc.returncode or not result:
        raise RuntimeError(f"ray run failed:\n{proc.stderr[-3000:]}")
    return {"mode": f"Ray Data, {cpus} CPU", **json.loads(result[0][6:])}


def entity_rate(files: list[Path], limit: int = 5000) -> float:
    """Python entity extraction alone, functions/s on one core."""
    codes = []
    for path in files:
        with gzip.open(path, "rt") as handle:
            codes.extend(json.loads(line)["code"] for line in handle)
        if len(codes) >= limit:
            break
    started = time.perf_counter()
    for code in codes[:limit]:
        with contextlib.suppress(ValueError):
            extract_code_entities(code, "python")
    return min(limit, len(codes)) / (time.perf_counter() - started)


def main() -> None:
    """Run every mode and print a table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/santa-bench"))
    parser.add_argument("--output", type=Path, default=Path("bench/results/preprocess.json"))
    args = parser.parse_args()
    files = build_corpus(args.workdir, args.records)
    results = [run_single_process(files)]
    print(
        f"single process: {results[0]['rows'] / results[0]['seconds']:,.0f} records/s", flush=True
    )
    for cpus in (1, 2):
        results.append(run_ray(files, cpus, args.workdir))
        print(
            f"{results[-1]['mode']}: {results[-1]['rows'] / results[-1]['seconds']:,.0f} records/s",
            flush=True,
        )
    rate = entity_rate(files)
    base = results[0]["rows"] / results[0]["seconds"]
    print("\n| mode | records | written | seconds | records/s | vs single | Ray start-up s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        per_s = r["rows"] / r["seconds"]
        print(
            f"| {r['mode']} | {r['rows']:,} | {r['written']:,} | {r['seconds']:.1f} | "
            f"{per_s:,.0f} | {per_s / base:.2f}x | {r.get('startup', 0):.1f} |"
        )
    print(f"\nPython entity extraction alone: {rate:,.0f} functions/s on one core")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"results": results, "entity_functions_per_s": rate}, indent=2)
    )


if __name__ == "__main__":
    main()
