"""Record parsing, validation and pair construction, without Ray."""

import json

import pytest

from santa.data.readers import language_from_path, split_from_path
from santa.data.records import (
    DropRow,
    PairOptions,
    Reason,
    build_code_pair,
    build_product_judgment_row,
    build_product_pretrain_pair,
    normalize_advtest,
    normalize_codesearchnet,
    parse_json_line,
)
from santa.method.masking import fill_sentinels
from tests.conftest import needs_tagger
from tests.datagen import other_language_records, stdlib_python_records

PYTHON_RECORD = {
    "repo": "r",
    "path": "p.py",
    "func_name": "add",
    "original_string": "",
    "language": "python",
    "code": 'def add(a, b):\n    """Add two numbers.\n\n    More text.\n    """\n    return a + b\n',
    "code_tokens": [],
    "docstring": "Add two numbers.\n\nMore text.",
    "docstring_tokens": ["Add", "two", "numbers", "."],
    "url": "https://x/add",
    "partition": "train",
}


def reason_of(call) -> str:
    with pytest.raises(DropRow) as caught:
        call()
    return caught.value.reason


def test_parse_json_line_reasons():
    assert parse_json_line(b'{"a": 1}') == {"a": 1}
    assert reason_of(lambda: parse_json_line(b'{"a": ')) == Reason.MALFORMED_JSON
    assert reason_of(lambda: parse_json_line(b"[1, 2]")) == Reason.MALFORMED_JSON
    assert reason_of(lambda: parse_json_line(b'{"a": "\xff"}')) == Reason.UNDECODABLE_BYTES


def test_normalize_fills_every_csn_field_and_rejects_missing_code():
    record = normalize_codesearchnet({"code": "x", "docstring": "d", "language": "Go"})
    assert record["language"] == "go" and record["url"].startswith("sha:")
    assert record["code_tokens"] == [] and record["original_string"] == "x"
    assert reason_of(lambda: normalize_codesearchnet({"docstring": "d", "language": "go"})) == (
        Reason.MISSING_FIELD
    )


def test_code_pretrain_pair_masks_identifiers_and_round_trips():
    row = build_code_pair(dict(PYTHON_RECORD), "codesearchnet", PairOptions())
    assert row["query"] == "Add two numbers."
    assert '"""' not in row["document"] and "return a + b" in row["document"]
    assert row["entities"] == ["add", "a", "b"]
    assert row["masked_document"].startswith("def <extra_id_0>(<extra_id_1>, <extra_id_2>):")
    assert row["mep_target"] == "<extra_id_0> add <extra_id_1> a <extra_id_2> b"
    assert fill_sentinels(row["masked_document"], row["mep_target"]) == row["document"]
    assert 0 < row["num_masked_tokens"] < row["num_tokens"]


def test_finetune_uses_docstring_tokens_and_skips_masking():
    row = build_code_pair(dict(PYTHON_RECORD), "codesearchnet", PairOptions(stage="finetune"))
    assert row["query"] == "Add two numbers ."
    assert row["masked_document"] == "" and row["entities"] == []


def test_span_masking_keeps_the_entity_rate():
    entity = build_code_pair(dict(PYTHON_RECORD), "codesearchnet", PairOptions())
    span = build_code_pair(dict(PYTHON_RECORD), "codesearchnet", PairOptions(mask="span"))
    assert span["num_masked_tokens"] == entity["num_masked_tokens"]
    assert fill_sentinels(span["masked_document"], span["mep_target"]) == span["document"]


@pytest.mark.parametrize("language", ["java", "go", "javascript", "ruby", "php"])
def test_other_languages_build_pairs(language):
    for record in other_language_records(language, count=3):
        row = build_code_pair(normalize_codesearchnet(record), "codesearchnet", PairOptions())
        assert row["entities"], row
        assert fill_sentinels(row["masked_document"], row["mep_target"]) == row["document"]


def test_real_stdlib_records_build_pairs():
    records = stdlib_python_records(limit=50)
    rows = [build_code_pair(r, "source", PairOptions()) for r in records]
    assert all(r["query"] and r["mep_target"] for r in rows)
    assert all(fill_sentinels(r["masked_document"], r["mep_target"]) == r["document"] for r in rows)


def test_code_pair_drop_reasons():
    options = PairOptions(max_document_chars=50)
    empty = dict(PYTHON_RECORD, docstring="", docstring_tokens=[])
    assert reason_of(lambda: build_code_pair(empty, "c", PairOptions())) == Reason.EMPTY_DOCSTRING
    long = dict(PYTHON_RECORD, code=PYTHON_RECORD["code"] + "    x = 1\n" * 20)
    assert reason_of(lambda: build_code_pair(long, "c", options)) == Reason.TOO_LONG
    sentinel = dict(PYTHON_RECORD, code=PYTHON_RECORD["code"] + "    '<extra_id_3>'\n")
    assert reason_of(lambda: build_code_pair(sentinel, "c", PairOptions())) == (
        Reason.SENTINEL_IN_TEXT
    )
    cobol = dict(PYTHON_RECORD, language="cobol")
    assert reason_of(lambda: build_code_pair(cobol, "c", PairOptions())) == (
        Reason.UNSUPPORTED_LANGUAGE
    )
    garbage = dict(PYTHON_RECORD, language="java", code="\x00\x01 ))) }}} ((( ;;; ### @@@ !!!")
    assert reason_of(lambda: build_code_pair(garbage, "c", PairOptions())) == (
        Reason.UNPARSABLE_CODE
    )


def test_advtest_test_records_map_to_csn_fields():
    record = normalize_advtest(
        {
            "url": "u",
            "function": 'def Func(arg_0):\n    """Doc."""\n    return arg_0',
            "docstring_tokens": ["Doc", "."],
            "identifier": "m.f",
        }
    )
    assert record["code"].startswith("def Func") and record["language"] == "python"
    row = build_code_pair(record, "advtest", PairOptions(stage="eval"))
    assert row["query"] == "Doc ." and "Doc." not in row["document"]
    train = normalize_advtest(json.loads(json.dumps(PYTHON_RECORD)))
    assert train["func_name"] == "add"


@needs_tagger
def test_product_pretrain_pair_masks_title_nouns():
    product = {
        "product_id": "B1",
        "product_title": "Acme Coffee Grinder with Travel Pouch",
        "product_description": "<p>Store the <b>grinder</b> &amp; beans in the pouch.</p>",
        "product_bullet_point": "FAST: grinds in seconds\nQUIET: low noise",
        "product_locale": "us",
    }
    row = build_product_pretrain_pair(product, PairOptions())
    assert row["document"] == "Store the grinder & beans in the pouch."
    assert row["query"] in ("FAST: grinds in seconds", "QUIET: low noise")
    assert set(row["entities"]) == {"grinder", "pouch"}
    assert fill_sentinels(row["masked_document"], row["mep_target"]) == row["document"]
    again = build_product_pretrain_pair(product, PairOptions())
    assert again["query"] == row["query"]
    no_bullets = dict(product, product_bullet_point="")
    assert reason_of(lambda: build_product_pretrain_pair(no_bullets, PairOptions())) == (
        Reason.EMPTY_DOCSTRING
    )


def test_product_judgment_grades():
    example = {
        "query": "q",
        "query_id": 7,
        "product_id": "B1",
        "product_title": "T",
        "product_description": "d",
        "product_bullet_point": "b",
        "product_locale": "us",
    }
    grades = {
        label: build_product_judgment_row(dict(example, esci_label=label), PairOptions())["label"]
        for label in "ESCI"
    }
    assert grades == {"E": 3, "S": 2, "C": 1, "I": 0}
    bad = dict(example, esci_label="X")
    assert reason_of(lambda: build_product_judgment_row(bad, PairOptions())) == (
        Reason.MISSING_FIELD
    )


def test_split_and_language_from_path():
    assert split_from_path("csn/python/final/jsonl/train/python_train_0.jsonl.gz") == "train"
    assert split_from_path("advtest/test_sample.jsonl") == "test"
    assert split_from_path("cosqa/cosqa-dev.json") == "valid"
    assert split_from_path("data/functions.jsonl") == ""
    assert language_from_path("csn/ruby/final/jsonl/valid/x.jsonl.gz") == "ruby"
    assert language_from_path("data/functions.jsonl") == ""


@needs_tagger
def test_product_pretrain_pair_without_entities_trains_sda_only(tmp_path):
    """A description sharing no noun with its title has nothing to mask. The pair must
    still train (SDA; its MEP labels all ignored), not be taken for a graded judgment."""
    import numpy as np
    import pyarrow as pa

    from santa.data.kinds import PRODUCT_PRETRAIN
    from santa.data.schema import PAIR_SCHEMA
    from santa.models.tokenizer import train_tokenizer
    from santa.negatives.corpus import load_mining_corpus
    from santa.train.data import IGNORE_INDEX, tokenize_pairs
    from tests.training import write_pairs

    product = {
        "product_id": "B7",
        "product_title": "Acme Coffee Grinder",
        "product_description": "it has stainless steel burrs and a quiet motor.",
        "product_bullet_point": "FAST: grinds in seconds",
        "product_locale": "us",
    }
    row = build_product_pretrain_pair(product, PairOptions())
    assert row["kind"] == PRODUCT_PRETRAIN and row["mep_target"] == "" and row["entities"] == []
    with_entities = build_product_pretrain_pair(
        dict(product, product_id="B8", product_description="The grinder has quiet burrs."),
        PairOptions(),
    )
    assert with_entities["mep_target"]

    tokenizer = train_tokenizer(
        [row["query"], row["document"], with_entities["document"]] * 20, vocab_size=400
    )
    tokenizer.save_pretrained(tmp_path / "tok")
    table = pa.Table.from_pylist([row, with_entities], schema=PAIR_SCHEMA)
    out = tokenize_pairs(
        table,
        tokenizer_path=str(tmp_path / "tok"),
        max_query_length=16,
        max_document_length=32,
        max_target_length=16,
        with_mep=True,
        with_document=False,
    )
    assert out["query_input_ids"].shape[0] == 2  # the entity-less pair trains
    assert (out["labels"][0] == IGNORE_INDEX).all()  # ...with no MEP label
    assert (out["labels"][1] != IGNORE_INDEX).any()
    pairs = write_pairs(tmp_path / "pairs", [row, with_entities])
    corpus = load_mining_corpus(pairs, str(tmp_path / "rows"))
    queries = corpus.query_ids(range(corpus.num_queries))
    assert set(queries) == {row["query_id"], with_entities["query_id"]}
    assert np.isfinite(out["query_input_ids"]).all()


# ------------------------------------------------------------- the released code's data

JS_CODE = (
    "function addTotal(items, tax) {\n  var total = 0;\n"
    "  for (var i = 0; i < items.length; i++) { total += items[i]; }\n  return total * tax;\n}"
)
JS_RECORD = {
    **PYTHON_RECORD,
    "language": "javascript",
    "func_name": "addTotal",
    "code": JS_CODE,
    "code_tokens": [
        "function",
        "addTotal",
        "(",
        "items",
        ",",
        "tax",
        ")",
        "{",
        "var",
        "total",
        "=",
        "0",
        ";",
        "for",
        "(",
        "var",
        "i",
        "=",
        "0",
        ";",
        "i",
        "<",
        "items",
        ".",
        "length",
        ";",
        "i",
        "++",
        ")",
        "{",
        "total",
        "+=",
        "items",
        "[",
        "i",
        "]",
        ";",
        "}",
        "return",
        "total",
        "*",
        "tax",
        ";",
        "}",
    ],
    "docstring": "Sum the items, with tax.",
    "docstring_tokens": ["Sum", "the", "items", ",", "with", "tax", "."],
}


def released_masked_names(identifiers: list[str], language: str, rng) -> set[str]:
    """processing/Code/build_code_entity.py's draw, its lines as written (the names of a
    sample of the occurrences; Python keeps every one)."""
    if language == "python":
        return set(identifiers)
    ratio = 0.1 if language == "javascript" else 0.5
    no_delete = rng.sample(identifiers, k=int(max(ratio * (len(identifiers) - 1), 1)))
    return {item for item in identifiers if item in no_delete}


@pytest.mark.parametrize("language", ["javascript", "ruby", "python"])
def test_released_targets_mask_what_the_released_script_draws_and_end_with_a_sentinel(
    language,
) -> None:
    import random

    from santa.data.records import stable_hash
    from santa.method.entities import extract_code_entities

    if language == "javascript":
        record = dict(JS_RECORD)
    elif language == "ruby":
        (record,) = other_language_records("ruby", count=1)
        record = dict(normalize_codesearchnet(record), code_tokens=record["code"].split())
    else:
        record = {
            **PYTHON_RECORD,
            "code_tokens": ["def", "add", "(", "a", ",", "b", ")", ":", "return", "a", "+", "b"],
        }
    options = PairOptions(code_text="tokens", mep_targets="released", seed=3)
    row = build_code_pair(dict(record), "codesearchnet", options)
    document = " ".join(record["code_tokens"])
    assert row["document"] == document
    assert row["query"] == " ".join(record["docstring_tokens"])  # pretraining too
    # The same draw as the script's, from the same identifiers and seed.
    source = document if language == "python" else record["code"]
    spans = extract_code_entities(source, language)
    identifiers = [source[start:end] for start, end in spans]
    rng = random.Random(stable_hash(3, record["url"], "mep"))
    names = released_masked_names(identifiers, language, rng)
    masked_tokens = [t for t in record["code_tokens"] if t in names]
    assert set(row["entities"]) == set(masked_tokens) and row["entities"]
    if language == "javascript":
        assert len(set(row["entities"])) < len(set(identifiers))  # a tenth of them
    k = len(row["entities"])
    assert row["mep_target"].endswith(f"<extra_id_{k - 1}> {row['entities'][-1]} <extra_id_{k}>")
    assert fill_sentinels(row["masked_document"], row["mep_target"]) == document
    # santa's rule stays the default: every identifier, no trailing sentinel.
    default = build_code_pair(dict(record), "codesearchnet", PairOptions(code_text="tokens"))
    assert len(default["entities"]) >= k
    assert not default["mep_target"].endswith(f"<extra_id_{len(default['entities'])}>")


def test_tokens_text_needs_code_tokens() -> None:
    record = {**PYTHON_RECORD, "code_tokens": []}
    options = PairOptions(code_text="tokens")
    assert reason_of(lambda: build_code_pair(record, "c", options)) == Reason.MISSING_FIELD


def test_a_table_recipe_brings_its_data_options_and_the_command_line_wins(tmp_path) -> None:
    from ray_jobs.preprocess import MERGED_SPLIT_WARNING, parse_args, split_warning

    base = ["--dataset", "codesearchnet", "--input", str(tmp_path), "--output", str(tmp_path)]
    config, _, _ = parse_args([*base, "--recipe", "codet5-base-adv-table2"])
    assert (config.code_text, config.mep_targets, config.split) == (
        "tokens",
        "released",
        "train+test",
    )
    assert config.wanted_splits == ("train", "test")
    assert split_warning(config) == MERGED_SPLIT_WARNING
    given, _, _ = parse_args([*base, "--recipe", "codet5-base-codesearch", "--code-text", "raw"])
    assert (given.code_text, given.mep_targets, given.split) == ("raw", "released", "")
    assert split_warning(given) is None
    plain, _, _ = parse_args(base)
    assert (plain.code_text, plain.mep_targets) == ("raw", "all")
    with pytest.raises(SystemExit):
        parse_args([*base, "--stage", "eval", "--split", "train+test"])


def test_a_merged_split_builds_both_splits_and_keeps_the_others_out() -> None:
    import pyarrow as pa

    from santa.data.operators import CodePairBuilder
    from santa.data.schema import RAW_SCHEMA

    lines = [
        dict(PYTHON_RECORD, url=f"https://x/{split}", partition=split)
        for split in ("train", "test", "valid")
    ]
    batch = pa.table(
        {
            "path": ["python/x.jsonl"] * 3,
            "line_number": [1, 2, 3],
            "raw": [json.dumps(line).encode() for line in lines],
            "split": ["", "", ""],
            "drop_reason": ["", "", ""],
        },
        schema=RAW_SCHEMA,
    )
    builder = CodePairBuilder(
        "codesearchnet", PairOptions(), ("train", "test"), ("valid",), (), "/"
    )
    rows = builder(batch).to_pylist()
    assert [row["drop_reason"] for row in rows][:2] == ["", ""]
    assert rows[2]["drop_reason"] != ""  # valid: held out (its keys only)
