"""Shared pytest setup: GPU tests are skipped where no CUDA device is present."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    is_sm90 = has_cuda and torch.cuda.get_device_capability() == (9, 0)
    for item in items:
        if item.get_closest_marker("gpu") and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif item.get_closest_marker("sm90") and not is_sm90:
            item.add_marker(pytest.mark.skip(reason="needs an sm_90 GPU (H100/H200)"))
