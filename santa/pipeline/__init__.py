"""The staged pipeline (corpus → pretrain → fine-tune → ANCE → evaluation), callable from
Python: :func:`run_pipeline` with a :class:`PipelineSpec`; ``ray_jobs.pipeline`` is its
command line."""

from santa.pipeline.spec import DEFAULT_RECIPE, DEFAULT_STEPS, PipelineSpec, stage_config
from santa.pipeline.stages import run_pipeline

__all__ = ["DEFAULT_RECIPE", "DEFAULT_STEPS", "PipelineSpec", "run_pipeline", "stage_config"]
