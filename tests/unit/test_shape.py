"""The code's shape, checked (docs/architecture.md): no file in src over 800 lines, no function over 80, and no
import inside a function or under ``TYPE_CHECKING`` but for a heavy dependency only some commands need, named
here with why; and no SQL in ``services/`` nor ``control/``: every query is a function of ``store/``.

Migrations are left out (each is one upgrade and one downgrade, written once and never edited). A CLI command's
Typer option list counts one line a parameter, however many lines its help text takes. An exception below that
is no longer needed fails the test too, so the lists only shrink."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dlcloud"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80

# functions still over the limit: (path below src/dlcloud, name) -> why
LONG_FUNCTIONS: dict[tuple[str, str], str] = {}

# modules (and their submodules) a function may import lazily, with the reason
LAZY_IMPORTS: dict[str, str] = {
    "alembic": "migrations: about a second to import, needed only when the schema is upgraded",
    "boto3": "S3 client: only with an s3:// store",
    "botocore": "S3 client: only with an s3:// store",
    "s3transfer": "S3 client: only with an s3:// store",
    "optuna": "tuning: a heavy import only the study driver needs",
    "plotext": "terminal charts: only `jobs metrics --plot`",
    "pynvml": "NVIDIA management library: only where GPUs are probed",
    "tensorboard": "event-file reading: a heavy import only the ingester needs",
    "torch": "PyTorch: only the template trainer's PyTorch paths",
    "yaml": "YAML: only a model directory with a YAML sidecar",
    "dlcloud.reporter": "`import dlcloud` in a job must not load the reporter's HTTP client before the first report",
    "dlcloud.server": "`dlcloud up` only: FastAPI, uvicorn and SQLAlchemy would slow every other CLI command",
    "dlcloud.serving.server": "`dlcloud serve` only: NumPy and the model loaders",
    "dlcloud.serving.config": "`dlcloud serve` only: NumPy and the model loaders",
    "dlcloud.templates.networks": "the template trainer's networks import torch",
}

# what services/ and control/ may import of SQLAlchemy: (module, name); every name of sqlalchemy.exc
SQL_TYPES_ALLOWED = {
    ("sqlalchemy.orm", "Session"),
    ("sqlalchemy", "Connection"),
    ("sqlalchemy.engine", "Connection"),
    ("sqlalchemy", "Engine"),
    ("sqlalchemy.engine", "Engine"),
}
SQL_LAYERS = ("services/", "control/")


def _sources() -> Iterator[tuple[str, ast.Module, str]]:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("store/migrations/"):
            continue
        text = path.read_text()
        yield rel, ast.parse(text), text


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        base = ("." * node.level) + (node.module or "")
        return [f"{base}.{alias.name}" for alias in node.names]  # a module or a name of one: both are matched
    return [alias.name for alias in node.names]


def _lazy_reason(module: str) -> str | None:
    for allowed in LAZY_IMPORTS:
        if module == allowed or module.startswith(allowed + "."):
            return allowed
    return None


def _length(f: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Its lines; a Typer command's signature one line a parameter (its help texts are data, not logic)."""
    end = f.end_lineno or f.lineno
    params = [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs]
    defaults = [*f.args.defaults, *f.args.kw_defaults]
    typer = any(isinstance(d, ast.Call) and ast.unparse(d.func).endswith(("Option", "Argument")) for d in defaults)
    if typer and f.body:
        return 1 + len(params) + (end - f.body[0].lineno + 1)
    return end - f.lineno + 1


def test_no_file_is_over_800_lines() -> None:
    long = {rel: text.count("\n") for rel, _, text in _sources() if text.count("\n") > MAX_FILE_LINES}
    assert long == {}, f"split these files (at most {MAX_FILE_LINES} lines): {long}"


def test_no_function_is_over_80_lines() -> None:
    long: dict[tuple[str, str], int] = {}
    for rel, tree, _ in _sources():
        for f in _functions(tree):
            lines = _length(f)
            if lines > MAX_FUNCTION_LINES:
                long[(rel, f.name)] = lines
    assert set(long) - set(LONG_FUNCTIONS) == set(), (
        f"split these functions (at most {MAX_FUNCTION_LINES} lines): {long}"
    )
    assert set(LONG_FUNCTIONS) - set(long) == set(), "these are no longer over the limit: drop them from LONG_FUNCTIONS"


def test_imports_inside_functions_are_only_heavy_optional_dependencies() -> None:
    found: set[str] = set()
    wrong: list[str] = []
    for rel, tree, _ in _sources():
        lazy: list[tuple[ast.Import | ast.ImportFrom, str]] = []
        for f in _functions(tree):
            lazy += [(n, f.name) for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)]
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                lazy += [(n, "TYPE_CHECKING") for n in node.body if isinstance(n, ast.Import | ast.ImportFrom)]
        for node, where in lazy:
            for module in _imported(node):
                allowed = _lazy_reason(module)
                if allowed is not None:
                    found.add(allowed)
                else:
                    wrong.append(f"{rel}:{node.lineno} ({where}) imports {module}")
    assert wrong == [], "import these at module level (untie the cycle if there is one):\n" + "\n".join(wrong)
    assert set(LAZY_IMPORTS) - found == set(), "no longer imported lazily: drop them from LAZY_IMPORTS"


def test_services_and_control_hold_no_sql() -> None:
    """Services and control-plane loops reach the database through ``store/`` functions only: they import none
    of SQLAlchemy's statement builders and helpers (``select``, ``insert``, ``update``, ``delete``, ``text``,
    ``func``, ``and_``, ``or_``, ``exists``, ``flag_modified``, ...) and call no ``.execute``.

    Allowed: the types a transaction is passed around as (``Session``; the Core ``Connection`` of the hot reads
    that skip the ORM; ``Engine``), which a service opens and hands to the store, and every exception of
    ``sqlalchemy.exc``: a service catches ``IntegrityError`` when a concurrent request won a race, and leadership
    tells a lock timeout (``OperationalError``) from a lost session (``SQLAlchemyError``). Those are how a caller
    uses the store's functions, not queries of its own."""
    wrong: list[str] = []
    for rel, tree, _ in _sources():
        if not rel.startswith(SQL_LAYERS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wrong += [
                    f"{rel}:{node.lineno} imports {a.name}" for a in node.names if a.name.startswith("sqlalchemy")
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
                module = node.module or ""
                if module == "sqlalchemy.exc" or module.startswith("sqlalchemy.exc."):
                    continue
                refused = [a.name for a in node.names if (module, a.name) not in SQL_TYPES_ALLOWED]
                wrong += [f"{rel}:{node.lineno} imports {module}.{name}" for name in refused]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "execute":
                wrong.append(f"{rel}:{node.lineno} calls {ast.unparse(node.func)}(...)")
    assert wrong == [], "move these queries into a store/ function:\n" + "\n".join(wrong)
