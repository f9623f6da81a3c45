"""Decoder layer: request snapshots and the batched GuidedDecoder."""

from guidedec.decoder.base import BaseGuidedDecoder
from guidedec.decoder.decoder import GuidedDecoder, GuidedStep
from guidedec.decoder.errors import RequestError
from guidedec.decoder.request import GuidedRequest, GuidedRequests
from guidedec.decoder.stats import DecoderStats

__all__ = [
    "BaseGuidedDecoder",
    "DecoderStats",
    "GuidedDecoder",
    "GuidedRequest",
    "GuidedRequests",
    "GuidedStep",
    "RequestError",
]
