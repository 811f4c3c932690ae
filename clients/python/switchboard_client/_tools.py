"""Client tools: a Python function (or a ready tool dict) as a tool declaration, its JSON schema
from type hints, and the call of the function with a call's arguments."""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import re
import sys
import types
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar, Union

from ._context import ToolCallContext, context_parameter

_BaseModel: Any
try:  # pydantic is optional
    from pydantic import BaseModel as _BaseModel
except ImportError:  # pragma: no cover - exercised without pydantic
    _BaseModel = None

_UnionType: Any = getattr(types, "UnionType", None)  # X | Y (3.10+)

_OPTION_KEYS = ("concurrency_safe", "access", "timeout_ms", "output_cap", "defer", "effect")
#: The values of a client tool's ``defer`` option: ``never`` (always in the model's context),
#: ``auto`` (the server's default: deferred when the session's catalog is large), ``always``
#: (left out of the model's context until ``tool_search`` finds it).
DEFER_VALUES = ("never", "auto", "always")
#: The values of a client tool's ``effect`` option, what running a call twice would do:
#: ``read_only`` (changes nothing), ``idempotent`` (a second run leaves the same state as one),
#: ``side_effect`` (anything else; the server's default). With a call journal, a call cut off by
#: a crash runs again when re-sent unless it is ``side_effect``: that one is answered
#: ``outcome_unknown``.
EFFECT_VALUES = ("read_only", "idempotent", "side_effect")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _is_model(tp: Any) -> bool:
    return _BaseModel is not None and isinstance(tp, type) and issubclass(tp, _BaseModel)


class _Defs:
    """Collects the ``$defs`` of pydantic schemas used as parameter types into the root."""

    def __init__(self) -> None:
        self.defs: Dict[str, Any] = {}

    def model(self, tp: Any) -> Dict[str, Any]:
        schema = dict(tp.model_json_schema())
        self.defs.update(schema.pop("$defs", {}))
        return schema


def type_schema(tp: Any, defs: Optional[_Defs] = None) -> Dict[str, Any]:
    """The JSON schema of a type hint: str, int, float, bool, None, list/sequence/set/tuple,
    dict/mapping, Optional/Union, Literal, Enum, Annotated (a str annotation is the
    description), pydantic models, dataclasses; ``Any`` or no hint is ``{}``."""
    defs = defs if defs is not None else _Defs()
    if tp is inspect.Parameter.empty or tp is Any or tp is object:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        schema = type_schema(args[0], defs)
        for extra in args[1:]:
            if isinstance(extra, str):
                schema = dict(schema, description=extra)
        return schema
    if origin is Union or (_UnionType is not None and origin is _UnionType):
        options = [a for a in args if a is not type(None)]
        nullable = len(options) < len(args)
        if len(options) == 1:
            inner = type_schema(options[0], defs)
            if not nullable:
                return inner
            t = inner.get("type")
            if isinstance(t, str) and set(inner) <= {"type", "description", "items",
                                                       "additionalProperties", "enum"} \
                    and "enum" not in inner:
                return dict(inner, type=[t, "null"])
            return {"anyOf": [inner, {"type": "null"}]}
        schemas = [type_schema(a, defs) for a in options]
        if nullable:
            schemas.append({"type": "null"})
        return {"anyOf": schemas}
    if origin is typing.Literal:
        return _enum_schema([a.value if isinstance(a, enum.Enum) else a for a in args])
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_schema([m.value for m in tp])
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if _is_model(tp):
        return defs.model(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _object_schema(tp, defs)
    container = origin or tp
    if container in (list, set, frozenset, tuple) or _subclass(container, (List, typing.Sequence,
                                                                            typing.AbstractSet)):
        if container is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return {"type": "array", "prefixItems": [type_schema(a, defs) for a in args],
                    "minItems": len(args), "maxItems": len(args)}
        array: Dict[str, Any] = {"type": "array"}
        if args:
            array["items"] = type_schema(args[0], defs)
        return array
    if container is dict or _subclass(container, (Dict, typing.Mapping)):
        obj: Dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            obj["additionalProperties"] = type_schema(args[1], defs)
        return obj
    if _is_typeddict(tp):
        return _object_schema(tp, defs)
    return {}


def _enum_schema(values: List[Any]) -> Dict[str, Any]:
    kinds = {_json_type(v) for v in values}
    if len(kinds) == 1 and None not in kinds:
        return {"type": kinds.pop(), "enum": values}
    return {"enum": values}


def _subclass(tp: Any, bases: Tuple[Any, ...]) -> bool:
    try:
        import collections.abc as abc
        mapping = {List: list, typing.Sequence: abc.Sequence, typing.AbstractSet: abc.Set,
                   Dict: dict, typing.Mapping: abc.Mapping}
        real = tuple(mapping.get(b, b) for b in bases)
        return isinstance(tp, type) and issubclass(tp, real) and tp is not str \
            and tp is not bytes
    except TypeError:
        return False


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__annotations__") \
        and hasattr(tp, "__total__")


def _object_schema(tp: Any, defs: _Defs) -> Dict[str, Any]:
    hints = typing.get_type_hints(tp, include_extras=True)
    props = {k: type_schema(v, defs) for k, v in hints.items()}
    required: List[str] = []
    if dataclasses.is_dataclass(tp):
        for f in dataclasses.fields(tp):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
    else:
        required = sorted(getattr(tp, "__required_keys__", hints))
    schema: Dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    return schema


def _json_type(v: Any) -> Optional[str]:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return None


_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:\s*$")
_OTHER_SECTION = re.compile(r"^\s*(Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*\*{0,2}([A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: Optional[str]) -> Tuple[str, Dict[str, str]]:
    """The description (the docstring up to a Google-style ``Args:`` section) and each
    argument's description from that section."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: List[str] = []
    params: Dict[str, str] = {}
    i = 0
    while i < len(lines) and not _SECTION.match(lines[i]):
        description.append(lines[i])
        i += 1
    current = None
    for line in lines[i + 1:] if i < len(lines) else []:
        if _OTHER_SECTION.match(line):
            break
        m = _ARG_LINE.match(line)
        if m and (len(line) - len(line.lstrip())) <= 8:
            current = m.group(1)
            params[current] = m.group(3).strip()
        elif current and line.strip():
            params[current] = (params[current] + " " + line.strip()).strip()
    text = "\n".join(description).strip()
    # Drop trailing Returns/Raises sections from the description.
    out: List[str] = []
    for line in text.splitlines():
        if _OTHER_SECTION.match(line):
            break
        out.append(line)
    return "\n".join(out).strip(), params


class ToolEntry:
    """One client tool: its declaration (``spec``, sent to the server) and its function."""

    __slots__ = ("name", "spec", "fn", "is_async", "model", "converters", "context_param")

    def __init__(self, name: str, spec: Dict[str, Any], fn: Optional[Callable[..., Any]],
                 model: Any = None, converters: Optional[Dict[str, Callable[[Any], Any]]] = None):
        self.name = name
        self.spec = spec
        self.fn = fn
        self.is_async = fn is not None and _is_coroutine_function(fn)
        self.model = model  # a pydantic model: called with the whole input validated into it
        self.converters = converters or {}
        # The parameter annotated ToolCallContext, which gets the call's context.
        self.context_param = context_parameter(fn) if fn is not None else None

    def arguments(self, input: Any, context: Optional[ToolCallContext] = None
                  ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """The positional and keyword arguments of a call with ``input`` (and ``context``,
        for a function with a parameter annotated :class:`ToolCallContext`)."""
        if self.model is not None:
            args: Tuple[Any, ...] = (self.model.model_validate(input or {}),)
            kwargs: Dict[str, Any] = {}
        else:
            args = ()
            kwargs = dict(input or {})
            for key, convert in self.converters.items():
                if key in kwargs:
                    kwargs[key] = convert(kwargs[key])
        if self.context_param is not None:
            kwargs[self.context_param] = context
        return args, kwargs


def _is_coroutine_function(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))


def _converter(tp: Any) -> Optional[Callable[[Any], Any]]:
    """How a JSON argument becomes the declared type, for the types JSON cannot carry."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _converter(typing.get_args(tp)[0])
    if origin is Union or (_UnionType is not None and origin is _UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1:
            inner = _converter(options[0])
            if inner is not None:
                convert = inner
                return lambda v: None if v is None else convert(v)
        return None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    if _is_model(tp):
        return tp.model_validate
    if origin in (list, List) and typing.get_args(tp):
        inner = _converter(typing.get_args(tp)[0])
        if inner is not None:
            item = inner
            return lambda v: [item(x) for x in v]
    if tp is tuple or origin is tuple:
        return tuple
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return lambda v: tp(**v)
    return None


def check_defer(defer: Any) -> None:
    """Raises ValueError unless ``defer`` is None or one of :data:`DEFER_VALUES`."""
    if defer is not None and not (isinstance(defer, str) and defer in DEFER_VALUES):
        raise ValueError(f"defer must be 'never', 'auto' or 'always' (or None for the server's "
                         f"default, 'auto'), not {defer!r}")


def check_effect(effect: Any) -> None:
    """Raises ValueError unless ``effect`` is None or one of :data:`EFFECT_VALUES`."""
    if effect is not None and not (isinstance(effect, str) and effect in EFFECT_VALUES):
        raise ValueError(f"effect must be 'read_only', 'idempotent' or 'side_effect' (or None "
                         f"for the server's default, 'side_effect'), not {effect!r}")


def _defer_loading_conflict(spec: Mapping[str, Any], defer: str) -> bool:
    """Whether a tool dict's own ``defer_loading`` says otherwise than ``defer`` (the server
    refuses a tool whose two marks disagree)."""
    loading = spec.get("defer_loading")
    if not isinstance(loading, bool):
        return False
    return defer != ("always" if loading else "never")


def with_options(spec: Dict[str, Any], concurrency_safe: Optional[bool], access: Any,
                 timeout_ms: Optional[int], output_cap: Optional[int],
                 defer: Optional[str] = None, effect: Optional[str] = None) -> Dict[str, Any]:
    check_defer(defer)
    check_effect(effect)
    if defer is not None and _defer_loading_conflict(spec, defer):
        raise ValueError(f"tool {spec_name(spec)!r}: defer={defer!r} disagrees with its "
                         f"defer_loading={spec['defer_loading']!r} (defer_loading true is "
                         "defer 'always', false is 'never'); give one")
    if concurrency_safe:
        spec["concurrency_safe"] = True
    if access is not None:
        spec["access"] = access
    if timeout_ms is not None:
        spec["timeout_ms"] = int(timeout_ms)
    if output_cap is not None:
        spec["output_cap"] = int(output_cap)
    if defer is not None:
        spec["defer"] = defer
    if effect is not None:
        spec["effect"] = effect
    return spec


def spec_name(spec: Mapping[str, Any]) -> str:
    """The name of a ready tool dict, Anthropic or OpenAI shape."""
    if spec.get("type") == "function" and isinstance(spec.get("function"), Mapping):
        return spec["function"]["name"]
    if "name" in spec:
        return spec["name"]
    raise ValueError(f"a tool dict needs a `name` (Anthropic shape) or `function.name` "
                     f"(OpenAI shape): {dict(spec)!r}")


def _is_tool_dict(schema: Mapping[str, Any]) -> bool:
    return ("input_schema" in schema and "name" in schema) or (
        schema.get("type") == "function" and isinstance(schema.get("function"), Mapping))


def tool_entry(fn: Optional[Callable[..., Any]] = None, schema: Optional[Mapping[str, Any]] = None,
               *, name: Optional[str] = None, description: Optional[str] = None,
               concurrency_safe: bool = False, access: Any = None,
               timeout_ms: Optional[int] = None, output_cap: Optional[int] = None,
               defer: Optional[str] = None, effect: Optional[str] = None) -> ToolEntry:
    """The declaration of a client tool. ``schema`` is the input JSON schema or a complete tool
    dict (Anthropic or OpenAI shape, kept as it is, ``defer_loading`` included, but for the
    options given); without it the schema comes from ``fn``'s type hints and the description
    from its docstring. ``defer`` is ``"never"``, ``"auto"`` or ``"always"`` (None: not sent,
    the server's ``auto``); ``effect`` is ``"read_only"``, ``"idempotent"`` or
    ``"side_effect"`` (None: not sent, the server's ``side_effect``)."""
    check_defer(defer)
    check_effect(effect)
    if fn is None and schema is None:
        raise ValueError("a client tool needs a function or a schema")
    if fn is not None and not callable(fn):
        raise TypeError(f"a client tool's function must be callable, not {fn!r}")
    if schema is not None and _is_tool_dict(schema):
        spec = dict(schema)
        if spec.get("type") == "function":
            spec["function"] = dict(spec["function"])
            inner = spec["function"]
            if name is not None:
                inner["name"] = name
            if description is not None:
                inner["description"] = description
        else:
            if name is not None:
                spec["name"] = name
            if description is not None:
                spec["description"] = description
        spec = with_options(spec, concurrency_safe, access, timeout_ms, output_cap, defer,
                            effect)
        return ToolEntry(spec_name(spec), spec, fn)
    tool_name = name or (getattr(fn, "__name__", None) if fn is not None else None)
    if not tool_name or tool_name == "<lambda>":
        raise ValueError("a client tool needs a name: pass name=...")
    if not _NAME.match(tool_name):
        raise ValueError(f"tool name {tool_name!r} must match ^[A-Za-z0-9_-]{{1,64}}$")
    doc_description, arg_docs = parse_docstring(inspect.getdoc(fn) if fn is not None else None)
    model = None
    converters: Dict[str, Callable[[Any], Any]] = {}
    if schema is not None:
        input_schema = dict(schema)
    else:
        assert fn is not None
        input_schema, model, converters = function_schema(fn, arg_docs)
    spec = {"name": tool_name, "description": description if description is not None
            else (doc_description or tool_name),
            "input_schema": input_schema}
    spec = with_options(spec, concurrency_safe, access, timeout_ms, output_cap, defer, effect)
    return ToolEntry(tool_name, spec, fn, model, converters)


def function_schema(fn: Callable[..., Any], arg_docs: Optional[Dict[str, str]] = None
                    ) -> Tuple[Dict[str, Any], Any, Dict[str, Callable[[Any], Any]]]:
    """The input schema of ``fn`` from its signature: each parameter a property (a default
    makes it optional), or the whole schema of a single pydantic model parameter. A parameter
    annotated :class:`ToolCallContext` is not part of it (it gets the call's context)."""
    arg_docs = arg_docs or {}
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        hints = {p.name: p.annotation for p in sig.parameters.values()}
    context = context_parameter(fn)
    params = [p for p in sig.parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != context]
    var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    if len(params) == 1 and _is_model(hints.get(params[0].name)) \
            and params[0].kind != params[0].KEYWORD_ONLY:
        model = hints[params[0].name]
        return dict(model.model_json_schema()), model, {}
    defs = _Defs()
    props: Dict[str, Any] = {}
    required: List[str] = []
    converters: Dict[str, Callable[[Any], Any]] = {}
    for p in params:
        if p.kind == p.POSITIONAL_ONLY:
            raise TypeError(f"{fn.__name__}: positional-only parameter {p.name!r} cannot be "
                            "given by name")
        tp = hints.get(p.name, inspect.Parameter.empty)
        prop = dict(type_schema(tp, defs))
        if p.name in arg_docs and "description" not in prop:
            prop["description"] = arg_docs[p.name]
        if p.default is not inspect.Parameter.empty:
            try:
                json.dumps(p.default)
                if p.default is not None:
                    prop["default"] = p.default.value if isinstance(p.default, enum.Enum) \
                        else p.default
            except (TypeError, ValueError):
                pass
        else:
            required.append(p.name)
        props[p.name] = prop
        convert = _converter(tp)
        if convert is not None:
            converters[p.name] = convert
    schema: Dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    if not var_kw:
        schema["additionalProperties"] = False
    if defs.defs:
        schema["$defs"] = defs.defs
    return schema, None, converters


def tool_spec(fn: Callable[..., Any], schema: Optional[Mapping[str, Any]] = None, *,
              name: Optional[str] = None, description: Optional[str] = None,
              concurrency_safe: bool = False, access: Any = None,
              timeout_ms: Optional[int] = None, output_cap: Optional[int] = None,
              defer: Optional[str] = None, effect: Optional[str] = None) -> Dict[str, Any]:
    """The tool declaration (Anthropic shape, with the client-tool options) that
    ``session.register`` would send for ``fn``."""
    return tool_entry(fn, schema, name=name, description=description,
                      concurrency_safe=concurrency_safe, access=access, timeout_ms=timeout_ms,
                      output_cap=output_cap, defer=defer, effect=effect).spec


class ToolRegistry:
    """A session's client tools, in declaration order."""

    def __init__(self) -> None:
        self.entries: Dict[str, ToolEntry] = {}

    def add(self, entry: ToolEntry) -> None:
        if entry.name in self.entries:
            raise ValueError(f"client tool {entry.name!r} is registered twice")
        self.entries[entry.name] = entry

    def add_any(self, tool: Any) -> None:
        """A Python callable, or a ready tool dict (Anthropic or OpenAI shape)."""
        if isinstance(tool, Mapping):
            spec = dict(tool)
            self.add(ToolEntry(spec_name(spec), spec, None))
        elif callable(tool):
            self.add(tool_entry(tool))
        else:
            raise TypeError(f"a client tool is a function or a tool dict, not {tool!r}")

    def specs(self) -> List[Dict[str, Any]]:
        return [e.spec for e in self.entries.values()]

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def get(self, name: str) -> Optional[ToolEntry]:
        return self.entries.get(name)


def no_function(name: str) -> str:
    return (f"SwitchboardError: client tool {name!r} has no Python function in this session "
            "(it was declared as a dict); register one with session.register(fn, schema=...)")


F = TypeVar("F", bound=Callable[..., Any])


class SessionTools:
    """The client-tool side of a session, the same for :class:`Session` and
    :class:`AsyncSession`: declaring tools, and which entry answers a call. The session says
    when its tools are fixed (``_tools_fixed``: the server session exists or is being made)."""

    def __init__(self, tools: Optional[List[Any]] = None) -> None:
        self._registry = ToolRegistry()
        for t in tools or ():
            self._registry.add_any(t)

    def _tools_fixed(self) -> bool:
        raise NotImplementedError

    def _check_open_for_tools(self) -> None:
        if self._tools_fixed():
            raise RuntimeError(
                "client tools must be registered before the session is first used: the server "
                "fixes a session's client tools when it creates it (on the first dispatch, "
                "start, info or tools call). Register them first, or open a new session.")

    @typing.overload
    def tool(self, fn: F) -> F: ...

    @typing.overload
    def tool(self, fn: None = None, *, name: Optional[str] = None,
             description: Optional[str] = None, concurrency_safe: bool = False,
             access: Any = None, timeout_ms: Optional[int] = None,
             output_cap: Optional[int] = None, defer: Optional[str] = None,
             effect: Optional[str] = None) -> Callable[[F], F]: ...

    def tool(self, fn: Any = None, *, name: Optional[str] = None,
             description: Optional[str] = None, concurrency_safe: bool = False,
             access: Any = None, timeout_ms: Optional[int] = None,
             output_cap: Optional[int] = None, defer: Optional[str] = None,
             effect: Optional[str] = None) -> Any:
        """Decorator: ``@session.tool`` or ``@session.tool(name=..., ...)`` registers the
        function as a client tool and returns it unchanged."""
        check_defer(defer)
        check_effect(effect)

        def decorate(f: F) -> F:
            self.register(f, name=name, description=description,
                          concurrency_safe=concurrency_safe, access=access,
                          timeout_ms=timeout_ms, output_cap=output_cap, defer=defer,
                          effect=effect)
            return f
        return decorate(fn) if fn is not None else decorate

    def register(self, fn: Optional[Callable[..., Any]], schema: Optional[Dict[str, Any]] = None,
                 *, name: Optional[str] = None, description: Optional[str] = None,
                 concurrency_safe: bool = False, access: Any = None,
                 timeout_ms: Optional[int] = None, output_cap: Optional[int] = None,
                 defer: Optional[str] = None, effect: Optional[str] = None) -> Dict[str, Any]:
        """Registers a client tool: ``fn`` is called with the call's arguments as keywords.
        With :class:`Session`, in a worker thread (a coroutine function on an event loop of
        its own thread); with :class:`AsyncSession`, a coroutine function runs as a task on
        the loop, a plain function in a worker thread. ``schema`` is its input schema or a
        whole tool dict; by default the schema comes from the type hints and the description
        from the docstring. ``defer``: ``"always"`` leaves the tool out of the model's context
        until the engine's ``tool_search`` finds it, ``"never"`` keeps it in, ``"auto"`` (the
        server's default when not given) defers it when the session's catalog is large.
        ``effect``: what running a call twice would do — ``"read_only"``, ``"idempotent"`` or
        ``"side_effect"`` (the server's default when not given); with a call journal, a call
        cut off by a crash runs again when re-sent unless it is ``"side_effect"``, which is
        answered ``outcome_unknown``. Returns the declaration."""
        self._check_open_for_tools()
        entry = tool_entry(fn, schema, name=name, description=description,
                           concurrency_safe=concurrency_safe, access=access,
                           timeout_ms=timeout_ms, output_cap=output_cap, defer=defer,
                           effect=effect)
        self._registry.add(entry)
        return entry.spec

    @property
    def client_tools(self) -> List[Dict[str, Any]]:
        """The declarations of this session's client tools."""
        return self._registry.specs()

    def _streams(self, names: Optional[List[str]]) -> bool:
        """Whether a dispatch calling ``names`` (``None``: unknown) must stream, because it
        may call a client tool whose calls come on the stream."""
        return bool(self._registry) and (names is None or any(n in self._registry
                                                              for n in names))

    def _call_entry(self, call: Dict[str, Any]) -> Tuple[Optional[ToolEntry], str]:
        """The entry that runs ``call``, or None and the error text to answer it with."""
        name = call.get("name", "")
        entry = self._registry.get(name)
        if entry is None or entry.fn is None:
            return None, no_function(name)
        return entry, ""


if sys.version_info < (3, 9):  # pragma: no cover
    raise ImportError("switchboard_client needs Python 3.9 or newer")
