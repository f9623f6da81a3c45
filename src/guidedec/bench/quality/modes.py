"""The ways ``guidedec bench quality`` decodes: guidedec's own modes and the peers'."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    """One way to decode every item.

    ``engine``: ``guidedec`` (its ``LLM``), ``vllm`` (vLLM's own structured outputs, its
    xgrammar backend and defaults), ``vllm-plugin`` (vLLM with guidedec's logits processor) or
    ``transformers`` (``generate`` with xgrammar's own logits processor). ``tight``: each item's
    budget is three quarters of the tokens its output took in the ``guided`` mode, so that
    closing has to end it.
    """

    name: str
    engine: str = "guidedec"
    guided: bool = True
    backend: str = "auto"
    whitespace: str = "flexible"
    jump_forward: bool = True
    tight: bool = False
    closing: bool = True
    think_first: bool = False
    closed: bool = True
    describe: str = ""


MODES = {
    m.name: m
    for m in (
        Mode("unguided", guided=False, describe="no guide; the answer read out of the reply"),
        Mode(
            "guided",
            describe="guidedec's defaults: auto backend, flexible whitespace, objects closed",
        ),
        Mode(
            "think first",
            think_first=True,
            describe="free text before the JSON value (GuidedDecodingParams(think_first=True))",
        ),
        Mode(
            "open objects",
            closed=False,
            describe="LLM(disable_additional_properties=False): a property the schema does "
            "not name allowed where JSON Schema allows it",
        ),
        Mode("xgrammar", backend="xgrammar", describe="the xgrammar backend"),
        Mode("llguidance", backend="llguidance", describe="the llguidance backend"),
        Mode("compact", whitespace="compact", describe="compact JSON whitespace"),
        Mode("no jump-forward", jump_forward=False, describe="forced text sampled token by token"),
        Mode("tight", tight=True, describe="3/4 of the guided tokens, closing on"),
        Mode(
            "tight, no closing",
            tight=True,
            closing=False,
            describe="3/4 of the guided tokens, cut at the budget",
        ),
        Mode("vllm", engine="vllm", describe="vLLM's own structured outputs (xgrammar)"),
        Mode("vllm + guidedec", engine="vllm-plugin", describe="vLLM with guidedec's plugin"),
        Mode(
            "transformers + xgrammar",
            engine="transformers",
            describe="transformers generate with xgrammar's logits processor",
        ),
    )
}
PEERS = ("vllm", "vllm-plugin", "transformers")
