"""Inference engines: the SGLang protocol, a client and pool for it, and a CPU dev engine.

The client side (:mod:`dressage.engines.sglang_client`) needs only httpx and numpy; the dev
engine (:mod:`dressage.engines.dev_engine`) needs the ``engine`` extra (torch, transformers).
"""

from dressage.engines.protocol import SGLANG_VERSION, FinishReason, ModelInfo, SamplingParams
from dressage.engines.sglang_client import EngineClient, EnginePool, GenerateDelta, GenerateResult

__all__ = [
    "SGLANG_VERSION",
    "EngineClient",
    "EnginePool",
    "FinishReason",
    "GenerateDelta",
    "GenerateResult",
    "ModelInfo",
    "SamplingParams",
]
