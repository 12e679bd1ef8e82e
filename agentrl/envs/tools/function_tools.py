"""Function tools: plain typed Python functions as tools, their JSON schemas read from the
signature and the docstring (see :mod:`agentrl.envs.tools` for the supported annotations)."""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

import anyio

from agentrl.envs.parsers import ToolOutput
from agentrl.envs.tools.protocols import Tool, ToolContext, tool_schema
from agentrl.errors import ConfigError, InfraError, ToolCallError

__all__ = ["FunctionTool", "as_tool", "function_tool", "json_schema", "json_type", "parse_docstring"]


_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|Attributes)\s*:\s*$",
    re.IGNORECASE,
)
_REST_PARAM = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_GOOGLE_ARG = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` from a Google-style (``Args:``) or reST-style
    (``:param x:``) docstring. The description is the text before the first section, with
    paragraphs kept and lines of a paragraph joined."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    head: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    indent: int | None = None
    for line in lines:
        rest = _REST_PARAM.match(line)
        if rest:
            current, section = rest.group(1), "rest"
            params[current] = rest.group(2).strip()
            continue
        if line.strip().startswith(":"):  # :returns:, :raises: ...
            section, current = "rest-other", None
            continue
        m = _SECTION.match(line)
        if m:
            section = m.group(1).lower()
            current, indent = None, None
            continue
        if section is None:
            head.append(line)
        elif section in ("args", "arguments", "parameters", "params"):
            arg = _GOOGLE_ARG.match(line)
            if arg and (indent is None or len(arg.group(1)) <= indent):
                indent = len(arg.group(1))
                current = arg.group(2)
                params[current] = arg.group(3).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
        elif section == "rest" and current and line.strip():
            params[current] = (params[current] + " " + line.strip()).strip()
    paragraphs = [" ".join(p.split()) for p in "\n".join(head).strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p), params


def json_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of values of the Python type ``annotation`` (see the module docstring for
    what is supported).

    Raises:
        ConfigError: the annotation has no JSON form (e.g. a class, ``bytes``, a callable).
    """
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = json_schema(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema["description"] = " ".join(notes)
        return schema
    if annotation is None or annotation is type(None):
        return {"type": "null"}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    if annotation is str:
        return {"type": "string"}
    if annotation in (list, tuple, set, frozenset):
        return {"type": "array"}
    if annotation is dict:
        return {"type": "object"}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [m.value for m in annotation]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1 and len(args) == 2:
            return {"anyOf": [json_schema(members[0]), {"type": "null"}]}
        return {"anyOf": [json_schema(a) for a in args]}
    if origin in (list, set, frozenset, Sequence) or origin is getattr(typing, "Sequence", None):
        return {"type": "array", "items": json_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": json_schema(args[0])}
        return {"type": "array", "prefixItems": [json_schema(a) for a in args], "minItems": len(args), "maxItems": len(args)}
    if origin is dict:
        if args and args[0] is not str:
            raise ConfigError(f"tool argument type {annotation!r}: JSON object keys are strings (use dict[str, ...])")
        return {"type": "object", "additionalProperties": json_schema(args[1])} if args else {"type": "object"}
    raise ConfigError(f"tool argument type {annotation!r} has no JSON schema (use str, int, float, bool, list, dict, Literal, Enum)")


def _check_value(value: Any, schema: dict[str, Any], where: str) -> Any:
    """``value`` checked against (our subset of) JSON schema; ints become floats for ``number``.

    Raises:
        ToolCallError: the value does not fit (the message says where and what was expected).
    """
    if not schema:
        return value
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return _check_value(value, option, where)
            except ToolCallError:
                continue
        raise ToolCallError(f"{where}: {json_type(value)} {value!r:.60} fits none of the allowed types")
    if "enum" in schema:
        if value not in schema["enum"]:
            raise ToolCallError(f"{where}: {value!r:.60} is not one of {schema['enum']}")
        return value
    kind = schema.get("type")
    if kind == "null" and value is None:
        return None
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "array" and isinstance(value, list):
        if "prefixItems" in schema:
            if len(value) != len(schema["prefixItems"]):
                raise ToolCallError(f"{where}: expected {len(schema['prefixItems'])} items, got {len(value)}")
            return [_check_value(v, s, f"{where}[{i}]") for i, (v, s) in enumerate(zip(value, schema["prefixItems"]))]
        items = schema.get("items", {})
        return [_check_value(v, items, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind == "object" and isinstance(value, dict):
        extra = schema.get("additionalProperties", {})
        if isinstance(extra, dict):
            return {k: _check_value(v, extra, f"{where}[{k!r}]") for k, v in value.items()}
        return value
    raise ToolCallError(f"{where}: expected {kind}, got {json_type(value)} {value!r:.60}")


def json_type(value: Any) -> str:
    """The JSON type name of a decoded JSON value (``"integer"``, ``"string"``, ``"object"``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _convert(value: Any, annotation: Any) -> Any:
    """Turn checked JSON values into the annotated Python type where they differ (Enum, tuple, set)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _convert(value, typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation(value)
    if origin is tuple or annotation is tuple:
        return tuple(value)
    if origin in (set, frozenset) or annotation in (set, frozenset):
        return (origin or annotation)(value)
    return value


class FunctionTool:
    """A tool made from a plain typed Python function (see :func:`function_tool`).

    Attributes:
        name, description, parameters: as in :class:`Tool`.
        fn: the function.
        timeout_s: longest the call may run, seconds (None: the environment's ``tool_timeout_s``).
            A sync function that overruns keeps running in its worker thread; the model is told
            it timed out.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"a tool must be callable, got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", self.name):
            raise ConfigError(f"tool name {self.name!r} must be 1-64 letters, digits, '_', '.', '-'")
        doc_description, doc_params = parse_docstring(inspect.getdoc(fn))
        self.description = description if description is not None else doc_description
        self.timeout_s = timeout_s
        try:
            signature = inspect.signature(fn)
            hints = typing.get_type_hints(fn, include_extras=True)
        except (TypeError, ValueError, NameError) as exc:
            raise ConfigError(f"tool {self.name!r}: cannot read its signature: {exc}") from exc
        self._annotations: dict[str, Any] = {}
        properties: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ConfigError(f"tool {self.name!r}: *args/**kwargs have no schema; name every argument")
            if param.kind is param.POSITIONAL_ONLY:
                raise ConfigError(f"tool {self.name!r}: positional-only argument {pname!r} cannot be passed by name")
            annotation = hints.get(pname, inspect.Parameter.empty)
            try:
                prop = json_schema(annotation)
            except ConfigError as exc:
                raise ConfigError(f"tool {self.name!r}, argument {pname!r}: {exc}") from exc
            if pname in doc_params and "description" not in prop:
                prop["description"] = doc_params[pname]
            if param.default is param.empty:
                required.append(pname)
            elif _is_json(param.default):
                default = param.default.value if isinstance(param.default, enum.Enum) else param.default
                prop["default"] = list(default) if isinstance(default, tuple) else default
            self._annotations[pname] = annotation
            properties[pname] = prop
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"

    def schema(self) -> dict[str, Any]:
        return tool_schema(self.name, self.description, self.parameters)

    def bind(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the function, checked against the schema.

        Raises:
            ToolCallError: an unknown or missing argument, or a value of the wrong type.
        """
        props = self.parameters["properties"]
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise ToolCallError(f"{self.name}() got unknown argument(s) {unknown}; it takes {sorted(props) or 'none'}")
        missing = [p for p in self.parameters["required"] if p not in arguments]
        if missing:
            raise ToolCallError(f"{self.name}() is missing required argument(s) {missing}")
        return {
            k: _convert(_check_value(v, props[k], f"{self.name}() argument {k!r}"), self._annotations[k])
            for k, v in arguments.items()
        }

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        kwargs = self.bind(arguments)
        timeout_s = self.timeout_s if self.timeout_s is not None else ctx.limits.tool_timeout_s
        try:
            with anyio.fail_after(timeout_s):
                if inspect.iscoroutinefunction(self.fn):
                    value = await self.fn(**kwargs)
                else:
                    value = await anyio.to_thread.run_sync(lambda: self.fn(**kwargs), abandon_on_cancel=True)
                    if inspect.isawaitable(value):
                        value = await value
        except InfraError:
            raise
        except TimeoutError:
            return ToolOutput(f"TimeoutError: {self.name}() ran longer than {timeout_s:g} s", True, self.name)
        except Exception as exc:
            return ToolOutput(f"{type(exc).__name__}: {exc}", True, self.name)
        return ToolOutput("" if value is None else str(value), False, self.name)


def _is_json(value: Any) -> bool:
    if isinstance(value, enum.Enum):
        value = value.value
    return value is None or isinstance(value, (bool, int, float, str)) or (
        isinstance(value, (list, tuple)) and all(_is_json(v) for v in value)
    )


def function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Make a :class:`FunctionTool` from ``fn``; usable as ``@function_tool`` or
    ``@function_tool(name=..., timeout_s=...)``. A plain function in ``ToolEnv.tools`` is
    wrapped the same way, so the decorator is only needed to override these settings.

    Raises:
        ConfigError: the function's signature has no JSON schema (see the module docstring).
    """
    if fn is None:
        return lambda f: FunctionTool(f, name=name, description=description, timeout_s=timeout_s)
    return FunctionTool(fn, name=name, description=description, timeout_s=timeout_s)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """``obj`` if it is already a :class:`Tool`, else ``FunctionTool(obj)``."""
    if isinstance(obj, Tool):
        return obj
    return FunctionTool(obj)
