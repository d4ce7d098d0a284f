"""mok.fast against the bit-exact reference: per tensor, error <= 2x the plain bf16 implementation's
error against the same reference (docs/determinism.md), on golden cases, edge cases and hypothesis-drawn shapes."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mok.fast
from mok.testing.cases import MoEConfig, make_inputs
from mok.testing.tolerance import assert_within_2x, plain_outputs
from mok.cli.golden import load_case, load_manifest
from mok.testing.runner import run_layer

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


def _check(inputs: dict, label: str) -> None:
    got = run_layer(inputs, impl=mok.fast)
    ref = run_layer(inputs)
    plain = plain_outputs(inputs)
    assert_within_2x(got, ref, plain, label)


def _cuda(inputs: dict) -> dict:
    return {k: (v.cuda() if v is not None else None) for k, v in inputs.items()}


GOLDEN = sorted(load_manifest()["cases"])


@pytest.mark.parametrize("name", GOLDEN)  # every golden case: the reference's bits are stored
def test_golden_case(name):
    inputs, expected = load_case(name)
    inputs = _cuda(inputs)
    got = run_layer(inputs, impl=mok.fast)
    plain = plain_outputs(inputs)
    assert_within_2x(got, _cuda(expected), plain, f"golden {name}")


EDGE = [
    ("T=1", MoEConfig(T=1, H=64, I=32, E=4, K=2, S=16), "random"),  # one token: two experts of four empty
    ("empty expert", MoEConfig(T=40, H=64, I=32, E=6, K=2, S=16), "empty_expert"),  # expert 5 gets no rows
    ("all on one expert", MoEConfig(T=64, H=64, I=32, E=4, K=1, S=0), "one_expert"),  # one group, three empty
    ("K=E", MoEConfig(T=33, H=64, I=32, E=4, K=4, S=16), "random"),  # every token on every expert
    ("no shared", MoEConfig(T=64, H=128, I=64, E=8, K=2, S=0), "random"),  # S = 0: routed experts alone
    ("T=37", MoEConfig(T=37, H=96, I=48, E=8, K=3, S=24), "random"),  # odd T, K = 3: ragged groups, partial tiles
    ("skewed, multi-tile", MoEConfig(T=300, H=512, I=320, E=8, K=2, S=128), "skewed"),  # expert 0 > 128 rows
]


@pytest.mark.parametrize("label,cfg,routing", EDGE, ids=[e[0] for e in EDGE])
def test_edge_cases(label, cfg, routing):
    _check(make_inputs(cfg, seed=11, routing=routing, device="cuda"), label)


@st.composite
def configs(draw):
    E = draw(st.integers(1, 12))
    K = draw(st.integers(1, E))
    return MoEConfig(T=draw(st.integers(1, 160)), H=8 * draw(st.integers(1, 40)), I=8 * draw(st.integers(1, 24)),
                     E=E, K=K, S=8 * draw(st.integers(0, 12)))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(cfg=configs(), seed=st.integers(0, 2**16), skewed=st.booleans())
def test_hypothesis_shapes(cfg, seed, skewed):
    routing = "skewed" if skewed and cfg.K < cfg.E else "random"
    _check(make_inputs(cfg, seed=seed, routing=routing, device="cuda"), f"{cfg} seed={seed} {routing}")
