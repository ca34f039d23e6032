"""The harness every benchmark uses: machine report, result JSON, tables and figures.

    from bench import common

    run = common.BenchRun(__file__, argv)   # prints what it runs on; notes date, commit, command
    ...
    print(common.format_table(["system", "pairs/s"], [["santa", "4.83"]]))
    run.write_json(output, payload)         # the payload plus "meta", written whole
    common.save_figure(figure, output.with_suffix(".png"))

A result file is one JSON object: the script's own figures and ``meta`` (``date``,
``commit``, ``command``, ``seconds``, ``machine``: CPU model and cores, GPUs, memory, load
average at the start, torch/ray/transformers versions; ``load_average_end``). On a shared
machine the load average says how far to trust a timing.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
VERSIONED = ("torch", "ray", "transformers", "faiss-cpu", "sentence-transformers")

__all__ = [
    "RESULTS_DIR",
    "ROOT",
    "BenchRun",
    "command_line",
    "describe_machine",
    "format_table",
    "git_commit",
    "load_average",
    "machine_report",
    "new_figure",
    "parse_tables",
    "plot_intervals",
    "save_figure",
    "write_json",
]


# --------------------------------------------------------------------------- machine


def cpu_model() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, rounded to 2 places."""
    return [round(value, 2) for value in os.getloadavg()]


def memory_gib() -> float | None:
    """Physical memory in GiB (None where the OS does not say)."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def package_versions(names: Sequence[str] = VERSIONED) -> dict[str, str]:
    """Installed versions of ``names`` (read from the package metadata, nothing imported)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def gpu_names() -> list[str]:
    """Names of the CUDA devices torch sees (none without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]


def torch_threads() -> int | None:
    """torch's intra-op threads in this process (None without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def machine_report() -> dict[str, Any]:
    """What a benchmark runs on, and how busy the machine is right now."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "memory_gib": memory_gib(),
        "gpus": gpu_names(),
        "torch_threads": torch_threads(),
        "load_average": load_average(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": package_versions(),
    }


def describe_machine(machine: Mapping[str, Any]) -> str:
    """One line: CPU and cores, GPUs, memory, load, library versions."""
    gpus = ", ".join(machine.get("gpus") or []) or "no GPU"
    load = "/".join(f"{value:.2f}" for value in machine["load_average"])
    versions = ", ".join(f"{name} {version}" for name, version in machine["versions"].items())
    memory = machine.get("memory_gib")
    return (
        f"{machine['cpu']} ({machine['cpus_usable']} of {machine['cpu_count']} cores), {gpus}"
        + (f", {memory:g} GiB" if memory else "")
        + f"; load {load}; {versions}"
    )


def git_commit(root: Path = ROOT) -> str | None:
    """The checked-out commit, with ``-dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None  # no git here, or not a repository (an unpacked copy)
    return f"{head}-dirty" if changed else head


def command_line(script: str | Path, argv: Sequence[str] | None = None) -> str:
    """How to run this again: ``python bench/perf/x.py --flag value`` (path from the root)."""
    path = Path(script).resolve()
    try:
        shown = str(path.relative_to(ROOT))
    except ValueError:
        shown = str(path)
    arguments = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", shown, *arguments])


class BenchRun:
    """One run of a benchmark: the machine, the date, the commit and the command line."""

    def __init__(
        self,
        script: str | Path,
        argv: Sequence[str] | None = None,
        *,
        busy_above: float | None = None,
        quiet: bool = False,
    ) -> None:
        """Note the start; print the machine line, and a warning when the 1-minute load
        is above ``busy_above`` (default: the usable cores)."""
        self.started = time.time()
        self.command = command_line(script, argv)
        self.commit = git_commit()
        self.machine = machine_report()
        if quiet:
            return
        print(f"machine: {describe_machine(self.machine)}", flush=True)
        load = self.machine["load_average"][0]
        limit = self.machine["cpus_usable"] if busy_above is None else busy_above
        if load > limit:
            print(
                f"warning: 1-minute load {load:.2f} before starting: other work shares this "
                "machine, timings will be noisy",
                flush=True,
            )

    def meta(self) -> dict[str, Any]:
        """The ``meta`` block of a result file (the load average again, at the end)."""
        return {
            "date": datetime.fromtimestamp(self.started).astimezone().isoformat("T", "seconds"),
            "seconds": round(time.time() - self.started, 1),
            "commit": self.commit,
            "command": self.command,
            "machine": self.machine,
            "load_average_end": load_average(),
        }

    def write_json(self, path: str | Path, payload: Mapping[str, Any]) -> Path:
        """Write ``payload`` and this run's ``meta`` whole (see :func:`write_json`)."""
        if "meta" in payload:
            raise ValueError("a benchmark payload cannot hold its own 'meta' key")
        return write_json(path, {**payload, "meta": self.meta()})


# --------------------------------------------------------------------------- files


def write_json(path: str | Path, payload: Any) -> Path:
    """Write JSON whole or not at all: serialized first, then a temporary file renamed."""
    path = Path(path)
    text = json.dumps(payload, indent=2, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide results from the other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# --------------------------------------------------------------------------- tables


def logged_windows(run_dir: str | Path) -> list[dict[str, Any]]:
    """A santa run's logged windows (its ``metrics.jsonl``, read by the pipeline report's
    :func:`~santa.pipeline.report.read_history`: one line per report, the window's means),
    in step order; none logged is an error naming the file."""
    from santa.pipeline.report import read_history

    windows = read_history(str(run_dir))
    if not windows:
        raise FileNotFoundError(f"no logged window in {run_dir}/metrics.jsonl")
    return sorted(windows, key=lambda m: m["step"])


def format_table(
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    align: str | None = None,
    style: str = "markdown",
) -> str:
    """Rows of cells as a table whose columns line up in a terminal.

    ``align`` has one letter per column, ``l`` or ``r`` (default: the first column left,
    the others right). ``style`` ``markdown`` (pipes, an alignment row; ``|`` in a cell is
    escaped) or ``text`` (columns two spaces apart, the header underlined). A cell is
    written with ``str``; ``None`` is shown as ``—``.
    """
    if style not in ("markdown", "text"):
        raise ValueError(f"style must be 'markdown' or 'text', not {style!r}")
    columns = len(header)
    align = align or "l" + "r" * (columns - 1)
    if len(align) != columns or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one of 'l'/'r' per column ({columns}), got {align!r}")
    for row in rows:
        if len(row) != columns:
            raise ValueError(f"a row has {len(row)} cells for {columns} columns: {row!r}")

    def cell(value: Any) -> str:
        text = "—" if value is None else str(value)
        return text.replace("|", "\\|") if style == "markdown" else text

    table = [[cell(value) for value in row] for row in [header, *rows]]
    widths = [max(3, *(len(row[i]) for row in table)) for i in range(columns)]

    def line(row: Sequence[str]) -> list[str]:
        return [
            text.rjust(width) if side == "r" else text.ljust(width)
            for text, width, side in zip(row, widths, align, strict=True)
        ]

    if style == "text":
        lines = ["  ".join(line(row)).rstrip() for row in table]
        lines.insert(1, "  ".join("-" * width for width in widths))
        return "\n".join(lines)
    rule = [
        "-" * (width - 1) + ":" if side == "r" else "-" * width
        for width, side in zip(widths, align, strict=True)
    ]
    lines = ["| " + " | ".join(line(row)) + " |" for row in table]
    lines.insert(1, "| " + " | ".join(rule) + " |")
    return "\n".join(lines)


def parse_tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table in ``text`` (runs of lines starting with ``|``), each as its
    rows keyed by column title, cells stripped and unescaped."""

    def cells(line: str) -> list[str]:
        parts = re.split(r"(?<!\\)\|", line.strip()[1:-1])
        return [part.strip().replace("\\|", "|") for part in parts]

    tables, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.strip().startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2:
            header = cells(block[0])
            tables.append([dict(zip(header, cells(row), strict=True)) for row in block[2:]])
        block = []
    return tables


# --------------------------------------------------------------------------- figures


def new_figure(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``plt.subplots`` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(figure: Any, path: str | Path, dpi: int = 120) -> Path:
    """Write a matplotlib figure as PNG whole or not at all (a temporary file renamed)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    try:
        figure.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    finally:
        plt.close(figure)
        tmp.unlink(missing_ok=True)
    return path


def plot_intervals(
    groups: Mapping[str, Mapping[str, Mapping[str, float]]],
    path: str | Path,
    title: str,
    *,
    ylabel: str,
    reference: float | None = None,
    ylim: tuple[float, float] | None = None,
    figsize: tuple[float, float] = (7, 4),
    rotation: float = 0,
    wrap: bool = False,
) -> Path:
    """Bars of means with their intervals (``mean``, ``ci_low``, ``ci_high``).

    ``groups`` maps each x position to its bars (series → row); with more than one series
    the bars of a group stand side by side under a legend. ``reference``: a dashed line
    (e.g. the zero-shot model's mean); ``wrap``: a label's ``, `` starts a new line.
    """
    import numpy as np

    names = list(groups)
    series = list(dict.fromkeys(key for bars in groups.values() for key in bars))
    width = 0.8 / len(series)
    figure, axis = new_figure(figsize=figsize)
    for k, key in enumerate(series):
        rows = [groups[name].get(key) for name in names]
        means = np.array([row["mean"] if row else np.nan for row in rows])
        errors = np.array(
            [
                [row["mean"] - row["ci_low"] if row else 0 for row in rows],
                [row["ci_high"] - row["mean"] if row else 0 for row in rows],
            ]
        )
        axis.bar(
            np.arange(len(names)) + k * width,
            means,
            width,
            yerr=errors,
            capsize=3,
            label=key,
            color="#8fb3d9" if len(series) == 1 else None,
        )
    if reference is not None:
        axis.axhline(reference, color="gray", linestyle="--", linewidth=1)
    labels = [name.replace(", ", ",\n") for name in names] if wrap else names
    axis.set_xticks(
        np.arange(len(names)) + width * (len(series) - 1) / 2,
        labels,
        rotation=rotation,
        fontsize=8 if rotation or wrap else None,
    )
    if ylim is not None:
        axis.set_ylim(*ylim)
    axis.set_ylabel(ylabel)
    axis.set_title(title, fontsize=9)
    if len(series) > 1:
        axis.legend(fontsize=8)
    return save_figure(figure, path)


TENSOR_READS = ("item", "tolist", "__float__", "__int__", "__bool__")


@contextlib.contextmanager
def counting_tensor_reads():
    """Count every read of a tensor's values into Python while the block runs (on a GPU
    each one waits for the device): ``Tensor.item``/``tolist``/``float``/``int``/``bool``,
    by name. Reads by torch's optimizers are left out: AdamW's step counters are host
    tensors (fused AdamW on a GPU keeps them on the device and reads none)."""
    import torch

    counts: collections.Counter[str] = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in TENSOR_READS}

    def counted(name):
        original = originals[name]

        def read(self, *args, **kwargs):
            if "torch/optim/" not in sys._getframe(1).f_code.co_filename:
                counts[name] += 1
            return original(self, *args, **kwargs)

        return read

    for name in TENSOR_READS:
        setattr(torch.Tensor, name, counted(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def use_shared_nltk_data() -> None:
    """Point NLTK at ``../shared/nltk_data`` when the environment names no folder and that
    one exists (a fresh clone without ``../shared`` keeps NLTK's own search path, so the
    tests that need the tagger skip instead of failing)."""
    shared = ROOT.parent / "shared" / "nltk_data"
    if "NLTK_DATA" not in os.environ and shared.is_dir():
        os.environ["NLTK_DATA"] = str(shared)
