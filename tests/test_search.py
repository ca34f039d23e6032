"""Index → search: corpus readers, the Ray index job (shards, resume, S3) and the searcher,
whose ranks must be the evaluator's for the same model and queries."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from santa.config.recipes import get_recipe
from santa.data.beir import load_beir
from santa.eval import EvalConfig, evaluate
from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from santa.search.corpus import detect_format, read_corpus
from santa.search.indexing import IndexConfig, build_index
from santa.search.searcher import Searcher, first_line, format_hits
from santa.search.shards import EMBEDDINGS_DIR, shard_name
from tests.datagen import stdlib_python_records, write_csn_layout
from tests.training import stdlib_pair_rows, write_beir, write_pairs

# ============================================================================ fixtures


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A tiny T5 saved as a santa checkpoint (``model/`` with santa_config.json)."""
    records = stdlib_python_records()
    tokenizer = train_tokenizer(
        [r["code"] for r in records] + [r["docstring"] for r in records], vocab_size=1000
    )
    model = DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0)
    root = tmp_path_factory.mktemp("checkpoint")
    model.save_pretrained(str(root / "model"), santa_config=get_recipe("tiny"))
    return str(root)


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> str:
    """A BEIR folder of 105 standard-library functions and their docstrings."""
    return write_beir(tmp_path_factory.mktemp("beir"), stdlib_pair_rows())


@pytest.fixture(scope="module")
def built(checkpoint, beir, tmp_path_factory, ray_cluster) -> dict:
    """The BEIR corpus indexed on two encoder actors, 4 shards of 30 (the other indexes of
    these tests, small, are encoded in the driver); ``printed``: what the build printed,
    a progress line each time the actors' count is read."""
    import contextlib
    import io

    output = tmp_path_factory.mktemp("indexes") / "stdlib"
    config = IndexConfig(
        checkpoint=checkpoint, corpus=beir, output=str(output), shard_size=30, num_actors=2
    )
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setenv("SANTA_PROGRESS_EVERY_S", "0")
        manifest = build_index(config)
    return {
        "config": config,
        "manifest": manifest,
        "output": str(output),
        "printed": printed.getvalue(),
    }


def _trec(path: Path) -> dict[str, list[str]]:
    ranking: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        qid, _, doc, _rank, _score, _tag = line.split()
        ranking.setdefault(qid, []).append(doc)
    return ranking


# ============================================================================ corpus readers


def test_jsonl_corpus_skips_bad_rows_by_reason(tmp_path):
    lines = [
        json.dumps({"id": "a", "text": "first\nsecond line", "title": "A"}),
        "{not json",
        json.dumps({"id": "b", "text": "   "}),
        json.dumps({"text": "no id"}),
        json.dumps({"id": "a", "text": "again"}),
        json.dumps(["a list"]),
        json.dumps({"id": 7, "text": "numeric ids become strings"}),
    ]
    # Told apart by its rows, not its name (a file may be called corpus.jsonl).
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    corpus = read_corpus(str(tmp_path / "corpus.jsonl"))
    assert corpus.format == "jsonl"
    assert corpus.ids == ["a", "7"]
    assert corpus.table.column("title").to_pylist() == ["A", ""]
    assert dict(corpus.skipped) == {
        "malformed_json": 2,
        "empty_text": 1,
        "missing_field": 1,
        "duplicate_id": 1,
    }


def test_formats_are_told_apart_and_read_as_the_evaluator_and_trainer_embed(tmp_path, beir):
    rows = stdlib_pair_rows()[:12]
    # BEIR folder and its corpus.jsonl: the evaluator's document texts, in file order.
    data = load_beir(beir)
    assert detect_format(beir) == "beir"
    folder = read_corpus(beir)
    assert folder.ids == data.doc_ids
    assert folder.table.column("text").to_pylist() == data.document_texts()
    single = read_corpus(os.path.join(beir, "corpus.jsonl"))
    assert single.format == "beir-corpus" and single.ids == data.doc_ids
    # Preprocessed pairs: each doc_id once (two pairs sharing a document are one document).
    pairs = write_pairs(tmp_path / "pairs", rows + [dict(rows[0], id="again", query="other")])
    corpus = read_corpus(pairs)
    assert corpus.format == "pairs"
    assert corpus.ids == [row["doc_id"] for row in rows] and not corpus.skipped
    # CodeSearchNet: ids are urls, the text the code without its docstring.
    csn = tmp_path / "csn"
    urls = write_csn_layout(csn, languages=("python",))
    corpus = read_corpus(str(csn))
    assert corpus.format == "codesearchnet"
    assert set(corpus.ids) == set().union(*urls.values())
    source = {r["url"]: r for r in stdlib_python_records(limit=120)}
    for row in corpus.table.slice(0, 5).to_pylist():
        docstring = source[row["id"]]["docstring"].strip().splitlines()[0]
        assert docstring not in row["text"] and row["title"] == source[row["id"]]["func_name"]
    # gzip jsonl of {id, text}
    with gzip.open(tmp_path / "plain.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"id": "x", "text": "y"}) + "\n")
    assert read_corpus(str(tmp_path / "plain.jsonl.gz")).ids == ["x"]


def test_unknown_layout_and_empty_corpus_are_clear_errors(tmp_path):
    (tmp_path / "odd.jsonl").write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(ValueError, match="cannot tell the corpus format"):
        read_corpus(str(tmp_path / "odd.jsonl"))
    (tmp_path / "empty.jsonl").write_text(json.dumps({"id": "a", "text": ""}) + "\n")
    with pytest.raises(ValueError, match="no document to index.*empty_text: 1"):
        read_corpus(str(tmp_path / "empty.jsonl"))


def test_first_line_and_table():
    assert first_line("\n\n  def f(x):\n    return x\n") == "def f(x):"
    assert first_line("a" * 200, 10) == "a" * 9 + "…"
    from santa.search.searcher import Hit

    table = format_hits("q", [Hit(1, 0.5, "doc-1", "", "def f():\n  pass")])
    assert table.splitlines()[1].split() == ["rank", "score", "id", "text"]
    assert table.splitlines()[2].split() == ["1", "0.5000", "doc-1", "def", "f():"]


def test_the_page_marks_the_querys_words_as_words_and_labels_the_score():
    """A query's words are marked where they stand as words (``read_file`` marks ``file``;
    ``bits`` does not mark ``its``, nor ``SameFileError`` ``file``), stop words not at all,
    and each hit's score says what it is (the model's similarity)."""
    from santa.search.page import highlight, render_page

    text = "def bits(x): raise SameFileError  # read_file with its file"
    marked = highlight(text, "read a file with its bits")
    assert marked == (
        "def <mark>bits</mark>(x): raise SameFileError  # <mark>read</mark>_<mark>file</mark>"
        " with its <mark>file</mark>"
    )
    assert highlight("x = open(PATH)", "Open a path") == "x = <mark>open</mark>(<mark>PATH</mark>)"
    assert highlight("a < b", "with the") == "a &lt; b"  # only stop words: nothing marked

    hit = {"rank": 1, "score": 0.61234, "id": "m.py#L1-L2", "title": "f", "text": "def f(): ..."}
    page = render_page({"similarity": "cosine", "count": 1}, query="f", hits=[hit])
    assert '<span class="score" title="cosine similarity to the query">cosine 0.6123</span>' in page


def test_long_ids_keep_their_line_ranges():
    """Two functions of one file: their ids differ only at the end, which the table keeps
    (cut at the end, both read ``.../configdialog.py#L1…``)."""
    from santa.search.searcher import Hit

    root = "/usr/lib/python3.11/idlelib/configdialog.py"
    hits = [Hit(1, 0.61, f"{root}#L120-L135", "", "x"), Hit(2, 0.6, f"{root}#L140-L152", "", "y")]
    shown = [line.split()[2] for line in format_hits("q", hits).splitlines()[2:]]
    assert shown[0] != shown[1]
    assert shown[0].endswith("configdialog.py#L120-L135") and shown[0].startswith("…")
    assert shown[1].endswith("configdialog.py#L140-L152")


# ============================================================================ index → search


def test_search_ranks_equal_the_evaluators(built, checkpoint, beir, tmp_path, capsys):
    import re

    manifest = built["manifest"]
    assert manifest["count"] == 105 and manifest["dimension"] == 128
    assert manifest["similarity"] == "cosine" and manifest["pooling"] == "decoder-0"
    assert manifest["shards"] == {"count": 4, "size": 30, "encoded": 4, "reused": 0}
    assert manifest["checkpoint"] == checkpoint and manifest["model"].endswith("model")
    assert manifest["index"]["kind"] == "flat" and manifest["actors"] == 2
    # The actors count each batch into the driver's progress lines as they go.
    encoded = [
        line
        for line in built["printed"].splitlines()
        if line.startswith("[index] documents encoded")
    ]
    assert re.fullmatch(r"\[index\] documents encoded: 105 documents in \d+ s.*", encoded[-1])
    assert all(
        re.fullmatch(r"\[index\] documents encoded: \d+/105 documents \(\d+%\), .*", line)
        for line in encoded[:-1]
    ), encoded
    output = Path(built["output"])
    shards = sorted((output / EMBEDDINGS_DIR).glob("*.parquet"))
    assert [p.name for p in shards] == [shard_name(i) for i in range(4)]

    evaluate(checkpoint, beir, EvalConfig(output=str(tmp_path / "eval"), baseline=None))
    expected = _trec(tmp_path / "eval" / "run.model.trec")
    data = load_beir(beir)
    query_ids = list(data.queries)
    searcher = Searcher.open(built["output"])
    results = searcher.search([data.queries[q] for q in query_ids], 100)
    for qid, hits in zip(query_ids, results, strict=True):
        assert [hit.id for hit in hits] == expected[qid][: len(hits)], qid
        assert [hit.rank for hit in hits] == list(range(1, len(hits) + 1))

    # The command line gives the same hits.
    from ray_jobs import search

    chosen = query_ids[:3]
    argv = ["--index", built["output"], "-k", "5", "--json"] + [data.queries[q] for q in chosen]
    assert search.main(argv) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [[hit["id"] for hit in line["hits"]] for line in printed] == [
        expected[q][:5] for q in chosen
    ]
    assert search.main(["--index", built["output"], "-k", "2", data.queries[chosen[0]]]) == 0
    table = capsys.readouterr().out
    assert "   1  " in table and expected[chosen[0]][0] in table


def test_several_queries_in_one_start_with_start_up_and_search_timed_apart(
    built, beir, monkeypatch, capsys
):
    """One start answers many queries: from a file, from standard input, or typed at a
    prompt one after the other; stderr says the start-up (index and model loaded) apart
    from the time spent searching (a single search was 9-15 s, most of it start-up)."""
    import io
    import re

    from ray_jobs import search

    data = load_beir(beir)
    queries = [data.queries[q] for q in list(data.queries)[:3]]
    listed = Path(built["output"]).parent / "queries.txt"
    listed.write_text("\n".join(queries) + "\n")
    assert search.main(["--index", built["output"], "-k", "2", "--queries", str(listed)]) == 0
    out, err = capsys.readouterr()
    assert out.count("query: ") == 3
    # In-process, beside the suite's session Ray, a raylet warning may reach stderr too.
    ready, searched = [line for line in err.splitlines() if line.startswith("[search]")]
    assert re.fullmatch(
        r"\[search\] ready in \d+\.\d s \(index of 105 documents and its model loaded\)", ready
    )
    assert re.fullmatch(r"\[search\] 3 queries searched in \d+\.\d\d s \(\d+ ms each\)", searched)

    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(queries[:2]) + "\n"))
    assert search.main(["--index", built["output"], "-k", "1", "--json"]) == 0  # a pipe
    out, err = capsys.readouterr()
    assert [json.loads(line)["query"] for line in out.splitlines()] == queries[:2]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal("\n".join(queries[:2]) + "\n\n"))
    assert search.main(["--index", built["output"], "-k", "1"]) == 0  # a prompt
    out, err = capsys.readouterr()
    assert out.count(search.PROMPT) == 3 and out.count("query: ") == 2
    lines = [line for line in err.splitlines() if line.startswith("[search]")]
    assert lines[0].endswith(" loaded); one query a line, an empty line to end")
    assert [re.fullmatch(r"\[search\] \d+ ms", line) is not None for line in lines[1:3]] == [
        True,
        True,
    ]
    assert re.fullmatch(r"\[search\] 2 queries searched in .*", lines[3])


def test_an_index_at_a_truncated_dimension_finds_the_brute_force_top_1(
    built, checkpoint, beir, tmp_path
):
    """``--dim 16``: the index job keeps the first 16 dimensions (shards and index a
    eighth the size), the searcher opens a whole index at 16 too, and both return, for
    every query, the top 1 of brute force over the truncated vectors; the evaluator's
    ``--dim`` ranks the same."""
    from santa.eval.retrieval import prepare_embeddings
    from santa.models.checkpoints import load
    from santa.models.encoding import encode_texts
    from santa.search.shards import read_embeddings

    dim = 16
    config = IndexConfig(
        checkpoint=checkpoint,
        corpus=beir,
        output=str(tmp_path / "cut"),
        shard_size=105,
        dim=dim,
    )
    manifest = build_index(config)
    assert manifest["dimension"] == dim and manifest["model_dimension"] == 128
    assert manifest["actors"] == 0  # 105 documents on CPU: encoded in the driver
    full_size = (Path(built["output"]) / "index.faiss").stat().st_size
    assert (tmp_path / "cut" / "index.faiss").stat().st_size < full_size / 6

    data = load_beir(beir)
    query_ids = list(data.queries)
    queries = [data.queries[q] for q in query_ids]
    doc_ids, doc_vectors = read_embeddings(built["output"], 4)  # (105, 128), whole
    length = manifest["max_query_length"]
    query_vectors = encode_texts(load(checkpoint), queries, max_length=length, role="query")
    scores = (
        prepare_embeddings(query_vectors[:, :dim], "cosine")
        @ prepare_embeddings(np.ascontiguousarray(doc_vectors[:, :dim]), "cosine").T
    )  # (queries, documents)
    expected = [doc_ids[i] for i in scores.argmax(axis=1)]
    for searcher in (Searcher.open(config.output), Searcher.open(built["output"], dim=dim)):
        assert searcher.index.dim == dim
        assert [hits[0].id for hits in searcher.search(queries, 1)] == expected
    evaluate(checkpoint, beir, EvalConfig(output=str(tmp_path / "eval"), baseline=None, dim=dim))
    ranked = _trec(tmp_path / "eval" / "run.model.trec")
    assert [ranked[q][0] for q in query_ids] == expected
    with pytest.raises(ValueError, match="--dim 200: the index at .* holds 128 dimensions"):
        Searcher.open(built["output"], dim=200)


def test_rerun_of_a_published_index_is_up_to_date(built):
    again = build_index(built["config"])
    assert again["up_to_date"] is True
    assert again["manifest"]["run_id"] == built["manifest"]["manifest"]["run_id"]


def test_resume_encodes_only_the_missing_shard(built, tmp_path):
    """A run that died after three of four shards: its work folder is picked up again, the
    missing shard encoded in the driver (30 documents) as the actors encoded the others."""
    key = built["manifest"]["config"]["fingerprint"]
    output = tmp_path / "resumed"
    work = Path(f"{output}.partial-{key}")
    shutil.copytree(built["output"], work)
    (work / "report.json").unlink()
    (work / "index.faiss").unlink()
    (work / EMBEDDINGS_DIR / shard_name(2)).unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in (work / EMBEDDINGS_DIR).iterdir()}
    config = IndexConfig(
        checkpoint=built["config"].checkpoint,
        corpus=built["config"].corpus,
        output=str(output),
        shard_size=30,
    )
    manifest = build_index(config)
    assert manifest["shards"] == {"count": 4, "size": 30, "encoded": 1, "reused": 3}
    assert manifest["actors"] == 0
    assert manifest["throughput"]["documents_encoded"] == 30
    assert not work.exists()  # published: renamed into place
    for name, mtime in kept.items():
        assert (output / EMBEDDINGS_DIR / name).stat().st_mtime_ns == mtime, name
    ids_a, emb_a = _embeddings(Path(built["output"]))
    ids_b, emb_b = _embeddings(output)
    assert ids_a == ids_b
    np.testing.assert_allclose(emb_a, emb_b, atol=1e-5)


def _embeddings(root: Path) -> tuple[list[str], np.ndarray]:
    from santa.search.shards import read_embeddings

    return read_embeddings(str(root), 4)


def test_index_and_search_on_s3(built, moto_s3, tmp_path):
    bucket = moto_s3.create_bucket("santa-index")
    rows = stdlib_pair_rows()[:40]
    lines = "".join(
        json.dumps({"id": f"fn-{i}", "text": row["document"]}) + "\n" for i, row in enumerate(rows)
    )
    from santa.files import storage

    storage.write_bytes(f"{bucket}/corpus/docs.jsonl", lines.encode())
    config = IndexConfig(
        checkpoint=built["config"].checkpoint,
        corpus=f"{bucket}/corpus",
        output=f"{bucket}/indexes/fns",
        shard_size=16,
    )
    manifest = build_index(config)
    assert manifest["count"] == 40 and manifest["shards"]["count"] == 3
    assert manifest["actors"] == 0  # the driver wrote the shards to S3
    assert manifest["manifest"]["prefix"].startswith("runs/work-")
    searcher = Searcher.open(f"{bucket}/indexes/fns")
    hits = searcher.search([rows[3]["query"]], 40)[0]
    assert len(hits) == 40 and {hit.id for hit in hits} == {f"fn-{i}" for i in range(40)}
    assert searcher.describe()["count"] == 40


# ============================================================================ Ray Serve


def _request(url: str, body: bytes | None = None, method: str | None = None):
    """(status, JSON payload) of one HTTP request on loopback."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _post(url: str, payload) -> tuple[int, dict]:
    return _request(url, json.dumps(payload).encode(), "POST")


@pytest.fixture(scope="module")
def served(built, ray_cluster):
    """``ray_jobs.serve`` deployed on the cluster (batches of up to 8, waiting 50 ms);
    removed cleanly at the end, which the teardown checks."""
    import threading
    import time
    import urllib.error

    from ray import serve

    from ray_jobs import serve as serve_job
    from tests.conftest import free_port

    port = free_port()
    args = serve_job.parse_args(
        ["--index", built["output"], "--port", str(port), "--cpus-per-replica", "0.25"]
        + ["--name", "search-test", "-k", "3", "--max-batch-size", "8", "--batch-wait-ms", "50"]
    )
    stop = threading.Event()
    result: dict = {}
    server = threading.Thread(target=lambda: result.update(code=serve_job.run(args, stop)))
    server.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                status, health = _request(base + "/healthz")
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                pass
            assert time.time() < deadline and server.is_alive(), "Serve did not come up"
            time.sleep(0.25)
        searcher = Searcher.open(built["output"])
        queries = list(load_beir(built["config"].corpus).queries.values())
        yield {"base": base, "health": health, "searcher": searcher, "queries": queries}
    finally:
        stop.set()
        server.join(timeout=120)
    assert result.get("code") == 0 and not server.is_alive()
    assert "search-test" not in serve.status().applications
    serve.shutdown()
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _request(base + "/healthz")


def test_serve_over_http_matches_the_cli_and_survives_bad_requests(served):
    """Real HTTP on loopback: hits equal the searcher's, 4xx for bad requests with the
    replica still answering, two concurrent clients."""
    from concurrent.futures import ThreadPoolExecutor

    base, health = served["base"], served["health"]
    assert health["status"] == "ok" and health["count"] == 105
    assert health["similarity"] == "cosine"
    queries = served["queries"][:8]
    expected = [[hit.id for hit in hits] for hits in served["searcher"].search(queries, 5)]

    status, body = _post(base + "/search", {"query": queries[0], "k": 5})
    assert status == 200 and [hit["id"] for hit in body["hits"]] == expected[0]
    assert body["hits"][0]["rank"] == 1 and body["hits"][0]["text"]
    status, body = _post(base + "/search", {"query": queries[1]})
    assert status == 200 and len(body["hits"]) == 3  # the server's -k
    status, body = _post(base + "/search", {"queries": queries[:2], "k": 5})
    assert [[h["id"] for h in r["hits"]] for r in body["results"]] == expected[:2]

    bad = [
        (b"{not json", 400, "not JSON"),
        (json.dumps({"k": 5}).encode(), 400, "query"),
        (json.dumps({"query": "x", "k": 0}).encode(), 400, "k must be"),
        (json.dumps({"query": "   "}).encode(), 400, "non-empty"),
        (json.dumps({"query": "x", "top": 3}).encode(), 400, "unknown field"),
        (json.dumps(["x"]).encode(), 400, "JSON object"),
    ]
    for payload, code, message in bad:
        status, body = _request(base + "/search", payload, "POST")
        assert status == code and message in body["error"], (payload, body)
    assert _request(base + "/search")[0] == 405
    assert _request(base + "/nowhere")[0] == 404
    assert _request(base + "/healthz")[0] == 200  # the replica is still up

    def client(offset: int) -> list[list[str]]:
        answers = []
        for query in queries[offset::2]:
            status, body = _post(base + "/search", {"query": query, "k": 5})
            assert status == 200
            answers.append([hit["id"] for hit in body["hits"]])
        return answers

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(client, (0, 1))
    assert first == expected[0::2] and second == expected[1::2]


def test_serve_batches_concurrent_clients_and_refuses_large_bodies(served):
    """20 concurrent clients: every answer 200 and right, and the replica searched several
    requests at once; a body over 64 KB is a 413, a long query is not echoed whole."""
    from concurrent.futures import ThreadPoolExecutor

    base, searcher = served["base"], served["searcher"]
    queries = served["queries"][:20]
    expected = {
        q: [h.id for h in hits]
        for q, hits in zip(queries, searcher.search(queries, 3), strict=True)
    }

    def before() -> int:
        return _request(base + "/healthz")[1]["batches"]["requests"]

    seen = before()
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda q: (q, _post(base + "/search", {"query": q})), queries * 2))
    assert all(status == 200 for _, (status, _) in answers)
    assert all([h["id"] for h in body["hits"]] == expected[q] for q, (_, body) in answers)
    batches = _request(base + "/healthz")[1]["batches"]
    assert batches["requests"] - seen == 40
    assert batches["largest"] > 1, batches  # requests were searched together

    status, body = _post(base + "/search", {"query": "x" * (70 * 1024)})
    assert status == 413 and "over the limit of 65,536" in body["error"]
    long_query = "parse the file " * 400  # 6,000 characters: under the limit
    status, body = _post(base + "/search", {"query": long_query, "k": 2})
    assert status == 200 and len(body["hits"]) == 2
    assert len(body["query"]) <= 201 and body["query"].endswith("…")


def test_search_page_renders_the_same_hits(served):
    """GET / is a self-contained page (no external assets); GET /?q= lists the searcher's
    hits with the query's words marked."""
    import html
    import re
    import urllib.parse
    import urllib.request

    base, searcher = served["base"], served["searcher"]
    with urllib.request.urlopen(base + "/", timeout=60) as response:
        assert response.headers["content-type"].startswith("text/html")
        page = response.read().decode()
    assert '<form method="get"' in page and 'name="q"' in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing from elsewhere
    query = served["queries"][3]
    expected = [h.id for h in searcher.search([query], 5)[0]]
    url = f"{base}/?" + urllib.parse.urlencode({"q": query, "k": 5})
    with urllib.request.urlopen(url, timeout=60) as response:
        page = response.read().decode()
    assert [html.unescape(i) for i in re.findall(r'data-id="([^"]*)"', page)] == expected
    assert "<mark>" in page and 'id="took"' in page


def test_search_page_in_a_real_browser(served, built, capsys):
    """Chromium types a query into the page and reads the hits: the top hit is the one
    ``ray_jobs.search`` prints."""
    import shutil

    selenium = pytest.importorskip("selenium", reason="selenium is not installed")
    browser = shutil.which("chromium") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if not (browser and driver_path):
        # A real browser is a system package, not a Python one: .ci/run installs it where
        # it can (root and apt); elsewhere the page is still checked over HTTP above.
        pytest.skip("no Chromium and chromedriver on PATH (Debian: apt install chromium-driver)")
    from selenium.webdriver import Chrome, ChromeOptions
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from ray_jobs import search as search_job

    assert selenium
    options = ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    query = served["queries"][5]
    driver = Chrome(options=options, service=Service(driver_path))
    try:
        driver.get(served["base"] + "/")
        box = driver.find_element(By.ID, "q")
        box.clear()
        box.send_keys(query)
        driver.find_element(By.ID, "go").click()
        WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "li.hit"))
        ids = [e.get_attribute("data-id") for e in driver.find_elements(By.CSS_SELECTOR, "li.hit")]
        took = driver.find_element(By.ID, "took").text
    finally:
        driver.quit()
    assert search_job.main(["--index", built["output"], "-k", "3", "--json", query]) == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert ids == [hit["id"] for hit in printed["hits"]] and "ms" in took


# ============================================================================ the demo's step


def test_pipeline_step_indexes_the_heldout_set_and_shows_examples(
    built, beir, tmp_path, tmp_path_factory, capsys, monkeypatch
):
    import re

    from santa.search.demo import index_and_show, pick_queries

    monkeypatch.setenv("SANTA_PROGRESS_EVERY_S", "0")  # a progress line each time it moves

    data = load_beir(beir)
    assert pick_queries(data.queries, 3) == pick_queries(dict(reversed(data.queries.items())), 3)
    # The run's other sets are indexed beside the held-out one (everyday questions then
    # find their function), and one line says what the index holds.
    # Its path sorts before the held-out set's: the line keeps the order indexed, not the
    # manifest's (a JSON object's keys are written sorted).
    extra = tmp_path_factory.mktemp("aaa-more") / "more.jsonl"
    extra.write_text(
        "".join(
            json.dumps({"id": f"extra-{i}", "text": f"def helper_{i}(): return {i}"}) + "\n"
            for i in range(5)
        )
    )
    shown = index_and_show(
        built["config"].checkpoint,
        beir,
        str(tmp_path / "index"),
        examples=3,
        k=3,
        more_corpora=(("dev", ""), ("training", str(extra))),
        holds="a test corpus",
    )
    out = capsys.readouterr().out
    assert "[index] holds 110 documents (105 held-out, 5 training): a test corpus\n" in out
    # Published and found again (up to date): the same counts in the same order.
    again = index_and_show(
        built["config"].checkpoint,
        beir,
        str(tmp_path / "index"),
        examples=1,
        k=1,
        more_corpora=(("dev", ""), ("training", str(extra))),
    )
    assert again["count"] == 110
    assert "[index] holds 110 documents (105 held-out, 5 training)\n" in capsys.readouterr().out
    # The encoding says how far it got as its batches are done, not only per shard (110
    # documents: in the driver; the actors' count is test_search_ranks_equal_the_evaluators').
    encoded = [line for line in out.splitlines() if line.startswith("[index] documents encoded")]
    assert re.fullmatch(r"\[index\] documents encoded: 110 documents in \d+ s.*", encoded[-1])
    assert all(
        re.fullmatch(r"\[index\] documents encoded: \d+/110 documents \(\d+%\), .*", line)
        for line in encoded[:-1]
    ), encoded
    assert shown["count"] == 110 and len(shown["examples"]) == 3
    assert out.count("query: ") == 3 and "python -m ray_jobs.search --index" in out
    searcher = Searcher.open(str(tmp_path / "index"))
    for example in shown["examples"]:
        hits = searcher.search([example["query"]], 3)[0]
        assert [hit["id"] for hit in example["hits"]] == [hit.id for hit in hits]
        qid = next(q for q, text in data.queries.items() if text == example["query"])
        answers = set(data.qrels[qid])
        ranks = [hit.rank for hit in hits if hit.id in answers]
        assert example["answer_rank"] == (ranks[0] if ranks else None)
    assert out.count("← the judged answer") == sum(
        1 for example in shown["examples"] if example["answer_rank"]
    )
    # The query it suggests is the shown one whose judged answer ranked best (searched 100
    # deep, so each of these 105 documents' ranks is known), quoted for a shell.
    for example in shown["examples"]:
        qid = next(q for q, text in data.queries.items() if text == example["query"])
        ranked = [hit.id for hit in searcher.search([example["query"]], 110)[0]]
        assert example["judged_rank"] == 1 + min(ranked.index(doc) for doc in data.qrels[qid])
    best = min(shown["examples"], key=lambda example: example["judged_rank"])
    assert shown["suggested_query"] == " ".join(best["query"].split())
    line = out.split("search it yourself:\n", 1)[1].splitlines()[0]
    assert shlex.split(line)[-1] == shown["suggested_query"]
    assert shlex.split(line)[:5] == ["python", "-m", "ray_jobs.search", "--index", shown["index"]]


def test_functions_sharing_a_docstring_are_each_a_judged_answer(
    checkpoint, tmp_path, capsys, ray_cluster
):
    """Two functions with one docstring (``Node.pre_order``, ``Leaf.pre_order``) are two
    held-out queries of the same text with one answer each: the example of that text marks
    both (it marked one, the other looked like a miss)."""
    from santa.search.demo import index_and_show

    rows = [dict(row) for row in stdlib_pair_rows()[:6]]
    rows[1]["query"] = rows[0]["query"]
    beir = write_beir(tmp_path / "beir", rows)
    shown = index_and_show(checkpoint, beir, str(tmp_path / "index"), examples=6, k=6)
    blocks = capsys.readouterr().out.split("query: ")[1:]
    head = " ".join(rows[0]["query"].split())[:60]  # the table's header cuts long queries
    shared = [block for block in blocks if block.startswith(head)]
    assert len(shared) == 2
    for block in shared:
        marked = [line.split()[2] for line in block.splitlines() if "← the judged answer" in line]
        assert sorted(marked) == ["d0", "d1"]
    assert all(example["answer_rank"] is not None for example in shown["examples"])


def test_the_suggested_query_is_the_best_ranked_example_quoted_for_a_shell():
    from santa.search.demo import suggest_query

    examples = [
        {"query": "Return ' s is blank or represents an int '", "judged_rank": 4},
        {"query": "Copy $HOME\n  to `dst` ;", "judged_rank": 2},
        {"query": "never found", "judged_rank": None},
        {"query": "also second", "judged_rank": 2},
    ]
    assert suggest_query(examples) == "Copy $HOME to `dst` ;"
    assert shlex.split(f"search {shlex.quote(suggest_query(examples))}") == [
        "search",
        "Copy $HOME to `dst` ;",
    ]
    assert suggest_query(examples[:1]) == "Return ' s is blank or represents an int '"
    assert suggest_query([examples[2], dict(examples[2], query="second")]) == "never found"
    with pytest.raises(ValueError):
        suggest_query([])


def test_the_default_demo_is_minilm_and_tests_keep_tiny():
    from ray_jobs import pipeline
    from santa.pipeline import stage_config

    def spec(*argv: str):
        return pipeline.spec_from_args(pipeline.parse_args(list(argv)))

    default = spec()
    assert default.recipe == "minilm" and default.index
    assert default.stages == ("pretrain", "finetune")
    assert spec("--max-steps", "5").stages == ("pretrain", "finetune", "ance")
    config = stage_config(default, "pretrain")
    assert config.model.kind == "encoder" and config.train.max_steps == 20
    assert config.train.global_batch_size == 32 and config.train.eval_every == 20
    tiny = stage_config(spec("--recipe", "tiny"), "pretrain")
    assert tiny.model.kind == "t5" and tiny.train.max_steps == 150
    assert spec("--recipe", "tiny").stages == ("pretrain", "finetune", "ance")
    assert not spec("--no-index").index


def test_a_small_corpus_on_cpu_is_encoded_without_an_actor_pool():
    """No actors (0: the driver encodes) for up to LOCAL_MAX_DOCUMENTS documents on CPU
    when none are asked for: a pool's actors take longer to start than such a corpus to
    encode. Otherwise one actor per CPU but one, or per GPU, at most one per shard."""
    from dataclasses import replace

    from santa.search.encoders import LOCAL_MAX_DOCUMENTS, encoder_actors

    auto = IndexConfig(checkpoint="m", corpus="c", output="o")

    def actors(config: IndexConfig = auto, **cluster) -> int:
        cluster = {"use_gpu": False, "gpus": 0, "cpus": 8, "shards": 1, "documents": 500, **cluster}
        return encoder_actors(config, **cluster)

    assert actors() == actors(documents=LOCAL_MAX_DOCUMENTS) == 0
    assert actors(documents=LOCAL_MAX_DOCUMENTS + 1, shards=2) == 2
    assert actors(documents=50_000, shards=50) == 7  # one CPU left free
    assert actors(replace(auto, num_actors=1)) == 1  # asked for: a pool, however small
    assert actors(replace(auto, cpus_per_actor=2.0), documents=50_000, shards=50) == 3
    assert actors(use_gpu=True, gpus=2) == 1 and actors(use_gpu=True, gpus=2, shards=4) == 2


@pytest.mark.slow
def test_a_killed_index_job_resumes_with_the_missing_shards(built, tmp_path, ray_cluster):
    """``kill -9`` of the index job (an actor pool: ``--actors 1``) once some shards are
    written; the index built again encodes only the shards that were not (in the driver)."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    output = tmp_path / "killed"
    argv = [sys.executable, "-m", "ray_jobs.index", "--checkpoint", built["config"].checkpoint]
    argv += ["--corpus", built["config"].corpus, "--output", str(output), "--shard-size", "5"]
    argv += ["--actors", "1", "--address", ray_cluster.address]
    job = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    written: list[Path] = []
    try:
        while time.time() < deadline and job.poll() is None:
            written = list(tmp_path.glob(f"killed.partial-*/{EMBEDDINGS_DIR}/part-*.parquet"))
            if len(written) >= 3:
                break
            time.sleep(0.2)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)
    assert len(written) >= 3, "the job wrote no shard in time"
    done = {p.name for p in written}
    assert len(done) < 21 and not (output / "report.json").exists()
    manifest = build_index(
        IndexConfig(
            checkpoint=built["config"].checkpoint,
            corpus=built["config"].corpus,
            output=str(output),
            shard_size=5,
        )
    )
    assert manifest["shards"]["count"] == 21 and manifest["actors"] == 0
    assert manifest["shards"]["reused"] >= len(done)
    assert manifest["shards"]["encoded"] == 21 - manifest["shards"]["reused"]
    searcher = Searcher.open(str(output))
    reference = Searcher.open(built["output"])
    query = load_beir(built["config"].corpus).queries
    texts = list(query.values())[:5]
    assert [[h.id for h in hits] for hits in searcher.search(texts, 10)] == [
        [h.id for h in hits] for hits in reference.search(texts, 10)
    ]


def test_search_serve_flag_hands_the_other_flags_to_the_serve_job(monkeypatch):
    from ray_jobs import search, serve

    seen: dict = {}
    monkeypatch.setattr(serve, "main", lambda argv: seen.update(argv=argv) or 0)
    assert search.main(["--index", "idx", "--serve", "--replicas", "2", "-k", "4"]) == 0
    args = serve.parse_args(seen["argv"])
    assert (args.index, args.replicas, args.top_k) == ("idx", (2, None), 4)
