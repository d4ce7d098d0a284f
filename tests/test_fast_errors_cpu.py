"""Errors of mok.fast that need no GPU (these run in CI): CPU tensors, a missing toolchain."""
import pytest
import torch

import mok.fast
from mok.harness.cases import LAYER_ARGS, MoEConfig, make_inputs
from mok.fast import _build


def test_cpu_tensors_raise_naming_x():
    inputs = make_inputs(MoEConfig(T=4, H=16, I=8, E=2, K=1, S=8), seed=0)
    with pytest.raises(ValueError, match="^x: expected a CUDA tensor"):
        mok.fast.forward(*(inputs[a] for a in LAYER_ARGS))


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
        _build.library()
