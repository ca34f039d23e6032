"""Hard negatives that never came (issue 33): one line with the refresh and step times."""

from __future__ import annotations

from santa.negatives.health import negatives_warning
from tests.training import tiny_config


def test_no_table_in_the_whole_stage_is_said_with_the_times() -> None:
    config = tiny_config(
        stage="finetune", negatives={"source": "async", "per_query": 1, "refresh_every": 10}
    )
    metrics = {"step": 40, "step_time_s": 0.15, "negatives_step": -1.0, "negatives_staleness": -1}
    line = negatives_warning(config, metrics, {"last_build_s": None, "refresh_running_s": 28.0})
    assert line == (
        "santa: warning: hard negatives: no table arrived in 40 steps: the stage trained on "
        "in-batch negatives only; the first refresh was still running after 28.0 s, a step "
        "0.15 s (one refresh spans about 187 steps); wait for the first table (--set "
        "negatives.wait_for_first=true), add miner actors (--miner-actors N, --miner-gpus G), "
        "or refresh less often (--set negatives.refresh_every=N)"
    )


def test_a_stale_table_is_said_and_a_fresh_one_is_not() -> None:
    config = tiny_config(
        stage="finetune", negatives={"source": "async", "per_query": 1, "refresh_every": 10}
    )
    fresh = {"step": 100, "step_time_s": 0.2, "negatives_step": 90.0, "negatives_staleness": 10}
    assert negatives_warning(config, fresh, {"last_build_s": 1.5}) is None
    stale = dict(fresh, negatives_step=50.0, negatives_staleness=50)
    line = negatives_warning(config, stale, {"last_build_s": 9.0})
    assert line is not None and "mined at step 50, 50 steps before the end" in line
    assert "a refresh takes 9.0 s, a step 0.20 s (one refresh spans about 45 steps)" in line
    offline = tiny_config(stage="finetune", negatives={"source": "none"})
    assert negatives_warning(offline, stale, None) is None


def test_a_stage_without_any_table_says_so_with_the_times(monkeypatch, capsys) -> None:
    """The driver's end of an ``async`` stage (``santa.train.trainer``) in which no table
    arrived: the workers' final metrics (a client that never got one), the miner's answer
    (its first refresh still running, or no answer at all), one line on stderr. (Was a Ray
    job on a corpus 40 times the stdlib's, 65 s; the real miner's ``info()`` at the end of a
    stage is called in tests/test_recovery.py's killed-miner job, which prints no such line.)"""
    import types

    import ray

    from santa.negatives.client import NegativesClient
    from santa.train.trainer import _warn_if_negatives_never_came

    config = tiny_config(
        stage="finetune", negatives={"source": "async", "per_query": 1, "refresh_every": 1000}
    )
    client = NegativesClient("async", data_uri="", n=1, seed=0, rank=0, world_size=1)
    metrics = {"step": 4, "step_time_s": 0.25, **client.metrics(4, None)}  # no table: None
    result = types.SimpleNamespace(metrics=metrics)

    class Miner:  # a handle whose info() is answered as Ray's would be
        def __init__(self, info):
            self.info = types.SimpleNamespace(remote=lambda: info)

    def get(value, timeout=None):
        if isinstance(value, Exception):
            raise value
        return value

    monkeypatch.setattr(ray, "get", get)
    _warn_if_negatives_never_came(config, result, Miner({"refresh_running_s": 8.5}))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "santa: warning: hard negatives: no table arrived in 4 steps: the stage trained on "
        "in-batch negatives only; the first refresh was still running after 8.5 s, a step "
        "0.25 s (one refresh spans about 34 steps); "
    ), lines[0]
    assert "--set negatives.wait_for_first=true" in lines[0]
    # A miner that does not answer (dead, or stuck): the line still, without its times.
    _warn_if_negatives_never_came(config, result, Miner(ray.exceptions.GetTimeoutError()))
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "the miner never finished a refresh, a step 0.25 s; " in line, line


def _agreeing_rank(rank: int, world: int, port: int, out: str) -> None:
    """One of two gloo ranks: a client whose tables arrive at other steps than its peer's."""
    import json

    import torch.distributed as dist

    from santa.negatives import client as miner

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    calls: list[int] = []
    reduce = miner.all_reduce_min

    client = miner.NegativesClient("async", data_uri="", n=1, seed=0, rank=rank, world_size=world)
    used = []
    for step in range(25):
        # Rank 0 receives the table of step 3 at step 4, rank 1 at step 12.
        if step == (4 if rank == 0 else 12):
            client.tables[3] = "table-3"

        def counted(value, device, step=step):
            calls.append(step)
            return reduce(value, device)

        miner.all_reduce_min = counted
        used.append(client.agreed_table("cpu", step))
    dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as handle:
        json.dump({"calls": calls, "used": used}, handle)


def test_ranks_agree_on_the_miners_table_every_few_steps_not_every_step(tmp_path) -> None:
    """The agreement is a collective read on the host (a GPU sync): it runs at the first
    step and every AGREE_EVERY-th, on every rank alike, and a table all ranks hold is used
    from the first agreement after it."""
    import json

    import torch.multiprocessing as mp

    from santa.negatives.client import AGREE_EVERY
    from tests.conftest import free_port

    mp.start_processes(
        _agreeing_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert AGREE_EVERY == 10
    for rank in ranks:
        assert rank["calls"] == [0, 10, 20]
        # both hold it from step 12: agreed at step 20, used from there
        assert rank["used"] == [None] * 20 + ["table-3"] * 5
