"""The benchmark shape files (benchmarks/configs.json, benchmarks/suite.json) describe layers the fast
path accepts, so a device run never stops half-way on a bad row; the benchmark scripts' own helpers (workload specs,
targets, routing, labels, memory charging) do what they say. The device-call scripts' steps: test_device_scripts.py."""
import json

import pytest
from bench_scripts import BENCH, energy_probe


@pytest.mark.parametrize("name", [
    "configs.json",  # the default benchmark shapes
    "suite.json",    # public model shapes for --suite, some T not multiples of 128
])


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
    assert {c["K"] for c in configs} >= {1, 2, 4, 8}, "top-1 (Llama 4), few large experts (K = 2), K = 4, K = 8"
    assert any(c["E"] & (c["E"] - 1) for c in configs), "an expert count that is not a power of two"
    assert any(c["K"] == 1 and c["S"] for c in configs), "top-1 with a shared expert (Llama 4)"
    assert any(c["K"] == 4 and c["S"] for c in configs), "top-4 with a shared expert (Qwen1.5-MoE)"
    assert any(c["H"] % 128 for c in configs), "a hidden size that is not a multiple of 128 (gpt-oss: 2880)"


def test_bench_ep_traffic_counts_rows_routed_to_each_rank():
    import sys

    import torch
    sys.path.insert(0, str(BENCH))
    from bench_ep import traffic

    # W = 2 ranks of T = 2 tokens, E = 4 experts (rank 0 owns 0, 1; rank 1 owns 2, 3), K = 2, H = 8
    idx = torch.tensor([[0, 2], [1, 3],     # rank 0's tokens
                        [0, 1], [3, 2]])    # rank 1's tokens
    r0, r1 = traffic(idx, 2, 0, 8, 4), traffic(idx, 2, 1, 8, 4)
    assert (r0["rows"], r0["remote_rows"]) == (4, 2)   # ids 0, 1 at (0,0), (1,0), (2,0), (2,1)
    assert (r1["rows"], r1["remote_rows"]) == (4, 2)   # ids 2, 3 at (0,1), (1,1), (3,0), (3,1)
    assert r0["bytes"] == 4 * 8 * 2 and r0["remote_bytes"] == 2 * 8 * 2


@pytest.mark.parametrize("spec, want", [
    ("matmul", ("matmul", None, {})),                                   # the peak's 8192^3 product
    ("mok:qwen3-30b-a3b", ("mok", {"S": 0, "I": 768}, {})),               # the default rule
    ("fused:mid-64e@S0", ("fused", {"S": 0, "I": 1536}, {"MOK_FAST_FUSE_SWIGLU_BWD": "1"})),  # shared expert dropped
    ("unfused:mid-64e", ("unfused", {"S": 1536}, {"MOK_FAST_FUSE_SWIGLU_BWD": "0"})),  # the fusion off, S kept
    ("dense:mixtral-8x7b", ("dense", {"K": 2, "I": 14336}, {})),          # the dense-GEMM floor of the step
    ("mok:mid-64e@S0@balanced", ("mok", {"S": 0, "routing": "balanced"}, {})),  # every expert T*K/E rows
    ("mok:qwen3-30b-a3b", ("mok", {"routing": "random"}, {})),            # configs.json's routing by default
    ("mok:dsv3-ep8-slice@S0+MOK_FAST_GEMM_VARIANT=0,1,0,1,2,2,3,0,0+A=b=c",  # settings keep commas and later '='
     ("mok", {"S": 0, "H": 7168}, {"MOK_FAST_GEMM_VARIANT": "0,1,0,1,2,2,3,0,0", "A": "b=c"})),
])


def test_energy_probe_reads_workload_specs(spec, want):
    parse_workload, configs = energy_probe()
    kind, c, env = parse_workload(spec, configs)
    assert (kind, env) == (want[0], want[2])
    if want[1] is None:
        assert c is None
    else:
        assert {k: c[k] for k in want[1]} == want[1]


@pytest.mark.parametrize("spec", [
    "mok",                        # no config
    "slow:qwen3-30b-a3b",         # unknown kind
    "mok:qwen3-30b",              # unknown config
    "mok:qwen3-30b-a3b@S1",       # only @S0 and @balanced
    "mok:qwen3-30b-a3b@bal",      # a misspelt routing is not dropped silently
    "dense:mid-64e@balanced",     # nor a routing the dense floor would ignore
    "mok:qwen3-30b-a3b+NOEQUALS",  # a setting without '='
])


def test_energy_probe_refuses_bad_specs_naming_them(spec):
    parse_workload, configs = energy_probe()
    with pytest.raises(ValueError, match="workload"):
        parse_workload(spec, configs)


def test_energy_probe_rounds_alternate_the_order_and_summarize_per_workload():
    import sys
    sys.path.insert(0, str(BENCH))
    from energy_probe import round_order, summarize

    assert round_order(["a", "b", "c"], 3) == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"),
                                               (2, "a"), (2, "b"), (2, "c")]
    with pytest.raises(ValueError, match="--rounds"):
        round_order(["a"], 0)
    rows = summarize([("a", {"burst_ms": 3.0, "steady_ms": 4.0}), ("b", {"burst_ms": 1.0, "steady_ms": 2.0}),
                      ("a", {"burst_ms": 1.0, "steady_ms": 6.0}), ("a", {"burst_ms": 2.0, "steady_ms": 5.0})])
    assert rows == ["| a | 3 | 2.00 (1.00-3.00) | 5.00 (4.00-6.00) |", "| b | 1 | 1.00 (1.00-1.00) | 2.00 (2.00-2.00) |"]


def test_issue13_targets_reproduce_run_19s_table():
    """benchmarks/targets.py on run 19's burst times (benchmarks/RESULTS.md: matmul 791 TFLOP/s; qwen3 7.03, mid-64e
    9.76, dsv3 28.29, Mixtral 26.82 ms) gives that run's hand-made table: 67% / 72% / 77% / 82% of the peak and
    1.04x / 1.13x / 1.03x / 1.06x SonicMoE's share, which only mid-64e's ratio and Mixtral's share meet."""
    import sys
    sys.path.insert(0, str(BENCH))
    from energy_probe import parse_workload
    from targets import PRESET, TARGETS, target_rows

    _, configs = energy_probe()
    flops = {"matmul": 2 * 8192**3}
    for spec in TARGETS:
        c = parse_workload(spec, configs)[1]
        flops[spec] = 3 * 6 * c["H"] * (c["T"] * c["K"] * c["I"] + c["T"] * c["S"])
    burst = {"matmul": 2 * 8192**3 / 791e9, "mok:qwen3-30b-a3b": 7.03, "mok:mid-64e@S0": 9.76,
             "mok:dsv3-ep8-slice@S0": 28.29, "mok:mixtral-8x7b": 26.82}
    results = [(spec, {"burst_ms": burst[spec]}) for spec in PRESET]
    rows = target_rows(results, flops)
    assert rows[0].startswith("bf16 peak (matmul burst, median of 2): 791 TFLOP/s")
    got = {r.split(" | ")[0][2:]: r for r in rows[3:]}
    for spec, share, ok, ratio, ratio_ok in (("mok:qwen3-30b-a3b", 67, "not met", "1.04x", "not met"),
                                             ("mok:mid-64e@S0", 72, "not met", "1.13x", "met"),
                                             ("mok:dsv3-ep8-slice@S0", 77, "not met", "1.03x", "not met"),
                                             ("mok:mixtral-8x7b", 82, "met", "1.06x", "not met")):
        assert f"| {share}% (" in got[spec] and f"%: {ok})" in got[spec], got[spec]
        assert f"| {ratio} ({ratio_ok}) |" in got[spec], got[spec]
    with pytest.raises(ValueError, match="^results: expected a 'matmul'"):
        target_rows(results[1:-1], flops)


@pytest.mark.parametrize("c", [
    dict(T=3, H=16, I=8, K=2, S=0),    # routed experts only
    dict(T=5, H=8, I=16, K=3, S=24),   # with a shared expert
])


def test_dense_floor_runs_the_steps_flops_as_six_products_per_expert(c):
    import sys

    import torch
    sys.path.insert(0, str(BENCH))
    from dense_floor import dense_products, dense_step

    products = dense_products(c, "cpu")
    assert len(products) == 6 * (2 if c["S"] else 1)
    assert len({name for name, *_ in products}) == len(products), "each product named once"
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for _, _, a, b in products)
    assert flops == 3 * 6 * c["H"] * (c["T"] * c["K"] * c["I"] + c["T"] * c["S"])  # energy_probe's count
    for _, out, _, _ in products:
        out.fill_(float("nan"))
    dense_step(products)()
    for _, out, a, b in products:
        assert torch.equal(out, torch.mm(a, b))


@pytest.mark.parametrize("T, E, K", [
    (16, 8, 2),    # few large experts
    (24, 64, 8),   # many small ones: 3 rows each
])


def test_balanced_bench_routing_gives_every_expert_the_same_rows(T, E, K):
    import sys

    import torch
    sys.path.insert(0, str(BENCH))
    from bench_moe import bench_routing
    from mok.harness.cases import MoEConfig

    cfg = MoEConfig(T=T, H=8, I=8, E=E, K=K, S=0)
    idx, w = bench_routing(cfg, "balanced")
    random_idx, random_w = bench_routing(cfg, "random")
    assert idx.dtype == random_idx.dtype and idx.shape == (T, K)
    assert torch.equal(torch.bincount(idx.flatten(), minlength=E), torch.full((E,), T * K // E))
    assert all(len(set(row.tolist())) == K for row in idx), "distinct experts within a token"
    assert torch.equal(w, random_w)


def test_tile_waste_counts_tiles_and_short_last_tiles():
    import sys

    sys.path.insert(0, str(BENCH))
    from tile_waste import waste

    # 128: one whole tile; 129: a whole tile and a 1-row short one; 200: a whole tile and a 72-row last tile (not
    # short); 64: one short tile; 0: nothing. Rows 521, tiles 1 + 2 + 2 + 1 = 6 (768 rows of work), 2 short.
    w = waste([128, 129, 200, 64, 0], short_cost=0.5)
    assert (w["tiles"], w["short"]) == (6, 2)
    assert w["one"] == pytest.approx((768 - 521) / 521)
    assert w["split"] == pytest.approx((5 * 128 - 521) / 521)  # the two short tiles at half a tile each
    assert w["paired"] == pytest.approx((5 * 128 - 521) / 521)  # ... or both in one tile
    assert waste([128, 129, 200, 64, 0], short_cost=0.6)["split"] == pytest.approx((5.2 * 128 - 521) / 521)
    assert waste([], 0.6)["one"] == 0.0
    from tile_waste import one_launch_waste
    counts = [128, 129, 200, 64, 0]
    assert one_launch_waste(counts, 128) == pytest.approx(waste(counts, 0.6)["one"])  # the same count
    assert one_launch_waste(counts, 256) == pytest.approx((4 * 256 - 521) / 521)  # 1 + 1 + 1 + 1 + 0 tiles of 256
    assert one_launch_waste([0, 0], 256) == 0.0


def _gemm_name(tile_m: int, tile_n: int, schedule: str = "Pingpong") -> str:
    """A CUTLASS grouped GEMM kernel's name as demangled (cluster shape first, then the tile shape)."""
    return ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<"
            "cute::tuple<int, int, int> >, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::"
            "MainloopSm90ArrayTmaGmmaWarpSpecialized<4, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, "
            f"cutlass::gemm::KernelPtrArrayTmaWarpSpecialized{schedule}>, cute::tuple<cute::C<{tile_m}>, "
            f"cute::C<{tile_n}>, cute::C<64> >, cutlass::bfloat16_t> > >(Params)")


def test_profile_fast_labels_each_gemm_launch_in_order_with_its_tile():
    import sys
    sys.path.insert(0, str(BENCH))
    from profile_fast import gemm_labels, tile_of

    assert tile_of(_gemm_name(128, 192)) == "128x192" and tile_of("combine_rows_k<true>") == ""
    assert tile_of(_gemm_name(64, 256).replace(" >", ">")) == "64x256"  # with or without the space
    flops = [("gate/up", 4e12), ("down", 2e12)]
    lines = gemm_labels([(_gemm_name(128, 192), 4.0), ("combine_rows_k<true>", 0.5),
                         (_gemm_name(128, 256, "Cooperative"), 2.0), (_gemm_name(64, 256), 1.0)], flops)
    assert "128x192  [gate/up: 1000 TFLOP/s]" in lines[0]
    assert "combine" in lines[1] and "TFLOP/s" not in lines[1]  # not a GEMM: takes no GEMM's label
    assert "128x256  [down: 1000 TFLOP/s]" in lines[2]
    assert "64x256  [?: 0 TFLOP/s]" in lines[3]  # more GEMM launches than labels: named as unknown


@pytest.mark.parametrize("epilogue, says", [
    ("mok::SwigluBwdLoadedEpilogueArray<long*>", " SwiGLU-bwd epilogue"),  # the d_a launch (ping-pong)
    ("mok::StagedAdapter<mok::SwigluFwdStagedEpilogueArray<long*> >", " SwiGLU-fwd epilogue, staged"),  # run 48's
    ("cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<mok::SwigluFwdEpilogueArray<long*> >",
     " SwiGLU-fwd epilogue"),  # the fused gate/up launch's cooperative tile: register stores
    ("cutlass::epilogue::fusion::LinearCombination<cutlass::bfloat16_t, float, void, float>", " bf16-out"),  # down
])
def test_profile_fast_names_each_epilogue(epilogue, says):
    """profile_fast.short: a GEMM launch's name says which epilogue it ran (the first match wins, so the staged
    forward epilogue is not taken for the register one)."""
    import sys
    sys.path.insert(0, str(BENCH))
    from profile_fast import short

    assert short(_gemm_name(128, 192)[:-len("(Params)")] + epilogue + "(Params)").endswith("pingpong" + says)


def _tiny_bench_inputs(S: int) -> dict:
    """bench_moe's inputs on the CPU, T, H, I, E, K = 6, 16, 8, 4, 2 and S shared columns (None when 0): bf16 x [T, H],
    int64 topk_idx [T, K], fp32 topk_weight [T, K], bf16 weights, bf16 dy [T, H]."""
    import torch

    T, H, I, E, K = 6, 16, 8, 4, 2
    bf = {"dtype": torch.bfloat16}
    return {"x": torch.randn(T, H, **bf), "topk_idx": torch.randint(0, E, (T, K)), "topk_weight": torch.rand(T, K),
            "shared_gate": torch.randn(S, H, **bf) if S else None, "shared_up": torch.randn(S, H, **bf) if S else None,
            "shared_down": torch.randn(H, S, **bf) if S else None, "routed_gate": torch.randn(E, I, H, **bf),
            "routed_up": torch.randn(E, I, H, **bf), "routed_down": torch.randn(E, H, I, **bf),
            "dy": torch.randn(T, H, **bf)}


@pytest.mark.parametrize("S", [0, 8])  # without / with a shared expert (its gate and up stacked too for mok_gu)
def test_bench_moe_charges_each_method_one_copy_of_the_inputs(S):
    """bench_moe's peak GiB: each method counts the bytes of the inputs it reads once. The loop also keeps the
    inputs the baselines clone and mok_gu stacks; counting those (as before run 26) inflated the grouped_mm path's
    peak by all its inputs and mok_gu's by its gate/up weights."""
    import sys
    sys.path.insert(0, str(BENCH))
    from bench_moe import ARGS, Method, peak_gib

    inp = _tiny_bench_inputs(S)
    one_copy = sum(v.numel() * v.element_size() for k, v in inp.items() if v is not None and (k in ARGS or k == "dy"))
    for name in ("mok", "mok_gu", "grouped_mm"):
        meth = Method(name, inp)
        assert meth.input_bytes() == one_copy, name
        theirs = {t.untyped_storage().data_ptr() for t in meth.inputs()}
        shared = theirs & {v.untyped_storage().data_ptr() for k, v in inp.items() if v is not None}
        want = {"mok": len(theirs), "mok_gu": len(theirs) - (2 if S else 1)}.get(name, 2)  # own copies apart
        assert len(shared) == want, (name, len(shared))  # grouped_mm reads only topk_idx and dy of inp itself
    assert peak_gib(3 * 2**30, 2**30, 2**29) == 2.5


@pytest.mark.parametrize("name", ["grouped_mm",  # the baseline the suite compares peak memory with
                                  "naive"])  # the other baseline built on the same autograd leaves
def test_bench_moe_frees_a_baseline_method_without_the_garbage_collector(name):
    """A baseline Method (its cloned weights) is freed by `del` alone. In a reference cycle (run 50: self.fn was a
    lambda over self) it lived until the collector ran, inside the next method's timed calls, so that method's
    `resident` held bytes freed before its peak: DBRX's grouped_mm peak read 10.63 GiB against 13.88 in run 39."""
    import gc
    import sys
    import weakref
    sys.path.insert(0, str(BENCH))
    from bench_moe import Method

    meth = Method(name, _tiny_bench_inputs(0))
    gone, leaf = weakref.ref(meth), weakref.ref(meth.leaves["routed_gate"])
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del meth
        assert gone() is None and leaf() is None, f"{name}: a Method outlives `del` (a reference cycle)"
    finally:
        if was_enabled:
            gc.enable()


def test_saved_swiglu_dtype_scan_rounds_only_its_modes_inputs():
    """benchmarks/saved_swiglu_dtype_scan.py: mode none is the fp32 [p | q] form, each other mode rounds its inputs
    (so its scan measures that rounding), and an unknown mode is refused."""
    import subprocess
    import sys

    import torch
    sys.path.insert(0, str(BENCH))
    from saved_swiglu_dtype_scan import MODES, swiglu_bwd_rows, swiglu_fwd_rows_keeping_gu

    g = torch.Generator().manual_seed(3)
    I, rows = 16, 32
    gu, da = torch.randn(rows, 2 * I, generator=g) * 3, torch.randn(rows, I, generator=g)
    out = {}
    for mode in MODES:
        out[mode] = torch.empty(rows, 2 * I, dtype=torch.bfloat16)
        swiglu_bwd_rows(mode)(da, gu, out[mode], I)
    sig = torch.sigmoid(gu[:, :I])
    p = gu[:, I:] * (sig * (1 + gu[:, :I] * (1 - sig)))
    assert torch.equal(out["none"][:, :I], (da * p).bfloat16())
    assert torch.equal(out["none"][:, I:], (da * (gu[:, :I] * sig)).bfloat16())
    for mode in MODES[:-1]:
        if mode == "pq24":  # the top 24 bits: bf16 products seldom move, so check its formula on the inputs cut
            cut = (p.view(torch.int32) & ~0xFF).view(torch.float32)
            assert not torch.equal(cut, p) and torch.equal(out[mode][:, :I], (da * cut).bfloat16())
            continue
        assert not torch.equal(out[mode], out["none"]), mode
    # its forward keeps [g | u] for the modes to round (the emulator's own turns it into [p | q])
    kept, a = gu.clone(), torch.empty(rows, I, dtype=torch.bfloat16)
    swiglu_fwd_rows_keeping_gu(kept, a, I)
    assert torch.equal(kept, gu) and torch.equal(a, (gu[:, :I] * sig * gu[:, I:]).bfloat16())
    r = subprocess.run([sys.executable, str(BENCH / "saved_swiglu_dtype_scan.py"), "bf16"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "MODE one of" in r.stderr


def test_bench_moe_refuses_an_unknown_config_name_and_names_the_option():
    """`bench_moe.py --configs` runs the configs in the order given; a name the shape file lacks is an error (exit 2,
    naming --configs and the name), not a config silently skipped."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(BENCH / "bench_moe.py"), "--suite", "--configs", "qwen3-30b-a3b,nope-7b"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--configs: no config 'nope-7b' in suite.json" in r.stderr, r.stderr


def test_bench_moe_losses_name_only_peers_and_the_peak_memory():
    """bench_moe's closing lines compare each mok method with the peers only (mok_gu is the same layer, not a
    peer), on time forward and forward+backward, and on peak memory."""
    import sys
    sys.path.insert(0, str(BENCH))
    from bench_moe import losses

    def row(method, fwd, fb, gib, config="a"):
        return dict(config=config, routing="random", method=method, fwd_ms=fwd, fb_ms=fb, peak_gib=gib)
    rows = [row("mok", 1.0, 3.0, 2.0), row("mok_gu", 0.9, 3.5, 1.0), row("grouped_mm", 1.1, 3.2, 1.5),
            row("mok", 1.0, 3.0, 2.0, "b"), row("grouped_mm", 2.0, 4.0, 3.0, "b")]
    slower, bigger = losses(rows)
    assert slower == "mok slower than a peer on: a random mok_gu vs grouped_mm (fwd+bwd)", slower
    assert bigger == "mok's peak memory above a peer's on: a random mok vs grouped_mm (2.00 against 1.50 GiB)", bigger
    assert losses(rows[3:]) == ["mok slower than a peer on: none", "mok's peak memory above a peer's on: none"]


def test_named_configs_keep_the_order_given_and_name_what_is_missing():
    """bench_moe.named_configs (profile_peers.py, sonic_check.py): configs.json and suite.json names in the order
    given; an unknown name is refused, named, not skipped."""
    import sys
    sys.path.insert(0, str(BENCH))
    from bench_moe import named_configs

    assert [c["name"] for c in named_configs("mixtral-8x7b,qwen3-30b-a3b")] == ["mixtral-8x7b", "qwen3-30b-a3b"]
    with pytest.raises(ValueError, match=r"^configs: no config 'nope', 'x' in configs.json or suite.json"):
        named_configs("qwen3-30b-a3b,nope,x")
