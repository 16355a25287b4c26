"""Rollouts: the engine interface (``base``), the in-process Hugging Face engine (``hf``), vLLM in a Ray
actor (``vllm``) and a pool of such actors (``pool``), FP8 weight rounding (``fp8``), NCCL weight sync
(``weight_sync``)."""

import importlib.util


def vllm_available() -> bool:
    """Whether vLLM is installed (without importing it, which takes seconds)."""
    return importlib.util.find_spec("vllm") is not None
