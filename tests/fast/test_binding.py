"""The typed binding (csrc/python_api.cpp, reached through mok.fast._lib): it binds every entry point of the C ABI
(csrc/mok_fast.h) and its constants; every function, called with keyword arguments, refuses a tensor of the wrong
dtype, shape, layout or device and an integer that disagrees with the shapes (two swapped) with a TypeError /
ValueError naming the argument, before the kernels library is even looked up (on the CPU, where it then asks for a
CUDA tensor; on an sm_90 GPU the same errors, and the right arguments launch). The rules for the Python around it
(no ctypes, no pointer arithmetic, no private reference imports) are in test_code_rules.py.

Building the binding needs a C++ compiler (the `mok_binding` fixture skips, saying so, without one).
"""
import ast
import re
from pathlib import Path

import pytest
import torch

from mok.fast import _build, _fp8, _lib

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
HEADER = CSRC / "mok_fast.h"
GPU = [pytest.mark.gpu, pytest.mark.sm90]


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _header() -> str:
    return _strip_comments(HEADER.read_text())


def header_entry_points() -> list[str]:
    """The C entry points the header exports (declared MOK_API), in order."""
    return re.findall(r"\bMOK_API\s+[^;{}()]*?\b(mok_\w+)\s*\(", _header())


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


# ---------------------------------------------------------------- the binding against the header


def test_the_header_parser_sees_the_entry_points():
    """Guards the tests below against a parser that silently finds nothing."""
    names = header_entry_points()
    assert {"mok_grouped_gemm", "mok_schedule", "mok_combine_fwd", "mok_last_error", "mok_ep_wait"} <= set(names)
    assert len(names) == len(set(names)) >= 20


def test_the_binding_resolves_every_entry_point_of_the_header(mok_binding):
    """Its table of typed function pointers (decltype of each declaration) covers the header, no more, no less."""
    assert sorted(mok_binding.ENTRY_POINTS) == sorted(header_entry_points())


@pytest.mark.parametrize("name", header_entry_points())  # each declared function needs a definition
def test_every_entry_point_is_defined_once_in_csrc(name):
    pattern = re.compile(rf"\b{name}\s*\([^;{{}}]*\)\s*\{{")
    hits = [p.name for p in CSRC.glob("*.cu") if pattern.search(_strip_comments(p.read_text()))]
    assert len(hits) == 1, f"{name}: defined in {hits or 'no'} csrc/*.cu file(s), expected exactly one"


def test_python_constants_match_the_header():
    """_lib's kinds and limits, read by the tile rules before anything is built."""
    enum = header_enum("MokGemmKind")
    n = enum.pop("MOK_GEMM_NUM_KINDS")
    assert _lib.GEMM_KINDS == enum and len(enum) == n and sorted(enum.values()) == list(range(n))
    d = header_defines()
    assert (d["MOK_MAX_SEGMENTS"], d["MOK_ROUTER_MAX_E"], d["MOK_GEMM_NUM_VARIANTS"]) == \
        (_lib.MAX_SEGMENTS, _lib.ROUTER_MAX_E, _lib.NUM_GEMM_VARIANTS)
    assert d["MOK_FP8_SWIGLU_GROUP"] == _fp8.GROUP, "the interleaved [gate; up]'s row groups: kernels and _fp8.GateUp"


def test_python_constants_match_the_binding(mok_binding):
    assert mok_binding.GEMM_KINDS == _lib.GEMM_KINDS
    assert (mok_binding.MAX_SEGMENTS, mok_binding.ROUTER_MAX_E, mok_binding.NUM_GEMM_VARIANTS) == \
        (_lib.MAX_SEGMENTS, _lib.ROUTER_MAX_E, _lib.NUM_GEMM_VARIANTS)


def test_the_binding_is_this_torchs(mok_binding):
    assert mok_binding.TORCH_VERSION == re.match(r"\d+\.\d+\.\d+", torch.__version__).group(0)


def test_a_binding_built_for_another_torch_is_refused_saying_what_to_do(mok_binding, monkeypatch):
    monkeypatch.setattr(_build, "_torch_release", lambda version: "2.0.1")  # as if this were torch 2.0.1
    with pytest.raises(_build.FastPathUnavailable, match=r"built against torch \d+\.\d+\.\d+, this is torch .*: delete "
                       r"that directory or set MOK_FAST_REBUILD=1"):
        _build.build_binding()


def test_no_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(_build.FastPathUnavailable, match="no C\\+\\+ compiler.*'no-such-c\\+\\+-compiler'.*set CXX"):
        _build.find_cxx()


# ---------------------------------------------------------------- every function's checks

T, K, H, E, I = 5, 2, 16, 8, 8  # tokens, experts per token, hidden, experts (all local), intermediate
R = T * K


def _z(dev, *shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=dev)


def _i32(dev, *shape):
    return _z(dev, *shape, dtype=torch.int32)


def _i64(dev, *shape):
    return _z(dev, *shape, dtype=torch.int64)


def _b16(dev, *shape):
    return _z(dev, *shape, dtype=torch.bfloat16)


def _f8(dev, *shape):
    return _z(dev, *shape, dtype=torch.float8_e4m3fn)


def _fp8_gemm(dev, **seg):
    """A FP8_TN_BF16 GEMM D [4, 16] bf16 = A [4, 256] e4m3 · B [16, 256]ᵀ with scales sfa [4, 2], sfb [1, 2]."""
    args = dict(rows=4, n=16, k=256, a=_lib.Operand(_f8(dev, 4, 256), 0, 0, 256),
                b=_lib.Operand(_f8(dev, 16, 256), 0, 0, 256), d=_lib.Operand(_b16(dev, 4, 16), 0, 0, 16),
                sfa=_lib.Operand(_z(dev, 4, 2), 0, 0, 2), sfb=_lib.Operand(_z(dev, 1, 2), 0, 0, 2))
    args.update(seg)
    return dict(kind=_lib.GEMM_FP8_TN_BF16, segments=[_lib.Segment.all_rows(**args)], device=torch.device(dev),
                variant=0)


def _gemm(dev, **seg):
    """A TN_F32 GEMM D [4, 8] fp32 = A [4, 16] bf16 · B [8, 16]ᵀ; `seg` overrides all_rows' arguments."""
    args = dict(rows=4, n=8, k=16, a=_lib.Operand(_b16(dev, 4, 16), 0, 0, 16),
                b=_lib.Operand(_b16(dev, 8, 16), 0, 0, 16),
                d=_lib.Operand(_z(dev, 4, 8), 0, 0, 8))
    args.update(seg)
    return dict(kind=_lib.GEMM_TN_F32, segments=[_lib.Segment.all_rows(**args)], device=torch.device(dev), variant=0)


# The right keyword arguments of each function on device `dev` (EP: pointer tables, so not launched on the GPU).
GOOD = {
    "schedule": lambda dev: dict(topk_idx=_i64(dev, T, K), E=E + 4, e0=0, L=E, capacity=R, offsets=_i32(dev, 2 * E + 1),
                                 row_pair=_i32(dev, R), pair_row=_i32(dev, R), flag=_i32(dev, 1)),
    "gather_rows": lambda dev: dict(x_TH=_b16(dev, T, H), pair_row=_i32(dev, R), capacity=R, x_RH=_b16(dev, R, H)),
    "swiglu_fwd": lambda dev: dict(gu=_z(dev, R, 2 * I), offsets=_i32(dev, 2 * E + 1), L=E, fixed_rows=0, I=I,
                                   capacity=R, a=_b16(dev, R, I)),
    "swiglu_bwd": lambda dev: dict(da=_z(dev, R, I), pq=_z(dev, R, 2 * I), offsets=None, L=0, fixed_rows=R, I=I,
                                   capacity=R, dgu=_b16(dev, R, 2 * I)),
    "combine_fwd": lambda dev: dict(s_TH=_b16(dev, T, H), o_RH=_b16(dev, R, H), w_TK=_z(dev, T, K),
                                    pair_row=_i32(dev, R), flag=_i32(dev, 1), y_TH=_b16(dev, T, H)),
    "combine_bwd_pre": lambda dev: dict(dy_TH=_b16(dev, T, H), o_RH=_b16(dev, R, H), w_TK=_z(dev, T, K),
                                        pair_row=_i32(dev, R), flag=_i32(dev, 1), d_w_TK=_z(dev, T, K),
                                        go_RH=_b16(dev, R, H)),
    "combine_bwd_dx": lambda dev: dict(dxs_TH=_b16(dev, T, H), dx_RH=_b16(dev, R, H), pair_row=_i32(dev, R),
                                       flag=_i32(dev, 1), K=K, dx_TH=_b16(dev, T, H)),
    "zero_empty": lambda dev: dict(d=_z(dev, E, 4, H), offsets=_i32(dev, 2 * E + 1), L=E, flag=_i32(dev, 1)),
    "poison": lambda dev: dict(t=_z(dev, T, H), flag=_i32(dev, 1)),
    "cast_pair_bf16": lambda dev: dict(first=_z(dev, E, 4, H), second=_z(dev, E, 4, H), out=_b16(dev, E, 8, H)),
    "router_topk": lambda dev: dict(logits=_z(dev, T, E), E=E, K=K, softmax=True, normalize=True,
                                    scores=_z(dev, T, E), topk_idx=_i64(dev, T, K), topk_w=_z(dev, T, K)),
    "router_bwd": lambda dev: dict(scores=_z(dev, T, E), topk_idx=_i64(dev, T, K), d_w=_z(dev, T, K), d_scores=None,
                                   d_logits=None, softmax=True, normalize=True, hl=_b16(dev, T, 2 * E)),
    "router_losses": lambda dev: dict(scores=_z(dev, T, E), logits=_z(dev, T, E), topk_idx=_i64(dev, T, K),
                                      normalize_rows=False, balance=_z(dev), z=_z(dev)),
    "router_losses_bwd": lambda dev: dict(d_balance=_z(dev), d_z=_z(dev), scores=_z(dev, T, E), logits=_z(dev, T, E),
                                          topk_idx=_i64(dev, T, K), normalize_rows=False, d_scores=_z(dev, T, E),
                                          d_logits=_z(dev, T, E)),
    "grouped_gemm": _gemm,
    "fp8_quant_rows": lambda dev: dict(x=_b16(dev, R, 2 * 136), parts=2, count=_i32(dev, 1), q=_f8(dev, R, 512),
                                       scales=_z(dev, R, 4)),
    "fp8_quant_blocks": lambda dev: dict(w=_b16(dev, E, 136, 16), q=_f8(dev, E, 136, 128), s=_z(dev, E, 2, 1),
                                         qT=_f8(dev, E, 16, 512), off_qT=256, sT=_z(dev, E, 1, 4), off_sT=2),
    "ep_gather_rows": lambda dev: dict(peers=_i64(dev, 2), per_rank=T, div=K, row_pair=_i32(dev, R),
                                       offsets=_i32(dev, 2 * E + 1), L=E, out=_b16(dev, R, H)),
    "ep_scatter_rows": lambda dev: dict(rows=_b16(dev, R, H), row_pair=_i32(dev, R), offsets=_i32(dev, 2 * E + 1),
                                        L=E, per_rank=R, peers=_i64(dev, 2)),
    "ep_concat": lambda dev: dict(peers=_i64(dev, 2), out=_i64(dev, 4, 8)),
    "ep_next_epoch": lambda dev: dict(epoch=_i32(dev, 1)),
    "ep_signal": lambda dev: dict(peer_flags=_i64(dev, 2), phase=3, rank=1, epoch=_i32(dev, 1)),
    "ep_wait": lambda dev: dict(flags=_i32(dev, 5, 2), phase=3, rank=1, epoch=_i32(dev, 1), timeout_s=1.0),
}
EP = {name for name in GOOD if name.startswith("ep_")}


def _swap(a, b):
    def change(kw, dev):
        kw[a], kw[b] = kw[b], kw[a]
    return change


def _set(**values):
    def change(kw, dev):
        kw.update({k: v(dev) if callable(v) else v for k, v in values.items()})
    return change


def _elsewhere(name):
    """Move argument `name` to another device than the call's (meta beside the CPU, the CPU beside a GPU)."""
    def change(kw, dev):
        kw[name] = kw[name].to("meta" if dev == "cpu" else "cpu")
    return change


V, TE = ValueError, TypeError
# (function, what is wrong, how, exception, the start of its message)
BAD = [
    ("schedule", "E and L swapped", _swap("E", "L"), V, r"e0, L: expected the local experts \[e0, e0 \+ L\)"),
    ("schedule", "pair_row one too long", _set(pair_row=lambda d: _i32(d, R + 1)), V,
     r"pair_row: expected shape \(T\*K,\)"),
    ("schedule", "offsets for other L", _set(offsets=lambda d: _i32(d, 2 * E)), V,
     r"offsets: expected shape \(2L\+1,\)"),
    ("schedule", "int32 ids", _set(topk_idx=lambda d: _i32(d, T, K)), TE,
     "topk_idx: expected dtype torch.int64, got torch.int32"),
    ("schedule", "row_pair elsewhere", _elsewhere("row_pair"), V, "row_pair: expected device"),
    ("gather_rows", "capacity off by one", _set(capacity=R - 1), V, r"x_RH: expected shape \(capacity, H\)"),
    ("gather_rows", "strided x", _set(x_TH=lambda d: _b16(d, H, T).t()), V, "x_TH: expected a contiguous tensor"),
    ("swiglu_fwd", "I and capacity swapped", _swap("I", "capacity"), V, r"gu: expected shape \(capacity, 2I\)"),
    ("swiglu_fwd", "offsets for fewer experts", _set(offsets=lambda d: _i32(d, E)), V, "offsets: expected at least"),
    ("swiglu_bwd", "more rows than capacity", _set(fixed_rows=R + 1), V, "fixed_rows: expected 0 <= fixed_rows"),
    ("swiglu_bwd", "bf16 da", _set(da=lambda d: _b16(d, R, I)), TE, "da: expected dtype torch.float32"),
    ("combine_fwd", "T and K swapped in w", _set(w_TK=lambda d: _z(d, K, T)), V, "topk_weight: expected T = 5 rows"),
    ("combine_fwd", "int64 flag", _set(flag=lambda d: _i64(d, 1)), TE, "flag: expected dtype torch.int32"),
    ("combine_bwd_pre", "o rows of another H", _set(o_RH=lambda d: _b16(d, R, K)), V, r"o_RH: expected shape \(R, H\)"),
    ("combine_bwd_pre", "go not o's shape", _set(go_RH=lambda d: _b16(d, R - 1, H)), V, "go_RH: expected o_RH's shape"),
    ("combine_bwd_dx", "K given T", _set(K=T), V, r"pair_row: expected shape \(T\*K,\) = \(25,\) for T = 5 and K = 5"),
    ("zero_empty", "L of another layer", _set(L=E // 2), V, "d: expected L = 4 expert blocks"),
    ("poison", "an int tensor", _set(t=lambda d: _i32(d, T, H)), TE,
     "t: expected dtype torch.float32 or torch.bfloat16"),
    ("cast_pair_bf16", "halves of two shapes", _set(second=lambda d: _z(d, E, 4, 8)), V, "second: expected shape"),
    ("router_topk", "E and K swapped", _swap("E", "K"), V, "E, K: expected 1 <= K <= E"),
    ("router_bwd", "hl narrower than 2E", _set(hl=lambda d: _b16(d, T, E)), V,
     r"hl: expected shape \(T, 2 \* ld_half\)"),
    ("router_bwd", "T and K swapped in d_w", _set(d_w=lambda d: _z(d, K, T)), V,
     r"d_topk_weight: expected shape \(T, K\)"),
    ("router_losses", "a [1] balance", _set(balance=lambda d: _z(d, 1)), V,
     r"balance: expected a scalar tensor, shape \(\)"),
    ("router_losses_bwd", "T and E swapped in d_logits", _set(d_logits=lambda d: _z(d, E, T)), V,
     r"d_logits: expected shape \(T, E\)"),
    ("grouped_gemm", "n and k swapped", lambda kw, d: kw.update(_gemm(d, n=16, k=8)), V,
     r"segments\[0\]: operand b of 1 group\(s\) of 16 x 8 elements"),
    ("grouped_gemm", "a bf16 D for an fp32 kind",
     lambda kw, d: kw.update(_gemm(d, d=_lib.Operand(_b16(d, 4, 8), 0, 0, 8))), TE,
     r"segments\[0\]: operand d of GEMM kind 0 is torch.float32, got torch.bfloat16"),
    ("grouped_gemm", "D elsewhere", lambda kw, d: kw.update(_gemm(d, d=_lib.Operand(
        _z("meta" if d == "cpu" else "cpu", 4, 8), 0, 0, 8))), V,
     r"segments\[0\]: operand d must be a contiguous tensor"),
    ("grouped_gemm", "ld shorter than a row",
     lambda kw, d: kw.update(_gemm(d, a=_lib.Operand(_b16(d, 4, 16), 0, 0, 8))), V,
     r"segments\[0\]: operand a has rows of 16 elements"),
    ("grouped_gemm", "five segments", lambda kw, d: kw.update(segments=kw["segments"] * 5), V,
     "segments: expected 1 to 4, got 5"),
    ("grouped_gemm", "variant out of range", _set(variant=6), V, r"variant: expected an int in \[0, 6\)"),
    ("grouped_gemm", "an FP8 kind without scales", lambda kw, d: kw.update(_fp8_gemm(d, sfb=None)), V,
     r"segments\[0\]: operands sfa and sfb must be given for GEMM kind 10"),
    ("grouped_gemm", "bf16 operands for an FP8 kind",
     lambda kw, d: kw.update(_fp8_gemm(d, a=_lib.Operand(_b16(d, 4, 256), 0, 0, 256))), TE,
     r"segments\[0\]: operand a of GEMM kind 10 is torch.float8_e4m3fn, got torch.bfloat16"),
    ("grouped_gemm", "an FP8 k not a multiple of 128", lambda kw, d: kw.update(_fp8_gemm(d, k=192)), V,
     r"segments\[0\]: GEMM kind 10 needs rows as M, k a positive multiple of 128"),
    ("grouped_gemm", "FP8 scales of A one block short",
     lambda kw, d: kw.update(_fp8_gemm(d, sfa=_lib.Operand(_z(d, 4, 1), 0, 0, 1))), V,
     r"segments\[0\]: operands sfa and sfb must be K-major with ld = k / 128 = 2"),
    ("grouped_gemm", "scales on a bf16 kind",
     lambda kw, d: kw.update(_gemm(d, sfa=_lib.Operand(_z(d, 4, 1), 0, 0, 1))), V,
     r"segments\[0\]: operands sfa and sfb must be None for GEMM kind 0"),
    ("fp8_quant_rows", "parts not dividing x's columns", _set(parts=3), V,
     "parts: expected a divisor of x's 272 columns"),
    ("fp8_quant_rows", "q without the padding", _set(q=lambda d: _f8(d, R, 272)), V,
     r"q: expected shape \(rows, parts \* ceil\(P/128\) \* 128\)"),
    ("fp8_quant_rows", "bf16 q", _set(q=lambda d: _b16(d, R, 512)), TE,
     "q: expected dtype torch.float8_e4m3fn, got torch.bfloat16"),
    ("fp8_quant_rows", "scales per part of 128 columns short", _set(scales=lambda d: _z(d, R, 3)), V,
     r"scales: expected shape \(rows, parts \* ceil\(P/128\)\)"),
    ("fp8_quant_blocks", "q without the padding", _set(q=lambda d: _f8(d, E, 136, 16)), V,
     "q: expected 136 rows of at least offset"),
    ("fp8_quant_blocks", "s for other experts", _set(s=lambda d: _z(d, E - 1, 2, 1)), V,
     "s: expected 8 experts"),
    ("fp8_quant_blocks", "qT offset not 16-byte aligned", _set(off_qT=8), V,
     r"qT: expected 16 rows of at least offset \+ 256 columns \(offset 8"),
    ("fp8_quant_blocks", "sT too narrow for its offset", _set(off_sT=3), V,
     r"sT: expected 1 rows of at least offset \+ 2 columns"),
    ("ep_gather_rows", "div 0", _set(div=0), V, "div: expected at least 1"),
    ("ep_scatter_rows", "row_pair shorter than rows", _set(row_pair=lambda d: _i32(d, R - 1)), V,
     "row_pair: expected at least capacity"),
    ("ep_concat", "out not W regions of 8 bytes", _set(out=lambda d: _z(d, 3, dtype=torch.int8)), V,
     "out: expected W = 2 regions"),
    ("ep_next_epoch", "two epochs", _set(epoch=lambda d: _i32(d, 2)), V, r"epoch: expected shape \(1,\)"),
    ("ep_signal", "phase and rank swapped", _swap("phase", "rank"), V, "rank: expected 0 <= rank < W = 2"),
    ("ep_wait", "a phase past the flags'", _set(phase=5), V, "phase: expected 0 <= phase < 5"),
    ("ep_wait", "a negative timeout", _set(timeout_s=-1.0), V, "timeout_s: expected a value >= 0"),
]
DEVICES = ["cpu", pytest.param("cuda", marks=GPU)]


@pytest.fixture()
def no_kernel_lookup(monkeypatch, mok_binding, request):
    """On the CPU, the kernels library's locator replaced by one that records being asked (and then fails): the
    list of what asked. On a GPU, untouched (the right arguments launch)."""
    asked = []
    if getattr(request.node, "callspec", None) is None or request.node.callspec.params.get("dev", "cpu") == "cpu":
        def locate():
            asked.append("kernels_library")
            raise AssertionError("the binding asked for the kernels library")
        monkeypatch.setattr(_build, "kernels_library", locate)
    return asked


def test_every_function_has_good_arguments_and_a_bad_case(mok_binding):
    """The tables above cover every function the binding exports."""
    exported = {n for n in dir(mok_binding) if not n.startswith("_") and callable(getattr(mok_binding, n))
                and n.islower() and n not in ("set_kernels_locator", "kernels_loaded", "load_kernels",
                                              "check_segments", "ep_enable_peer_access")}
    assert exported == set(GOOD) == {fn for fn, *_ in BAD}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("fn, what, change, exc, match", BAD, ids=[f"{fn}: {what}" for fn, what, *_ in BAD])
def test_a_bad_argument_is_named_before_any_kernel_lookup(no_kernel_lookup, dev, fn, what, change, exc, match):
    kw = GOOD[fn](dev)
    change(kw, dev)
    with pytest.raises(exc, match="^" + match):
        getattr(_lib, fn)(**kw)
    assert no_kernel_lookup == []


@pytest.mark.parametrize("fn", sorted(GOOD))
def test_good_arguments_pass_every_check_then_ask_for_a_cuda_tensor(no_kernel_lookup, fn):
    """On the CPU the right arguments get as far as the launch, which needs a CUDA device: so the bad cases above
    fail for what they change, not for something else."""
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        getattr(_lib, fn)(**GOOD[fn]("cpu"))
    assert no_kernel_lookup == []


@pytest.mark.parametrize("dev", [pytest.param("cuda", marks=GPU)])
@pytest.mark.parametrize("fn", sorted(set(GOOD) - EP))
def test_good_arguments_launch_on_the_gpu(no_kernel_lookup, dev, fn):
    getattr(_lib, fn)(**GOOD[fn](dev))
    torch.cuda.synchronize()


def test_peer_access_takes_cuda_devices(mok_binding):
    with pytest.raises(ValueError, match="^device: expected a CUDA device with an index, got cpu"):
        _lib.ep_enable_peer_access(torch.device("cpu"), torch.device("cuda", 0))
    with pytest.raises(TypeError, match="device"):  # the signature's types, named
        _lib.ep_enable_peer_access(0, 1)


def test_operands_and_segments_are_typed(mok_binding):
    """A non-tensor operand or a float size is refused when the segment is made, naming the argument's type."""
    with pytest.raises(TypeError, match="tensor: torch.Tensor"):
        _lib.Operand([0.0], 0, 0, 1)
    op = _lib.Operand(torch.zeros(4, 8), 0, 8, 8, offset=0)
    with pytest.raises(TypeError, match="rows: (typing.SupportsInt|int)"):
        _lib.Segment.all_rows(4.0, 8, 8, op, op, op)
    seg = _lib.Segment.expert_rows(torch.zeros(3, dtype=torch.int32), 2, 8, 8, op, op, op, aux=op)
    assert (seg.num_groups, seg.rows_dim, seg.n, seg.k, seg.fixed_rows) == (2, 0, 8, 8, 0)
    assert seg.a.tensor is op.tensor and seg.aux.ld == 8 and seg.b_up is None and seg.offsets.dtype == torch.int32


def test_offsets_from_counts_lays_groups_end_to_end():
    """The offsets array Segment.expert_rows reads: first rows (an empty group's equal to the next one's, the last
    entry the total), then each group's rows; int32 on the device asked for."""
    got = _lib.offsets_from_counts(torch.tensor([3, 0, 5], dtype=torch.int64), torch.device("cpu"))
    assert got.dtype == torch.int32 and got.tolist() == [0, 3, 3, 8, 3, 0, 5], got


def test_offsets_from_counts_reads_the_counts_at_each_call():
    """Not cached: a tensor changed in place, or a new one at a freed one's address, would get stale offsets."""
    counts = torch.tensor([1, 2], dtype=torch.int32)
    assert _lib.offsets_from_counts(counts, torch.device("cpu")).tolist() == [0, 1, 3, 1, 2]
    counts[0] = 4
    assert _lib.offsets_from_counts(counts, torch.device("cpu")).tolist() == [0, 4, 6, 4, 2]


@pytest.mark.parametrize("counts", [
    [[1, 2], [3, 4]],  # 2-D: no group list
    [1.0, 2.0],        # floating point: not row counts
    [2, -1],           # a negative row count
])
def test_offsets_from_counts_refuses_bad_counts(counts):
    with pytest.raises(ValueError, match="counts_G"):
        _lib.offsets_from_counts(torch.tensor(counts), torch.device("cpu"))
