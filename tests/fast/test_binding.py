"""One binding (CPU only, no GPU, nothing built): the ctypes table of mok.fast._lib matches the C ABI
header csrc/mok_fast.h function by function, field by field and value by value, and Python code
neither does pointer arithmetic nor reaches into the reference's private modules.

The header is parsed as text: comments stripped, then the structs, the enum, the #defines and the
declarations inside `extern "C" { ... }`. Any C type this parser does not know fails the test, so a
new type has to be mapped here on purpose.
"""
import ast
import ctypes
import io
import re
import tokenize
from pathlib import Path

import pytest

from mok.fast import _lib

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
HEADER = CSRC / "mok_fast.h"


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _header() -> str:
    return _strip_comments(HEADER.read_text())


# C type (const and spaces removed; pointer stars kept) -> ctypes type, for arguments and fields.
_SCALARS = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "size_t": ctypes.c_size_t,
            "cudaStream_t": ctypes.c_void_p}


def _ctype(c_type: str, *, result: bool = False):
    """The ctypes type the binding must use for C type `c_type`."""
    is_const = re.search(r"\bconst\b", c_type) is not None
    t = re.sub(r"\bconst\b", "", c_type).replace(" ", "")
    if t.endswith("*"):
        base = t.rstrip("*")
        if t.count("*") == 1 and base == "char" and is_const and result:
            return ctypes.c_char_p  # const char*: a C string (mok_last_error)
        if t.count("*") == 1 and base == "MokSegment":
            return ctypes.POINTER(_lib.MokSegment)  # the host array of segments, typed
        return ctypes.c_void_p  # every other pointer: a raw address
    if t in _SCALARS:
        return _SCALARS[t]
    if t in ("MokOperand", "MokSegment"):
        return getattr(_lib, t)
    raise AssertionError(f"mok_fast.h: C type {c_type!r} has no mapping in tests/fast/test_binding.py")


def _split_decl(decl: str) -> tuple[str, str]:
    """'const int* offsets' -> ('const int*', 'offsets')."""
    m = re.fullmatch(r"\s*(.*?[\s*])(\w+)\s*", decl)
    assert m, f"cannot parse declaration {decl!r}"
    return m.group(1).strip(), m.group(2)


def header_functions() -> dict:
    """name -> (C return type, [C argument types]) for every function in extern "C" { ... }."""
    src = _header()
    m = re.search(r'extern\s+"C"\s*\{(.*)\}', src, flags=re.S)
    assert m, 'mok_fast.h: no extern "C" block'
    funcs = {}
    for decl in m.group(1).split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        f = re.fullmatch(r"(.+?[\s*])(\w+)\s*\((.*)\)", decl)
        assert f, f"cannot parse {decl!r}"
        args = [a for a in (x.strip() for x in f.group(3).split(",")) if a and a != "void"]
        funcs[f.group(2)] = (f.group(1).strip(), [_split_decl(a)[0] for a in args])
    return funcs


def header_structs() -> dict:
    """struct name -> [(field name, C type)] in declaration order (`int m, n, k;` gives three)."""
    structs = {}
    for name, body in re.findall(r"struct\s+(\w+)\s*\{(.*?)\}\s*;", _header(), flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            first, *more = (d.strip() for d in decl.split(","))
            c_type, fname = _split_decl(first)
            base = c_type.rstrip("*").strip()  # `int* a, b` would make b an int: keep the stars per name
            fields.append((fname, c_type))
            fields += [(_split_decl(f"{base} {d}")[1], base + "*" * d.count("*")) for d in more]
        structs[name] = fields
    return structs


def header_enum(name: str) -> dict:
    m = re.search(rf"enum\s+{name}\s*\{{(.*?)\}}\s*;", _header(), flags=re.S)
    assert m, f"mok_fast.h: no enum {name}"
    values = {}
    for item in m.group(1).split(","):
        if item.strip():
            k, v = (s.strip() for s in item.split("="))
            values[k] = int(v, 0)
    return values


def header_defines() -> dict:
    return {k: int(v, 0) for k, v in re.findall(r"#define\s+(MOK_\w+)\s+(\d+)\s*$", _header(), flags=re.M)}


# ---------------------------------------------------------------- the parser itself


def test_parser_sees_the_header():
    """Guards the tests below against a parser that silently finds nothing."""
    funcs, structs = header_functions(), header_structs()
    assert {"mok_grouped_gemm", "mok_schedule", "mok_combine_fwd", "mok_last_error"} <= set(funcs)
    assert len(funcs) >= 15
    assert [f for f, _ in structs["MokSegment"]][:6] == ["num_groups", "rows_dim", "fixed_rows", "m", "n", "k"]
    assert header_functions()["mok_grouped_gemm"][1][2] == "const MokSegment*"


@pytest.mark.parametrize("c_type, expected", [
    ("int", ctypes.c_int),                          # plain int
    ("int64_t", ctypes.c_int64),                    # 64-bit sizes and strides
    ("size_t", ctypes.c_size_t),                    # byte counts
    ("cudaStream_t", ctypes.c_void_p),              # an opaque handle: an address
    ("const float*", ctypes.c_void_p),              # a device pointer
    ("void*", ctypes.c_void_p),                     # an untyped device pointer
])
def test_type_mapping(c_type, expected):
    assert _ctype(c_type) is expected


def test_unknown_c_type_is_refused():
    with pytest.raises(AssertionError, match="no mapping"):
        _ctype("double")


# ---------------------------------------------------------------- the binding against the header


def test_signatures_list_exactly_the_header_functions():
    header, table = set(header_functions()), set(_lib.SIGNATURES)
    assert header == table, f"only in mok_fast.h: {sorted(header - table)}; only in SIGNATURES: {sorted(table - header)}"


@pytest.mark.parametrize("name", sorted(header_functions()))  # one row per C function of the header
def test_signature_types_match_the_header(name):
    c_ret, c_args = header_functions()[name]
    res, args = _lib.SIGNATURES[name]
    assert res is _ctype(c_ret, result=True), f"{name}: returns {c_ret}, SIGNATURES says {res.__name__}"
    assert len(args) == len(c_args), f"{name}: {len(c_args)} arguments in the header, {len(args)} in SIGNATURES"
    for i, (c, py) in enumerate(zip(c_args, args, strict=True)):
        assert py is _ctype(c), f"{name}: argument {i} is {c}, SIGNATURES says {py.__name__}"


@pytest.mark.parametrize("struct", ["MokOperand", "MokSegment"])  # every struct the C ABI passes
def test_structs_match_field_by_field(struct):
    c_fields = header_structs()[struct]
    py_fields = getattr(_lib, struct)._fields_
    assert [f for f, _ in py_fields] == [f for f, _ in c_fields], struct
    for (fname, c_type), (_, py) in zip(c_fields, py_fields, strict=True):
        assert py is _ctype(c_type), f"{struct}.{fname}: {c_type} in C, {py.__name__} in ctypes"


def test_header_declares_no_other_struct():
    assert set(header_structs()) == {"MokOperand", "MokSegment"}


def test_gemm_kinds_match_the_enum():
    enum = header_enum("MokGemmKind")
    n = enum.pop("MOK_GEMM_NUM_KINDS")
    assert _lib.GEMM_KINDS == enum
    assert len(enum) == n and sorted(enum.values()) == list(range(n))


def test_limits_match_the_defines():
    d = header_defines()
    assert d["MOK_MAX_SEGMENTS"] == _lib.MAX_SEGMENTS
    assert d["MOK_ROUTER_MAX_E"] == _lib.ROUTER_MAX_E
    assert d["MOK_GEMM_NUM_VARIANTS"] == _lib.NUM_GEMM_VARIANTS


@pytest.mark.parametrize("name", sorted(header_functions()))  # each declared function needs a definition
def test_every_header_function_is_defined_in_csrc(name):
    pattern = re.compile(rf"\b{name}\s*\([^;{{}}]*\)\s*\{{")
    hits = [p.name for p in CSRC.glob("*.cu") if pattern.search(_strip_comments(p.read_text()))]
    assert len(hits) == 1, f"{name}: defined in {hits or 'no'} csrc/*.cu file(s), expected exactly one"


# ---------------------------------------------------------------- Python-side rules


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
    """Python passes base pointers and element offsets; addresses are computed by the kernels."""
    bad = [str(p.relative_to(ROOT)) for p in _python_files("mok") if _PTR_ARITH.search(_code(p.read_text()))]
    assert not bad, f"data_ptr() arithmetic in {bad}"


# White-box tests that may import a private reference module, with the reason.
_PRIVATE_IMPORT_ALLOWED = {"tests/reference/test_exact.py": "patches the chunk size of the private matmul_exact module"}


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


def test_offsets_from_counts_lays_groups_end_to_end():
    """The offsets array Segment.expert_rows reads: first rows (an empty group's equal to the next one's, the last
    entry the total), then each group's rows; int32 on the device asked for."""
    import torch

    got = _lib.offsets_from_counts(torch.tensor([3, 0, 5], dtype=torch.int64), torch.device("cpu"))
    assert got.dtype == torch.int32 and got.tolist() == [0, 3, 3, 8, 3, 0, 5], got


def test_offsets_from_counts_reads_the_counts_at_each_call_and_workspace_sizes_stay_cached():
    """offsets_from_counts is not cached (a tensor changed in place, or a new one at a freed one's address, would get
    stale offsets), while _workspace_bytes, asked at every GEMM launch, is."""
    import torch

    counts = torch.tensor([1, 2], dtype=torch.int32)
    assert _lib.offsets_from_counts(counts, torch.device("cpu")).tolist() == [0, 1, 3, 1, 2]
    counts[0] = 4
    assert _lib.offsets_from_counts(counts, torch.device("cpu")).tolist() == [0, 4, 6, 4, 2]
    assert hasattr(_lib._workspace_bytes, "cache_info"), "the launch path asks the library for sizes every time"


@pytest.mark.parametrize("counts", [
    [[1, 2], [3, 4]],  # 2-D: no group list
    [1.0, 2.0],        # floating point: not row counts
    [2, -1],           # a negative row count
])
def test_offsets_from_counts_refuses_bad_counts(counts):
    import torch

    with pytest.raises(ValueError, match="counts_G"):
        _lib.offsets_from_counts(torch.tensor(counts), torch.device("cpu"))
