"""Rules for mok's Python code around the fast path: mok.fast keeps no ctypes table, no code does pointer arithmetic on
data_ptr(), and nothing outside mok.reference imports its private modules (its __init__ is the way in)."""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python_files(*dirs):
    for d in dirs:
        yield from sorted((ROOT / d).rglob("*.py"))


def _code(text: str) -> str:
    """Python source as its tokens joined without spaces, comments dropped and string literals blanked,
    so prose and docstrings never match and spacing does not matter."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            continue
        out.append('""' if tok.type == tokenize.STRING else tok.string)
    return "".join(out)


def test_no_ctypes_in_the_fast_path():
    """The kernels are reached through the typed binding only: no ctypes table, struct or load left in mok.fast."""
    bad = [str(p.relative_to(ROOT)) for p in _python_files("mok/fast") if "ctypes" in _code(p.read_text())]
    assert not bad, f"ctypes in {bad}"


_PTR_ARITH = re.compile(r"data_ptr\(\)[-+]|[-+][\w.\[\]()]*\.data_ptr\(")


@pytest.mark.parametrize("snippet, hit", [
    ("p = t.data_ptr() + 4 * off", True),           # base + byte offset
    ("p = off * 2 + t.data_ptr()", True),           # offset + base
    ("p = 2 + int(t.data_ptr())", True),            # through a cast
    ("p = ctypes.c_void_p(t.data_ptr())", False),   # a base pointer, passed as is
    ("s = 'data_ptr() + 4'  # data_ptr() + 4", False),  # prose in a string and a comment
])
def test_pointer_arithmetic_pattern(snippet, hit):
    assert bool(_PTR_ARITH.search(_code(snippet + "\n"))) == hit


def test_no_pointer_arithmetic_in_python():
    """Python passes tensors and element offsets; addresses are computed by the kernels."""
    bad = [str(p.relative_to(ROOT)) for p in _python_files("mok") if _PTR_ARITH.search(_code(p.read_text()))]
    assert not bad, f"data_ptr() arithmetic in {bad}"


# White-box tests that may import a private reference module, with the reason.
_PRIVATE_IMPORT_ALLOWED = {"tests/reference/test_exact.py": "patches the chunk size of the private matmul_exact module",
                           "tests/reference/test_exact_trees.py": "patches the same chunk size"}


_PRIVATE = re.compile(r"mok\.reference\._\w+")


def _private_reference_imports(path: Path, root: Path = ROOT) -> list[str]:
    """Imports of mok.reference._x (absolute, or relative from inside mok) in `path` under `root`."""
    rel = path.relative_to(root)
    package = list(rel.parent.parts) if rel.parts[0] == "mok" else []
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (node.module or "").split(".") if node.module else []
            if node.level:
                base = package[: len(package) - (node.level - 1)] + base
            module = ".".join(base)  # the module itself is private, or names a private submodule of it
            names = [module] if _PRIVATE.match(module) else [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        found += [n for n in names if _PRIVATE.match(n)]
    return found


@pytest.mark.parametrize("path, expected", [
    ("mok/fast/_x.py", "from ..reference._exact import tree_sum"),   # relative, into a private module
    ("mok/nn/_x.py", "from ..reference import _layer"),               # relative, a private module by name
    ("tools/x.py", "import mok.reference._comm"),                     # absolute
])
def test_private_import_detector(tmp_path, path, expected):
    f = tmp_path / path
    f.parent.mkdir(parents=True)
    f.write_text(expected + "\nfrom ..reference import tree_sum\n")  # the second import is public: fine
    assert len(_private_reference_imports(f, tmp_path)) == 1, expected


def test_no_private_reference_imports_outside_the_reference():
    """mok.reference's public API (its __init__) is the only way in for the rest of mok and its users."""
    bad = {}
    for p in _python_files("mok", "tests", "examples", "benchmarks", "tools"):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith("mok/reference/") or rel in _PRIVATE_IMPORT_ALLOWED:
            continue
        if hits := _private_reference_imports(p):
            bad[rel] = hits
    assert not bad, f"private mok.reference modules imported: {bad}"


def test_allowed_private_imports_are_still_needed():
    """An exception that is no longer used is removed from the list."""
    for rel in _PRIVATE_IMPORT_ALLOWED:
        assert _private_reference_imports(ROOT / rel), f"{rel} no longer imports a private module: drop it"
