"""One job's lifecycle, the same for every job santa runs: preflight → lock → Ray →
interrupts → staging → publish.

Each of the twelve jobs (``ray_jobs.*`` and ``tuning.sweep``) declares itself once, as a
:class:`Job`, and runs its work inside it; from the command line (``Job.main``: errors as
one line and an exit code) or from Python (``with job.running(): ...``: errors raised)::

    job = Job("preprocess", output=config.output, kept=lambda: "nothing was published")
    return job.main(lambda: write(config), argv, checks=[lambda: check_input(uri, "--input")])

1. **preflight**: the job's own cheap checks (inputs there, a recipe that fits, ...), then
   the place it writes checked writable: each failure one line naming the flag and the URI,
   before any lock or Ray;
2. **lock**: one writer per place, taken here and nowhere else: ``output=`` a folder the
   job publishes whole (:func:`santa.files.outputs.claim_output`: the output lock beside it,
   and the folder checked to hold this job's output or nothing), or ``run=`` a run folder
   that the job writes into (:class:`~santa.files.runlock.RunLock` inside it);
3. **Ray**: started or joined with its one line (:meth:`Job.start_ray`), by the jobs that
   need it, after the lock (a second writer is refused in a second, not after Ray's start);
4. **interrupts**: Ctrl-C or ``ray job stop`` unwinds the job and prints what it kept
   (``kept``) and how to go on (``hint``) (:mod:`santa.jobs.interrupts`);
5. **staging → publish**: the job's writer stages its files and publishes them whole
   (:func:`santa.files.outputs.staged_output`, the index's work folder, Ray Train's
   checkpoints); an interrupted or failed job leaves the output as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

__all__ = ["Job"]

Check = Callable[[], object]


@dataclass
class Job:
    """One job: what it is called, where it writes and what an interruption leaves."""

    tool: str
    """The job's name (``preprocess``, ``pretrain``, ``tuning.sweep`` ...): the lock's owner."""
    output: str = ""
    """A folder the job publishes whole (an output lock beside it)."""
    output_flag: str = "--output"
    run: str = ""
    """Or a run folder the job writes into (a run lock inside it)."""
    storage: str = ""
    """The storage root ``run`` lives under (checked writable as ``--storage``)."""
    force: bool = False
    """Take over a lock whose holder stopped renewing it (``--force``)."""
    kept: Callable[[], str] | None = None
    """What an interruption leaves (one clause of the line printed)."""
    hint: str = ""
    """How to go on after an interruption."""

    @property
    def description(self) -> str:
        return self.tool if "." in self.tool else f"ray_jobs.{self.tool}"

    def lock(self) -> contextlib.AbstractContextManager:
        """The job's one lock (none for a job that writes nothing)."""
        if self.output:
            from santa.files.outputs import claim_output

            return claim_output(self.output, self.tool, self.output_flag, force=self.force)
        if self.run:
            from santa.files.runlock import RunLock

            return RunLock(self.run, force=self.force, description=self.description)
        return contextlib.nullcontext()

    def preflight(self, checks: Iterable[Check] = ()) -> None:
        """The job's checks, then its output (or storage) writable: one line each."""
        from santa.jobs.preflight import check_writable

        for check in checks:
            check()
        if self.output:
            check_writable(self.output, self.output_flag)
        elif self.storage:
            check_writable(self.storage, "--storage")

    @contextlib.contextmanager
    def running(self, checks: Iterable[Check] = ()) -> Iterator[Job]:
        """Preflight, lock, and what an interruption says, around the job's work."""
        from santa.jobs import interrupts

        self.preflight(checks)
        with self.lock():
            if self.kept is None and not self.hint:
                yield self
                return
            with interrupts.keeping(self.kept or (lambda: ""), hint=self.hint):
                yield self

    def start_ray(self, address: str | None = None, **options) -> None:
        """Start or join Ray (:func:`santa.cluster.ray_utils.init_ray`), printing its line."""
        from santa.cluster.ray_utils import init_ray

        print(init_ray(address, **options), flush=True)

    def main(
        self,
        work: Callable[[], int | None],
        argv: list[str] | None = None,
        checks: Iterable[Check] = (),
    ) -> int:
        """The command line's face: :meth:`running` around ``work``; any error one line and
        an exit code (:func:`santa.jobs.errors.run_job`)."""
        from santa.jobs.errors import run_job

        def whole() -> int | None:
            with self.running(checks):
                return work()

        return run_job(whole, argv)
