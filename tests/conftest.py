"""Shared pytest setup: tests marked `gpu` skip without a CUDA device, tests marked `sm90` skip unless
`mok.fast.is_available()` (an sm_90 GPU plus a library or the toolchain to build one), with its reason."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    fast = None  # (ok, reason), asked once and only when an sm90 test is collected
    for item in items:
        if item.get_closest_marker("gpu") and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif item.get_closest_marker("sm90"):
            if fast is None:
                from mok.fast import is_available

                fast = is_available()
            if not fast[0]:
                item.add_marker(pytest.mark.skip(reason=f"needs mok.fast: {fast[1]}"))
