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


def test_a_corrupt_latest_checkpoint_resumes_the_loop_from_the_previous_one(tmp_path, capsys):
    """The loop (LocalSession: no Ray) over a checkpoint root whose newest checkpoint is
    broken: it says so in one line and resumes from the one before, then trains on."""
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer
    from santa.train.loop import WorkerTrainer, run_worker
    from santa.train.loop_config import LoopConfig
    from santa.train.session import LocalSession

    rows = stdlib_pair_rows()[:64]
    data = write_pairs(tmp_path / "pairs", rows)
    config = tiny_config(max_steps=4, log_every=1, checkpoint_every=1)
    texts = [row["query"] for row in rows] + [row["document"] for row in rows]
    tokenizer = train_tokenizer(texts, vocab_size=config.model.tiny_vocab_size)
    DualEncoder.build_tiny(config.model, tokenizer).save_pretrained(str(tmp_path / "init"), config)

    def loop(stop: int = 0) -> LoopConfig:
        return LoopConfig(
            santa=config,
            init_model=str(tmp_path / "init"),
            data_uri=data,
            stop_at_step=stop,
            row_cache=str(tmp_path / "rows"),
        )

    root = tmp_path / "run"
    run_worker(WorkerTrainer(loop(stop=3), LocalSession(checkpoint_root=str(root))))
    folders = _checkpoint_folders(root)
    assert [p.name for p in folders] == [f"checkpoint_00000{i}" for i in (1, 2, 3)]
    optimizer = folders[-1] / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])  # the newest one broken
    capsys.readouterr()
    trainer = WorkerTrainer(loop(), LocalSession(checkpoint_root=str(root)))
    assert trainer.state["resumed_at"] == [2]
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("santa:")]
    assert line.startswith(f"santa: warning: checkpoint {folders[-1]} cannot be loaded")
    run_worker(trainer)
    assert json.loads((root / "checkpoint_000004" / "trainer_state.json").read_text())["step"] == 4


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
