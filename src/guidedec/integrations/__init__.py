"""Adapters that plug guidedec into other libraries' generation loops.

- :mod:`guidedec.integrations.transformers`: ``GuidedLogitsProcessor``, a
  ``transformers.LogitsProcessor`` for ``model.generate`` (plain and assisted generation).
- :mod:`guidedec.integrations.vllm`: ``GuidedLogitsProcessor``, a vLLM v1 logits processor
  (needs ``vllm``, which guidedec does not install).

Each adapter is imported from its own module, so that importing this package imports nothing
heavy.
"""
