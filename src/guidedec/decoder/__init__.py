"""Decoder layer: request snapshots and the batched GuidedDecoder."""

from guidedec.decoder.decoder import DecoderStats, GuidedDecoder
from guidedec.decoder.request import GuidedRequest, GuidedRequests

__all__ = ["DecoderStats", "GuidedDecoder", "GuidedRequest", "GuidedRequests"]
