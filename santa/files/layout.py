"""Every path of a santa run, for local and ``s3://`` storage alike.

One object knows where a run keeps its files (as Ray's ``StorageContext`` knows a Ray Train
run's); every other module asks it instead of joining path strings of its own. A run folder
is ``STORAGE/NAME``; nested runs (the pipeline's stages, SCodeR's warm-up and iteration
stages, a sweep's trials) are run folders inside it::

    STORAGE/NAME/                      RunLayout.of(storage, name)
        .santa-lock | .santa-lock.json the one-writer lock (local flock | S3 lease)
        checkpoint_*/model/            Ray Train's checkpoints (model/ = HF folder)
        checkpoint_manager_snapshot.json   Ray's list of registered checkpoints
        init_model/                    the random tiny T5 every worker starts from
        metrics.jsonl                  every logged step's metrics
        tensorboard/                   TensorBoard events
        data/{pretrain,dev,test}/      the pipeline's corpus
        pretrain/ finetune/ ance/      the pipeline's stages (each a run folder)
        negatives/negatives.parquet    the pipeline's mined table
        eval/<system>/                 evaluation outputs
        index/                         the held-out corpus indexed with the final model
        report.json report.md report.html *.png (losses, dev_mrr, metrics, throughput)
        warmup/ discriminators-init/ iter-<i>/   SCodeR (see ScoderIteration)
        best.json runs/<NAME>-<trial>/           a sweep
        .santa-cache/                  caches the runs nested in this one share (CacheLayout)
    STORAGE/.santa-cache/              caches the runs of this storage share:
        tokenizers/<key>/              a tokenizer trained for the data (tiny recipe)
        compile/<key>/<shape>.bin      torch.compile's work (torch.compiler cache artifacts)

Only this module (and the published-output rules of :mod:`santa.files.outputs`) spells
these names.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any

from santa.files import storage

__all__ = [
    "BEST_FILE",
    "CHECKPOINT_PREFIX",
    "METRICS_FILE",
    "MODEL_DIR",
    "RUN_SNAPSHOT_FILE",
    "SANTA_CONFIG_FILE",
    "STATE_FILE",
    "CacheLayout",
    "RunLayout",
    "ScoderIteration",
    "checkpoint_model",
    "checkpoint_uri",
    "output_lock",
]

MODEL_DIR = "model"
"""Inside a santa checkpoint: the HF model folder (``save_pretrained`` + santa_config)."""
SANTA_CONFIG_FILE = "santa_config.json"
"""What ``DualEncoder.save_pretrained`` writes beside the HF files: the santa config."""
STATE_FILE = "trainer_state.json"
"""Inside a santa checkpoint: the loop's state (step, epoch, batches into the epoch)."""
CHECKPOINT_PREFIX = "checkpoint_"
# ray.train.v2._internal.constants.CHECKPOINT_MANAGER_SNAPSHOT_FILENAME (Ray 2.60).
RUN_SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"
METRICS_FILE = "metrics.jsonl"
BEST_FILE = "best.json"
REPORT_FILE = "report.json"
LOCAL_LOCK_FILE = ".santa-lock"
S3_LEASE_FILE = ".santa-lock.json"
TRIALS_DIR = "runs"
CACHE_DIR = ".santa-cache"
# Where rank 0 writes TensorBoard events of a run stored on S3 (copied into the run at every
# checkpoint, so they outlive the node).
LOCAL_EVENTS_ROOT = "~/santa-runs"


@dataclass(frozen=True)
class RunLayout:
    """The folder of one run and the names of everything in it."""

    root: str
    """``STORAGE/NAME``: an absolute local path or an ``s3://`` URI."""

    @classmethod
    def of(cls, storage_path: str, name: str) -> RunLayout:
        """The run ``name`` under ``storage_path`` (made absolute when local)."""
        return cls(storage.join(storage.absolute(storage_path), name))

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", storage.absolute(self.root))

    # ------------------------------------------------------------------ the run itself

    @property
    def name(self) -> str:
        """The run's name (its folder's name)."""
        return posixpath.basename(self.root.rstrip("/"))

    @property
    def storage_path(self) -> str:
        """The folder holding the run (Ray Train's ``storage_path``)."""
        return posixpath.dirname(self.root.rstrip("/"))

    @property
    def is_s3(self) -> bool:
        """Whether the run lives on S3."""
        return storage.is_s3(self.root)

    def path(self, *parts: str) -> str:
        """A path inside the run folder."""
        return storage.join(self.root, *parts)

    def child(self, name: str) -> RunLayout:
        """A run nested in this one (a stage, an iteration's stage, a trial)."""
        return RunLayout(self.path(name))

    @property
    def cache(self) -> CacheLayout:
        """The caches this run shares with the other runs of its storage (the folder holding
        it): the pipeline's stages share their pipeline run's, a standalone run its
        storage path's."""
        return CacheLayout(storage.join(self.storage_path, CACHE_DIR))

    @property
    def shared_cache(self) -> CacheLayout:
        """The caches of the runs nested in this one (its stages, iterations, trials)."""
        return CacheLayout(self.path(CACHE_DIR))

    @property
    def local_lock(self) -> str:
        """The flock file of a local run."""
        return self.path(LOCAL_LOCK_FILE)

    @property
    def s3_lease(self) -> str:
        """The lease object of an S3 run."""
        return self.path(S3_LEASE_FILE)

    # ------------------------------------------------------------------ a Ray Train run

    @property
    def init_model(self) -> str:
        """The tiny recipe's random initial model, saved once so every worker shares it."""
        return self.path("init_model")

    @property
    def metrics(self) -> str:
        """Every logged step's metrics as JSON lines (Ray keeps metrics only with
        checkpoints)."""
        return self.path(METRICS_FILE)

    @property
    def tensorboard(self) -> str:
        """The run's TensorBoard events (on S3: the copy)."""
        return self.path("tensorboard")

    @property
    def tensorboard_dir(self) -> str:
        """Where rank 0 writes TensorBoard events: the run folder, or for a run on S3 a
        local folder whose events are copied to :attr:`tensorboard`."""
        if self.is_s3:
            return os.path.join(os.path.expanduser(LOCAL_EVENTS_ROOT), self.name, "tensorboard")
        return self.tensorboard

    @property
    def tensorboard_copy(self) -> str:
        """Where the events of :attr:`tensorboard_dir` are copied; empty when they are
        written in the run already."""
        return self.tensorboard if self.is_s3 else ""

    @property
    def checkpoint_snapshot(self) -> str:
        """Ray Train's list of registered checkpoints."""
        return self.path(RUN_SNAPSHOT_FILE)

    def checkpoint(self, name: str) -> str:
        """A checkpoint folder of the run, by name (``checkpoint_...``)."""
        return self.path(name)

    def checkpoint_uri(self, checkpoint: Any) -> str:
        """The URI of a ``ray.train.Checkpoint`` of this run (Ray drops ``s3://``)."""
        return checkpoint_uri(checkpoint, self.root)

    # ------------------------------------------------------------------ the pipeline

    def data(self, part: str) -> str:
        """A corpus the pipeline preprocessed (``pretrain``, ``dev``, ``test``)."""
        return self.path("data", part)

    def stage(self, stage: str) -> RunLayout:
        """A pipeline stage's Ray Train run (``pretrain``, ``finetune``, ``ance``)."""
        return self.child(stage)

    @property
    def negatives(self) -> str:
        """The folder of the mined hard-negatives table."""
        return self.path("negatives")

    @property
    def negatives_table(self) -> str:
        """The mined hard-negatives table."""
        return self.path("negatives", "negatives.parquet")

    @property
    def index(self) -> str:
        """The pipeline's index of the held-out corpus (``ray_jobs.search --index``)."""
        return self.path("index")

    def eval(self, system: str = "") -> str:
        """Evaluation outputs (metrics, TREC runs), per system when named."""
        return self.path("eval", system) if system else self.path("eval")

    @property
    def report(self) -> str:
        """The run's report (JSON)."""
        return self.path(REPORT_FILE)

    @property
    def report_markdown(self) -> str:
        """The run's report (Markdown)."""
        return self.path("report.md")

    @property
    def report_html(self) -> str:
        """The run's report as a page (the Markdown's HTML, its plots beside it)."""
        return self.path("report.html")

    # ------------------------------------------------------------------ SCodeR

    @property
    def warmup(self) -> RunLayout:
        """Algorithm 2's in-batch-negative warm-up (a Ray Train run)."""
        return self.child("warmup")

    @property
    def warmup_record(self) -> str:
        """What the finished warm-up left (its model, time, final metrics)."""
        return self.path("warmup", "warmup.json")

    @property
    def initial_discriminators(self) -> str:
        """The discriminators Algorithm 2 starts from (backbone + new heads)."""
        return self.path("discriminators-init")

    def iteration(self, iteration: int) -> ScoderIteration:
        """The folder of one iteration of Algorithm 2."""
        return ScoderIteration(self.path(f"iter-{iteration}"))

    @property
    def scoder_metrics(self) -> str:
        """One line of metrics per finished SCodeR iteration."""
        return self.path("scoder_metrics.jsonl")

    # ------------------------------------------------------------------ sweeps

    @property
    def best(self) -> str:
        """A sweep's best trial (``best.json``)."""
        return self.path(BEST_FILE)

    @property
    def trials(self) -> str:
        """The folder of a sweep's trial runs (their Ray Train storage path)."""
        return self.path(TRIALS_DIR)

    def trial(self, trial_id: str) -> RunLayout:
        """The Ray Train run of one trial: unique, and the same again on restore."""
        return RunLayout(storage.join(self.trials, f"{self.name}-{trial_id}"))


@dataclass(frozen=True)
class ScoderIteration:
    """``RUN/iter-<i>/``: one iteration of SCodeR's Algorithm 2."""

    root: str

    def path(self, *parts: str) -> str:
        """A path inside the iteration folder."""
        return storage.join(self.root, *parts)

    @property
    def negatives(self) -> str:
        """The table mined with the current dual encoder."""
        return self.path("negatives")

    def examples(self, stage: str) -> str:
        """The listwise examples a stage trains on (``discriminators``, ``dual_encoder``)."""
        return self.path("examples", stage)

    @property
    def soft_labels(self) -> str:
        """The examples with the discriminators' scores (offline soft labels)."""
        return self.path("soft_labels")

    def stage(self, stage: str) -> RunLayout:
        """The Ray Train run of a stage (``discriminators``, ``dual_encoder``)."""
        return RunLayout(self.path(stage))

    @property
    def manifest(self) -> str:
        """Written last: the iteration is done."""
        return self.path("manifest.json")


@dataclass(frozen=True)
class CacheLayout:
    """``.santa-cache/``: what runs of the same data or shape reuse instead of redoing."""

    root: str

    def path(self, *parts: str) -> str:
        """A path inside the cache folder."""
        return storage.join(self.root, *parts)

    def tokenizer(self, key: str) -> str:
        """A tokenizer trained for a corpus (the tiny recipe), by corpus and vocabulary."""
        return self.path("tokenizers", key)

    def compile(self, key: str) -> str:
        """torch.compile's cache artifacts of one model, device and torch version (a blob
        per stage shape inside)."""
        return self.path("compile", key)


def output_lock(uri: str) -> str:
    """The one-writer lock of a job's output folder (preprocess, evaluate, export, mining).

    Locally beside the folder (``PARENT/.NAME.santa-lock``): publishing renames a new
    folder onto the output, which would carry a lock inside it away. On S3 (no renames)
    inside it, as for runs.
    """
    if storage.is_s3(uri):
        return storage.join(uri, S3_LEASE_FILE)
    path = storage.absolute(uri).rstrip(os.sep)
    parent, name = os.path.split(path)
    return os.path.join(parent, f".{name}{LOCAL_LOCK_FILE}")


def checkpoint_uri(checkpoint: Any, storage_root: str) -> str:
    """The URI of a ``ray.train.Checkpoint`` stored under ``storage_root``: Ray's paths
    lose the ``s3://`` scheme when the storage is S3."""
    path = str(getattr(checkpoint, "path", checkpoint))
    if storage.is_s3(storage_root) and not path.startswith("s3://"):
        return "s3://" + path.lstrip("/")
    return path


def checkpoint_model(checkpoint: str) -> str:
    """The HF model folder inside a santa checkpoint."""
    return storage.join(checkpoint, MODEL_DIR)
