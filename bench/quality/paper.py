"""Benchmark: santa's number beside the paper's, under the paper's own protocol.

    python bench/paper.py --setting codesearch --checkpoint CKPT --data CodeSearch/ [--languages ruby go]
    python bench/paper.py --setting adv --checkpoint CKPT --data AdvTest/test.jsonl
    python bench/paper.py --setting esci-4 --checkpoint CKPT --data esci/   # raw parquets or BEIR

Settings and the protocol each runs (``santa.eval.protocols``):

- ``codesearch``: each language's queries against its own codebase, MRR per language and
  the mean, beside SANTA's Table 6 (zero-shot and fine-tuned SANTA, CodeRetriever) and
  SCodeR's Table 1. ``--data`` is GraphCodeBERT's layout, or a CodeSearchNet split file
  (``.jsonl[.gz]``, e.g. ../shared/fixtures/csn/ruby/valid.jsonl.gz) whose own functions
  then are the codebase: a one-language CodeSearch set (the sizes are printed beside
  Table 7's, which the MRR depends on), or a code BEIR folder (each language's corpus its
  codebase: the same texts ``--protocol retrieval`` ranks, languages kept apart).
- ``adv``: CodeXGLUE's AdvTest MRR, beside SANTA's Tables 2 and 6 and SCodeR's Table 1.
- ``esci-2`` / ``esci-4``: each query's judged products, NDCG@100 with two- or four-class
  gains, beside SANTA's Table 2. ``--data`` is a BEIR folder of ``ray_jobs.preprocess
  --dataset esci --stage eval``, or the raw ESCI parquet folder (preprocessed first, on Ray).

``--checkpoint minilm`` is the all-MiniLM-L6-v2 folder santa ships with; any checkpoint,
run, model folder or ``s3://`` URI works. ``--limit N`` keeps the first N queries and
candidates (a smoke run). Results go to ``--output`` (JSON).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402
from santa.eval import EvalConfig  # noqa: E402
from santa.eval.advtest import advtest_file  # noqa: E402
from santa.eval.codesearch import write_codesearch_layout  # noqa: E402
from santa.eval.paper_numbers import SETTINGS, TABLE1_SIZES, TABLE7_SIZES, numbers_for  # noqa: E402
from santa.eval.protocols import run_protocol  # noqa: E402
from santa.runtime import storage  # noqa: E402

PROTOCOL = {"codesearch": "codesearch", "adv": "advtest", "esci-2": "esci", "esci-4": "esci"}
METRIC = {"esci-2": "ndcg@100", "esci-4": "ndcg@100_4class"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=SETTINGS, required=True)
    parser.add_argument("--checkpoint", required=True, help="model, or 'minilm'")
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default=None, help="default: test (valid for a CSN file)")
    parser.add_argument("--languages", nargs="*", default=[])
    parser.add_argument("--limit", type=int, default=0, help="first N queries/candidates only")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-query-length", type=int, default=None)
    parser.add_argument("--max-document-length", type=int, default=None)
    parser.add_argument("--workdir", default=None, help="where converted data goes (temp)")
    parser.add_argument("--output", default=None, help="results JSON")
    parser.add_argument("--address", default=None, help="Ray, for raw ESCI preprocessing")
    return parser.parse_args(argv)


def checkpoint_of(name: str) -> str:
    """``minilm`` → the shipped all-MiniLM-L6-v2 folder; anything else as it is."""
    if name == "minilm":
        from santa.recipes import minilm_path

        return minilm_path()
    return name


def read_records(path: str) -> list[dict[str, Any]]:
    data = storage.read_bytes(path)
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def prepare_data(args: argparse.Namespace, workdir: Path) -> tuple[str, str, dict[str, Any]]:
    """The data the protocol reads, its split, and what was converted (for the report)."""
    split = args.split or "test"
    notes: dict[str, Any] = {}
    if args.setting == "codesearch" and args.data.endswith((".jsonl", ".jsonl.gz")):
        records = read_records(args.data)
        language = str(records[0].get("language") or "unknown").lower()
        split = args.split or "valid"
        if args.limit:
            records = records[: args.limit]
        write_codesearch_layout(records, workdir / "codesearch", language, split)
        notes["converted"] = f"{args.data}: its {len(records)} functions as the {language} codebase"
        return str(workdir / "codesearch"), split, notes
    if args.setting == "codesearch" and storage.exists(storage.join(args.data, "corpus.jsonl")):
        notes["converted"] = beir_as_codesearch(args.data, split, workdir / "codesearch")
        return str(workdir / "codesearch"), split, notes
    if args.setting == "adv" and args.limit:
        rows = read_records(advtest_file(args.data, split))
        (workdir / "adv.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in rows[: args.limit])
        )
        return str(workdir / "adv.jsonl"), split, notes
    if args.setting.startswith("esci") and storage.exists(
        storage.join(args.data, "shopping_queries_dataset_examples.parquet")
    ):
        from santa.data.pipeline import PreprocessConfig, run_preprocess
        from santa.runtime.ray_utils import init_ray

        print(init_ray(args.address), flush=True)
        output = str(workdir / "esci")
        report = run_preprocess(
            PreprocessConfig(
                dataset="esci", input=args.data, output=output, stage="eval", split=split
            )
        )
        notes["preprocessed"] = {"rows_written": report["rows_written"], "esci": report["esci"]}
        return output, split, notes
    return args.data, split, notes


def beir_as_codesearch(uri: str, split: str, root: Path) -> str:
    """A code BEIR folder (``ray_jobs.preprocess --stage eval``) in GraphCodeBERT's layout:
    each language's corpus its codebase, each query answered by its judged document. The
    texts are the BEIR texts as they are, so this runs the same data as ``--protocol
    retrieval`` does, languages apart."""
    from santa.data.beir import load_beir

    beir = load_beir(uri, split)
    by_language: dict[str, tuple[list, list]] = {}
    for doc_id, doc in beir.corpus.items():
        language = doc.get("language", "unknown")
        by_language.setdefault(language, ([], []))[0].append({"url": doc_id, "code": doc["text"]})
    for qid, text in beir.queries.items():
        (answer,) = [doc for doc, label in beir.qrels[qid].items() if label > 0][:1]
        language = beir.corpus[answer].get("language", "unknown")
        row = {"url": answer, "docstring_tokens": [text]}  # one token: the text as it is
        by_language[language][1].append(row)
    for language, (codebase, queries) in by_language.items():
        folder = root / language
        folder.mkdir(parents=True, exist_ok=True)
        for name, rows in (("codebase", codebase), (split, queries)):
            text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            (folder / f"{name}.jsonl").write_text(text, encoding="utf-8")
    return f"{uri}: the BEIR {split} split, each language's corpus as its codebase"


def compare(setting: str, results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per column (language, adv, NDCG class): santa's value and the paper's."""
    model = results["model"]
    if setting == "codesearch":
        values = {lang: row["mrr"] for lang, row in model["by_language"].items()}
        if len(values) > 1:
            values["overall"] = model["mrr"]
    elif setting == "adv":
        values = {"adv": model["mrr"]}
    else:
        values = {"two-class" if setting == "esci-2" else "four-class": model[METRIC[setting]]}
    published = numbers_for(setting)
    rows = []
    for column, value in values.items():
        row = {"column": column, "santa": round(100 * value, 2)}
        for number in published:
            if number.column == column:
                row[number.source] = number.value
        rows.append(row)
    return rows


def count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def format_table(rows: list[dict[str, Any]]) -> str:
    sources = list(
        dict.fromkeys(key for row in rows for key in row if key not in ("column", "santa"))
    )
    cells = [
        [
            row["column"],
            f"{row['santa']:.2f}",
            *(f"{row[s]:.2f}" if s in row else "" for s in sources),
        ]
        for row in rows
    ]
    return common.format_table(["", "santa (this run)", *sources], cells)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as temporary:
        data, split, notes = prepare_data(args, Path(temporary))
        config = EvalConfig(
            split=split,
            baseline="bm25",
            batch_size=args.batch_size,
            max_query_length=args.max_query_length,
            max_document_length=args.max_document_length,
            progress=False,
        )
        started = time.perf_counter()
        outcome = run_protocol(
            PROTOCOL[args.setting],
            checkpoint_of(args.checkpoint),
            data,
            config,
            languages=args.languages,
        )
        seconds = time.perf_counter() - started
    rows = compare(args.setting, outcome.results)
    sizes = {}
    if args.setting == "codesearch":
        for language, counts in outcome.info["languages"].items():
            paper = TABLE7_SIZES.get(language, {})
            sizes[language] = {
                "queries": counts["queries"],
                "candidates": counts["codebase"],
                "paper_queries": paper.get(split),
                "paper_candidates": paper.get("codebase"),
                "paper_table": "SANTA Table 7",
            }
    else:
        dataset = "adv" if args.setting == "adv" else "esci"
        queries = outcome.results["model"]["num_queries"]
        sizes[dataset] = {
            "queries": queries,
            "candidates": queries if dataset == "adv" else outcome.info["num_judgments"],
            "paper_queries": TABLE1_SIZES[dataset]["queries"].get(split),
            "paper_candidates": TABLE1_SIZES[dataset]["candidates"].get(split),
            "paper_table": "SANTA Table 1",
        }
    result = {
        "setting": args.setting,
        "protocol": PROTOCOL[args.setting],
        "checkpoint": args.checkpoint,
        "data": args.data,
        "split": split,
        "limit": args.limit,
        "rows": rows,
        "metrics": outcome.results,
        "sizes": sizes,
        "notes": notes,
        "seconds": round(seconds, 1),
    }
    print(outcome.markdown)
    print(f"{args.setting} ({args.checkpoint}, {split}); paper values x 100 as printed:\n")
    print(format_table(rows))
    for name, size in sizes.items():
        what = "judged products" if name == "esci" else "candidates"
        print(
            f"\n{name}: {size['queries']:,} queries, {size['candidates']:,} {what} "
            f"({size['paper_table']}, {split}: {count(size['paper_queries'])} queries, "
            f"{count(size['paper_candidates'])} {what})"
        )
    if args.output:
        print(f"\nresults: {bench.write_json(args.output, result)}")
    return result


if __name__ == "__main__":
    main()
