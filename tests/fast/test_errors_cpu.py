"""Errors of mok.fast that need no GPU (these run in CI): CPU tensors, a missing toolchain."""
import pytest
import torch

import mok.fast
from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs
from mok.fast import _build


def test_cpu_tensors_raise_naming_x():
    inputs = make_inputs(MoEConfig(T=4, H=16, I=8, E=2, K=1, S=8), seed=0)
    with pytest.raises(ValueError, match="^x: expected a CUDA tensor"):
        mok.fast.forward(*(inputs[a] for a in LAYER_ARGS))


@pytest.mark.parametrize("precision", ["fp16", "FP8", None, 8])
def test_a_bad_precision_is_named_before_anything_else(precision):
    inputs = make_inputs(MoEConfig(T=4, H=16, I=8, E=2, K=1, S=8), seed=0)
    with pytest.raises(ValueError, match=r"^precision: expected one of \('bf16', 'fp8'\)"):
        mok.fast.forward(*(inputs[a] for a in LAYER_ARGS), precision=precision)


def test_fp8_takes_the_same_input_checks():
    inputs = make_inputs(MoEConfig(T=4, H=16, I=8, E=2, K=1, S=8), seed=0)
    with pytest.raises(ValueError, match="^x: expected a CUDA tensor"):
        mok.fast.forward(*(inputs[a] for a in LAYER_ARGS), precision="fp8")


def test_missing_nvcc_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.setattr(_build.shutil, "which", lambda name: None)
    monkeypatch.setattr(_build.os.path, "exists", lambda p: False)
    with pytest.raises(_build.FastPathUnavailable, match="nvcc"):
        _build.find_nvcc()


def test_missing_cutlass_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("CUTLASS_DIR", raising=False)
    import builtins
    real_import = builtins.__import__

    def no_cutlass(name, *a, **k):
        if name == "cutlass_library":
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cutlass)
    with pytest.raises(_build.FastPathUnavailable, match="nvidia-cutlass"):
        _build.cutlass_include_dirs()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_no_gpu_is_a_clear_error():
    with pytest.raises(_build.FastPathUnavailable, match="GPU"):
        _build.kernels_library()


def _router_args(T=4, H=16, E=6):
    x, w = torch.randn(T, H).bfloat16(), torch.randn(E, H).bfloat16()
    return x, w


@pytest.mark.parametrize("call, exc, match", [
    # CPU tensors: named before any CUDA call (was an AssertionError from torch's CUDA stream API)
    (lambda x, w: mok.fast.router_forward(x, w, 2, "softmax", True), ValueError, "^x_TH: expected a CUDA tensor"),
    (lambda x, w: mok.fast.router_backward(x, w, None, None, None, None, None, "softmax", True), ValueError,
     "^x_TH: expected a CUDA tensor"),
    (lambda x, w: mok.fast.router_losses(torch.rand(4, 6), torch.rand(4, 6), torch.zeros(4, 2, dtype=torch.long),
                                         "softmax"), ValueError, "^scores_TE: expected a CUDA tensor"),
    (lambda x, w: mok.fast.router_losses_backward(torch.tensor(1.0), torch.tensor(1.0), torch.rand(4, 6),
                                                  torch.rand(4, 6), torch.zeros(4, 2, dtype=torch.long), "softmax"),
     ValueError, "^scores_TE: expected a CUDA tensor"),
    # options the kernels would misread: "relu" as sigmoid, True as K = 1, a truthy string as normalize
    (lambda x, w: mok.fast.router_forward(x, w, 2, "relu", True), ValueError, "^score: expected one of"),
    (lambda x, w: mok.fast.router_forward(x, w, True, "softmax", True), TypeError, "^k: expected an int"),
    (lambda x, w: mok.fast.router_forward(x, w, 2, "softmax", "yes"), TypeError, "^normalize: expected a bool"),
    (lambda x, w: mok.fast.router_losses(torch.rand(4, 6), torch.rand(4, 6), torch.zeros(4, 2, dtype=torch.long),
                                         "Softmax"), ValueError, "^score: expected one of"),
    (lambda x, w: mok.fast.router_forward(x.tolist(), w, 2, "softmax", True), TypeError, "^x_TH: expected a torch"),
])
def test_fast_router_refuses_what_its_kernels_would_misread(monkeypatch, call, exc, match):
    from mok.fast import _router

    x, w = _router_args()
    if "CUDA" not in match:  # get past the device check to the options
        monkeypatch.setattr(_router, "_on_cuda", lambda name, t: None)
    with pytest.raises(exc, match=match):
        call(x, w)
