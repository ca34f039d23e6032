"""The Ray Data preprocessing pipeline end to end, on a local two-node Ray cluster."""

from __future__ import annotations

import gzip
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.model_selection import train_test_split

from santa.data.plan import PreprocessConfig, run_preprocess
from santa.data.schema import PAIR_SCHEMA
from santa.files import storage
from santa.files.outputs import published_root
from santa.method.masking import fill_sentinels
from tests.conftest import needs_tagger
from tests.datagen import (
    stdlib_python_records,
    stdlib_records,
    write_advtest,
    write_bad_input,
    write_csn_layout,
    write_esci,
    write_jsonl_gz,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")


def read_pairs(output: str):
    fs, path = storage.resolve(storage.join(published_root(output), "data"))
    return pq.read_table(path, filesystem=fs)


def assert_accounted(report: dict) -> None:
    """Every row read is written, dropped for a reason, or filtered out."""
    total = (
        report["rows_written"] + sum(report["dropped"].values()) + sum(report["filtered"].values())
    )
    assert total == report["rows_read"], report


def read_beir(output):
    corpus = [
        json.loads(x)
        for x in storage.read_bytes(f"{published_root(output)}/corpus.jsonl").splitlines()
    ]
    queries = [
        json.loads(x)
        for x in storage.read_bytes(f"{published_root(output)}/queries.jsonl").splitlines()
    ]
    return corpus, queries


@pytest.fixture(scope="module")
def csn_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("csn")
    urls = write_csn_layout(root)
    return root, urls


def test_codesearchnet_pretrain_all_languages(csn_root, tmp_path):
    root, urls = csn_root
    output = str(tmp_path / "out")
    report = run_preprocess(
        PreprocessConfig(dataset="codesearchnet", input=str(root), output=output)
    )
    table = read_pairs(output)
    assert table.schema.names == PAIR_SCHEMA.names
    assert table.num_rows == report["rows_written"] > 0
    assert_accounted(report)
    assert set(report["entity_ratio"]) == {"python", "java", "go", "javascript", "ruby", "php"}
    assert all(0.05 < ratio < 0.9 for ratio in report["entity_ratio"].values())
    rows = table.to_pylist()
    assert {row["doc_id"] for row in rows} <= urls["train"]
    for row in rows:
        assert fill_sentinels(row["masked_document"], row["mep_target"]) == row["document"]
    stored = storage.read_json(f"{output}/report.json")
    assert stored["rows_written"] == report["rows_written"]


def test_rerun_overwrites_instead_of_appending(csn_root, tmp_path):
    root, _ = csn_root
    config = PreprocessConfig(
        dataset="codesearchnet", input=str(root), output=str(tmp_path), languages=("go",)
    )
    first = run_preprocess(config)
    second = run_preprocess(config)
    assert read_pairs(str(tmp_path)).num_rows == first["rows_written"] == second["rows_written"]
    assert set(read_pairs(str(tmp_path)).column("language").to_pylist()) == {"go"}


def test_bad_input_is_counted_by_reason(tmp_path):
    good = stdlib_python_records(limit=30)
    for record in good:
        record["partition"] = ""  # a plain file of one split, as users have
    expected = write_bad_input(tmp_path / "in" / "functions.jsonl", good)
    report = run_preprocess(
        PreprocessConfig(
            dataset="codesearchnet",
            input=str(tmp_path / "in"),
            output=str(tmp_path / "out"),
            max_document_chars=20_000,
        )
    )
    assert report["dropped"] == expected
    assert report["rows_written"] == len(good)
    assert report["rows_read"] == len(good) + sum(expected.values())
    assert_accounted(report)
    assert sorted(read_pairs(str(tmp_path / "out")).column("doc_id").to_pylist()) == sorted(
        r["url"] for r in good
    )


def test_pairs_are_written_in_input_order_whatever_finishes_first(tmp_path):
    """Many small blocks over parser tasks on two nodes finish in any order; the pairs are
    written in the order of the input files and their lines (a training run orders its
    epochs over row positions: another order would train another model)."""
    records = stdlib_records(360)
    for record in records:
        record["partition"] = ""
    # Enough work that both nodes' parsers (each reading its own blocks) are busy.
    files = [records[index * 60 : (index + 1) * 60] for index in range(6)]
    for index, part in enumerate(files):  # names sort as they are numbered
        write_jsonl_gz(tmp_path / "in" / f"part{index}.jsonl.gz", part)
    expected = [r["url"] for part in files for r in part]
    config = PreprocessConfig(
        dataset="codesearchnet",
        input=str(tmp_path / "in"),
        output=str(tmp_path / "out"),
        lines_per_block=3,
        batch_size=3,
    )
    report = run_preprocess(config)
    assert report["rows_written"] == len(expected)
    assert read_pairs(str(tmp_path / "out")).column("doc_id").to_pylist() == expected


def test_a_cut_short_file_is_named_in_the_report(tmp_path):
    """A truncated .jsonl.gz: the lines before the fault are kept, and report.json names
    the file, the reason, the reader's message and the rows kept from it."""
    good = stdlib_python_records(limit=60)
    for record in good:
        record["partition"] = ""  # files of one split, as users have
    write_jsonl_gz(tmp_path / "in" / "whole.jsonl.gz", good[:20])
    cut = write_jsonl_gz(tmp_path / "in" / "cut.jsonl.gz", good[20:])
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])  # the gzip stream breaks off
    report = run_preprocess(
        PreprocessConfig(
            dataset="codesearchnet", input=str(tmp_path / "in"), output=str(tmp_path / "out")
        )
    )
    (failed,) = report["failed_files"]
    assert failed["path"] == str(cut) and failed["reason"] == "corrupt_file"
    assert "truncated" in failed["detail"] and str(cut) in failed["detail"]
    assert 0 < failed["rows_read"] < 40 and failed["at_line"] == failed["rows_read"] + 1
    assert failed["rows_kept"] == failed["rows_read"]  # every line before the fault is good
    assert report["rows_written"] == 20 + failed["rows_kept"]
    assert report["dropped"] == {"corrupt_file": 1}
    from santa.data.accounting import format_text as format_report

    assert f"failed file   {cut}: corrupt_file" in format_report(report)


def test_training_rows_that_leak_into_heldout_splits_are_dropped(tmp_path):
    records = stdlib_python_records(limit=40)
    for record in records:
        record["partition"] = "train"
    leaked = dict(records[0], partition="test")
    write_jsonl_gz(tmp_path / "in" / "train" / "a.jsonl.gz", records)
    write_jsonl_gz(tmp_path / "in" / "test" / "a.jsonl.gz", [leaked])
    report = run_preprocess(
        PreprocessConfig(
            dataset="codesearchnet",
            input=str(tmp_path / "in"),
            output=str(tmp_path / "out"),
            stage="finetune",
        )
    )
    assert report["dropped"].get("heldout_leak") == 1
    assert leaked["url"] not in set(read_pairs(str(tmp_path / "out")).column("doc_id").to_pylist())


def test_codesearchnet_eval_writes_beir(csn_root, tmp_path):
    root, urls = csn_root
    output = str(tmp_path / "beir")
    report = run_preprocess(
        PreprocessConfig(dataset="codesearchnet", input=str(root), output=output, stage="eval")
    )
    corpus, queries = read_beir(output)
    assert {doc["_id"] for doc in corpus} == urls["test"]
    assert len(queries) == len(corpus) == report["beir"]["queries"]
    qrels = storage.read_bytes(f"{output}/qrels/test.tsv").decode().splitlines()
    assert qrels[0] == "query-id\tcorpus-id\tscore"
    assert len(qrels) - 1 == len(urls["test"])
    assert all(line.endswith("\t1") for line in qrels[1:])


def test_source_tree_records(tmp_path, monkeypatch, capsys):
    """A source tree: records split by file, the files that do not parse counted by reason
    in one summary line, and santa's progress lines while the files are parsed."""
    import re

    from santa.data.accounting import format_text

    monkeypatch.setenv("SANTA_PROGRESS_EVERY_S", "0")  # a line each time the count moves
    tree = tmp_path / "tree"
    shutil.copytree(
        storage.join(__import__("santa.data.source", fromlist=["x"]).default_source_root(), "json"),
        tree / "json",
    )
    (tree / "pkg").mkdir()
    (tree / "pkg" / "Box.java").write_text(
        "class Box {\n  /** Returns the size of the box. */\n"
        "  int size(int count) { return count * 2; }\n}\n"
    )
    (tree / "pkg" / "broken.py").write_text("def f(:\n    '''doc'''\n")
    (tree / "pkg" / "latin1.py").write_bytes(b"def f():\n    '''caf\xe9'''\n")
    outputs = {}
    for split in ("train", "valid", "test"):
        outputs[split] = run_preprocess(
            PreprocessConfig(
                dataset="source",
                input=str(tree),
                output=str(tmp_path / split),
                split=split,
                stage="finetune",
            )
        )
    report = outputs["train"]
    assert report["dropped"]["unparsable_code"] == 1
    assert report["dropped"]["undecodable_bytes"] == 1
    summary = format_text(report).splitlines()
    assert not [line for line in summary if line.startswith("failed file ")]
    assert (
        "failed files           2 source files not parsed (undecodable_bytes 1, "
        "unparsable_code 1; report.json's failed_files names each)"
    ) in summary
    printed = capsys.readouterr().out.splitlines()
    progress = [line for line in printed if line.startswith("[preprocess] ")]
    files = len(list(tree.rglob("*.py"))) + 1  # and Box.java
    assert progress, printed
    assert all(
        re.fullmatch(rf"\[preprocess\] source files parsed: \d+/{files} files .*", line)
        or re.fullmatch(rf"\[preprocess\] source files parsed: {files} files in \d+ s.*", line)
        for line in progress
    ), progress
    assert re.fullmatch(rf"\[preprocess\] source files parsed: {files} files in .*", progress[-1])
    written = sum(r["rows_written"] for r in outputs.values())
    assert written > 10
    ids = [set(read_pairs(str(tmp_path / s)).column("url").to_pylist()) for s in outputs]
    files = [{u.split("#")[0] for u in split_ids} for split_ids in ids]
    assert not (files[0] & files[1]) and not (files[0] & files[2]) and not (files[1] & files[2])
    java = [u for split_ids in ids for u in split_ids if u.endswith(("Box.java#L3-L3",))]
    assert len(java) == 1


def test_advtest_eval_from_generated_files(tmp_path):
    write_advtest(tmp_path / "adv")
    output = str(tmp_path / "out")
    report = run_preprocess(
        PreprocessConfig(
            dataset="advtest", input=str(tmp_path / "adv"), output=output, stage="eval"
        )
    )
    corpus, queries = read_beir(output)
    assert len(corpus) == report["rows_written"] == 20
    assert all("def Func" in doc["text"] for doc in corpus)


@needs_tagger
def test_esci_pretrain_finetune_eval(tmp_path):
    data = write_esci(tmp_path / "esci")
    test_products = {e["product_id"] for e in data["examples"] if e["split"] == "test"}
    pre = run_preprocess(
        PreprocessConfig(dataset="esci", input=str(tmp_path / "esci"), output=str(tmp_path / "p"))
    )
    assert_accounted(pre)
    assert pre["filtered"]["other_locale"] == 4
    pairs = read_pairs(str(tmp_path / "p")).to_pylist()
    assert not {row["doc_id"] for row in pairs} & test_products
    assert pre["dropped"].get("heldout_leak", 0) > 0
    assert all(
        fill_sentinels(r["masked_document"], r["mep_target"]) == r["document"] for r in pairs
    )
    assert "esci" not in pre["entity_ratio"] and pre["entity_ratio"]["us"] > 0
    assert pre["by_kind"] == {"product_pretrain": pre["rows_written"]}
    assert {row["kind"] for row in pairs} == {"product_pretrain"}
    assert set(pre["without_entities"]) <= {"product_pretrain"}

    fine = run_preprocess(
        PreprocessConfig(
            dataset="esci",
            input=str(tmp_path / "esci"),
            output=str(tmp_path / "f"),
            stage="finetune",
        )
    )
    assert_accounted(fine)
    assert fine["by_kind"] == {"product_judgment": fine["rows_written"]}
    train_small = [e for e in data["examples"] if e["split"] == "train" and e["small_version"]]
    # The train split without the dev queries SANTA's scripts carve out of it (1 of 3).
    order = list(dict.fromkeys(e["query_id"] for e in train_small))
    _, dev = train_test_split(order, test_size=0.125, random_state=10)
    assert fine["rows_written"] == sum(e["query_id"] not in dev for e in train_small)
    assert fine["esci"]["queries"] == {"train": 2, "valid": 1, "test": 1}
    assert fine["filtered"]["other_version"] > 0 and fine["filtered"]["other_split"] > 0

    run_preprocess(
        PreprocessConfig(
            dataset="esci", input=str(tmp_path / "esci"), output=str(tmp_path / "e"), stage="eval"
        )
    )
    qrels = storage.read_bytes(f"{tmp_path}/e/qrels/test.tsv").decode().splitlines()[1:]
    expected = {
        (str(e["query_id"]), e["product_id"]): {"E": 3, "S": 2, "C": 1, "I": 0}[e["esci_label"]]
        for e in data["examples"]
        if e["split"] == "test" and e["small_version"]
    }
    got = {(q, d): int(s) for q, d, s in (line.split("\t") for line in qrels)}
    assert got == expected


def test_s3_input_and_output_on_moto(csn_root, moto_s3):
    root, urls = csn_root
    bucket = moto_s3.create_bucket("santa-preprocess")
    for path in root.rglob("*.jsonl.gz"):
        storage.write_bytes(f"{bucket}/csn/{path.relative_to(root)}", path.read_bytes())
    report = run_preprocess(
        PreprocessConfig(
            dataset="codesearchnet",
            input=f"{bucket}/csn",
            output=f"{bucket}/out",
            languages=("python", "ruby"),
        )
    )
    table = read_pairs(f"{bucket}/out")
    assert table.num_rows == report["rows_written"] > 0
    assert set(table.column("language").to_pylist()) == {"python", "ruby"}
    assert storage.read_json(f"{bucket}/out/report.json")["rows_written"] == table.num_rows


def test_shared_fixtures_ruby_and_advtest(shared_fixtures, tmp_path):
    report = run_preprocess(
        PreprocessConfig(
            dataset="codesearchnet",
            input=str(shared_fixtures / "csn" / "ruby"),
            output=str(tmp_path / "ruby"),
            split="valid",
        )
    )
    with gzip.open(shared_fixtures / "csn" / "ruby" / "valid.jsonl.gz") as handle:
        total = sum(1 for _ in handle)
    assert report["rows_read"] == total == 1400  # the real sample's size, and the stand-in's
    assert report["rows_written"] > 0.9 * total
    assert_accounted(report)
    assert 0.1 < report["entity_ratio"]["ruby"] < 0.6
    adv = run_preprocess(
        PreprocessConfig(
            dataset="advtest",
            input=str(shared_fixtures / "advtest"),
            output=str(tmp_path / "adv"),
            stage="eval",
        )
    )
    assert adv["rows_read"] == 100 and adv["rows_written"] > 90


@needs_tagger
def test_shared_esci_fixture_eval_and_pretrain(shared_fixtures, tmp_path):
    esci = shared_fixtures / "esci"
    examples = pq.read_table(esci / "shopping_queries_dataset_examples.parquet").to_pylist()
    report = run_preprocess(
        PreprocessConfig(dataset="esci", input=str(esci), output=str(tmp_path / "e"), stage="eval")
    )
    expected = {
        (str(e["query_id"]), e["product_id"]): {"E": 3, "S": 2, "C": 1, "I": 0}[e["esci_label"]]
        for e in examples
        if e["split"] == "test" and e["small_version"] == 1 and e["product_locale"] == "us"
    }
    qrels = storage.read_bytes(f"{tmp_path}/e/qrels/test.tsv").decode().splitlines()[1:]
    assert {(q, d): int(s) for q, d, s in (line.split("\t") for line in qrels)} == expected
    assert report["rows_written"] == len(expected)
    corpus, queries = read_beir(str(tmp_path / "e"))
    assert len(queries) == 1 and all(doc["title"] for doc in corpus)


def test_preprocess_job_cli_starts_its_own_ray(tmp_path):
    """The README's first command shape: `python -m ray_jobs.preprocess` on a laptop."""
    import os
    import subprocess
    import sys

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "mod.py").write_text(
        'def area(width, height):\n    """Return the area of a rectangle."""\n'
        "    return width * height\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_jobs.preprocess",
            "--dataset",
            "source",
            "--input",
            str(tree),
            "--output",
            str(tmp_path / "out"),
            "--split",
            "train",
            "--max-actors",
            "1",
            # A Ray of its own, not the session's test cluster.
            "--address",
            "local",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rows written" in proc.stdout
    report = storage.read_json(str(tmp_path / "out" / "report.json"))
    assert report["rows_read"] == 1
    assert report["rows_written"] + report["filtered"].get("other_split", 0) == 1


def test_large_files_are_read_in_parts_with_their_line_numbers(tmp_path):
    """A file read by several tasks yields every line once, numbered as in the whole file:
    one task per file would leave all but a few parsers idle on a few large files."""
    import ray
    import ray.data

    from santa.data.readers import JsonLinesDatasource

    records = (stdlib_python_records() * 4)[:400]  # lines only: repeats are fine
    assert len(records) == 400
    big, small = tmp_path / "train.jsonl.gz", tmp_path / "valid.jsonl"
    write_jsonl_gz(big, records)
    small.write_text("".join(json.dumps(r) + "\n" for r in records[:5]))
    # The gzip file is most of the bytes: it is read in parts, the small file in one.
    part_bytes = big.stat().st_size // 3 + 1
    assert small.stat().st_size < part_bytes
    source = JsonLinesDatasource(
        [str(big), str(small)], root=str(tmp_path), lines_per_block=50, part_bytes=part_bytes
    )
    assert source.parts == [3, 1] and source.num_read_tasks == 4
    dataset = ray.data.read_datasource(source, override_num_blocks=source.num_read_tasks)
    rows = dataset.materialize()
    blocks = [ray.get(ref) for ref in rows.to_arrow_refs()]
    # Blocks of different read tasks are never merged: the big file came in several.
    assert sum(b.num_rows > 0 and b["path"][0].as_py() == str(big) for b in blocks) >= 2
    table = pa.concat_tables([b for b in blocks if b.num_rows])
    lines = sorted(
        zip(
            table["path"].to_pylist(),
            table["line_number"].to_pylist(),
            table["raw"].to_pylist(),
            strict=True,
        )
    )
    got_big = [(n, json.loads(raw)) for p, n, raw in lines if p == str(big)]
    assert got_big == list(enumerate(records, start=1))
    assert [n for p, n, _ in lines if p == str(small)] == list(range(1, 6))
    assert set(table["split"].to_pylist()) == {"train", "valid"}


def test_plan_parts_follows_the_file_sizes_alone_and_is_capped():
    from santa.data.readers import plan_parts

    assert plan_parts([100, 100, 100, 100], part_bytes=100, max_parts=8) == [1, 1, 1, 1]
    assert plan_parts([300, 101], part_bytes=50, max_parts=8) == [6, 3]
    assert plan_parts([1000, 1], part_bytes=10, max_parts=8) == [8, 1]
    assert plan_parts([0, 0], part_bytes=10, max_parts=8) == [1, 1]


def test_parsers_read_their_own_input(csn_root, tmp_path):
    """The JSON lines read fuses into the parser tasks: each parses the block it read (no
    lines through the object store between a reader and a parser), and no actor pool
    (whose worker processes start and exit with every job)."""
    from santa.data.plan import _code_work_dataset

    root, _ = csn_root
    config = PreprocessConfig(dataset="codesearchnet", input=str(root), output=str(tmp_path))
    stats = _code_work_dataset(config)[0].materialize().stats()
    assert "Operator 1 ReadJsonLines->MapBatches(build_code_pairs):" in stats, stats
    assert "Operator 2" not in stats and "actor" not in stats.lower(), stats


def test_parsers_are_tasks_unless_min_actors_asks_for_more_than_the_cluster_holds():
    """A pool only where it buys something: a ``min_actors`` above the CPUs present on a
    cluster that can grow (the autoscaler adds nodes for the actors waiting; test_autoscaling
    runs it). The session cluster (2 nodes of 1 CPU) cannot grow: tasks, whatever the
    ``min_actors``, unless ``max_actors`` says the pool may be larger than the cluster."""
    from santa.data.operators import CodePairBuilder, build_code_pairs
    from santa.data.plan import _parsers

    def parsers(**fields):
        config = PreprocessConfig(dataset="codesearchnet", input="in", output="out", **fields)
        return _parsers(config, build_code_pairs, CodePairBuilder, {"split": "train"})

    tasks = parsers()  # the session cluster: 2 nodes of 1 CPU
    assert tasks["fn"] is build_code_pairs and tasks["fn_kwargs"] == {"split": "train"}
    assert "compute" not in tasks and "concurrency" not in tasks, tasks
    assert parsers(min_actors=2, max_actors=2)["concurrency"] == 2
    assert parsers(min_actors=3)["fn"] is build_code_pairs
    pool = parsers(min_actors=3, max_actors=4)
    assert pool["fn"] is CodePairBuilder and pool["fn_constructor_kwargs"] == {"split": "train"}
    assert pool["compute"].min_size == 3 and pool["num_cpus"] == 1.0, pool
    assert pool["batch_size"] is None  # whole blocks: the read still fuses into the pool
    # Two 2-CPU parsers do not fit on two 1-CPU nodes: a pool of two.
    assert parsers(min_actors=2, max_actors=2, num_cpus_per_actor=2.0)["fn"] is CodePairBuilder


def test_the_preprocess_command_passes_the_parsers_bounds_on():
    from ray_jobs.preprocess import parse_args

    base = ["--dataset", "source", "--input", "in", "--output", "out"]
    config, _, _ = parse_args([*base, "--min-actors", "6", "--max-actors", "8"])
    assert (config.min_actors, config.max_actors) == (6, 8)
    assert parse_args(base)[0].min_actors == 1  # the config's default


def test_small_blocks_are_written_as_few_parquet_files(tmp_path):
    """Many small read blocks must not become one small Parquet file each."""
    records = stdlib_python_records()
    write_jsonl_gz(tmp_path / "in" / "train.jsonl.gz", records)
    outputs = {}
    for rows_per_file in (100_000, 40):
        output = tmp_path / f"out-{rows_per_file}"
        report = run_preprocess(
            PreprocessConfig(
                dataset="codesearchnet",
                input=str(tmp_path / "in"),
                output=str(output),
                lines_per_block=20,
                read_part_bytes=4096,  # the one small file read in parts, as a large one
                rows_per_file=rows_per_file,
            )
        )
        files = sorted((output / "data").glob("*.parquet"))
        assert sum(pq.read_metadata(f).num_rows for f in files) == report["rows_written"]
        outputs[rows_per_file] = (files, report["rows_written"])
    files, written = outputs[100_000]
    # A small output is split over the cluster's CPUs (2 here), written in parallel.
    counts = [pq.read_metadata(f).num_rows for f in files]
    assert written >= 80 and len(files) == 2 and sum(counts) == written
    files, written = outputs[40]
    assert 2 <= len(files) <= -(-written // 40)  # files of 40 rows or more, but the last
    counts = [pq.read_metadata(f).num_rows for f in files]
    assert sum(count < 40 for count in counts) <= 1  # only the last file may be short


@pytest.mark.slow
def test_asst_option_writes_code_code_pairs_beside_the_pairs(csn_root, tmp_path):
    """``asst=True``: one ASST pair (kind ``asst``) per code pair with a selectable sub-tree,
    in the same data folder; the span put back into its context is the function again."""
    from santa.data.kinds import ASST, CODE_PAIR

    root, _ = csn_root
    config = PreprocessConfig(
        dataset="codesearchnet", input=str(root), output=str(tmp_path), asst=True
    )
    report = run_preprocess(config)
    table = read_pairs(str(tmp_path))
    assert table.schema.names == PAIR_SCHEMA.names
    rows = table.to_pylist()
    code = {row["doc_id"]: row for row in rows if row["kind"] == CODE_PAIR}
    asst = [row for row in rows if row["kind"] == ASST]
    assert len(code) == report["rows_written"]
    assert len(asst) == report["asst"]["written"] == report["by_kind"]["asst"] > 0
    assert len(asst) + sum(report["asst"]["skipped"].values()) == len(code)
    # The generated one-statement functions of the other languages are mostly too short.
    assert "python" in {row["language"] for row in asst}
    assert set(report["asst"]["skipped"]) <= {"no_subtree", "unparsable_code"}
    for row in asst:
        source = code[row["doc_id"].removesuffix("#asst")]
        assert row["query"] and row["document"] and row["query"] in source["document"]
        start = source["document"].index(row["query"])
        rebuilt = row["document"][:start] + row["query"] + row["document"][start:]
        assert rebuilt == source["document"]
    # A rerun replaces the ASST files instead of adding to them; same seed, same pairs.
    run_preprocess(config)
    again = [r for r in read_pairs(str(tmp_path)).to_pylist() if r["kind"] == ASST]
    assert sorted(r["id"] for r in again) == sorted(r["id"] for r in asst)
