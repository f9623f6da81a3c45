"""OpenAI request fields to guidedec guides, and constrained tool-call output to ``tool_calls``.

At most one of ``response_format``, ``structured_outputs`` (vLLM's extra body) and ``tools`` with
``tool_choice`` may constrain the output. Here, tool calls are guidedec's own JSON (the server
writes them in the model's format where it knows one: :mod:`guidedec.server.tool_calls`):
``tool_choice`` ``"required"`` makes the output a JSON array of one or more ``{"name": <tool>,
"arguments": {...}}`` calls, a named tool makes it that tool's arguments object alone,
``"none"``/``"auto"`` leave it free. Only the request's shape is checked here; whether a guide
compiles, the engine finds out later.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from guidedec.grammar.params import GuidedDecodingParams
from guidedec.server.errors import BadRequestError

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "lark", "structural_tag", "json_object")
_RENAMED = {"json": "json_schema", "grammar": "ebnf"}  # others are GuidedDecodingParams fields
TOP_LEVEL_GUIDES = {
    # vLLM's fields before ``structured_outputs``
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    # SGLang's
    "json_schema": "json",
    "regex": "regex",
    "ebnf": "grammar",
}
"""Request fields outside ``structured_outputs`` that other servers take as a guide, and the
``structured_outputs`` key each means."""


class RequestError(BadRequestError):
    """Bad structured-output fields in a request (HTTP 400). The message names the field, e.g.
    ``"response_format.json_schema.schema must be an object"``; :attr:`param` is its path."""


def guide_for_request(
    *,
    response_format: Mapping[str, Any] | None = None,
    structured_outputs: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | None = None,
    top_level: Mapping[str, Any] | None = None,
    tool_guide: GuidedDecodingParams | None = None,
) -> GuidedDecodingParams | None:
    """The guide a request's output must follow, or ``None`` when it is unconstrained. ``tools``
    are validated whenever given; ``response_format`` ``{"type": "text"}`` and ``tool_choice``
    ``"none"``/``"auto"`` yield no guide, so combine with anything. ``structured_outputs`` keys
    that are null (or ``json_object: false``) count as absent. ``top_level`` holds the request's
    fields of :data:`TOP_LEVEL_GUIDES` (``guided_json``, SGLang's ``regex``...), each a guide
    of its own. ``tool_guide``: the tool calls' guide, made elsewhere (in the model's format,
    see :mod:`guidedec.server.tool_calls`), in place of ``tools`` and ``tool_choice``'s.

    Raises:
        RequestError: a field has the wrong shape, or more than one field yields a guide.
    """
    guides = {
        "response_format": _from_response_format(response_format),
        "structured_outputs": _from_structured_outputs(structured_outputs),
        "tool_choice": tool_guide or _from_tools(tools, tool_choice),
    }
    for name, value in (top_level or {}).items():
        if value is not None:
            guides[name] = _structured_guide(TOP_LEVEL_GUIDES[name], value, name)
    given = [(name, guide) for name, guide in guides.items() if guide is not None]
    if len(given) > 1:
        names = " and ".join(name for name, _ in given)
        raise RequestError(f"{names} both constrain the output; give only one", given[1][0])
    return given[0][1] if given else None


def tool_choice_constrains(tool_choice: str | Mapping[str, Any] | None) -> bool:
    """Whether ``tool_choice`` forces tool calls (``"required"`` or a named function), so that
    the output is to be read with :func:`parse_tool_calls`."""
    return tool_choice is not None and tool_choice not in ("none", "auto")


def parse_tool_calls(
    text: str, *, tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The OpenAI ``tool_calls`` of an output constrained by :func:`guide_for_request`. With
    ``"required"`` the text is a JSON array of ``{"name", "arguments"}`` objects; with a
    named tool it is that tool's arguments object. Each call is ``{"id": "call_<24 hex>",
    "type": "function", "function": {"name": ..., "arguments": <arguments as a JSON string>}}``,
    ids unique. ``"none"`` and ``"auto"`` give ``[]``.

    Raises:
        ValueError: the text is not such JSON (e.g. cut short by ``max_tokens``), or names a tool
            not in ``tools``; :class:`RequestError` if ``tools``/``tool_choice`` are malformed.
    """
    named = tool_schemas(tools)
    chosen = chosen_tool(tool_choice, named)
    if not tool_choice_constrains(tool_choice):
        return []
    value = _loads(text)
    if chosen is not None:
        return [_call(chosen, _arguments(value))]
    if not isinstance(value, list) or not value:
        raise ValueError("tool-call output must be a non-empty JSON array of calls")
    return [_call(*_name_and_arguments(item, named)) for item in value]


def _from_response_format(fmt: Mapping[str, Any] | None) -> GuidedDecodingParams | None:
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise RequestError("response_format must be an object", "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GuidedDecodingParams(json_object=True)
    if kind == "json_schema":
        return GuidedDecodingParams(json_schema=_response_schema(fmt.get("json_schema")))
    if kind == "structural_tag":
        return GuidedDecodingParams(structural_tag=dict(fmt))
    raise _error(
        "response_format.type",
        f"must be text, json_object, json_schema or structural_tag: {kind!r}",
    )


def _response_schema(spec: Any) -> dict[str, Any]:
    path = "response_format.json_schema"
    if not isinstance(spec, Mapping):
        raise _error(path, "must be an object")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise _error(f"{path}.name", "must be a string")
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise _error(f"{path}.schema", "must be an object")
    return dict(schema)


def _from_structured_outputs(so: Mapping[str, Any] | None) -> GuidedDecodingParams | None:
    if so is None:
        return None
    if not isinstance(so, Mapping):
        raise RequestError("structured_outputs must be an object", "structured_outputs")
    unknown = sorted(set(so) - set(_STRUCTURED_KEYS))
    if unknown:
        raise _error(f"structured_outputs.{unknown[0]}", f"is not one of {_STRUCTURED_KEYS}")
    given = [k for k in _STRUCTURED_KEYS if so.get(k) is not None and so.get(k) is not False]
    if len(given) != 1:
        raise _error("structured_outputs", f"needs exactly one of {_STRUCTURED_KEYS}: {given}")
    return _structured_guide(given[0], so[given[0]], f"structured_outputs.{given[0]}")


def _structured_guide(key: str, value: Any, path: str) -> GuidedDecodingParams:
    guide: Any = _structured_value(key, value, path)
    return GuidedDecodingParams(**{_RENAMED.get(key, key): guide})


def _structured_value(key: str, value: Any, path: str) -> Any:
    if key in ("json", "structural_tag"):
        return _json_guide(value, path)
    if key == "json_object" and value is not True:
        raise RequestError(f"{path} must be true", path)
    is_choice = isinstance(value, list) and value and all(isinstance(c, str) for c in value)
    if key == "choice" and not is_choice:
        raise _error(path, "must be a non-empty list of strings")
    if key in ("regex", "grammar", "lark") and not isinstance(value, str):
        raise RequestError(f"{path} must be a string", path)
    return value


def _json_guide(value: Any, path: str) -> dict[str, Any] | str:
    """A dict as is, or a string that holds a JSON object."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RequestError(f"{path} is not valid JSON: {exc}", path) from None
        except RecursionError:
            raise RequestError(f"{path} nests too deeply to be read", path) from None
        if isinstance(parsed, dict):
            return value
    raise RequestError(f"{path} must be an object or a JSON string of one", path)


def _from_tools(
    tools: Sequence[Mapping[str, Any]] | None, tool_choice: str | Mapping[str, Any] | None
) -> GuidedDecodingParams | None:
    named = tool_schemas(tools) if tools is not None else {}
    chosen = chosen_tool(tool_choice, named)
    if chosen is not None:
        return GuidedDecodingParams(json_schema=named[chosen])
    if tool_choice == "required":
        return GuidedDecodingParams(json_schema=required_calls_schema(named))
    return None


def check_tools(tools: Any) -> None:
    """Raise :class:`RequestError` naming the first malformed field of ``tools``."""
    tool_schemas(tools)


def tool_schemas(tools: Any) -> dict[str, dict[str, Any]]:
    """Each tool's name to its parameters schema (``{"type": "object"}`` when absent)."""
    if not isinstance(tools, Sequence) or isinstance(tools, str | bytes):
        raise RequestError("tools must be a list", "tools")
    named: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        name, params = _tool_schema(tool, f"tools[{i}]")
        if name in named:
            path = f"tools[{i}].function.name"
            raise RequestError(f"{path} {name!r} is a duplicate", path)
        named[name] = params
    return named


def _tool_schema(tool: Any, path: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
        raise RequestError(f"{path} must be an object of type 'function'", path)
    function, path = tool.get("function"), f"{path}.function"
    if not isinstance(function, Mapping):
        raise RequestError(f"{path} must be an object", path)
    name, params = function.get("name"), function.get("parameters", _ANY_OBJECT)
    if not isinstance(name, str) or not name:
        raise RequestError(f"{path}.name must be a non-empty string", f"{path}.name")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):  # null: not strict
        raise RequestError(f"{path}.strict must be a boolean", f"{path}.strict")
    params = _ANY_OBJECT if params is None else params  # JSON null means absent
    if not isinstance(params, Mapping):
        raise _error(f"{path}.parameters", "must be an object")
    for key in ("$defs", "definitions"):
        if key in params and not isinstance(params[key], Mapping):
            raise _error(f"{path}.parameters.{key}", "must be an object")
    try:  # against its meta-schema: the tool is shown to the model even when no call is guided
        jsonschema.validators.validator_for(params).check_schema(params)
    except jsonschema.SchemaError as exc:
        where = "".join(f"[{p!r}]" for p in exc.path)
        problem = f"{where} {exc.message}" if where else exc.message
        raise _error(f"{path}.parameters", f"is not a JSON schema: {problem}") from exc
    return name, dict(params)


def chosen_tool(tool_choice: Any, named: Mapping[str, Any]) -> str | None:
    """The forced tool's name for a named ``tool_choice``; ``None`` for the string choices."""
    if tool_choice is None or tool_choice in ("none", "auto"):
        return None
    if tool_choice == "required":
        if not named:
            raise RequestError("tool_choice 'required' needs at least one tool", "tool_choice")
        return None
    function = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    if not isinstance(function, Mapping) or tool_choice.get("type", "function") != "function":
        raise RequestError(
            "tool_choice must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    name, path = function.get("name"), "tool_choice.function.name"
    if not isinstance(name, str):
        raise RequestError(f"{path} must be a string", path)
    if name not in named:
        raise RequestError(f"{path} {name!r} is not one of the tools {list(named)}", path)
    return str(name)


def required_calls_schema(named: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON schema of ``tool_choice: "required"`` output: a non-empty array whose items are
    ``{"name": <const tool name>, "arguments": <its parameters>}`` with no other keys.

    Local ``$ref``\\ s of each parameters schema (``#``, ``#/$defs/X``, ``#/definitions/X``) are
    rewritten to point into the array schema's root ``$defs`` (as ``tool<i>`` and
    ``tool<i>__X``), where the definitions are moved, so they resolve as in the tool's own schema.
    """
    defs: dict[str, Any] = {}
    items = [_call_schema(i, name, dict(p), defs) for i, (name, p) in enumerate(named.items())]
    return {"type": "array", "minItems": 1, "items": {"anyOf": items}} | (
        {"$defs": defs} if defs else {}
    )


def _call_schema(i: int, name: str, params: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    prefix, recursive = f"tool{i}", '"#"' in json.dumps(params)  # a false positive is harmless
    local = {**params.pop("$defs", {}), **params.pop("definitions", {})}
    for key, sub in local.items():
        defs[f"{prefix}__{key}"] = _rewrite_refs(sub, prefix)
    arguments = _rewrite_refs(params, prefix)
    if recursive:
        defs[prefix] = arguments
        arguments = {"$ref": f"#/$defs/{prefix}"}
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _rewrite_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, list):
        return [_rewrite_refs(x, prefix) for x in node]
    if not isinstance(node, Mapping):
        return node
    out = {k: _rewrite_refs(v, prefix) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith(("#/$defs/", "#/definitions/"))):
        out["$ref"] = f"#/$defs/{prefix}" + ("__" + ref.split("/", 2)[2] if ref != "#" else "")
    return out


def _error(path: str, problem: str) -> RequestError:
    return RequestError(f"{path} {problem}", path)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool-call output is not complete JSON ({exc}): {text[:200]!r}") from None


def _arguments(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"tool-call arguments must be a JSON object, got {type(value).__name__}")
    return value


def _name_and_arguments(item: Any, named: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if not isinstance(item, dict) or item.get("name") not in named:
        raise ValueError(f"tool call {item!r} does not name one of the tools {list(named)}")
    return str(item["name"]), _arguments(item.get("arguments"))


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
