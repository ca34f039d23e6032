"""Using a trained model: index a corpus (Ray Data), search it (CLI, Ray Serve).

- :mod:`santa.search.corpus`: corpora to index (pairs, BEIR, CodeSearchNet, ``{id, text}``);
- :mod:`santa.search.indexing`: encode shards on an actor pool, build and publish the index;
- :mod:`santa.search.searcher`: load an index and its model, answer queries;
- :mod:`santa.search.serve`: the Ray Serve deployment (``POST /search``, ``GET /healthz``);
- :mod:`santa.search.demo`: index a held-out set and show example queries (the pipeline's
  last step).
"""
