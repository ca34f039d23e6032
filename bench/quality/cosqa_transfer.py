"""What fine-tuning lets all-MiniLM-L6-v2 beat its zero-shot start on real web queries?

``bench/quality/versus_st_quality.py`` found that 20 steps on standard-library docstring → code
pairs lower CoSQA dev MRR@100 (web queries) below the zero-shot model, with santa and with
sentence-transformers alike. This benchmark tests the two usual suspects with santa
(``python -m ray_jobs.finetune``, the ``minilm-finetune`` recipe, 2 Ray Train workers), at
the same steps and batch, all scored with santa's evaluator on the same 313 CoSQA queries
over all 552 of its functions:

- **zero-shot**: the model as shipped;
- **stdlib docstrings**: the pairs of ``versus_st_quality.py`` at the recipe's learning
  rate (2e-5, the model's own pre-training rate);
- **stdlib docstrings, lr/10**: the same at a tenth of it (does the loss come from moving
  too far from a good start?);
- **CoSQA web queries, cross-fitted**: the labelled CoSQA pairs themselves, in ``--folds``
  folds grouped by function; each fold's queries are scored by a model trained on the
  other folds only, so no scored query, and no scored query's function as a positive, was
  trained on (does the loss come from the data: docstrings are not web queries?);
- **stdlib docstrings, no pair repeated** (``stdlib-large``, with ``--stdlib-data``): a
  preprocessed folder with at least steps × batch pairs, such as the whole standard
  library's ``--stage finetune`` pairs, so no pair is seen twice (the 105 test pairs are
  repeated about six times in 20 steps of 32: is it over-fitting?).

Per-query RR@100 from ranx; 95 % bootstrap intervals for each system and paired ones for
the differences against zero-shot.

    python bench/quality/cosqa_transfer.py --cosqa ../shared/fixtures/cosqa/cosqa-dev.json \\
        [--steps 20] [--batch 32] [--folds 2] [--systems stdlib,stdlib-low-lr,cosqa]

Prints a table and writes ``bench/results/cosqa_transfer.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.quality.scoring import bootstrap, format_interval, per_query_rr
from bench.quality.versus_st_quality import IN_PROCESS_HELP

RESULTS = common.RESULTS_DIR / "cosqa_transfer.json"
ZERO = "zero-shot"
STDLIB = "stdlib docstrings"
STDLIB_LOW = "stdlib docstrings, lr/10"
COSQA = "CoSQA web queries, cross-fitted"
STDLIB_LARGE = "stdlib docstrings, no pair repeated"
# --systems names (the labels above hold commas).
CHOICES = {"stdlib": STDLIB, "stdlib-low-lr": STDLIB_LOW, "cosqa": COSQA}
CHOICES["stdlib-large"] = STDLIB_LARGE


def function_folds(qrels: dict[tuple[str, str], int], folds: int, seed: int) -> list[set[str]]:
    """Query ids in ``folds`` folds, every function's queries in one fold (seeded, sizes as
    even as the groups allow: each group goes to the smallest fold so far)."""
    if folds < 2:
        raise ValueError(f"need at least 2 folds, got {folds}")
    by_function: dict[str, list[str]] = defaultdict(list)
    for query_id, doc_id in qrels:
        by_function[doc_id].append(query_id)
    groups = [sorted(by_function[doc]) for doc in sorted(by_function)]
    random.Random(seed).shuffle(groups)
    parts: list[set[str]] = [set() for _ in range(folds)]
    for group in sorted(groups, key=len, reverse=True):  # stable: shuffled order within size
        min(parts, key=len).update(group)
    if any(not part for part in parts):
        raise ValueError(f"{len(groups)} functions cannot fill {folds} folds")
    return parts


def cosqa_pair_rows(beir: Any, query_ids: set[str]) -> list[dict[str, Any]]:
    """Training pair rows (the preprocess job's schema) of the labelled pairs of
    ``query_ids``: the web query and its whole function, as the evaluation embeds it."""
    from santa.data.kinds import CODE_PAIR
    from santa.data.records import empty_pair_row, stable_hash

    texts = {query["_id"]: query["text"] for query in beir.queries}
    documents = {doc["_id"]: doc["text"] for doc in beir.corpus}
    rows = []
    for query_id, doc_id in sorted(beir.qrels):
        if query_id not in query_ids:
            continue
        row = empty_pair_row()
        row.update(
            kind=CODE_PAIR,
            id=stable_hash("cosqa", doc_id, texts[query_id]),
            dataset="cosqa",
            language="python",
            query_id=query_id,
            query=texts[query_id],
            doc_id=doc_id,
            document=documents[doc_id],
            dedup_key=stable_hash("python", documents[doc_id]),
        )
        rows.append(dict(row, drop_reason="", row_key=""))
    return rows


def write_fold_beir(beir: Any, query_ids: set[str], output: str) -> str:
    """A BEIR folder of the whole corpus and only the queries (and qrels) of one fold."""
    from santa.data.beir import write_beir_files

    queries = [query for query in beir.queries if query["_id"] in query_ids]
    qrels = {key: value for key, value in beir.qrels.items() if key[0] in query_ids}
    write_beir_files(output, beir.corpus, queries, qrels, "test")
    return output


def score(model: str, beir: str, folder: Path) -> dict[str, float]:
    """Per-query RR@100 of ``model`` on the BEIR folder ``beir`` (santa's evaluator)."""
    from santa.eval import EvalConfig, evaluate

    evaluate(
        model, beir, EvalConfig(split="test", baseline=None, progress=False, output=str(folder))
    )
    return per_query_rr(beir, str(folder / "run.model.trec"), "test")


def format_table(per_system: dict[str, dict], differences: dict[str, dict], seconds) -> str:
    """Markdown: MRR@100 with its interval, the paired difference to zero-shot, seconds."""
    rows = []
    for system, row in per_system.items():
        difference = differences.get(f"{system} - {ZERO}")
        rows.append(
            [
                system,
                format_interval(row),
                None if difference is None else format_interval(difference, signed=True),
                f"{seconds.get(system, 0.0):.0f}",
            ]
        )
    header = ["training", "CoSQA dev MRR@100 [95% CI]", "− zero-shot [95% CI]", "training s"]
    return common.format_table(header, rows)


def plot(per_system: dict[str, dict], path: Path, title: str) -> None:
    """Bars of MRR@100 with the 95 % intervals, zero-shot as a line."""
    common.plot_intervals(
        {system: {"MRR@100": row} for system, row in per_system.items()},
        path,
        title,
        ylabel="CoSQA dev MRR@100 (95% bootstrap CI)",
        reference=per_system[ZERO]["mean"],
        ylim=(min(row["ci_low"] for row in per_system.values()) - 0.05, 1.0),
        wrap=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cosqa", required=True, help="cosqa-dev.json")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--folds", type=int, default=2)
    parser.add_argument("--query-length", type=int, default=50)
    parser.add_argument("--doc-length", type=int, default=240)
    parser.add_argument("--bootstrap", type=int, default=10_000, help="resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--systems",
        default=",".join(CHOICES),
        help=f"comma-separated trainings to run besides zero-shot, of {', '.join(CHOICES)}",
    )
    parser.add_argument(
        "--stdlib-data",
        default="",
        help="stdlib-large: preprocessed pairs (ray_jobs.preprocess --output, local)",
    )
    parser.add_argument("--in-process", action="store_true", help=IN_PROCESS_HELP)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(names) - set(CHOICES))
    if unknown:
        parser.error(f"unknown --systems {unknown} (choose from {', '.join(CHOICES)})")
    systems = [CHOICES[name] for name in names]
    if STDLIB_LARGE in systems and not args.stdlib_data:
        parser.error("--systems stdlib-large needs --stdlib-data")

    from bench.corpora import stdlib_pair_rows, write_pairs
    from bench.perf.versus_st import RECIPE, pq_rows
    from bench.quality.versus_st_quality import santa_system, train
    from santa.cluster.ray_utils import init_ray
    from santa.config.recipes import get_recipe, minilm_path
    from santa.data.cosqa import cosqa_beir, read_cosqa

    bench = common.BenchRun(__file__, argv)
    work = Path(tempfile.mkdtemp(prefix="santa-cosqa-transfer-"))
    beir = cosqa_beir(read_cosqa(args.cosqa))
    folds = function_folds(beir.qrels, args.folds, args.seed)
    every_query = set().union(*folds)
    whole = write_fold_beir(beir, every_query, str(work / "beir-all"))
    if not args.in_process:  # the santa-ray children join this cluster
        print(init_ray(), flush=True)
    recipe_lr = get_recipe(RECIPE).train.learning_rate
    print(
        f"{len(every_query)} queries over {len(beir.corpus)} functions; folds of "
        f"{[len(f) for f in folds]} queries; {args.steps} steps x {args.batch} pairs each",
        flush=True,
    )

    def run(name: str, pairs: list[dict[str, Any]] | str, learning_rate: float, tag: str) -> str:
        options = argparse.Namespace(**{**vars(args), "learning_rate": learning_rate})
        data = pairs if isinstance(pairs, str) else write_pairs(work / f"pairs-{tag}", pairs)
        count = pq_rows(data) if isinstance(pairs, str) else len(pairs)
        print(f"training {name} ({tag}): {count} pairs, lr {learning_rate:g}", flush=True)
        model, spent = train(santa_system(args), options, data, work / f"train-{tag}")
        seconds[name] = seconds.get(name, 0.0) + spent
        print(f"  {spent:.0f} s", flush=True)
        return model

    scores: dict[str, dict[str, float]] = {ZERO: score(minilm_path(), whole, work / "eval-zero")}
    seconds: dict[str, float] = {ZERO: 0.0}
    stdlib = stdlib_pair_rows()
    for name, learning_rate in ((STDLIB, recipe_lr), (STDLIB_LOW, recipe_lr / 10)):
        if name in systems:
            tag = "stdlib" if name == STDLIB else "stdlib-low"
            model = run(name, stdlib, learning_rate, tag)
            scores[name] = score(model, whole, work / f"eval-{tag}")
    if COSQA in systems:
        scores[COSQA] = {}
        for k, fold in enumerate(folds):
            rows = cosqa_pair_rows(beir, every_query - fold)
            model = run(COSQA, rows, recipe_lr, f"cosqa-{k}")
            held_out = write_fold_beir(beir, fold, str(work / f"beir-fold-{k}"))
            scores[COSQA].update(score(model, held_out, work / f"eval-cosqa-{k}"))
    if STDLIB_LARGE in systems:
        model = run(STDLIB_LARGE, args.stdlib_data, recipe_lr, "stdlib-large")
        scores[STDLIB_LARGE] = score(model, whole, work / "eval-stdlib-large")
    pairs = tuple((system, ZERO) for system in scores if system != ZERO)
    pairs += ((COSQA, STDLIB),) if COSQA in scores and STDLIB in scores else ()
    per_system, differences = bootstrap(scores, args.bootstrap, args.seed, pairs=pairs)
    table = format_table(per_system, differences, seconds)
    print("\n" + table)
    payload = {
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "recipe": RECIPE,
        "learning_rates": {
            STDLIB: recipe_lr,
            STDLIB_LOW: recipe_lr / 10,
            COSQA: recipe_lr,
            STDLIB_LARGE: recipe_lr,
        },
        "queries": len(every_query),
        "corpus": len(beir.corpus),
        "fold_queries": [len(fold) for fold in folds],
        "train_pairs": {
            STDLIB: len(stdlib),
            COSQA: [len(every_query - f) for f in folds],
            STDLIB_LARGE: pq_rows(args.stdlib_data) if args.stdlib_data else 0,
        },
        "train_seconds": seconds,
        "systems": per_system,
        "differences": differences,
    }
    output = Path(args.output)
    bench.write_json(output, payload)
    title = f"all-MiniLM-L6-v2 + santa, {args.steps} steps x {args.batch}: CoSQA dev (web queries)"
    plot(per_system, output.with_suffix(".png"), title)
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
