"""Resume falls back to the newest registered checkpoint that loads; unregistered
checkpoint folders (interrupted uploads) are never resumed from, and are removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from santa.train.resume import (
    ResumeError,
    load_newest_loadable,
    ray_candidates,
    registered_checkpoints,
    remove_unregistered_checkpoints,
)
from tests.training import stdlib_pair_rows, tiny_config, write_pairs


def _state_of(checkpoint) -> dict:
    return json.loads(Path(checkpoint.path, "trainer_state.json").read_text())


def _checkpoint_folders(run: Path) -> list[Path]:
    return sorted(p for p in run.iterdir() if p.is_dir() and p.name.startswith("checkpoint_"))


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_corrupt_latest_checkpoint_resumes_from_the_previous_one(tmp_path):
    from santa.train.trainer import RunSpec, fit

    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:200])
    config = tiny_config(max_steps=4, log_every=1, checkpoint_every=1)
    common = {"data": data, "storage": str(tmp_path), "cpus_per_worker": 0.5, "num_to_keep": 10}
    first = fit(config, RunSpec.of(name="run", stop_at_step=3, **common))
    assert first.metrics["step"] == 3
    run = tmp_path / "run"
    registered = registered_checkpoints(str(run))
    assert len(registered) == 3 and Path(registered[0]) == Path(first.checkpoint.path)

    # The latest registered checkpoint broken; an upload cut short left a newer folder.
    optimizer = Path(registered[0], "optimizer.pt")
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    half = run / "checkpoint_2999-01-01_00-00-00.000000"
    (half / "model").mkdir(parents=True)
    (half / "trainer_state.json").write_text('{"step": 99}')

    second = fit(config, RunSpec.of(name="run", **common))
    assert second.metrics["step"] == 4
    state = json.loads(Path(second.checkpoint.path, "trainer_state.json").read_text())
    assert state["resumed_at"] == [2]
    assert not half.exists()


def test_fallback_names_the_broken_checkpoint(tmp_path, capsys):
    import ray.train

    folders = []
    for step in (1, 2, 3):
        folder = tmp_path / f"checkpoint_{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
        folders.append(str(folder))
    Path(folders[2], "trainer_state.json").write_text("{not json")

    def load(checkpoint):
        return _state_of(checkpoint)

    latest = ray.train.Checkpoint(folders[2])
    state, used = load_newest_loadable(ray_candidates(latest, folders[::-1]), load)
    assert state == {"step": 2} and used.path == folders[1]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"santa: warning: checkpoint {folders[2]} cannot be loaded")

    for folder in folders:
        Path(folder, "trainer_state.json").write_text("")
    with pytest.raises(ResumeError, match="no registered checkpoint loads"):
        load_newest_loadable(ray_candidates(latest, folders[::-1]), load, announce=False)


def test_unregistered_folders_are_removed_only_with_a_readable_snapshot(tmp_path):
    run = tmp_path / "run"
    for name in ("checkpoint_a", "checkpoint_b", "checkpoint_c"):
        (run / name).mkdir(parents=True)
    assert sorted(remove_unregistered_checkpoints(str(run))) == [  # no snapshot: none kept
        str(run / "checkpoint_a"),
        str(run / "checkpoint_b"),
        str(run / "checkpoint_c"),
    ]
    for name in ("checkpoint_a", "checkpoint_b"):
        (run / name).mkdir()
    snapshot = {"checkpoint_results": [{"checkpoint_dir_name": "checkpoint_a", "metrics": {}}]}
    (run / "checkpoint_manager_snapshot.json").write_text(json.dumps(snapshot))
    assert remove_unregistered_checkpoints(str(run)) == [str(run / "checkpoint_b")]
    assert [p.name for p in _checkpoint_folders(run)] == ["checkpoint_a"]
    (run / "checkpoint_manager_snapshot.json").write_text('{"checkpoint_results": 5}')
    assert remove_unregistered_checkpoints(str(run)) == []
    assert registered_checkpoints(str(run)) == []
