"""Job command lines that several tests read, each run once (issue 57).

``run_evaluate_cli``: ``python -m ray_jobs.evaluate`` on a small BEIR folder, as a user types
it (no ``--no-progress``, the default BM25 baseline), its log file named by
``SANTA_LOG_FILE``: tests/test_quiet.py (santa's lines only), tests/test_checks_before_ray.py
(no library lines, no Ray) and tests/test_evaluate.py (the table, the options it records)
read its output. One process of ~11 s where each ran one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MAX_DOCUMENT_LENGTH = 64  # an option the run records in info.json


def run_evaluate_cli(root: Path) -> dict[str, Any]:
    """A tiny model and 40 stdlib records as BEIR, evaluated from the command line:
    ``{"proc": CompletedProcess, "output": folder, "log": the log file's text}``."""
    from bench.corpora import write_beir
    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer
    from tests.datagen import stdlib_python_records

    records = stdlib_python_records()[:40]
    texts = [r["code"] for r in records] + [r["docstring"] for r in records]
    tokenizer = train_tokenizer(texts * 2, vocab_size=600)
    model = DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0).eval()
    model.save_pretrained(str(root / "checkpoint" / "model"), santa_config=get_recipe("tiny"))
    rows = [{"query": r["docstring"], "document": r["code"]} for r in records]
    beir = write_beir(root / "beir", rows)  # query i's answer: document i
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SANTA_"))}
    env.update(PYTHONPATH=str(ROOT), SANTA_LOG_FILE=str(root / "job.log"))
    command = [sys.executable, "-m", "ray_jobs.evaluate", "--checkpoint"]
    command += [str(root / "checkpoint"), "--data", beir, "--output", str(root / "out")]
    command += ["--max-document-length", str(MAX_DOCUMENT_LENGTH)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    log = root / "job.log"
    return {
        "proc": proc,
        "output": root / "out",
        "log": log.read_text() if log.is_file() else "",
    }
