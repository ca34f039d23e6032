"""Hard-negative mining: the sampling rules, the table format, and the corpus reader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from santa.negatives.corpus import load_mining_corpus
from santa.negatives.rules import FalseNegativeFilter, mine_hard_negatives, positive_scores
from santa.negatives.table import NegativesTable, read_negatives_table
from tests.training import mining_corpus, negatives_by_id, write_pairs


def test_positives_and_their_duplicates_never_come_back_as_negatives() -> None:
    hits = [["d1", "d2", "d3", "d4", "d5", "d6"], ["d4", "d1", "d2", "d6"]]
    positives = {"q1": {"d1", "d3"}, "q2": {"d4"}}
    duplicate_of = {"d5": "d3", "d3": "d3", "d6": "d6"}  # d5 has the same text as d3
    mined = mine_hard_negatives(
        ["q1", "q2"], hits, positives, n=10, duplicate_of=duplicate_of, seed=1
    )
    assert mined == {"q1": ["d2", "d4", "d6"], "q2": ["d1", "d2", "d6"]}


def test_duplicate_hits_are_kept_once_and_skip_top_drops_the_first_candidates() -> None:
    hits = [["p", "a", "a2", "b", "c", "d"]]
    duplicate_of = {"a2": "a"}
    mined = mine_hard_negatives(
        ["q"], hits, {"q": {"p"}}, n=10, skip_top=1, duplicate_of=duplicate_of
    )
    assert mined == {"q": ["b", "c", "d"]}  # 'a' skipped as the top candidate, 'a2' = 'a'


def test_sampling_is_seeded_order_independent_and_stays_in_the_window() -> None:
    hits = [[f"d{i}" for i in range(100)] for _ in range(3)]
    ids = ["q0", "q1", "q2"]
    first = mine_hard_negatives(ids, hits, {}, n=5, seed=7)
    again = mine_hard_negatives(list(reversed(ids)), list(reversed(hits)), {}, n=5, seed=7)
    other = mine_hard_negatives(ids, hits, {}, n=5, seed=8)
    assert first == again
    assert first != other
    for negatives in first.values():
        assert len(negatives) == len(set(negatives)) == 5
        ranks = [int(doc[1:]) for doc in negatives]
        assert ranks == sorted(ranks)  # kept in rank order


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="n and skip_top"):
        mine_hard_negatives(["q"], [["d"]], {}, n=-1)
    with pytest.raises(ValueError, match="1 query ids but 2 hit lists"):
        mine_hard_negatives(["q"], [["d"], ["e"]], {}, n=1)


def test_mining_from_an_exact_search_matches_brute_force_torch() -> None:
    from santa.index.faiss_index import EmbeddingIndex

    rng = np.random.default_rng(0)
    docs = rng.standard_normal((300, 16)).astype(np.float32)
    queries = rng.standard_normal((20, 16)).astype(np.float32)
    doc_ids = [f"d{i}" for i in range(len(docs))]
    index = EmbeddingIndex.build(docs, doc_ids, kind="flat")
    hits, _ = index.search(queries, 10)
    expected = torch.topk(torch.from_numpy(queries) @ torch.from_numpy(docs).T, 10).indices
    assert hits == [[doc_ids[j] for j in row] for row in expected.tolist()]
    positives = {f"q{i}": {hits[i][0], hits[i][3]} for i in range(20)}
    mined = mine_hard_negatives([f"q{i}" for i in range(20)], hits, positives, n=8)
    for query_id, negatives in mined.items():
        assert not positives[query_id] & set(negatives)
        assert len(negatives) == 8


@pytest.mark.parametrize("where", ["local", "s3"])
def test_table_round_trips_through_parquet(where, tmp_path, moto_s3) -> None:
    """By ids on disk, by numbers of the reader's corpus in memory."""
    corpus = mining_corpus(
        tmp_path, {"p1": "x", "p2": "y", "a": "a", "b": "b"}, {"q1": "q1", "q2": "q2"},
        {"q1": {"p1"}, "q2": {"p2"}},
    )  # fmt: skip
    numbers = dict(zip(corpus.doc_ids(range(4)), range(4), strict=True))
    negatives = np.array([[numbers["a"], numbers["b"]], [-1, -1]])
    table = NegativesTable(negatives, corpus.key, step=30, version=2, build_s=1.5)
    uri = str(tmp_path / "neg") if where == "local" else f"{moto_s3.create_bucket('neg')}/t"
    target = table.write_parquet(uri, corpus)
    assert target.endswith("negatives.parquet")
    back = read_negatives_table(uri, corpus)
    assert back.negatives.tolist() == negatives.tolist()
    assert negatives_by_id(back, corpus) == {"q1": ["a", "b"]}
    assert (back.step, back.version, back.build_s) == (30, 2, 1.5)
    assert back.built_at == pytest.approx(table.built_at)


def test_reading_a_missing_or_foreign_table_fails_clearly(tmp_path) -> None:
    from santa.negatives.table import write_id_table

    corpus = mining_corpus(tmp_path, {"p": "x", "a": "a"}, {"q": "q"}, {"q": {"p"}})
    with pytest.raises(FileNotFoundError, match="no hard-negatives table"):
        read_negatives_table(str(tmp_path / "nothing"), corpus)
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "foreign").mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign" / "negatives.parquet")
    with pytest.raises(ValueError, match="not a hard-negatives table"):
        read_negatives_table(str(tmp_path / "foreign"), corpus)
    # A document the corpus does not hold, and no text for it: named.
    write_id_table({"q": ["a", "ghost"]}, None, str(tmp_path / "ghost"))
    with pytest.raises(ValueError, match="names documents not in the corpus: 'ghost'"):
        read_negatives_table(str(tmp_path / "ghost"), corpus)
    # With its text (a user's own negatives): read, its text kept.
    write_id_table({"q": ["a", "ghost"]}, {"a": "a", "ghost": "boo"}, str(tmp_path / "own"))
    own = read_negatives_table(str(tmp_path / "own"), corpus)
    assert own.of(0)[0] == 1 and own.of(0)[1] == -2 and own.extra_texts == ["boo"]


def _row(**values):
    row = {
        "id": values["query_id"] + values["doc_id"],
        "dataset": "esci",
        "language": "us",
        "title": "",
        "label": 1,
        "entities": [],
        "masked_document": "",
        "mep_target": "",
        "num_tokens": 1,
        "num_masked_tokens": 0,
        "url": "",
        "drop_reason": "",
        "row_key": "",
        "dedup_key": "",
    }
    row.update(values)
    return row


def test_corpus_keeps_judged_products_and_trains_on_exact_only(tmp_path) -> None:
    rows = [
        _row(query_id="q1", query="red shoe", doc_id="p1", document="a red shoe", label=3),
        _row(query_id="q1", query="red shoe", doc_id="p2", document="a blue shoe", label=2),
        _row(query_id="q1", query="red shoe", doc_id="p3", document="shoe polish", label=1),
        _row(query_id="q1", query="red shoe", doc_id="p4", document="a lamp", label=0),
        _row(query_id="q2", query="lamp", doc_id="p4", document="a lamp", label=0),
        _row(query_id="q3", query="red", doc_id="p5", document="a red shoe", label=3),
    ]
    corpus = load_mining_corpus(write_pairs(tmp_path / "pairs", rows), str(tmp_path / "rows"))
    queries = range(corpus.num_queries)
    assert corpus.query_ids(queries) == ["q1", "q3"]  # q2 has no Exact product
    assert corpus.query_texts(queries) == ["red shoe", "red"]
    positives = [set(corpus.doc_ids(corpus.positives(q))) for q in queries]
    assert positives == [{"p1", "p2", "p3"}, {"p5"}]  # I is a negative
    assert corpus.doc_ids(range(corpus.num_docs)) == ["p1", "p2", "p3", "p4", "p5"]
    assert corpus.duplicate_of.tolist() == [0, 1, 2, 3, 0]  # p5: p1's description text
    # The training rows (the training row file's) name their queries and documents.
    assert corpus.query_of_training_row.tolist() == [0, 1]
    assert corpus.doc_of_training_row.tolist() == [0, 4]


def test_esci_judgments_are_embedded_as_title_and_text_like_evaluation(tmp_path) -> None:
    """Training, mining and evaluation embed an ESCI product the same way (title + text);
    code pairs (title = function name) and product pretraining pairs do not get the title."""
    from santa.data.beir import document_text
    from santa.data.kinds import CODE_PAIR, PRODUCT_JUDGMENT, PRODUCT_PRETRAIN, embedded_document
    from santa.data.schema import PAIR_SCHEMA, rows_to_table
    from santa.models.tokenizer import train_tokenizer
    from santa.train.data import tokenize_pairs

    lamp = embedded_document(PRODUCT_JUDGMENT, " Acme Lamp ", "a desk lamp")
    assert lamp == "Acme Lamp a desk lamp"
    assert embedded_document(PRODUCT_PRETRAIN, "Acme Lamp", "a desk lamp") == "a desk lamp"
    assert embedded_document(CODE_PAIR, "read_file", "def f(): pass") == "def f(): pass"
    assert document_text({"title": " Acme Lamp ", "text": "a desk lamp", "language": "us"}) == lamp

    rows = [
        _row(query_id="q1", query="lamp", doc_id="p1", title="Acme", document="a lamp", label=3),
        _row(
            query_id="q2",
            query="read",
            doc_id="c1",
            dataset="codesearchnet",
            language="python",
            title="read_file",
            document="def f(): pass",
        ),
    ]
    corpus = load_mining_corpus(write_pairs(tmp_path / "pairs", rows), str(tmp_path / "rows"))
    assert corpus.doc_texts([0, 1]) == ["Acme a lamp", "def f(): pass"]

    tokenizer = train_tokenizer(["Acme a lamp def f(): pass read_file lamp read"] * 20, 400)
    tokenizer.save_pretrained(tmp_path / "tok")
    out = tokenize_pairs(
        rows_to_table(rows).select(PAIR_SCHEMA.names),
        tokenizer_path=str(tmp_path / "tok"),
        max_query_length=8,
        max_document_length=16,
        max_target_length=8,
        with_mep=False,
        with_document=True,
    )
    decoded = tokenizer.batch_decode(out["document_input_ids"], skip_special_tokens=True)
    assert [text.strip() for text in decoded] == ["Acme a lamp", "def f(): pass"]


# --------------------------------------------------------------------- false negatives


def test_a_planted_near_duplicate_of_the_positive_is_removed_counted_and_the_rest_kept(
    tmp_path,
) -> None:
    """Among q's top hits: a copy of its positive with other whitespace and case (same
    text once normalized), and a near-duplicate whose score is within 5 % of the
    positive's. Both go, counted by reason; the other hits stay, in rank order."""
    code = "def read_config(path):\n    with open(path) as handle:\n        return load(handle)"
    rows = [
        _row(query_id="q", query="read config", doc_id="pos", document=code),
        _row(query_id="o1", query="x", doc_id="copy", document=code.upper().replace("    ", "\t")),
        _row(query_id="o2", query="x", doc_id="near", document=code.replace("load", "loads")),
        *(
            _row(query_id=f"o{i}", query="x", doc_id=f"d{i}", document=f"def f{i}(): pass")
            for i in range(3, 9)
        ),
    ]
    corpus = load_mining_corpus(write_pairs(tmp_path / "pairs", rows), str(tmp_path / "rows"))
    names = dict(zip(corpus.doc_ids(range(corpus.num_docs)), range(corpus.num_docs), strict=True))
    assert corpus.duplicate_of[names["copy"]] == names["pos"]
    hits = [[names[d] for d in ("pos", "copy", "near", "d3", "d4", "d5", "d6", "d7", "d8")]]
    positives = {"q": {names["pos"]}}
    scores = [[10.0, 9.9, 9.8, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0]]
    filtered: dict[str, int] = {}
    mined = mine_hard_negatives(
        ["q"],
        hits,
        positives,
        n=20,
        duplicate_of=corpus.duplicate_of,
        hit_scores=scores,
        positive_scores={"q": 10.0},
        score_filter=FalseNegativeFilter(max_score_ratio=0.95),
        filtered=filtered,
    )
    assert corpus.doc_ids(mined["q"]) == ["d3", "d4", "d5", "d6", "d7", "d8"]
    assert filtered == {
        "positive": 1,
        "same_text": 1,
        "duplicate_hit": 0,
        "score_ratio": 1,
        "score_margin": 0,
    }
    # Without the score filter the near-duplicate is a negative; the normalized copy never.
    plain = mine_hard_negatives(["q"], hits, positives, n=20, duplicate_of=corpus.duplicate_of)
    assert corpus.doc_ids(plain["q"]) == ["near", "d3", "d4", "d5", "d6", "d7", "d8"]


def test_margin_filter_and_negative_positive_scores() -> None:
    margin = FalseNegativeFilter(min_margin=1.5)
    assert margin.reason(8.6, 10.0) == "score_margin"
    assert margin.reason(8.5, 10.0) is None
    ratio = FalseNegativeFilter(max_score_ratio=0.9)
    assert ratio.reason(9.1, 10.0) == "score_ratio" and ratio.reason(8.9, 10.0) is None
    # A negative positive score: the threshold stays below the positive, 10 % of |p| away.
    # (ratio · p = -9 would drop hits scoring below the positive and keep those above it).
    assert ratio.reason(-10.5, -10.0) == "score_ratio"
    assert ratio.reason(-11.5, -10.0) is None
    assert ratio.reason(-9.0, -10.0) == "score_ratio"
    assert not FalseNegativeFilter().active
    with pytest.raises(ValueError, match="hit_scores and positive_scores"):
        mine_hard_negatives(["q"], [["d"]], {}, n=1, score_filter=ratio)


def test_positive_scores_take_the_best_positive() -> None:
    queries = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=np.float32)
    docs = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]], dtype=np.float32)
    rows = {"a": 0, "b": 1, "c": 2}
    positives = {"q0": {"a", "b"}, "q1": {"c", "missing"}, "q2": {"missing"}}
    scores = positive_scores(["q0", "q1", "q2"], queries, positives, rows, docs, block=1)
    assert scores == {"q0": 2.0, "q1": 1.0}


def test_the_mined_table_counts_what_was_filtered(tmp_path, caplog) -> None:
    """refresh_table with the ratio filter on: counts in the table, its Parquet metadata
    and the trainers' metrics; with a trained-looking model a near copy is filtered."""
    from santa.negatives.client import NegativesClient
    from santa.negatives.miner import refresh_table

    corpus = mining_corpus(
        tmp_path,
        {"p": "positive", "n": "near copy", "f1": "far one", "f2": "far two"},
        {"q": "query"},
        {"q": {"p"}},
    )
    vectors = {
        "query": [1.0, 0.0],
        "positive": [1.0, 0.1],
        "near copy": [0.98, 0.2],
        "far one": [0.5, 1.0],
        "far two": [0.1, 1.0],
    }

    class Encoder:  # stands in for the encoder pool: fixed embeddings per text
        def encode(self, jobs):
            return [np.array([vectors[t] for t in texts], dtype=np.float32) for texts, _ in jobs]

    from santa.config import SantaConfig

    config = SantaConfig().with_overrides(
        ["negatives.per_query=3", "negatives.top_k=4", "negatives.max_score_ratio=0.95"]
    )
    with caplog.at_level("WARNING", logger="santa.negatives.miner"):
        table = refresh_table(None, corpus, config, encoder=Encoder())
    assert negatives_by_id(table, corpus) == {"q": ["f1", "f2"]}
    # Most queries short of negatives (here the one): said, since trainers fill them.
    assert "left 1 of 1 queries with fewer than 3" in caplog.text
    assert table.filtered["score_ratio"] == 1 and table.filtered["positive"] == 1
    back = read_negatives_table(table.write_parquet(str(tmp_path / "t"), corpus), corpus)
    assert back.filtered == table.filtered
    unfiltered = refresh_table(
        None,
        corpus,
        config.with_overrides(["negatives.max_score_ratio=none"]),
        encoder=Encoder(),
    )
    assert negatives_by_id(unfiltered, corpus) == {"q": ["n", "f1", "f2"]}
    assert unfiltered.filtered["score_ratio"] == 0
    client = NegativesClient(
        f"table:{tmp_path / 't'}",
        data_uri=str(tmp_path / "pairs"),
        n=3,
        seed=0,
        rank=0,
        world_size=1,
        row_cache=str(tmp_path / "rows"),
    )
    metrics = client.metrics(5, client.tables[0])
    assert metrics["negatives_filtered_score_ratio"] == 1.0
    assert metrics["negatives_filtered_positive"] == 1.0


def test_a_cosine_model_mines_by_cosine_like_evaluation(tmp_path) -> None:
    """Vectors are normalized before the inner-product index when the model's similarity
    is cosine (evaluation does the same), so a long vector does not win by its norm."""
    from santa.config import SantaConfig
    from santa.negatives.miner import refresh_table

    vectors = {"q": [1.0, 0.0], "pos": [0.0, 1.0], "long": [3.0, 3.0], "aligned": [1.0, 0.05]}
    names = ("pos", "long", "aligned")
    corpus = mining_corpus(tmp_path, {n: n for n in names}, {"q": "q"}, {"q": {"pos"}})

    class Encoder:
        def encode(self, jobs):
            return [np.array([vectors[t] for t in texts], dtype=np.float32) for texts, _ in jobs]

    common = ["negatives.per_query=2", "negatives.top_k=2"]
    for similarity, expected in (("dot", ["long", "aligned"]), ("cosine", ["aligned", "long"])):
        config = SantaConfig().with_overrides([*common, f"model.similarity={similarity}"])
        table = refresh_table(None, corpus, config, encoder=Encoder())
        assert negatives_by_id(table, corpus) == {"q": expected}, similarity  # rank order


def test_a_table_keeps_the_pool_and_training_samples_per_query_from_it(tmp_path) -> None:
    """negatives.pool (SCodeR's mined pool) is what a table keeps per query; per_query is
    what a training step takes; SCodeR's old scoder.negatives_* keys move here."""
    from santa.config import SantaConfig
    from santa.config.recipes import get_recipe
    from santa.negatives.miner import refresh_table

    documents = {f"d{i}": f"d{i}" for i in range(8)}
    corpus = mining_corpus(tmp_path, documents, {"q": "q"}, {"q": {"d0"}})
    vectors = {"q": [1.0, 0.0], **{f"d{i}": [1.0 - i / 10, i / 10] for i in range(8)}}

    class Encoder:
        def encode(self, jobs):
            return [np.array([vectors[t] for t in texts], dtype=np.float32) for texts, _ in jobs]

    common = ["negatives.per_query=2", "negatives.top_k=6"]
    pooled = SantaConfig().with_overrides([*common, "negatives.pool=5"])
    assert pooled.negatives.mined_per_query == 5
    assert len(refresh_table(None, corpus, pooled, encoder=Encoder()).of(0)) == 5
    plain = SantaConfig().with_overrides(common)
    assert len(refresh_table(None, corpus, plain, encoder=Encoder()).of(0)) == 2
    with pytest.raises(ValueError, match="pool=7 must be at least per_query=2 and at most"):
        SantaConfig().with_overrides([*common, "negatives.pool=7"])
    # SCodeR's recipes hold their negatives in the negatives section; old keys move there.
    tiny = get_recipe("tiny-scoder")
    assert (tiny.negatives.per_query, tiny.negatives.pool, tiny.negatives.top_k) == (3, 8, 20)
    stored = tiny.to_dict()
    stored["scoder"].update(negatives_per_query=4, negatives_pool=9, negatives_top_k=30)
    for key in ("per_query", "pool", "top_k"):
        stored["negatives"].pop(key)
    moved = SantaConfig.from_dict(stored).negatives
    assert (moved.per_query, moved.pool, moved.top_k) == (4, 9, 30)
    with pytest.raises(ValueError, match=r"scoder.negatives_top_k is now negatives.top_k"):
        tiny.with_overrides(["scoder.negatives_top_k=50"])


@pytest.mark.parametrize("ratio, kept", [("none", False), ("0.95", True)])
def test_refresh_keeps_the_document_vectors_only_for_the_score_filter(tmp_path, ratio, kept):
    """The index holds its own copy of the documents' vectors: while the queries are mined,
    the encoded array is held only when the false-negative filter needs positives' scores."""
    import tracemalloc

    from santa.config import SantaConfig
    from santa.negatives.miner import refresh_table

    count, dim = 300, 4096
    documents = {f"d{i}": f"document {i}" for i in range(count)}
    queries = {f"q{i}": f"query {i}" for i in range(count)}
    corpus = mining_corpus(tmp_path, documents, queries, {f"q{i}": {f"d{i}"} for i in range(count)})
    traced: list[int] = []

    class Encoder:  # seeded vectors per text; notes the memory held when queries are encoded
        def encode(self, jobs):
            traced.append(tracemalloc.get_traced_memory()[0])
            return [
                np.stack(
                    [np.random.default_rng([len(t), int(t.split()[-1])]).random(dim) for t in texts]
                ).astype(np.float32)
                for texts, _ in jobs
            ]

    config = SantaConfig().with_overrides(
        ["negatives.per_query=1", "negatives.top_k=5", f"negatives.max_score_ratio={ratio}"]
    )
    tracemalloc.start()
    try:
        table = refresh_table(None, corpus, config, encoder=Encoder())
    finally:
        tracemalloc.stop()
    documents_at, queries_at = traced  # one block of documents, then one of queries
    assert table.negatives.shape == (count, 1)
    held = queries_at - documents_at  # what the documents' encoding left behind
    assert (held >= count * dim * 4) is kept, held
