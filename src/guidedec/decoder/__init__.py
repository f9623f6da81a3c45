"""Decoder layer: request snapshots and the batched GuidedDecoder."""

from guidedec.decoder.base import BaseGuidedDecoder, DecoderStats, RequestError
from guidedec.decoder.decoder import GuidedDecoder
from guidedec.decoder.request import GuidedRequest, GuidedRequests

__all__ = [
    "BaseGuidedDecoder",
    "DecoderStats",
    "GuidedDecoder",
    "GuidedRequest",
    "GuidedRequests",
    "RequestError",
]
