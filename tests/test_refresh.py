"""The sharded hard-negative refresh: encoder actors, tables of document numbers whose texts
trainers read from their node's row file, GPU flags."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from santa.models.dual_encoder import DualEncoder
from santa.models.encoding import (
    TextEncoder,
    autocast_dtype,
    encode_texts,
    plan_batches,
    select_device,
)
from santa.models.tokenizer import train_tokenizer
from santa.negatives.client import NegativesClient
from santa.negatives.corpus import load_mining_corpus
from santa.negatives.encoders import encoder_actor_options
from santa.negatives.miner import refresh_table
from santa.negatives.table import NegativesTable, read_negatives_table
from tests.training import stdlib_pair_rows, tiny_config, write_pairs

SETTINGS = tiny_config(
    negatives={"per_query": 2, "top_k": 20}, max_query_length=24, max_document_length=64
)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    return write_pairs(tmp_path_factory.mktemp("refresh-pairs"), stdlib_pair_rows())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, pairs) -> str:
    """A tiny T5 saved to a folder (what the miner's encoder actors load)."""
    corpus = load_mining_corpus(pairs)
    tokenizer = train_tokenizer(
        [*corpus.doc_texts(range(corpus.num_docs)), *corpus.query_texts(range(corpus.num_queries))],
        vocab_size=1000,
    )
    config = tiny_config()
    folder = str(tmp_path_factory.mktemp("refresh-model") / "model")
    DualEncoder.build_tiny(config.model, tokenizer, seed=0).save_pretrained(folder, config)
    return folder


def _trained_state(model_dir: str) -> dict[str, torch.Tensor]:
    """Weights other than the saved ones (a 'snapshot' from training)."""
    model = DualEncoder.from_pretrained(model_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


# --------------------------------------------------------------------- no Ray


def test_device_selection_and_autocast_dtype() -> None:
    assert select_device(0) == "cpu"
    assert select_device(0.25, cuda_available=False) == "cpu"  # asked, none visible: CPU
    assert select_device(0.25, cuda_available=True) == "cuda"
    assert select_device(0, cuda_available=True) == "cpu"  # no GPU given to the actor
    assert autocast_dtype("cpu") is None
    assert autocast_dtype("cuda", bf16_supported=True) == torch.bfloat16
    assert autocast_dtype("cuda", bf16_supported=False) == torch.float16


def test_text_encoder_equals_encode_texts_on_cpu(model_dir, pairs) -> None:
    torch.set_num_threads(1)
    texts = load_mining_corpus(pairs).doc_texts(range(70))
    # Asked for a quarter GPU on a machine without one: CPU, fp32 (what the actor does).
    encoder = TextEncoder(model_dir, None, num_gpus=0.25, threads=1)
    assert (encoder.device, encoder.dtype) == ("cpu", None)
    expected = encode_texts(encoder.model, texts, max_length=64, batch_size=16, progress=False)
    np.testing.assert_array_equal(encoder.encode(texts, 64, batch_size=16), expected)
    batches = plan_batches(texts, 16)
    assert [len(b) for b in batches] == [16, 16, 16, 16, 6]
    assert sorted(np.concatenate(batches).tolist()) == list(range(70))
    lengths = [len(texts[i]) for i in np.concatenate(batches)]
    assert lengths == sorted(lengths, reverse=True)  # longest first


def test_shard_encoder_runs_without_ray_or_faiss(model_dir) -> None:
    """What the encoder actors run is plain PyTorch: usable where Ray and faiss are not."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['ray'] = None; sys.modules['faiss'] = None\n"
        "from santa.models.encoding import TextEncoder\n"
        f"encoder = TextEncoder({model_dir!r}, None, num_gpus=1, threads=1)\n"
        "print(encoder.device, encoder.encode(['def f(): pass', 'x'], 16).shape)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split()[0] == "cpu"  # no CUDA here: falls back to CPU
    assert done.stdout.strip().endswith(", 128)")


def test_a_refresh_gives_numbers_of_the_corpus_and_parquet_keeps_them_by_id(
    model_dir, pairs, tmp_path
):
    corpus = load_mining_corpus(pairs)
    table = refresh_table(DualEncoder.from_pretrained(model_dir), corpus, SETTINGS, step=7)
    assert table.negatives.shape == (corpus.num_queries, 2) and table.corpus_key == corpus.key
    assert table.negatives.dtype == np.int64 and not table.extra_texts  # no text in a table
    for query in range(0, corpus.num_queries, 97):  # never a positive of its query
        assert not set(table.of(query)) & set(corpus.positives(query).tolist())
    back = read_negatives_table(table.write_parquet(str(tmp_path / "t"), corpus), corpus)
    assert back.negatives.tolist() == table.negatives.tolist() and back.step == 7


def test_trainers_read_the_negatives_texts_from_their_row_file(pairs, tmp_path) -> None:
    """A worker's negatives for its batch rows: the table's, then random documents of the
    corpus other than the row's own, drawn by (seed, step, row): the same on any rank."""
    from santa.negatives.table import write_id_table

    corpus = load_mining_corpus(pairs)
    queries = corpus.query_ids([0, 1, 2])
    docs = [d for d in range(10) if d not in corpus.positives(0)]
    names = corpus.doc_ids(docs[:4])
    uri = write_id_table(
        {queries[0]: names[:2], queries[1]: names[2:4], queries[2]: []}, None, str(tmp_path / "t")
    )
    clients = [
        NegativesClient(f"table:{uri}", data_uri=pairs, n=2, seed=0, rank=rank, world_size=2)
        for rank in (0, 1)
    ]
    table = clients[0].tables[0]
    rows = [int(np.flatnonzero(corpus.query_of_training_row == q)[0]) for q in (0, 1, 2)]
    chosen = clients[0].negatives_of_rows(table, rows, step=1)
    assert chosen[:4] == docs[:4]
    assert clients[0].texts_of(table, chosen[:4]) == corpus.doc_texts(docs[:4])
    assert clients[0].ids_of(table, chosen[:2]) == names[:2]
    own = int(corpus.doc_of_training_row[rows[2]])
    assert own not in chosen[4:] and clients[0].stats["filled"] == 2  # the third query's two
    # Another rank asked for the same rows at the same step fills them alike.
    assert clients[1].negatives_of_rows(clients[1].tables[0], rows, step=1) == chosen


def test_miner_flags_reach_the_encoder_actor_options() -> None:
    from ray_jobs.train_cli import build_parser, recipe_config

    parser = build_parser("finetune", "test")
    args = parser.parse_args(
        ["--data", "d", "--storage", "s", "--name", "n", "--miner-gpus", "0.25"]
        + ["--miner-actors", "3"]
    )
    settings = recipe_config(args).negatives
    assert (settings.encoder_gpus, settings.encoder_actors) == (0.25, 3)
    options = encoder_actor_options(num_cpus=settings.encoder_cpus, num_gpus=settings.encoder_gpus)
    assert options["num_gpus"] == 0.25 and options["num_cpus"] == 0.0
    default = recipe_config(parser.parse_args(args_without_miner())).negatives
    assert (default.encoder_gpus, default.encoder_actors) == (0.0, 1)
    with pytest.raises(ValueError, match="encoder_gpus"):
        tiny_config(negatives={"encoder_gpus": -1})


def args_without_miner() -> list[str]:
    return ["--data", "d", "--storage", "s", "--name", "n"]


# --------------------------------------------------------------------- on Ray


@pytest.mark.usefixtures("ray_cluster")
def test_one_and_two_encoder_actors_give_the_same_table(model_dir, pairs) -> None:
    import ray

    import santa.negatives.encoders
    from santa.negatives.encoders import EncoderPool

    @ray.remote(num_cpus=0)
    def imported_from() -> str:
        return santa.negatives.encoders.__file__

    # Ray's processes run this checkout's code (not another install of santa).
    assert ray.get(imported_from.remote()) == santa.negatives.encoders.__file__
    # Both pools start at once, while this process mines its own table: an actor's start
    # (its imports, the model) is most of this test.
    pools = {
        actors: EncoderPool(model_dir, None, actors=actors, num_cpus=0, batch_size=16)
        for actors in (1, 2)
    }
    try:
        corpus = load_mining_corpus(pairs)
        state = _trained_state(model_dir)
        weights = ray.put(state)  # once: every actor fetches this one copy
        expected_model = DualEncoder.from_pretrained(model_dir)
        expected_model.load_state_dict(state)
        torch.set_num_threads(1)  # the actors' thread count: same arithmetic
        expected = refresh_table(expected_model, corpus, SETTINGS, step=10)
        tables = {}
        for actors, pool in pools.items():
            assert pool.wait_ready(timeout=300) == actors
            pool.set_weights(weights, step=10)
            tables[actors] = refresh_table(None, corpus, SETTINGS, step=10, encoder=pool)
            assert pool.stats["actors_used"] == actors
            assert pool.stats["chunks"] > actors  # work was shared out in chunks
    finally:
        for pool in pools.values():
            pool.shutdown()
    assert tables[1].negatives.tolist() == tables[2].negatives.tolist()
    assert tables[2].negatives.tolist() == expected.negatives.tolist()
    # The snapshot was used: the saved (untrained) weights mine another table.
    untrained = refresh_table(DualEncoder.from_pretrained(model_dir), corpus, SETTINGS, step=10)
    assert untrained.negatives.tolist() != expected.negatives.tolist()


@pytest.mark.usefixtures("ray_cluster")
def test_a_gpu_request_reaches_ray_and_waits_for_a_gpu(model_dir) -> None:
    import ray

    from santa.negatives.encoders import EncoderPool

    pool = EncoderPool(model_dir, None, actors=2, num_gpus=0.25, batch_size=16)
    try:
        assert pool.options["num_gpus"] == 0.25
        # No GPU in this cluster: the actors stay pending (an autoscaler would add a node).
        ready, pending = ray.wait(list(pool._probes), num_returns=2, timeout=3)
        assert not ready and len(pending) == 2
    finally:
        pool.shutdown()


@pytest.mark.usefixtures("ray_cluster")
def test_training_steps_go_on_during_a_refresh(model_dir, pairs, tmp_path) -> None:
    import ray

    from santa.negatives.miner import start_miner

    # Enough documents that a refresh takes seconds on the test cluster.
    rows = stdlib_pair_rows()
    bigger = [dict(row, doc_id=f"{row['doc_id']}-{i}") for i in range(2) for row in rows]
    data = write_pairs(tmp_path / "pairs", bigger)
    config = tiny_config(
        stage="finetune", negatives={"source": "async", "per_query": 1}, max_document_length=64
    )
    name = "santa-miner-test-refresh"
    miner = start_miner(name, data_uri=data, model_uri=model_dir, config=config)
    client = NegativesClient(
        "async", data_uri=data, n=1, seed=0, rank=0, world_size=1, miner_name=name
    )
    model = DualEncoder.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = model.tokenize(["def f(x): return x"] * 8, 32)
    steps_during, polls = 0, []
    try:
        client.maybe_send_weights(0, model, force=True)
        deadline = time.time() + 240
        while client.newest_step() < 0:
            assert time.time() < deadline, "no table within 240s"
            started = time.perf_counter()
            client.poll()
            polls.append(time.perf_counter() - started)
            # One real training step of the "trainer" while the miner refreshes.
            loss = model.encode(batch["input_ids"], batch["attention_mask"]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps_during += 1
        info = ray.get(miner.info.remote())
    finally:
        ray.kill(miner)
    assert steps_during >= 5  # the trainer kept stepping while the table was built
    # Polls never wait for the refresh: only the first (actor lookup) and the one that
    # fetches the finished table do more than a zero-timeout check.
    assert float(np.median(polls)) < 0.05 and sorted(polls)[-3] < 0.5
    assert info["encoder_actors"] == 1 and info["encoder_actors_used"] == 1
    table = client.tables[0]
    assert table.corpus_key == client.corpus.key and table.queries_with_negatives > 0
    # The worker reads a training row's negatives by its query's number in the table.
    row = int(np.flatnonzero(table.negatives[client.corpus.query_of_training_row, 0] >= 0)[0])
    query = int(client.corpus.query_of_training_row[row])
    assert client.negatives_of_rows(table, [row], step=1) == table.of(query)[:1]


def test_auto_index_is_exact_for_small_corpora_and_ivf_for_large() -> None:
    from santa.index.faiss_index import AUTO_IVF_MIN_DOCUMENTS, index_kind

    assert index_kind("auto", 2000) == "flat"
    assert index_kind("auto", AUTO_IVF_MIN_DOCUMENTS - 1) == "flat"
    assert index_kind("auto", AUTO_IVF_MIN_DOCUMENTS) == "ivf"
    assert index_kind("hnsw", 10) == "hnsw" and index_kind("flat", 10**7) == "flat"
    assert tiny_config(negatives={"index": "auto"}).negatives.index == "auto"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_the_pipelines_offline_mining_on_two_encoder_actors(model_dir, pairs, tmp_path) -> None:
    from santa.negatives.offline import mine_negatives

    torch.set_num_threads(1)  # the actors' thread count: same arithmetic

    def mined(actors: int) -> NegativesTable:
        config = tiny_config(
            stage="finetune", negatives={"per_query": 1, "top_k": 20, "encoder_actors": actors}
        )
        return read_negatives_table(
            mine_negatives(model_dir, pairs, str(tmp_path / f"{actors}"), config),
            load_mining_corpus(pairs),
        )

    pooled, local = mined(2), mined(1)  # 2: an EncoderPool; 1: in this process
    assert pooled.negatives.tolist() == local.negatives.tolist()
    assert pooled.queries_with_negatives > 0
