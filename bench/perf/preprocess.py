"""Benchmark: preprocessing records/s, single process without Ray vs Ray Data on 1 and 2 CPUs.

    python bench/perf/preprocess.py [--records 20000 60000 100000] [--repeats 3]
                               [--workdir /tmp/santa-bench]

The corpus is real code: CodeSearchNet-format records of documented functions from this
interpreter's standard library, topped up from its site-packages until the size asked
for is reached (about 100k are there), written as gzipped JSON-lines shards. Every mode
does the same work and writes the same output: parse, validate, docstring removal,
entity extraction, masking (stage pretrain), duplicate removal, Parquet.

Ray runs start on a running cluster, as a job sent with ``ray job submit`` does: each run
starts a fresh local Ray (``ray.init``, reported, not timed) and runs one tiny Ray Data
job on it first (``warmup``, reported, not timed), which starts Ray Data's detached
helper actors (stats, autoscaling coordinator): a cluster starts them once, in its first
Ray Data job. The timed part is ``run_preprocess``: both of its executions (parser tasks,
which read their own input, then the writers) and its accounting; the task workers that
the warm-up started are reused, as a running cluster's are. ``--cold`` times the first
job instead.

Each repeat runs every mode at every size, interleaved, so that a slow spell of the
machine (this VM's speed varies by tens of percent from minute to minute) hits every mode
alike; the table gives medians. From the smallest and largest size it also gives the
steady-state rate (extra records / extra seconds), which leaves out the fixed start.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pyarrow.parquet as pq

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from santa.data.records import (
    DropRow,
    PairOptions,
    build_code_pair,
    normalize_codesearchnet,
    parse_json_line,
)
from santa.data.schema import PAIR_SCHEMA, rows_to_table
from santa.data.source import SourceRecords, default_source_root
from santa.method.entities import extract_code_entities


def build_corpus(workdir: Path, records: int, shards: int = 16) -> list[Path]:
    """Write ``records`` CSN-format records as ``shards`` .jsonl.gz files (cached)."""
    corpus = workdir / f"corpus-{records}"
    marker = corpus / "done"
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


def run_single_process(files: list[Path], workdir: Path) -> dict:
    """The same work in one Python process, no Ray: pairs, duplicates dropped, Parquet."""
    options = PairOptions()
    started = time.perf_counter()
    rows = 0
    pairs, seen = [], set()
    for path in files:
        with gzip.open(path, "rb") as handle:
            for line_number, line in enumerate(handle, start=1):
                rows += 1
                try:
                    record = normalize_codesearchnet(parse_json_line(line))
                    pair = build_code_pair(record, "codesearchnet", options)
                except DropRow:
                    continue
                if pair["dedup_key"] in seen:
                    continue
                seen.add(pair["dedup_key"])
                pairs.append(dict(pair, drop_reason="", row_key=f"{path}:{line_number:010d}"))
    output = workdir / "out-single"
    output.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows_to_table(pairs).select(PAIR_SCHEMA.names), output / "part-0.parquet")
    seconds = time.perf_counter() - started
    return {"mode": "single process", "rows": rows, "written": len(pairs), "seconds": seconds}


def run_ray(files: list[Path], cpus: int, workdir: Path, cold: bool = False) -> dict:
    """Run the Ray Data pipeline in a fresh process with a local Ray of ``cpus`` CPUs."""
    code = f"""
import json, time, ray
t0 = time.perf_counter()
ray.init(address="local", num_cpus={cpus}, include_dashboard=False, log_to_driver=False)
startup = time.perf_counter() - t0
import ray.data
from santa.data.plan import PreprocessConfig, run_preprocess
t1 = time.perf_counter()
if not {cold!r}:
    ray.data.range(1000).map_batches(lambda batch: batch).materialize()
warmup = time.perf_counter() - t1
t2 = time.perf_counter()
report = run_preprocess(PreprocessConfig(dataset="codesearchnet", input={str(files[0].parent)!r},
                        output={str(workdir / f"out-{cpus}")!r}))
seconds = time.perf_counter() - t2
print("RESULT" + json.dumps({{"rows": report["rows_read"], "written": report["rows_written"],
      "seconds": seconds, "startup": startup, "warmup": warmup, "phases": report["phases"]}}))
"""
    env = dict(os.environ, RAY_DATA_DISABLE_PROGRESS_BARS="1")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=common.ROOT,
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


MODES = ("single process", "Ray Data, 1 CPU", "Ray Data, 2 CPU")


def run_mode(mode: str, files: list[Path], workdir: Path, cold: bool) -> dict:
    """One timed run of ``mode``."""
    if mode == MODES[0]:
        return run_single_process(files, workdir)
    return run_ray(files, int(mode.split(", ")[1].split()[0]), workdir, cold)


def medians(runs: list[dict]) -> list[dict]:
    """Per (mode, records): the run of (lower) median seconds, with every repeat's seconds."""
    out = []
    for records in sorted({r["records"] for r in runs}):
        for mode in MODES:
            same = sorted(
                (r for r in runs if r["records"] == records and r["mode"] == mode),
                key=lambda r: r["seconds"],
            )
            if same:
                median = dict(same[(len(same) - 1) // 2])
                median["repeats_s"] = [round(r["seconds"], 2) for r in same]
                out.append(median)
    return out


def main(argv: list[str] | None = None) -> None:
    """Run every mode at every size, ``--repeats`` times interleaved, and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[20_000, 60_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="time each Ray cluster's first job")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/santa-bench"))
    parser.add_argument("--output", type=Path, default=common.RESULTS_DIR / "preprocess.json")
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    corpora = {records: build_corpus(args.workdir, records) for records in sorted(args.records)}
    runs = []
    for repeat in range(1, args.repeats + 1):
        for records, files in corpora.items():
            for mode in MODES:
                run = run_mode(mode, files, args.workdir, args.cold)
                run["records"], run["repeat"] = records, repeat
                runs.append(run)
                print(
                    f"repeat {repeat}/{args.repeats}, {records:,} records, {mode}: "
                    f"{run['seconds']:.1f} s, {run['rows'] / run['seconds']:,.0f} records/s",
                    flush=True,
                )
    results = medians(runs)
    rate = entity_rate(next(iter(corpora.values())))
    steady = steady_rates(results)
    print(f"\nMedians of {args.repeats} interleaved repeats:")
    rows = []
    for r in results:
        per_s = r["rows"] / r["seconds"]
        base = next(b for b in results if b["records"] == r["records"] and b["mode"] == MODES[0])
        rows.append(
            [
                r["mode"],
                f"{r['rows']:,}",
                f"{r['written']:,}",
                f"{r['seconds']:.1f}",
                f"{per_s:,.0f}",
                f"{per_s / (base['rows'] / base['seconds']):.2f}x",
                ", ".join(f"{s:.1f}" for s in r["repeats_s"]),
            ]
        )
    header = ["mode", "records", "written", "seconds", "records/s", "vs single", "repeats s"]
    print(common.format_table(header, rows, align="lrrrrrl"))
    if steady:
        base = steady[MODES[0]]["records_per_s"]
        print("\nSteady state (extra records / extra seconds between the two sizes):")
        rows = [
            [
                mode,
                f"{r['records_per_s']:,.0f}",
                f"{r['records_per_s'] / base:.2f}x",
                f"{r['fixed_s']:.1f}",
            ]
            for mode, r in steady.items()
        ]
        print(common.format_table(["mode", "records/s", "vs single", "fixed start s"], rows))
    print(f"\nPython entity extraction alone: {rate:,.0f} functions/s on one core")
    payload = {
        "repeats": args.repeats,
        "cold": args.cold,
        "results": results,
        "runs": runs,
        "steady_state": steady,
        "entity_functions_per_s": rate,
    }
    bench.write_json(args.output, payload)
    print(f"wrote {args.output}")


def steady_rates(results: list[dict]) -> dict[str, dict[str, float]]:
    """Per mode, from its smallest and largest size: marginal records/s and fixed seconds."""
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in results):
        runs = sorted((r for r in results if r["mode"] == mode), key=lambda r: r["rows"])
        small, large = runs[0], runs[-1]
        if large["rows"] == small["rows"]:
            continue
        rate = (large["rows"] - small["rows"]) / (large["seconds"] - small["seconds"])
        out[mode] = {"records_per_s": rate, "fixed_s": small["seconds"] - small["rows"] / rate}
    return out


if __name__ == "__main__":
    main()
