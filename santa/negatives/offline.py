"""Mining once with a trained model: the ANCE step of the staged pipeline, and SCodeR's
per-iteration refresh of the top-K negatives."""

from __future__ import annotations

from santa.config import SantaConfig

__all__ = ["mine_negatives"]


def mine_negatives(
    model_uri: str, data: str, output: str, config: SantaConfig, *, label: str = "ance"
) -> str:
    """Top-K with ``model_uri``, positives removed, ``n`` sampled per query; the table is
    written under ``output`` and its URI returned. ``label`` names the step in the progress
    line. A pool of encoder actors shards the encoding when the config asks for more than
    one or for GPUs (``negatives.encoder_actors``, ``negatives.encoder_gpus``)."""
    from santa.models.checkpoints import load_model
    from santa.negatives.corpus import load_mining_corpus
    from santa.negatives.miner import refresh_table

    if not model_uri:
        raise ValueError("the ance stage mines with the previous stage's model: run finetune first")
    model, _ = load_model(model_uri)
    corpus = load_mining_corpus(data)
    negatives = config.negatives
    print(
        f"[{label}] mining {negatives.mined_per_query} negative(s) per query for "
        f"{corpus.num_queries:,} queries among {corpus.num_docs:,} documents "
        f"(top {negatives.top_k}) with {model_uri}",
        flush=True,
    )
    encoder = None
    if negatives.encoder_actors > 1 or negatives.encoder_gpus > 0:
        from santa.negatives.encoders import EncoderPool

        encoder = EncoderPool(
            model_uri,
            None,
            actors=negatives.encoder_actors,
            num_cpus=negatives.encoder_cpus,
            num_gpus=negatives.encoder_gpus,
            batch_size=negatives.batch_size,
        )
    try:
        table = refresh_table(model, corpus, config, encoder=encoder)
    finally:
        if encoder is not None:
            encoder.shutdown()
    from santa.negatives.table import publish_table

    return publish_table(table, output, corpus)
