"""One Ray Train run with ``async`` hard negatives, for the async-swap test and the
shared-GPU test (issue 57: one run where the two tests ran two, ~30 s less).

Two workers of the tiny recipe fine-tune for 60 steps on a node added with two (fake)
GPUs: each worker asks for 0.75 of a GPU, the miner's encoder actor for 0.25, so the
encoder shares a GPU with a trainer (no GPU is left whole for it). There is no CUDA behind
the fake GPUs: the workers train on the CPU over gloo and the encoder encodes on the CPU,
as on a machine without them. Each test reads its part of the record
(tests/test_negatives_ray.py: the tables swapped in without waiting; tests/test_resources.py:
the placement beside the encoder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.training import stdlib_pair_rows, tiny_config, write_pairs

STEPS = 60


def async_run_on_fake_gpus(cluster, root: Path) -> dict[str, Any]:
    """Run it (see the module's docstring); its result, final state, GPU bundles, history."""
    import ray

    from santa.models.dual_encoder import DualEncoder
    from santa.train.trainer import RunSpec, fit

    data = write_pairs(root / "pairs", stdlib_pair_rows()[:-32])
    node = cluster.add_node(num_cpus=2, num_gpus=2)
    cluster.wait_for_nodes()
    try:
        config = tiny_config(
            {
                "source": "async",
                "per_query": 1,
                "refresh_every": 5,
                "wait_for_first": True,
                "encoder_gpus": 0.25,
            },
            stage="finetune",
            max_steps=STEPS,
            log_every=5,
            checkpoint_every=STEPS,
            num_workers=2,
            use_gpu="true",
            distributed_backend="gloo",  # no CUDA behind the fake GPUs: train on the CPU
        )
        spec = RunSpec.of(data=data, storage=str(root), name="async", cpus_per_worker=0.5)
        result = fit(config, spec)
        bundles = [
            bundle
            for group in ray.util.placement_group_table().values()
            for bundle in group["bundles"].values()
            if bundle.get("GPU")
        ]
    finally:
        cluster.remove_node(node)
    state = None
    if result.checkpoint is not None:
        with result.checkpoint.as_directory() as directory:
            state = json.loads(Path(directory, "trainer_state.json").read_text())
            DualEncoder.from_pretrained(os.path.join(directory, "model"))  # loads: consistent
    history = [json.loads(line) for line in (root / "async" / "metrics.jsonl").open()]
    return {"result": result, "state": state, "bundles": bundles, "history": history}
