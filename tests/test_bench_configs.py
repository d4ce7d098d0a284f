"""The benchmark shape files (benchmarks/configs.json, benchmarks/suite.json) describe layers the fast
path accepts, so a device run never stops half-way on a bad row."""
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


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


def _energy_probe():
    """(energy_probe.parse_workload, {name: config} of configs.json and suite.json)."""
    import sys
    sys.path.insert(0, str(BENCH))
    from bench_moe import CONFIGS, SUITE, load_configs
    from energy_probe import parse_workload

    return parse_workload, {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}


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
    parse_workload, configs = _energy_probe()
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
    parse_workload, configs = _energy_probe()
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

    _, configs = _energy_probe()
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


def _new_shapes_check_workloads(tmp_path, step: str):
    """[(kind, config or None, env)] of the workloads `bash benchmarks/new_shapes_check.sh <step>` prints (a step
    that runs nothing), each parsed by energy_probe, so a typo in the script cannot cost its device call."""
    parse, configs = _energy_probe()
    specs = _script_step("new_shapes_check.sh", step, tmp_path)
    assert len(specs) == len(set(specs)), specs  # each workload once
    return [parse(s, configs) for s in specs]


def test_new_shapes_check_energy_workloads_all_parse(tmp_path):
    """Run 22's energy step: the rule and its alternatives on the three shapes added to suite.json in run 21."""
    parsed = _new_shapes_check_workloads(tmp_path, "workloads")
    assert len(parsed) == 10
    shapes = {cfg["name"] for _, cfg, _ in parsed if cfg is not None}
    assert shapes == {"glm-4.5-air", "phi-3.5-moe", "granite-3.0-3b-a800m"}, shapes
    assert {"MOK_FAST_FUSE_SWIGLU_BWD": "0"} in [env for _, _, env in parsed]


def test_new_shapes_check_next_step_pairs_each_shape_with_the_other_tile(tmp_path):
    """The `next` step (the follow-up device call) runs each shape by the rule and with the row-tiled GEMMs forced
    to the other tile."""
    parsed = _new_shapes_check_workloads(tmp_path, "next-workloads")
    assert len(parsed) == 7
    forced = {cfg["name"] for _, cfg, env in parsed if env.get("MOK_FAST_GEMM_VARIANT")}
    plain = {cfg["name"] for _, cfg, env in parsed if cfg is not None and not env}
    assert forced == plain == {"mid-64e", "glm-4.5-air", "dsv3-ep8-slice"}, (forced, plain)


def _script_step(script: str, step: str, tmp_path) -> list[str]:
    """The words `bash benchmarks/<script> <step>` prints (a step that runs nothing); it must exit 0."""
    import os
    import subprocess

    r = subprocess.run(["bash", str(BENCH / script), step], capture_output=True, text=True, cwd=BENCH.parent,
                       env={**os.environ, "OUT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_main_check_run25_workloads_and_configs_all_parse(tmp_path):
    """Run 25's device call: the five new suite shapes by name (bench_moe --configs) and as energy_probe
    workloads, mok and the grouped_mm path each."""
    parse, configs = _energy_probe()
    names = _script_step("main_check_run25.sh", "configs", tmp_path)[0].split(",")
    assert len(names) == 5 and set(names) <= set(configs), names
    parsed = [parse(s, configs) for s in _script_step("main_check_run25.sh", "workloads", tmp_path)]
    assert [k for k, _, _ in parsed].count("grouped_mm") == 5
    assert {cfg["name"] for _, cfg, _ in parsed if cfg is not None} == set(names)


def test_main_check_run26_configs_are_suite_shapes(tmp_path):
    """Run 26's device call: its --configs are all shapes of the suite (bench_moe --suite runs only those)."""
    names = _script_step("main_check_run26.sh", "configs", tmp_path)[0].split(",")
    suite = {c["name"] for c in json.loads((BENCH / "suite.json").read_text())["configs"]}
    assert len(names) == 4 and set(names) <= suite, (names, sorted(suite))


@pytest.mark.parametrize("S", [0, 8])  # without / with a shared expert (its gate and up stacked too for mok_gu)
def test_bench_moe_charges_each_method_one_copy_of_the_inputs(S):
    """bench_moe's peak GiB: each method counts the bytes of the inputs it reads once. The loop also keeps the
    inputs the baselines clone and mok_gu stacks; counting those (as before run 26) inflated the grouped_mm path's
    peak by all its inputs and mok_gu's by its gate/up weights."""
    import sys

    import torch
    sys.path.insert(0, str(BENCH))
    from bench_moe import ARGS, Method, peak_gib

    T, H, I, E, K = 6, 16, 8, 4, 2
    bf = {"dtype": torch.bfloat16}
    inp = {"x": torch.randn(T, H, **bf), "topk_idx": torch.randint(0, E, (T, K)), "topk_weight": torch.rand(T, K),
           "shared_gate": torch.randn(S, H, **bf) if S else None, "shared_up": torch.randn(S, H, **bf) if S else None,
           "shared_down": torch.randn(H, S, **bf) if S else None, "routed_gate": torch.randn(E, I, H, **bf),
           "routed_up": torch.randn(E, I, H, **bf), "routed_down": torch.randn(E, H, I, **bf),
           "dy": torch.randn(T, H, **bf)}
    one_copy = sum(v.numel() * v.element_size() for k, v in inp.items() if v is not None and (k in ARGS or k == "dy"))
    for name in ("mok", "mok_gu", "grouped_mm"):
        meth = Method(name, inp)
        assert meth.input_bytes() == one_copy, name
        theirs = {t.untyped_storage().data_ptr() for t in meth.inputs()}
        shared = theirs & {v.untyped_storage().data_ptr() for k, v in inp.items() if v is not None}
        want = {"mok": len(theirs), "mok_gu": len(theirs) - (2 if S else 1)}.get(name, 2)  # own copies apart
        assert len(shared) == want, (name, len(shared))  # grouped_mm reads only topk_idx and dy of inp itself
    assert peak_gib(3 * 2**30, 2**30, 2**29) == 2.5


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


def test_main_check_run28_workloads_parse_and_configs_cover_the_suite(tmp_path):
    """Run 28's device calls: the energy step's extra workloads parse (the fused d_a kind forced to variant 2 only),
    and the suite step names every suite shape once."""
    parse, configs = _energy_probe()

    def step(name):
        return _script_step("main_check_run28.sh", name, tmp_path)

    parsed = [parse(s, configs) for s in step("workloads")]
    forced = [env["MOK_FAST_GEMM_VARIANT"] for _, _, env in parsed if env]
    assert forced and all(v.split(",") == [""] * 6 + ["2", "", ""] for v in forced), forced
    names = step("configs")[0].split(",")
    suite = {c["name"] for c in json.loads((BENCH / "suite.json").read_text())["configs"]}
    assert len(names) == len(set(names)) and set(names) == suite, sorted(suite ^ set(names))
    module = step("module-configs")[0].split(",")
    assert len(module) == 5 and set(module) <= suite, module
    peak = step("peak-configs")[0].split(",")
    assert len(peak) == len(set(peak)) == 8 and set(peak) <= suite, peak


def test_main_check_run29_d_act_workloads_pair_each_shape_fused_and_apart(tmp_path):
    """Run 29's d-act step: each shape once with the SwiGLU backward fused into the d_a GEMM and once apart."""
    parse, configs = _energy_probe()
    parsed = [parse(s, configs) for s in _script_step("main_check_run29.sh", "workloads", tmp_path)]
    kinds = {(kind, cfg["name"]) for kind, cfg, _ in parsed}
    assert len(kinds) == len(parsed) == 4, parsed
    assert kinds == {(k, n) for k in ("fused", "unfused") for n in ("qwen3-30b-a3b", "olmoe-1b-7b")}, kinds


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


def test_main_check_run31_ab_configs_are_suite_shapes(tmp_path):
    """Run 31's ab and fwd-ab steps name suite shapes only (bench_moe.py and bench_fused.py would stop at an unknown
    one), each once."""
    suite = {c["name"] for c in json.loads((BENCH / "suite.json").read_text())["configs"]}
    for step in ("ab-configs", "fwd-configs"):
        names = _script_step("main_check_run31.sh", step, tmp_path)[0].split(",")
        assert len(names) == len(set(names)) >= 4 and set(names) <= suite, (step, sorted(set(names) - suite))


def test_main_check_run32_workloads_parse_and_force_only_the_d_a_kind(tmp_path):
    """Run 32's planned device steps: the stages and dx-stages steps' configs and workloads name known shapes
    (profile_fast.py and energy_probe.py stop at an unknown one), with no settings of their own, and the da-v2 step
    pairs mid-64e with itself, the second forcing only the fused d_a kind (MOK_FAST_GEMM_VARIANT's seventh entry) to
    variant 2."""
    parse, configs = _energy_probe()

    def step(name):
        return _script_step("main_check_run32.sh", name, tmp_path)

    names = step("stage-configs")[0].split(",")
    assert len(names) == len(set(names)) == 3 and set(names) <= set(configs), names
    staged = [parse(s, configs) for s in step("stage-workloads")]
    assert [c["name"] for _, c, _ in staged] == names and all(env == {} for _, _, env in staged), staged
    dx = [parse(s, configs) for s in step("dx-workloads")]
    assert {c["name"] for _, c, _ in dx} >= set(names) and all(env == {} for _, _, env in dx), dx
    (k0, c0, env0), (k1, c1, env1) = [parse(s, configs) for s in step("da-workloads")]
    assert k0 == k1 == "mok" and c0 == c1 and c0["name"] == "mid-64e" and c0["S"] == 0, (c0, c1)
    assert env0 == {} and env1["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 6 + ["2", "", ""], env1


def test_stages_probe_diff_still_applies_to_this_tree():
    """benchmarks/stages_probe.sh patches a copy of csrc with stages_probe.diff: a change to csrc that the diff no
    longer fits would stop the probe's build in a device session."""
    import subprocess

    r = subprocess.run(["git", "apply", "--check", str(BENCH / "stages_probe.diff")], capture_output=True,
                       text=True, cwd=BENCH.parent)
    assert r.returncode == 0, r.stderr


def test_main_check_run33_gate_up_tiles_pair_each_shape_with_only_the_fused_gate_up_kind_forced(tmp_path):
    """Run 33's gu-tiles step: each few-large-expert shape twice, as the rule runs it and with only the fused gate/up
    + SwiGLU kind (MOK_FAST_GEMM_VARIANT's eighth entry) forced to the cooperative tile, variant 0."""
    parse, configs = _energy_probe()
    parsed = [parse(s, configs) for s in _script_step("main_check_run33.sh", "gu-workloads", tmp_path)]
    assert len(parsed) == 8 and all(kind == "mok" for kind, _, _ in parsed), parsed
    for (_, c0, env0), (_, c1, env1) in zip(parsed[::2], parsed[1::2]):
        assert c0 == c1 and c0["I"] >= 4096 and env0 == {}, (c0, c1, env0)
        assert env1["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 7 + ["0", ""], env1


def test_main_check_run34_workloads_force_only_the_kind_they_compare(tmp_path):
    """Run 34's steps: `old-workloads`, two of issue 13's preset shapes under run 33's rule (only the fused gate/up +
    SwiGLU kind, MOK_FAST_GEMM_VARIANT's eighth entry, forced to the ping-pong tile); `da-workloads`, each shape as
    the rule runs it and then with only the d_a + SwiGLU-backward kind (the seventh entry) forced cooperative."""
    parse, configs = _energy_probe()
    old = [parse(s, configs) for s in _script_step("main_check_run34.sh", "old-workloads", tmp_path)]
    assert [c["name"] for _, c, _ in old] == ["dsv3-ep8-slice", "mixtral-8x7b"], old
    for kind, c, env in old:
        assert kind == "mok" and env["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 7 + ["3", ""], env
    da = [parse(s, configs) for s in _script_step("main_check_run34.sh", "da-workloads", tmp_path)]
    assert len(da) == 10 and all(kind == "mok" for kind, _, _ in da), da
    for (_, c0, env0), (_, c1, env1) in zip(da[::2], da[1::2]):
        assert c0 == c1 and env0 == {}, (c0, c1, env0)
        assert env1["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 6 + ["0", "", ""], env1


def test_main_check_run35_quad_workloads_force_only_the_d_a_kind_to_variant_4(tmp_path):
    """Run 35's quad step: each shape as the rule runs it and then with only the d_a + SwiGLU-backward kind
    (MOK_FAST_GEMM_VARIANT's seventh entry) forced to variant 4, its 16-byte [dg | du] stores; the small-expert
    shapes whose d_a launch is the slowest come first."""
    parse, configs = _energy_probe()
    parsed = [parse(s, configs) for s in _script_step("main_check_run35.sh", "quad-workloads", tmp_path)]
    assert len(parsed) == 10 and all(kind == "mok" for kind, _, _ in parsed), parsed
    assert [c["name"] for _, c, _ in parsed[:4:2]] == ["qwen3-30b-a3b", "olmoe-1b-7b"], parsed
    for (_, c0, env0), (_, c1, env1) in zip(parsed[::2], parsed[1::2]):
        assert c0 == c1 and env0 == {}, (c0, c1, env0)
        assert env1["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 6 + ["4", "", ""], env1


def test_main_check_run35_gu_workloads_pair_large_expert_shapes_with_the_gate_up_kind_cooperative(tmp_path):
    """Run 35's gu-h200 step: each large-expert suite shape (I > 1536, H >= 4096: cooperative on an H100) as the rule
    runs it and then with only the fused gate/up + SwiGLU kind (the eighth entry) forced cooperative, variant 0."""
    parse, configs = _energy_probe()
    parsed = [parse(s, configs) for s in _script_step("main_check_run35.sh", "gu-workloads", tmp_path)]
    assert len(parsed) == 8 and all(kind == "mok" for kind, _, _ in parsed), parsed
    for (_, c0, env0), (_, c1, env1) in zip(parsed[::2], parsed[1::2]):
        assert c0 == c1 and env0 == {} and c0["I"] > 1536 and c0["H"] >= 4096, (c0, c1, env0)
        assert env1["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 7 + ["0", ""], env1


def test_main_check_run35_da_v2_workloads_pair_small_expert_shapes_with_the_d_a_kind_in_clusters(tmp_path):
    """Run 35's da-v2 step: many-small-expert shapes (I <= 1536) as the rule runs them and then with only the d_a +
    SwiGLU-backward kind (the seventh entry) forced to the 2x1-cluster ping-pong tile, variant 2."""
    parse, configs = _energy_probe()
    parsed = [parse(s, configs) for s in _script_step("main_check_run35.sh", "da-v2-workloads", tmp_path)]
    assert len(parsed) == 10 and all(kind == "mok" for kind, _, _ in parsed), parsed
    for (_, c0, env0), (_, c1, env1) in zip(parsed[::2], parsed[1::2]):
        assert c0 == c1 and env0 == {} and c0["I"] <= 1536, (c0, c1, env0)
        assert env1["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 6 + ["2", "", ""], env1
