"""Stage 4, predict: the analyses' results in, what to change out.

Enters: the TraceSet and the results of the analyses (stage 2). Leaves: a
:class:`~.recommend.types.RecommendationResult` — the verdict, and every change evaluated, each
with its predicted step time and peak memory, its evidence, caveats and tier.

Modules: :mod:`.whatif` (the models: pipeline schedule replay, α–β communication cost, DDP
buckets, chunk cost splits), :mod:`.replay` (a run's measured pipeline as a model to replay),
:mod:`.shapes` (what the model's shapes and batch allow), :mod:`.recommend` (one typed context,
one rule per kind of change, the ranking and noise policy, the verdict).
"""

from .recommend import compute_recommendations
from .recommend.types import Recommendation, RecommendationResult
from .replay import PipelineModel, pipeline_model

__all__ = ["PipelineModel", "Recommendation", "RecommendationResult", "compute_recommendations",
           "pipeline_model"]
