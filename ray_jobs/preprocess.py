"""Preprocess CodeSearchNet, AdvTest, ESCI or a local source tree into Parquet pairs / BEIR.

    python -m ray_jobs.preprocess --dataset source --output ./runs/corpus
    python -m ray_jobs.preprocess --dataset cosqa --input cosqa-dev.json --output ./runs/cosqa
    ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python -m ray_jobs.preprocess --dataset codesearchnet --input s3://b/csn --output s3://b/out
"""

from __future__ import annotations

import argparse
import json
import logging

from santa.data import esci
from santa.data.cosqa import write_cosqa_beir
from santa.data.outputs import claim_output, staged_output
from santa.data.pipeline import DATASETS, STAGES, PreprocessConfig, check_inputs, run_preprocess
from santa.data.schema import CODE_LANGUAGES
from santa.data.source import default_source_root
from santa.method.entities import PRODUCT_ENTITY_RULES
from santa.runtime import interrupts
from santa.runtime.errors import exit_with, run_job, with_exit_codes
from santa.runtime.preflight import check_input, check_writable
from santa.runtime.quiet import PROGRESS_HELP
from santa.runtime.ray_utils import init_ray

# CoSQA is one small JSON file of labelled query-code pairs: converted to a BEIR retrieval
# set (its positive queries against every function) in-process, without Ray.
COSQA = "cosqa"
# Your own {query, positive, negatives?} JSON lines → training pairs (santa.data.pairs).
PAIRS = "pairs"


def parse_args(
    argv: list[str] | None = None,
) -> tuple[PreprocessConfig | argparse.Namespace, str | None, bool]:
    """Parse the command line into a :class:`PreprocessConfig`, the Ray address and
    ``--progress``."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.preprocess",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", choices=(*DATASETS, COSQA, PAIRS), required=True)
    parser.add_argument(
        "--input",
        default=None,
        help="local path or s3:// URI (default for source: this Python's stdlib)",
    )
    parser.add_argument("--output", required=True, help="local path or s3:// URI")
    parser.add_argument("--stage", choices=STAGES, default="pretrain")
    parser.add_argument("--split", choices=("train", "valid", "test"), default="")
    parser.add_argument("--languages", nargs="*", choices=CODE_LANGUAGES, default=[])
    parser.add_argument("--mask", choices=("entity", "span"), default="entity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--esci-version", choices=("small", "large"), default="small")
    parser.add_argument("--locale", default="us")
    parser.add_argument(
        "--esci-pretrain",
        choices=esci.PRETRAIN_RULES,
        default="product",
        help="ESCI pretraining pairs: one per product, held-out products left out "
        "(product), or one per Exact judgment as SANTA's scripts, test products included "
        "(paper; use with --esci-version large)",
    )
    parser.add_argument(
        "--esci-dev-fraction",
        type=float,
        default=esci.DEV_FRACTION,
        help="ESCI: share of train queries carved out as --split valid (SANTA: 0.125)",
    )
    parser.add_argument(
        "--esci-dev-seed",
        type=int,
        default=esci.DEV_SEED,
        help="ESCI: seed of the dev carve (SANTA's random_state: 10)",
    )
    parser.add_argument(
        "--product-entities",
        choices=PRODUCT_ENTITY_RULES,
        default="scripts",
        help="ESCI entities: proper nouns as SANTA's scripts (scripts), or title nouns",
    )
    parser.add_argument("--skip-tests", action="store_true", help="source: skip test directories")
    parser.add_argument(
        "--asst",
        action="store_true",
        help="code: also write ASST code–code pairs (kind asst, SCodeR) beside the pairs",
    )
    parser.add_argument(
        "--max-actors",
        type=int,
        default=0,
        help="parser actors at most (default: one per cluster CPU)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=256,
        help="records per parser call for ESCI and source trees (JSON lines inputs are "
        "parsed in whole blocks of 1,000 lines)",
    )
    parser.add_argument(
        "--address", default=None, help="Ray address (default: RAY_ADDRESS or local)"
    )
    parser.add_argument("--debug", action="store_true", help="tracebacks on errors")
    parser.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    with_exit_codes(parser)
    args = parser.parse_args(argv)
    if args.input is None:
        if args.dataset != "source":
            parser.error("--input is required for this dataset")
        args.input = default_source_root()
    if args.asst and (args.dataset == "esci" or args.stage == "eval"):
        parser.error("--asst makes code–code training pairs: a code dataset, not --stage eval")
    if args.dataset == PAIRS:
        if args.stage == "eval" or args.asst:
            parser.error("pairs are training pairs: no --stage eval, no --asst")
        return args, args.address, args.progress
    if args.dataset == COSQA:
        if args.stage not in ("pretrain", "eval"):
            parser.error("cosqa is an evaluation set: use --stage eval")
        return args, args.address, args.progress
    config = PreprocessConfig(
        dataset=args.dataset,
        input=args.input,
        output=args.output,
        stage=args.stage,
        split=args.split,
        languages=tuple(args.languages),
        mask=args.mask,
        seed=args.seed,
        esci_version=args.esci_version,
        locale=args.locale,
        esci_pretrain=args.esci_pretrain,
        esci_dev_fraction=args.esci_dev_fraction,
        esci_dev_seed=args.esci_dev_seed,
        product_entities=args.product_entities,
        skip_tests=args.skip_tests,
        asst=args.asst,
        max_actors=args.max_actors,
        batch_size=args.batch_size,
    )
    return config, args.address, args.progress


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse → start/join Ray → run → print the report (errors: one line)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config, address, progress = parse_args(argv)
    return run_job(lambda: _run(config, address, progress), argv)


def _run(config, address: str | None, progress: bool = False) -> int:
    check_input(config.input, "--input")  # before any work: one line naming the URI
    check_writable(config.output, "--output")
    # One writer per output, which holds nothing but a preprocess output; an interrupted
    # run leaves it as it was.
    with (
        claim_output(config.output, "preprocess"),
        interrupts.keeping(
            lambda: (
                f"nothing was published; {config.output} is as it was (run the same "
                "command to start over)"
            )
        ),
    ):
        return _write(config, address, progress)


def _write(config, address: str | None, progress: bool = False) -> int:
    if isinstance(config, argparse.Namespace) and config.dataset == PAIRS:
        from santa.data.pairs import run_pairs_preprocess

        print(init_ray(address, progress=progress), flush=True)
        report = run_pairs_preprocess(config.input, config.output)
        print(format_report({**report, "entity_ratio": {}}))
        print(json.dumps({key: report[key] for key in ("queries", "documents", "negatives")}))
        print(f"output: {config.output}")
        return 0
    if isinstance(config, argparse.Namespace):  # CoSQA: a file → a BEIR folder
        split = config.split or "test"
        with staged_output(config.output, tool="preprocess") as staged:
            report = write_cosqa_beir(config.input, staged.staging, split=split)
            options = {"dataset": COSQA, "input": config.input, "split": split}
            staged.publish({**report, "config": options})
        print(json.dumps(report))
        print(f"output: {config.output}")
        return 0
    check_inputs(config)
    print(init_ray(address, progress=progress), flush=True)
    report = run_preprocess(config)
    print(format_report(report))
    print(f"output: {config.output}")
    return 0


def format_report(report: dict) -> str:
    """The report as a small plain-text table."""
    lines = [
        f"rows read     {report['rows_read']:>10,}",
        f"rows written  {report['rows_written']:>10,}",
    ]
    for reason, count in report["dropped"].items():
        lines.append(f"dropped  {reason:<22}{count:>10,}")
    for reason, count in report["filtered"].items():
        lines.append(f"filtered {reason:<22}{count:>10,}")
    for language, ratio in report["entity_ratio"].items():
        lines.append(f"entity ratio {language:<18}{ratio:>10.3f}")
    if "asst" in report:
        lines.append(f"asst pairs    {report['asst']['written']:>10,}")
        for reason, count in report["asst"]["skipped"].items():
            lines.append(f"asst skipped {reason:<18}{count:>10,}")
    lines += _esci_lines(report.get("esci"), report["config"])
    for failed in report.get("failed_files", []):
        lines.append(
            f"failed file   {failed['path']}: {failed['reason']} ({failed['detail']}); "
            f"{failed['rows_kept']:,} rows kept"
        )
    lines.append(f"wall time     {report['wall_time_s']:>10.1f} s")
    if "beir" in report:
        lines.append("BEIR " + json.dumps(report["beir"]))
    return "\n".join(lines)


def _esci_lines(counts: dict | None, config: dict) -> list[str]:
    """ESCI's split and pair counts beside the paper's (Table 1, Table 5)."""
    if not counts:
        return []
    if "queries" in counts:  # a judgments split
        lines = [f"ESCI {config['esci_version']} {config['locale']}: {counts['rule']}"]
        for split in ("train", "valid", "test"):
            paper = counts["paper_table1"][split]
            lines.append(
                f"  {split:<6} {counts['queries'][split]:>8,} queries "
                f"{counts['judgments'][split]:>9,} judgments   (SANTA Table 1, small us: "
                f"{paper['queries']:,} / {paper['judgments']:,})"
            )
        return lines
    comparable = "" if counts["comparable_to_table5"] else "; other version/locale"
    return [
        f"ESCI pretraining pairs {counts['pairs_written']:,}   (SANTA Table 5, large us: "
        f"{counts['paper_table5_pairs']:,}{comparable})",
        f"  {counts['rule']}",
        f"  of which from test queries' judgments: {counts['test_judgments']:,} (before drops)",
    ]


if __name__ == "__main__":
    exit_with(main())
