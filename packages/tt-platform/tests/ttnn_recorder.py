"""A stand-in ``ttnn`` for tests: it offers only the names in a surface table, binds every call to
the installed ttnn's real signature (so a wrong keyword or argument type fails here as it would on
hardware) and records the call order. Only the calls that need a device are faked."""

from __future__ import annotations

import ast
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


def resolve(module: Any, path: str) -> Any:
    """``resolve(ttnn, "cluster.ClusterType.TG")``; raises AttributeError naming the path."""
    obj = module
    for part in path.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"ttnn has no {path!r} (missing {part!r})")
        obj = getattr(obj, part)
    return obj


def _nb_signatures(obj: Any) -> list[inspect.Signature]:
    """nanobind functions publish ``def name(params) -> ret`` texts with ``\\N`` default
    placeholders in ``__nb_signature__``; parse each overload into an ``inspect.Signature``."""
    result = []
    for text, _doc, _defaults in obj.__nb_signature__:
        fn = ast.parse(re.sub(r"\\\d+", "...", text) + ": ...").body[0]
        assert isinstance(fn, ast.FunctionDef)
        a = fn.args

        def ann(node: ast.expr | None) -> Any:
            return inspect.Parameter.empty if node is None else ast.unparse(node)

        params: list[inspect.Parameter] = []
        positional = [(arg, inspect.Parameter.POSITIONAL_ONLY) for arg in a.posonlyargs]
        positional += [(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD) for arg in a.args]
        first_default = len(positional) - len(a.defaults)
        for i, (arg, kind) in enumerate(positional):
            default = ... if i >= first_default else inspect.Parameter.empty
            params.append(inspect.Parameter(arg.arg, kind, default=default, annotation=ann(arg.annotation)))
        if a.vararg:
            params.append(inspect.Parameter(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
        for arg, default_node in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            default = inspect.Parameter.empty if default_node is None else ...
            params.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=ann(arg.annotation)))
        if a.kwarg:
            params.append(inspect.Parameter(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
        result.append(inspect.Signature(params))
    return result


def real_signatures(obj: Any) -> list[inspect.Signature]:
    """The call signatures of a ttnn function, method or class (its constructor without
    ``self``), one per overload; raises TypeError when none can be introspected."""
    if isinstance(obj, type):
        init = obj.__init__
        sigs = _nb_signatures(init) if hasattr(init, "__nb_signature__") else [inspect.signature(init)]
        return [s.replace(parameters=list(s.parameters.values())[1:]) for s in sigs]
    if hasattr(obj, "__nb_signature__"):
        return _nb_signatures(obj)
    return [inspect.signature(obj)]


def accepts_keyword(sig: inspect.Signature, name: str) -> bool:
    param = sig.parameters.get(name)
    if param is not None:
        return param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def surface_problems(module: Any, surface: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Every surface entry that does not exist in ``module``, or passes a keyword that no
    overload of the real signature accepts."""
    problems = []
    for path, keywords in surface.items():
        try:
            obj = resolve(module, path)
        except AttributeError as exc:
            problems.append(str(exc))
            continue
        if not callable(obj) or isinstance(obj, enum.Enum):
            if keywords:
                problems.append(f"{path} is not callable but lists keywords {keywords}")
            continue
        try:
            sigs = real_signatures(obj)
        except (TypeError, ValueError) as exc:
            problems.append(f"{path}: no introspectable signature ({exc})")
            continue
        for kw in keywords:
            if not any(accepts_keyword(s, kw) for s in sigs):
                problems.append(f"{path} accepts no keyword {kw!r}: {[str(s) for s in sigs]}")
    return problems


def _annotation_types(module: Any, annotation: Any) -> tuple[type, ...] | None:
    """The classes an annotation allows, or None when it is absent or too generic to check."""
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        parts = []
        for text in annotation.split("|"):
            text = text.strip()
            if text == "None":
                parts.append(type(None))
            elif text in ("int", "str", "bool", "float"):
                parts.append({"int": int, "str": str, "bool": bool, "float": float}[text])
            elif re.fullmatch(r"ttnn(\.\w+)+", text):
                try:
                    parts.append(resolve(module, text.removeprefix("ttnn.")))
                except AttributeError:
                    return None
            else:
                return None
        return tuple(parts)
    if isinstance(annotation, type):
        return (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return args if all(isinstance(a, type) and typing.get_origin(a) is None for a in args) else None
    return None


def _type_ok(module: Any, annotation: Any, default: Any, value: Any) -> bool:
    allowed = _annotation_types(module, annotation)
    if allowed is None or (value is None and default is None):
        return True
    if isinstance(value, bool) and bool not in allowed:
        return False
    stands_for = getattr(value, "stands_for", None)
    return isinstance(value, allowed) or (isinstance(stands_for, type) and issubclass(stands_for, allowed))


def bind_real(module: Any, path: str, args: tuple[Any, ...], kwargs: dict[str, Any],
              self_obj: Any = None) -> dict[str, Any]:
    """Bind a call to the first real overload it fits (names and argument types);
    raises TypeError like the real binding would."""
    errors = []
    for sig in real_signatures(resolve(module, path)):
        call_args = (self_obj, *args) if self_obj is not None else args
        try:
            bound = sig.bind(*call_args, **kwargs)
        except TypeError as exc:
            errors.append(f"{sig}: {exc}")
            continue
        bad = [name for name, value in bound.arguments.items()
               if name != "self" and not _type_ok(module, sig.parameters[name].annotation,
                                                  sig.parameters[name].default, value)]
        if bad:
            errors.append(f"{sig}: wrong type for {bad}")
            continue
        return dict(bound.arguments)
    raise TypeError(f"ttnn.{path}{args}{kwargs} matches no real signature: {errors}")


@dataclass
class FakeCluster:
    """How the pretend machine behaves."""

    devices: int | Exception = 1
    cluster_type: str = "N150"
    submeshes: int = 0
    open_error: Exception | None = None
    close_error: Exception | None = None


@dataclass(repr=False)
class Stand:
    """An object the fake hands out where ttnn would hand out a device-backed one."""

    label: str
    stands_for: type

    def __repr__(self) -> str:
        return self.label


@dataclass(repr=False, eq=False)
class FakeMeshDevice(Stand):
    submeshes: list[FakeMeshDevice] = field(default_factory=list)
    recorder: Recorder | None = None

    def get_submeshes(self) -> list[FakeMeshDevice]:
        assert self.recorder is not None
        return self.recorder.call("MeshDevice.get_submeshes", (), {}, self_obj=self)


@dataclass
class Recorder:
    """Builds the fake module and keeps the calls made to it, in order."""

    real: Any
    surface: Mapping[str, tuple[str, ...]]
    cluster: FakeCluster
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def call(self, path: str, args: tuple[Any, ...], kwargs: dict[str, Any], self_obj: Any = None) -> Any:
        unlisted = sorted(set(kwargs) - set(self.surface[path]))
        if unlisted:
            raise TypeError(f"ttnn.{path} called with keywords {unlisted} missing from TTNN_SURFACE")
        bound = bind_real(self.real, path, args, kwargs, self_obj)
        self.calls.append((path, {k: _plain(v) for k, v in bound.items()}))
        return self._result(path, bound)

    def _result(self, path: str, bound: dict[str, Any]) -> Any:
        c = self.cluster
        if path == "get_num_devices":
            if isinstance(c.devices, Exception):
                raise c.devices
            return c.devices
        if path == "cluster.get_cluster_type":
            return self.real.cluster.ClusterType[c.cluster_type]
        if path == "MeshShape":
            return self.real.MeshShape(*bound.values())
        if path == "DispatchCoreConfig":
            text = ", ".join(f"{k}={_plain(v)}" for k, v in bound.items())
            return Stand(f"DispatchCoreConfig({text})", self.real.DispatchCoreConfig)
        if path == "open_mesh_device":
            if c.open_error is not None:
                raise c.open_error
            subs = [FakeMeshDevice(f"submesh{i}", self.real.MeshDevice, recorder=self) for i in range(c.submeshes)]
            return FakeMeshDevice("mesh", self.real.MeshDevice, subs, self)
        if path == "MeshDevice.get_submeshes":
            return bound["self"].submeshes
        if path == "close_mesh_device":
            if c.close_error is not None:
                raise c.close_error
            return None
        if path == "set_fabric_config":
            return None
        raise NotImplementedError(f"the recorder has no behaviour for ttnn.{path}; add one")

    def module(self) -> types.ModuleType:
        """A module holding only the surface names: enums are the real ones, callables record."""
        fake = types.ModuleType("ttnn")
        for path in self.surface:
            if path.startswith("MeshDevice."):
                continue
            obj = resolve(self.real, path)
            if isinstance(obj, enum.Enum):
                path, obj = path.rsplit(".", 1)[0], type(obj)
            elif not (isinstance(obj, type) and issubclass(obj, enum.Enum)):
                obj = self._stub(path)
            _place(fake, path, obj)
        return fake

    def _stub(self, path: str) -> Callable[..., Any]:
        def stub(*args: Any, **kwargs: Any) -> Any:
            return self.call(path, args, kwargs)

        return stub


def _place(root: Any, path: str, obj: Any) -> None:
    *parents, last = path.split(".")
    node = root
    for part in parents:
        if not hasattr(node, part):
            setattr(node, part, types.SimpleNamespace())
        node = getattr(node, part)
    setattr(node, last, obj)


def _plain(value: Any) -> Any:
    """Readable form for call tables: enum member names, labels, mesh shapes as text."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Stand):
        return value.label
    if type(value).__name__ == "MeshShape":
        return repr(value)
    return value
