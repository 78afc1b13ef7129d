"""The optimiser: pure Graph -> Graph passes, listed once in pipeline.PIPELINE."""

from deepdsl.passes.pipeline import PASS_NAMES, PIPELINE, Pass, PassStat, kernels, run_pipeline

__all__ = ["PASS_NAMES", "PIPELINE", "Pass", "PassStat", "kernels", "run_pipeline"]
