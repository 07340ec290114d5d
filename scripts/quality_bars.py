"""Print the code-quality figures the issue tracker holds the code to (tests/test_quality_bars.py asserts them).

- functions longer than :data:`MAX_FUNCTION_LINES` lines (outside tests), longest first;
- ``Any`` per 1,000 lines of ``dressage/`` and ``workers/`` (a name ``Any`` used in code, not in text);
- blind ``except Exception`` / ``except BaseException`` / bare ``except:`` handlers, each with whether
  it logs (a call on a logger, ``traceback``, or a re-raise) in its body.

Run: ``python scripts/quality_bars.py`` from the repository root.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dressage", "workers", "recipes")
MAX_FUNCTION_LINES = 80
MAX_ANY_PER_1000 = 12.0
BLIND = {"Exception", "BaseException"}


@dataclass(frozen=True)
class Function:
    """A function (or method) and its length in lines, decorators excluded."""

    path: str
    name: str
    lines: int


@dataclass(frozen=True)
class BlindExcept:
    """An ``except`` that catches everything: where, in which function, whether it re-raises (a
    translation at a seam) and whether its body reports what it caught."""

    path: str
    function: str
    line: int
    raises: bool
    logged: bool


def source_files(root: Path = ROOT) -> list[Path]:
    """Every ``.py`` file of the shipped packages (tests, scripts and benchmarks are not counted)."""
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def functions(root: Path = ROOT) -> list[Function]:
    """Every function with its length, longest first."""
    out: list[Function] = []
    for path in source_files(root):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                end = node.end_lineno or node.lineno
                out.append(Function(_rel(path, root), node.name, end - node.lineno + 1))
    return sorted(out, key=lambda f: -f.lines)


def any_per_1000(root: Path = ROOT) -> tuple[int, int]:
    """``(uses of the name Any, lines)`` over the shipped packages."""
    uses = lines = 0
    for path in source_files(root):
        text = path.read_text(encoding="utf-8")
        lines += len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Name) and node.id == "Any":
                uses += 1
            elif isinstance(node, ast.Attribute) and node.attr == "Any":
                uses += 1
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # string annotations ("dict[str, Any]") count as code
                uses += _annotation_anys(node.value)
    return uses, lines


def _annotation_anys(text: str) -> int:
    try:
        expr = ast.parse(text, mode="eval")
    except SyntaxError:
        return 0
    return sum(1 for n in ast.walk(expr) if isinstance(n, ast.Name) and n.id == "Any")


def _is_blind(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type
    if kinds is None:
        return True
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return any(isinstance(n, ast.Name) and n.id in BLIND for n in names)


def _logs(handler: ast.ExceptHandler) -> bool:
    """A logger call (``exception|error|warning|info|debug|critical``), a traceback written
    somewhere, a note printed on a console, the error handed to a future's waiter
    (``set_exception``), or a ``raise`` (the error goes on, translated, to a boundary that logs it)."""
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("traceback",):
                return True
            if node.func.attr in (
                "exception",
                "error",
                "warning",
                "info",
                "debug",
                "critical",
                "set_exception",
            ):
                return True
            if node.func.attr == "print" and "console" in ast.unparse(owner):
                return True
    return False


def blind_excepts(root: Path = ROOT) -> list[BlindExcept]:
    """Every handler catching everything, in file order."""
    out: list[BlindExcept] = []
    for path in source_files(root):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ExceptHandler) and _is_blind(node):
                    body = ast.Module(body=node.body, type_ignores=[])
                    raises = any(isinstance(n, ast.Raise) for n in ast.walk(body))
                    out.append(BlindExcept(_rel(path, root), fn.name, node.lineno, raises, _logs(node)))
    unique = {(b.path, b.line): b for b in out}  # a handler inside a nested function is seen twice
    return sorted(unique.values(), key=lambda b: (b.path, b.line))


def main() -> int:
    """Print the figures; exit 0 (the test decides what fails)."""
    long = [f for f in functions() if f.lines > MAX_FUNCTION_LINES]
    print(f"functions over {MAX_FUNCTION_LINES} lines: {len(long)}")
    for f in long:
        print(f"  {f.lines:4d}  {f.path}:{f.name}")
    uses, lines = any_per_1000()
    print(f"Any: {uses} uses in {lines} lines = {1000 * uses / max(lines, 1):.1f} per 1,000 lines")
    blind = blind_excepts()
    swallowed = [b for b in blind if not b.raises]
    print(
        f"blind excepts: {len(blind)} ({len(swallowed)} not re-raising, {sum(not b.logged for b in blind)} not logged)"
    )
    for b in blind:
        what = "re-raises" if b.raises else "swallows"
        print(f"  {b.path}:{b.line} {b.function}: {what}{'' if b.logged else ', NOT LOGGED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
