"""benchmarks/sonic_peer.py hands SonicMoE the inputs the other methods get, in its own layout, and the side-by-side
table reads mok against it. SonicMoE itself runs only on the device (`bench_moe.py --methods sonic`, which checks its
y and d_x against the fp32 oracle); these check the conversion and the bookkeeping on the CPU."""
import sys

import pytest
import torch
from bench_scripts import BENCH, energy_probe

sys.path.insert(0, str(BENCH))
from sonic_peer import sonic_forward_ref, sonic_leaves  # noqa: E402

from mok.harness.plain import moe_plain  # noqa: E402


def _inputs(T, H, I, E, K, S=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    bf = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    return {"x": bf(T, H), "topk_idx": idx, "topk_weight": torch.rand(T, K, generator=g),
            "shared_gate": bf(S, H) if S else None, "shared_up": bf(S, H) if S else None,
            "shared_down": bf(H, S) if S else None, "routed_gate": bf(E, I, H), "routed_up": bf(E, I, H),
            "routed_down": bf(E, H, I), "dy": bf(T, H)}


@pytest.mark.parametrize("T, H, I, E, K", [
    (5, 16, 8, 4, 2),    # a few tokens, K = 2 of 4 experts
    (7, 8, 24, 6, 3),    # I > H, K = 3: the interleave spans more rows than H
    (3, 16, 8, 3, 3),    # every token picks every expert
])
def test_sonic_leaves_compute_mok_s_layer(T, H, I, E, K):
    """SonicMoE's layer read off the converted tensors (gate rows at 2i, up rows at 2i + 1) is mok's routed layer:
    the same y as the plain fp32 implementation."""
    inp = _inputs(T, H, I, E, K)
    leaves = sonic_leaves(inp)
    want = moe_plain(*(inp[a] for a in ("x", "topk_idx", "topk_weight", "shared_gate", "shared_up", "shared_down",
                                        "routed_gate", "routed_up", "routed_down")), dtype=torch.float32)
    torch.testing.assert_close(sonic_forward_ref(leaves), want.detach(), rtol=1e-5, atol=1e-5)
    assert leaves["idx_TK"].dtype == torch.int32 and torch.equal(leaves["idx_TK"].long(), inp["topk_idx"])
    assert leaves["w1_EFH"].shape == (E, 2 * I, H) and leaves["w1_EFH"].is_contiguous()
    assert torch.equal(leaves["w1_EFH"][:, 0::2], inp["routed_gate"])
    assert torch.equal(leaves["w1_EFH"][:, 1::2], inp["routed_up"])
    for k in ("x", "w1_EFH", "w2_EHI", "score_TK"):  # fresh leaves: SonicMoE's gradients never land on the inputs
        assert leaves[k].requires_grad and leaves[k].is_leaf
    assert leaves["x"].untyped_storage().data_ptr() != inp["x"].untyped_storage().data_ptr()


def test_sonic_leaves_refuse_a_shared_expert_naming_the_argument():
    with pytest.raises(ValueError, match="^inp: SonicMoE's layer has no shared expert"):
        sonic_leaves(_inputs(3, 8, 8, 4, 2, S=8))


@pytest.mark.parametrize("spec, ok", [
    ("sonic:mixtral-8x7b", True),       # no shared expert in the config
    ("sonic:qwen3-30b-a3b", True),      # the same
    ("sonic:mid-64e@S0", True),         # the shared expert dropped, as issue 13 measured it
    ("sonic:mid-64e", False),           # S = 1536: refused before anything runs, not run without it silently
    ("sonic:dsv3-ep8-slice", False),    # the same
])
def test_energy_probe_takes_sonic_workloads_only_without_a_shared_expert(spec, ok):
    parse_workload, configs = energy_probe()
    if ok:
        kind, c, _ = parse_workload(spec, configs)
        assert kind == "sonic" and c["S"] == 0
    else:
        with pytest.raises(ValueError, match="no shared expert; add '@S0'"):
            parse_workload(spec, configs)


def test_the_side_by_side_preset_pairs_each_target_shape_with_sonicmoe():
    """--preset issue13-sonic: the matmul around mok's four shapes and SonicMoE's same four; every spec parses."""
    from targets import PRESETS, SONIC, TARGETS

    parse_workload, configs = energy_probe()
    side = PRESETS["issue13-sonic"]
    assert side[0] == side[-1] == "matmul"
    assert set(side[1:-1]) == set(TARGETS) | set(SONIC.values()) and len(side) == 2 + 2 * len(TARGETS)
    for spec in side:
        parse_workload(spec, configs)
    for mok_spec, sonic_spec in SONIC.items():
        assert parse_workload(mok_spec, configs)[1] == parse_workload(sonic_spec, configs)[1]  # the same layer


def test_side_by_side_rows_give_sonicmoe_s_time_over_mok_s():
    from targets import side_by_side_rows

    results = [("mok:qwen3-30b-a3b", {"burst_ms": 6.0}), ("sonic:qwen3-30b-a3b", {"burst_ms": 7.0}),
               ("mok:qwen3-30b-a3b", {"burst_ms": 5.0}), ("sonic:qwen3-30b-a3b", {"burst_ms": 6.0}),  # medians
               ("mok:qwen3-30b-a3b", {"burst_ms": 7.0}), ("sonic:qwen3-30b-a3b", {"burst_ms": 8.0}),  # 6.0, 7.0
               ("mok:mixtral-8x7b", {"burst_ms": 20.0}), ("sonic:mixtral-8x7b", {"burst_ms": 22.0}),  # 1.10: met
               ("mok:mid-64e@S0", {"burst_ms": 9.0}), ("matmul", {"burst_ms": 1.0})]  # no SonicMoE run: no row
    rows = side_by_side_rows(results)
    assert rows[2:] == ["| qwen3-30b-a3b | 6.00 | 7.00 | 1.17x (met) |",
                        "| mixtral-8x7b | 20.00 | 22.00 | 1.10x (met) |"]
    assert side_by_side_rows([("mok:mixtral-8x7b", {"burst_ms": 20.0}), ("sonic:mixtral-8x7b", {"burst_ms": 21.0})]
                             )[2:] == ["| mixtral-8x7b | 20.00 | 21.00 | 1.05x (not met) |"]
    assert side_by_side_rows(results[-2:]) == []


def test_profile_peers_names_kernels_without_their_arguments():
    from profile_peers import kernel_name

    assert kernel_name("void (anonymous namespace)::combine_rows_k<true>(float const*, int)") == "combine_rows_k<true>"
    assert kernel_name("kernel_cutlass_" + "x" * 200 + "(int)") == ("kernel_cutlass_" + "x" * 200)[:100]


def test_bench_moe_ratio_column_divides_by_mok_or_else_mok_gu():
    """bench_moe's table: the ratio column is mok's time over each method's; with only mok_gu run (as beside SonicMoE)
    it is mok_gu's, not '-'."""
    from bench_moe import mok_row

    row = lambda m, c="a": {"config": c, "routing": "random", "method": m}  # noqa: E731
    rows = [row("mok_gu"), row("sonic"), row("mok"), row("mok_gu", "b"), row("sonic", "b"), row("sonic", "c")]
    assert mok_row(rows, rows[1]) is rows[2]      # mok wins where both ran
    assert mok_row(rows, rows[4]) is rows[3]      # mok_gu where mok did not run
    assert mok_row(rows, rows[5]) is None         # neither: the column prints '-'


def test_asking_for_sonicmoe_where_it_is_missing_fails_before_anything_runs(monkeypatch):
    """energy_probe.py with a sonic: workload, on a machine without sonicmoe, stops at the spec check with the
    workload named (no matmul or mok workload runs first); require_sonic passes where the package is found."""
    import importlib.util
    import subprocess

    import sonic_peer
    if importlib.util.find_spec("sonicmoe") is not None:
        pytest.skip("sonicmoe is installed here")
    r = subprocess.run([sys.executable, str(BENCH / "energy_probe.py"), "matmul", "sonic:mixtral-8x7b"],
                       capture_output=True, text=True, cwd=BENCH.parent)
    assert r.returncode != 0 and "workload 'sonic:mixtral-8x7b': SonicMoE (the sonicmoe package) is not importable" \
        in r.stderr, r.stderr[-2000:]
    assert "| matmul" not in r.stdout
    monkeypatch.setattr(sonic_peer.importlib.util, "find_spec", lambda name: object())
    sonic_peer.require_sonic("--methods sonic")  # found: no error


def test_bench_moe_refuses_sonic_on_a_config_with_a_shared_expert_before_anything_runs():
    """bench_moe.py --methods sonic on a config with a shared expert stops at the argument check, naming the option,
    the config and the remedy (--no-shared), instead of failing in the middle of a run."""
    import subprocess

    r = subprocess.run([sys.executable, str(BENCH / "bench_moe.py"), "--configs", "qwen3-30b-a3b,mid-64e",
                        "--methods", "mok_gu,sonic"], capture_output=True, text=True, cwd=BENCH.parent)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "--methods sonic: SonicMoE's layer has no shared expert, and mid-64e has one; add --no-shared" in r.stderr
