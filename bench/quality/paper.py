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
run, model folder or ``s3://`` URI works. SANTA trains one model per language for
CodeSearch: ``--checkpoint ruby=CKPT go=CKPT ...`` evaluates each language with its own
model and prints each language and their mean. ``--limit N`` keeps the first N queries and
candidates (a smoke run). Results go to ``--output`` (JSON).

Scored as SANTA's released scripts scored the tables: Adv as MRR@100 (the uncut MRR on
the next row), ESCI's four-class gains as ``evaluate_product.py`` maps them (Substitute
0.01, Complement 0.1; the next row has Table 2 caption's Substitute 0.1, Complement 0.01),
CodeSearch and Adv candidates as their code tokens joined (``--code-text``). The lengths
every model is encoded at are printed: ``--max-query-length``/``--max-document-length``,
else one checkpoint's trained lengths, and 50/240 for every model where there are several.
A malformed line of an input file is skipped and counted with the file's name; a
compressed file cut short ends the run in one line naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402
from santa.data.beir import load_beir  # noqa: E402
from santa.data.jsonl import json_lines  # noqa: E402
from santa.eval import EvalConfig  # noqa: E402
from santa.eval.advtest import advtest_file  # noqa: E402
from santa.eval.codesearch import (  # noqa: E402
    macro_summary,
    skipped_line,
    write_codesearch_layout,
)
from santa.eval.esci import esci_metrics  # noqa: E402
from santa.eval.evaluation import CODE_TEXTS  # noqa: E402
from santa.eval.paper_numbers import (  # noqa: E402
    CODESEARCH_LANGUAGES,
    SETTINGS,
    TABLE1_SIZES,
    TABLE7_SIZES,
    numbers_for,
)
from santa.eval.protocols import ProtocolResult, run_protocol  # noqa: E402
from santa.files import storage

PROTOCOL = {"codesearch": "codesearch", "adv": "advtest", "esci-2": "esci", "esci-4": "esci"}
METRIC = {"esci-2": "ndcg@100", "esci-4": "ndcg@100_4class"}
CAPTION_GAINS = "ndcg@100_4class_caption_gains"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=SETTINGS, required=True)
    parser.add_argument(
        "--checkpoint",
        required=True,
        nargs="+",
        help="model, or 'minilm'; codesearch: LANG=MODEL per language",
    )
    parser.add_argument(
        "--code-text", choices=CODE_TEXTS, default="released", help="candidate text"
    )
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
    args = parser.parse_args(argv)
    try:
        args.checkpoints = checkpoints_by_language(args.checkpoint, args.setting)
    except ValueError as error:
        parser.error(str(error))
    return args


def checkpoints_by_language(values: list[str], setting: str) -> dict[str, str]:
    """``{"": CKPT}`` for one model; ``{language: CKPT}`` for ``LANG=CKPT`` values."""
    pairs = [value.partition("=") for value in values]
    if len(values) == 1 and not pairs[0][1]:
        return {"": values[0]}
    if setting != "codesearch" or not all(sep and lang and ckpt for lang, sep, ckpt in pairs):
        raise ValueError(
            "several checkpoints are one per CodeSearch language: "
            "--setting codesearch --checkpoint ruby=CKPT go=CKPT ..."
        )
    unknown = sorted({lang for lang, _, _ in pairs} - set(CODESEARCH_LANGUAGES))
    if unknown:
        raise ValueError(f"unknown languages {unknown}: one of {', '.join(CODESEARCH_LANGUAGES)}")
    return {lang: checkpoint for lang, _, checkpoint in pairs}


def checkpoint_of(name: str) -> str:
    """``minilm`` → the shipped all-MiniLM-L6-v2 folder; anything else as it is."""
    if name == "minilm":
        from santa.config.recipes import minilm_path

        return minilm_path()
    return name


def read_records(path: str, notes: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON-lines file's rows; malformed lines skipped and counted in ``notes``."""
    skipped: Counter = Counter()
    records = [row for _, row in json_lines(path, skipped)]
    if skipped:
        notes.setdefault("skipped", {})[path] = dict(skipped)
    return records


def prepare_data(args: argparse.Namespace, workdir: Path) -> tuple[str, str, dict[str, Any]]:
    """The data the protocol reads, its split, and what was converted (for the report)."""
    split = args.split or "test"
    notes: dict[str, Any] = {}
    if args.setting == "codesearch" and args.data.endswith((".jsonl", ".jsonl.gz")):
        records = read_records(args.data, notes)
        language = str(records[0].get("language") or "unknown").lower()
        split = args.split or "valid"
        if args.limit:
            records = records[: args.limit]
        write_codesearch_layout(records, workdir / "codesearch", language, split)
        notes["converted"] = f"{args.data}: its {len(records)} functions as the {language} codebase"
        return str(workdir / "codesearch"), split, notes
    if args.setting == "codesearch" and storage.exists(storage.join(args.data, "corpus.jsonl")):
        notes["converted"] = beir_as_codesearch(args.data, split, workdir / "codesearch")
        args.code_text = "training"  # the BEIR texts as they are (no tokens to join)
        return str(workdir / "codesearch"), split, notes
    if args.setting == "adv" and args.limit:
        rows = read_records(advtest_file(args.data, split), notes)
        (workdir / "adv.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in rows[: args.limit])
        )
        return str(workdir / "adv.jsonl"), split, notes
    if args.setting.startswith("esci") and storage.exists(
        storage.join(args.data, "shopping_queries_dataset_examples.parquet")
    ):
        from santa.cluster.ray_utils import init_ray
        from santa.data.plan import PreprocessConfig, run_preprocess

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
    """One row per column (language, adv, NDCG class): santa's value and the paper's.

    Scored as the paper's numbers were: Adv's MRR@100 and ESCI's released gains carry the
    published numbers; the uncut MRR and the caption's gains follow, without any."""
    model = results["model"]
    if setting == "codesearch":
        values = {lang: row["mrr"] for lang, row in model["by_language"].items()}
        if len(values) > 1:
            values["overall"] = model["mrr"]
    elif setting == "adv":
        values = {"adv": model["mrr@100"], "adv, uncut MRR": model["mrr"]}
    elif setting == "esci-2":
        values = {"two-class": model[METRIC[setting]]}
    else:
        values = {"four-class": model[METRIC[setting]]}
        if CAPTION_GAINS in model:
            values["four-class, Table 2 caption's gains"] = model[CAPTION_GAINS]
    published = numbers_for(setting)
    rows = []
    for column, value in values.items():
        row = {"column": column, "santa": round(100 * value, 2)}
        for number in published:
            if number.column == column:
                row[number.source] = number.value
        rows.append(row)
    return rows


def evaluate_checkpoints(args: argparse.Namespace, data: str, config: EvalConfig):
    """The protocol's outcome: one model, or one per CodeSearch language (merged)."""
    if "" in args.checkpoints:
        return run_protocol(
            PROTOCOL[args.setting],
            checkpoint_of(args.checkpoints[""]),
            data,
            config,
            languages=args.languages,
        )
    outcomes = {
        language: run_protocol(
            "codesearch", checkpoint_of(checkpoint), data, config, languages=[language]
        )
        for language, checkpoint in args.checkpoints.items()
    }
    first = next(iter(outcomes.values()))
    results = {
        system: macro_summary(
            {
                lang: outcome.results[system]["by_language"][lang]
                for lang, outcome in outcomes.items()
            }
        )
        for system in first.results
    }
    for lang, checkpoint in args.checkpoints.items():
        results["model"]["by_language"][lang]["checkpoint"] = checkpoint
    results["model"].update(
        {key: first.results["model"][key] for key in ("max_query_length", "max_document_length")},
        lengths_from=first.results["model"]["lengths_from"],
    )
    info = {
        "languages": {lang: o.info["languages"][lang] for lang, o in outcomes.items()},
        "checkpoints": args.checkpoints,
    }
    markdown = "\n".join(o.markdown for o in outcomes.values())
    return ProtocolResult(results, {}, markdown, info)


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
        several = len(args.checkpoints) > 1  # one pair of lengths for every model
        config = EvalConfig(
            split=split,
            baseline="bm25",
            batch_size=args.batch_size,
            max_query_length=args.max_query_length or (50 if several else None),
            max_document_length=args.max_document_length or (240 if several else None),
            code_text=args.code_text,
            progress=False,
        )
        started = time.perf_counter()
        outcome = evaluate_checkpoints(args, data, config)
        if args.setting == "esci-4":
            qrels = load_beir(data, split).qrels
            caption = esci_metrics(qrels, outcome.rankings["model"], "paper")
            outcome.results["model"][CAPTION_GAINS] = caption["ndcg@100_4class"]
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
        "checkpoint": args.checkpoints.get("", args.checkpoints),
        "data": args.data,
        "split": split,
        "limit": args.limit,
        "code_text": args.code_text,
        "rows": rows,
        "metrics": outcome.results,
        "sizes": sizes,
        "notes": notes,
        "seconds": round(seconds, 1),
    }
    print(outcome.markdown)
    checkpoints = ", ".join(f"{k}={v}" if k else v for k, v in args.checkpoints.items())
    model = outcome.results["model"]
    print(f"{args.setting} ({checkpoints}, {split}); paper values x 100 as printed:\n")
    print(format_table(rows))
    print(
        f"\nevery model encoded at {model['max_query_length']}/{model['max_document_length']} "
        f"query/document tokens ({model['lengths_from']})"
    )
    for path, reasons in notes.get("skipped", {}).items():
        print(skipped_line(path, reasons))
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
    from santa.jobs.errors import exit_with, run_job

    exit_with(run_job(lambda: main() and 0))
