"""The reference engine: ``LLM`` generates under grammars with continuous batching, chunked
prefill, speculative decoding (n-gram or a draft model) and disaggregated prefill."""

from guidedec.engine.handoff import Handoff
from guidedec.engine.llm import LLM, EngineStats
from guidedec.engine.request import RequestOutput
from guidedec.engine.sampling import SamplingParams

__all__ = ["LLM", "EngineStats", "Handoff", "RequestOutput", "SamplingParams"]
