"""A job whose working directory vanishes under it must not die in ``import torch``.

torch's CPU wheels link Intel oneMKL into ``libtorch_cpu.so``; its loader calls
``getcwd()`` when the library is loaded and aborts the whole process (exit status 2, no
Python traceback) when the working directory no longer exists::

    Intel oneMKL FATAL ERROR: Cannot load .../torch/lib/libtorch_cpu.so.

(``rm -r $PWD; python -c 'import torch'`` shows it.) Under ``ray job submit --working-dir``
the driver runs inside Ray's unpacked copy of the working directory
(``.../runtime_resources/working_dir_files/_ray_pkg_<hash>/``), and Ray may remove and
unpack that folder again while a job runs in it — nodes of a local multi-node cluster that
share one temp folder unpack the same package over each other, and two identical
submissions share one package folder. A santa driver imports torch late (its start-up is
faster without it), which left a wide window.

So every job, at its start: moves to its home folder if its working directory is already
gone (relative paths could not be resolved anyway), and, when it runs in a Ray working
directory, loads torch at once, before anything can replace that folder (training jobs
import it a moment later anyway).
"""

from __future__ import annotations

import os

__all__ = ["RAY_WORKING_DIR_MARK", "steady_working_directory"]

RAY_WORKING_DIR_MARK = os.sep + os.path.join("runtime_resources", "working_dir_files") + os.sep
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def steady_working_directory() -> str:
    """Make the MKL abort impossible for this process; returns what was done (for tests)."""
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        os.chdir(os.path.expanduser("~"))
        return "moved"
    if RAY_WORKING_DIR_MARK in cwd + os.sep and os.environ.get(RAY_JOB_ENV):
        import torch  # noqa: F401 - loads libtorch_cpu.so (and MKL) while the folder is there

        return "preloaded"
    return "kept"
