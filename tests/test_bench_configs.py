"""The benchmark shape files (benchmarks/configs.json, benchmarks/suite.json) describe layers the fast
path accepts, so a device run never stops half-way on a bad row."""
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("name", ["configs.json", "suite.json"])
def test_every_benchmark_shape_is_a_valid_fast_path_layer(name):
    configs = json.loads((BENCH / name).read_text())["configs"]
    names = [c["name"] for c in configs]
    assert len(set(names)) == len(names), f"{name}: duplicate config names"
    for c in configs:
        assert set(c) == {"name", "T", "H", "I", "E", "K", "S"}, c
        assert all(isinstance(c[k], int) for k in "THIEKS"), c
        assert c["T"] >= 1 and c["H"] >= 8 and c["I"] >= 8 and 1 <= c["K"] <= c["E"], c
        assert c["H"] % 8 == 0 and c["I"] % 8 == 0 and c["S"] % 8 == 0, f"{c['name']}: TMA needs 16-byte rows"
        assert c["T"] * c["K"] < 2**31, c


def test_the_suite_has_token_counts_that_are_not_multiples_of_128():
    configs = json.loads((BENCH / "suite.json").read_text())["configs"]
    assert any(c["T"] % 128 for c in configs)
    assert {c["K"] for c in configs} >= {2, 8}, "few large experts (K = 2) and many small ones (K = 8)"
