"""The device-call scripts (benchmarks/main_check_run*.sh, new_shapes_check.sh): each printing step's workloads parse
as energy_probe.py reads them and force only what the step compares, and its configs are suite shapes, so a typo in
a script cannot cost its device call. (The benchmarks they run and the diffs they apply: test_bench_tools.py.)"""
import json

import pytest

from bench_scripts import (BENCH, energy_probe, forced_entries, forced_kind_groups, forced_kind_pairs, row_tiled_kinds,
                           script_step)


def _new_shapes_check_workloads(tmp_path, step: str):
    """[(kind, config or None, env)] of the workloads `bash benchmarks/new_shapes_check.sh <step>` prints (a step
    that runs nothing), each parsed by energy_probe, so a typo in the script cannot cost its device call."""
    parse, configs = energy_probe()
    specs = script_step("new_shapes_check.sh", step, tmp_path)
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


def test_main_check_run25_workloads_and_configs_all_parse(tmp_path):
    """Run 25's device call: the five new suite shapes by name (bench_moe --configs) and as energy_probe
    workloads, mok and the grouped_mm path each."""
    parse, configs = energy_probe()
    names = script_step("main_check_run25.sh", "configs", tmp_path)[0].split(",")
    assert len(names) == 5 and set(names) <= set(configs), names
    parsed = [parse(s, configs) for s in script_step("main_check_run25.sh", "workloads", tmp_path)]
    assert [k for k, _, _ in parsed].count("grouped_mm") == 5
    assert {cfg["name"] for _, cfg, _ in parsed if cfg is not None} == set(names)


def test_main_check_run26_configs_are_suite_shapes(tmp_path):
    """Run 26's device call: its --configs are all shapes of the suite (bench_moe --suite runs only those)."""
    names = script_step("main_check_run26.sh", "configs", tmp_path)[0].split(",")
    suite = {c["name"] for c in json.loads((BENCH / "suite.json").read_text())["configs"]}
    assert len(names) == 4 and set(names) <= suite, (names, sorted(suite))


def test_main_check_run28_workloads_parse_and_configs_cover_the_suite(tmp_path):
    """Run 28's device calls: the energy step's extra workloads parse (the fused d_a kind forced to variant 2 only),
    and the suite step names every suite shape once."""
    parse, configs = energy_probe()

    def step(name):
        return script_step("main_check_run28.sh", name, tmp_path)

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
    parse, configs = energy_probe()
    parsed = [parse(s, configs) for s in script_step("main_check_run29.sh", "workloads", tmp_path)]
    kinds = {(kind, cfg["name"]) for kind, cfg, _ in parsed}
    assert len(kinds) == len(parsed) == 4, parsed
    assert kinds == {(k, n) for k in ("fused", "unfused") for n in ("qwen3-30b-a3b", "olmoe-1b-7b")}, kinds


def test_main_check_run31_ab_configs_are_suite_shapes(tmp_path):
    """Run 31's ab and fwd-ab steps name suite shapes only (bench_moe.py and bench_fused.py would stop at an unknown
    one), each once."""
    suite = {c["name"] for c in json.loads((BENCH / "suite.json").read_text())["configs"]}
    for step in ("ab-configs", "fwd-configs"):
        names = script_step("main_check_run31.sh", step, tmp_path)[0].split(",")
        assert len(names) == len(set(names)) >= 4 and set(names) <= suite, (step, sorted(set(names) - suite))


def test_main_check_run32_workloads_parse_and_force_only_the_d_a_kind(tmp_path):
    """Run 32's planned device steps: the stages and dx-stages steps' configs and workloads name known shapes
    (profile_fast.py and energy_probe.py stop at an unknown one), with no settings of their own, and the da-v2 step
    pairs mid-64e with itself, the second forcing only the fused d_a kind (MOK_FAST_GEMM_VARIANT's seventh entry) to
    variant 2."""
    parse, configs = energy_probe()

    def step(name):
        return script_step("main_check_run32.sh", name, tmp_path)

    names = step("stage-configs")[0].split(",")
    assert len(names) == len(set(names)) == 3 and set(names) <= set(configs), names
    staged = [parse(s, configs) for s in step("stage-workloads")]
    assert [c["name"] for _, c, _ in staged] == names and all(env == {} for _, _, env in staged), staged
    dx = [parse(s, configs) for s in step("dx-workloads")]
    assert {c["name"] for _, c, _ in dx} >= set(names) and all(env == {} for _, _, env in dx), dx
    (k0, c0, env0), (k1, c1, env1) = [parse(s, configs) for s in step("da-workloads")]
    assert k0 == k1 == "mok" and c0 == c1 and c0["name"] == "mid-64e" and c0["S"] == 0, (c0, c1)
    assert env0 == {} and env1["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 6 + ["2", "", ""], env1


def test_main_check_run33_gate_up_tiles_pair_each_shape_with_only_the_fused_gate_up_kind_forced(tmp_path):
    """Run 33's gu-tiles step: each few-large-expert shape twice, as the rule runs it and with only the fused gate/up
    + SwiGLU kind (MOK_FAST_GEMM_VARIANT's eighth entry) forced to the cooperative tile, variant 0."""
    shapes = forced_kind_pairs("main_check_run33.sh", "gu-workloads", tmp_path, kind=7, variant="0", n_pairs=4)
    assert all(c["I"] >= 4096 for c in shapes), shapes


def test_main_check_run34_workloads_force_only_the_kind_they_compare(tmp_path):
    """Run 34's steps: `old-workloads`, two of issue 13's preset shapes under run 33's rule (only the fused gate/up +
    SwiGLU kind, MOK_FAST_GEMM_VARIANT's eighth entry, forced to the ping-pong tile); `da-workloads`, each shape as
    the rule runs it and then with only the d_a + SwiGLU-backward kind (the seventh entry) forced cooperative."""
    parse, configs = energy_probe()
    old = [parse(s, configs) for s in script_step("main_check_run34.sh", "old-workloads", tmp_path)]
    assert [c["name"] for _, c, _ in old] == ["dsv3-ep8-slice", "mixtral-8x7b"], old
    for kind, c, env in old:
        assert kind == "mok" and env["MOK_FAST_GEMM_VARIANT"].split(",") == [""] * 7 + ["3", ""], env
    forced_kind_pairs("main_check_run34.sh", "da-workloads", tmp_path, kind=6, variant="0", n_pairs=5)


def test_main_check_run35_quad_workloads_force_only_the_d_a_kind_to_variant_4(tmp_path):
    """Run 35's quad step: each shape as the rule runs it and then with only the d_a + SwiGLU-backward kind
    (MOK_FAST_GEMM_VARIANT's seventh entry) forced to variant 4, its 16-byte [dg | du] stores; the small-expert
    shapes whose d_a launch is the slowest come first."""
    shapes = forced_kind_pairs("main_check_run35.sh", "quad-workloads", tmp_path, kind=6, variant="4", n_pairs=5)
    assert [c["name"] for c in shapes[:2]] == ["qwen3-30b-a3b", "olmoe-1b-7b"], shapes


def test_main_check_run35_gu_workloads_pair_large_expert_shapes_with_the_gate_up_kind_cooperative(tmp_path):
    """Run 35's gu-h200 step: each large-expert suite shape (I > 1536, H >= 4096: cooperative on an H100) as the rule
    runs it and then with only the fused gate/up + SwiGLU kind (the eighth entry) forced cooperative, variant 0."""
    shapes = forced_kind_pairs("main_check_run35.sh", "gu-workloads", tmp_path, kind=7, variant="0", n_pairs=4)
    assert all(c["I"] > 1536 and c["H"] >= 4096 for c in shapes), shapes


def test_main_check_run35_da_v2_workloads_pair_small_expert_shapes_with_the_d_a_kind_in_clusters(tmp_path):
    """Run 35's da-v2 step: many-small-expert shapes (I <= 1536) as the rule runs them and then with only the d_a +
    SwiGLU-backward kind (the seventh entry) forced to the 2x1-cluster ping-pong tile, variant 2."""
    shapes = forced_kind_pairs("main_check_run35.sh", "da-v2-workloads", tmp_path, kind=6, variant="2", n_pairs=5)
    assert all(c["I"] <= 1536 for c in shapes), shapes


def test_main_check_run36_floor_workloads_are_issue13_shapes_as_dense_floors(tmp_path):
    """Run 36's floor step: each of issue 13's four shapes (benchmarks/targets.py, what --preset issue13 adds) as a
    dense cuBLAS floor, with the same config (the shared expert dropped where the preset drops it) and nothing
    forced."""
    from targets import TARGETS
    parse, configs = energy_probe()
    specs = script_step("main_check_run36.sh", "floor-workloads", tmp_path)
    parsed = [parse(s, configs) for s in specs]
    assert all(kind == "dense" and env == {} for kind, _, env in parsed), parsed
    assert [s.replace("dense:", "mok:", 1) for s in specs] == list(TARGETS), specs


def test_main_check_run36_cache_workloads_are_issue13_shapes_as_the_rule_runs_them(tmp_path):
    """Run 36's cache step: issue 13's four shapes, nothing forced (the two libraries are what differs), and its
    profile configs are the same shapes."""
    from targets import TARGETS
    parse, configs = energy_probe()
    specs = script_step("main_check_run36.sh", "cache-workloads", tmp_path)
    assert specs == list(TARGETS), specs
    assert all(kind == "mok" and env == {} for kind, _, env in (parse(s, configs) for s in specs))


def test_main_check_run37_store_workloads_are_issue13_shapes_and_olmoe_as_the_rule_runs_them(tmp_path):
    """Run 37's store step: issue 13's four shapes and OLMoE-1B-7B, each once, nothing forced (the two libraries
    are what differs)."""
    parse, configs = energy_probe()  # puts benchmarks/ on the path
    from targets import TARGETS
    specs = script_step("main_check_run37.sh", "store-workloads", tmp_path)
    assert specs == [*TARGETS, "mok:olmoe-1b-7b"], specs
    assert all(kind == "mok" and env == {} for kind, _, env in (parse(s, configs) for s in specs))


def test_main_check_run37_coop_da_workloads_pair_each_small_expert_shape_with_the_cooperative_d_a(tmp_path):
    """Run 37's coop-da step: each small-expert shape by the rule, then with only the fused d_a kind
    (GEMM_NN_SWIGLU_BWD) forced to the cooperative 128x256 tile, variant 0."""
    shapes = forced_kind_pairs("main_check_run37.sh", "coop-da-workloads", tmp_path, kind=6, variant="0", n_pairs=3)
    assert all(c["I"] <= 1536 for c in shapes), shapes


def test_main_check_run38_da_coop_workloads_pair_issue13_shapes_and_olmoe_with_the_cooperative_d_a(tmp_path):
    """Run 38's da-coop step: issue 13's four shapes and OLMoE-1B-7B by the rule, then with only the fused d_a kind
    (GEMM_NN_SWIGLU_BWD) forced to the cooperative 128x256 tile, variant 0."""
    shapes = forced_kind_pairs("main_check_run38.sh", "da-coop-workloads", tmp_path, kind=6, variant="0", n_pairs=5)
    assert [(c["E"], c["S"]) for c in shapes] == [(128, 0), (64, 0), (32, 0), (8, 0), (64, 0)], shapes


def test_main_check_run39_pdl_workloads_pair_issue13_shapes_and_olmoe_with_pdl_off(tmp_path):
    """Run 39's pdl-ab step: issue 13's four shapes and OLMoE-1B-7B as the library launches them, each followed by
    the same workload with MOK_FAST_PDL=0 and nothing else set."""
    parse, configs = energy_probe()  # puts benchmarks/ on the path
    from targets import TARGETS
    specs = script_step("main_check_run39.sh", "pdl-workloads", tmp_path)
    parsed = [parse(s, configs) for s in specs]
    assert specs[::2] == [*TARGETS, "mok:olmoe-1b-7b"], specs
    assert all(k == "mok" for k, _, _ in parsed), parsed
    for (_, c0, env0), (_, c1, env1) in zip(parsed[::2], parsed[1::2]):
        assert c0 == c1 and env0 == {} and env1 == {"MOK_FAST_PDL": "0"}, (c0, c1, env0, env1)


def test_main_check_run39_new_shapes_are_suite_shapes_and_tile_workloads_force_only_row_tiled_kinds(tmp_path):
    """Run 39's suite-new step names suite.json shapes; its next-tiles step runs Qwen3-Next-80B-A3B and DeepSeek-V2
    by the rule and with the row-tiled kinds (forward, down, d_x, fused gate/up and d_a) cooperative, variant 0, the
    weight gradients left to the rule; then Qwen3-Next with only the fused gate/up kind, then only the fused d_a
    kind, cooperative."""
    parse, configs = energy_probe()
    from bench_moe import SUITE, load_configs
    names = script_step("main_check_run39.sh", "new-shapes", tmp_path)[0].split(",")
    assert set(names) <= {c["name"] for c in load_configs(SUITE)}, names
    from mok.fast._lib import GEMM_NN_SWIGLU_BWD, GEMM_TN_SWIGLU_FWD
    parsed = [parse(s, configs) for s in script_step("main_check_run39.sh", "tile-workloads", tmp_path)]
    assert [c["name"] for _, c, _ in parsed] == ["qwen3-next-80b-a3b"] * 2 + ["deepseek-v2"] * 2 + \
        ["qwen3-next-80b-a3b"] * 2, parsed
    forced = [env.get("MOK_FAST_GEMM_VARIANT", "").split(",") if env else None for _, _, env in parsed]
    row_tiled = forced_entries(row_tiled_kinds(), "0")
    assert forced == [None, row_tiled, None, row_tiled, forced_entries((GEMM_TN_SWIGLU_FWD,), "0"),
                      forced_entries((GEMM_NN_SWIGLU_BWD,), "0")], forced
    assert all(k == "mok" for k, _, _ in parsed)


def test_main_check_run39_short_workloads_pair_each_shape_with_the_row_tiled_kinds_in_64_row_tiles(tmp_path):
    """Run 39's short-tiles step: six suite shapes, each by the rule, then with the row-tiled kinds (forward, down,
    d_x, fused gate/up and d_a) forced to variant 5 (ping-pong 64x256), the weight gradients left to the rule."""
    shapes = forced_kind_pairs("main_check_run39.sh", "short-workloads", tmp_path, kind=row_tiled_kinds(), variant="5",
                               n_pairs=6)
    assert [c["name"] for c in shapes] == ["qwen3-next-80b-a3b", "deepseek-v2", "gpt-oss-120b",
                                           "deepseek-v2-lite-t1000", "qwen3-30b-a3b", "olmoe-1b-7b"], shapes


def test_main_check_run40_sonic_shapes_with_mixtral_are_issue13_s_four(tmp_path):
    """Run 40's sonic-check step: bench_moe.py on configs.json's shapes it names (plus suite.json's Mixtral-8x7B),
    --no-shared: together the four layers of issue 13's targets, so SonicMoE's checked run covers each one."""
    parse, configs = energy_probe()
    from bench_moe import CONFIGS, load_configs
    from targets import TARGETS
    names = script_step("main_check_run40.sh", "sonic-shapes", tmp_path)[0].split(",")
    assert set(names) <= {c["name"] for c in load_configs(CONFIGS)}, names
    want = {parse(s, configs)[1]["name"] for s in TARGETS}
    assert set(names) | {"mixtral-8x7b"} == want, names


def test_main_check_run40_tall_workloads_pair_issue13_shapes_with_down_and_d_x_in_variant_5(tmp_path):
    """Run 40's tall-ab step: issue 13's four shapes, each by the rule, then with only the down (TN_BF16) and d_x
    (NN_BF16) kinds forced to variant 5 (cooperative 256x128 in 1x2 clusters)."""
    from mok.fast._lib import GEMM_NN_BF16, GEMM_TN_BF16
    from targets import TARGETS
    shapes = forced_kind_pairs("main_check_run40.sh", "tall-workloads", tmp_path, kind=(GEMM_TN_BF16, GEMM_NN_BF16),
                               variant="5", n_pairs=4)
    parse, configs = energy_probe()
    assert shapes == [parse(s, configs)[1] for s in TARGETS]


def test_main_check_run41_ab_workloads_quad_issue13_shapes_with_one_forced_choice_each(tmp_path):
    """Run 41's ab step: issue 13's four shapes, each by the rule, then with only the down and d_x kinds in variant 5,
    then with only the fused gate/up kind in variant 1, then in variant 2 (its tiles in 2x1 clusters)."""
    from mok.fast._lib import GEMM_NN_BF16, GEMM_TN_BF16, GEMM_TN_SWIGLU_FWD
    parse, configs = energy_probe()  # puts benchmarks/ on the path
    from targets import TARGETS
    wants = [forced_entries((GEMM_TN_BF16, GEMM_NN_BF16), "5"), forced_entries((GEMM_TN_SWIGLU_FWD,), "1"),
             forced_entries((GEMM_TN_SWIGLU_FWD,), "2")]
    shapes = forced_kind_groups("main_check_run41.sh", "ab-workloads", tmp_path, wants, n_shapes=4)
    assert shapes == [parse(s, configs)[1] for s in TARGETS]


def test_main_check_run41_mid_workloads_quad_shapes_with_i_up_to_1536(tmp_path):
    """Run 41's mid step: ten distinct shapes whose I is at most _tiles.PINGPONG_MAX_I, each by the rule, then with
    only the down and d_x kinds in variant 5, only the fused gate/up in variant 1, and both."""
    from mok.fast import _tiles
    from mok.fast._lib import GEMM_NN_BF16, GEMM_TN_BF16, GEMM_TN_SWIGLU_FWD
    tall = forced_entries((GEMM_TN_BF16, GEMM_NN_BF16), "5")
    gu1 = forced_entries((GEMM_TN_SWIGLU_FWD,), "1")
    both = [t or g for t, g in zip(tall, gu1, strict=True)]
    shapes = forced_kind_groups("main_check_run41.sh", "mid-workloads", tmp_path, [tall, gu1, both], n_shapes=10)
    assert len({c["name"] for c in shapes}) == 10 and all(c["I"] <= _tiles.PINGPONG_MAX_I for c in shapes), shapes


def test_main_check_run41_tall_suite_shapes_are_suite_shapes_the_rule_runs_tall(tmp_path):
    """Run 41's suite-tall step: suite.json shapes whose down and d_x GEMMs the rule runs in the cooperative 256x128
    tile in 1x2 clusters (what changed), so the grouped_mm comparison covers the change."""
    from mok.fast import _lib, _tiles
    energy_probe()  # puts benchmarks/ on the path
    from bench_moe import SUITE, load_configs
    suite = {c["name"]: c for c in load_configs(SUITE)}
    names = script_step("main_check_run41.sh", "tall-suite", tmp_path)[0].split(",")
    assert len(names) == len(set(names)) == 3 and set(names) <= set(suite), names
    for n in names:
        c = suite[n]
        assert _tiles.variant(_lib.GEMM_NN_BF16, c["H"], c["I"]) == _tiles.COOPERATIVE_TALL_1X2, c


def test_main_check_run41_gather_coop_runs_each_tile_over_the_gate_up_column_tiles(tmp_path):
    """Run 41's gather-coop step: the probe on Qwen3-30B-A3B's and mid-64e's gate/up shapes, in each tile with the
    gate/up's column tiles (2I over the tile's N: 192 ping-pong, 256 cooperative), A by TMA, gathered, contiguous."""
    import os
    import subprocess

    from bench_moe import CONFIGS, load_configs  # bench_scripts put benchmarks/ on the path
    fake = tmp_path / "probe"
    fake.write_text('#!/bin/sh\necho "PROBE $@"\n')
    fake.chmod(0o755)
    r = subprocess.run(["bash", str(BENCH / "main_check_run41.sh"), "gather-coop"], capture_output=True, text=True,
                       cwd=BENCH.parent, env={**os.environ, "OUT": str(tmp_path), "PROBE": str(fake)})
    runs = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("PROBE ")]
    assert len(runs) == 12, r.stdout + r.stderr
    configs = {c["name"]: c for c in load_configs(CONFIGS)}
    seen = set()
    for args in runs:
        opt = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
        c = next(c for c in (configs["qwen3-30b-a3b"], configs["mid-64e"]) if c["H"] == int(opt["--hidden"]))
        assert (int(opt["--tokens"]), int(opt["--topk"])) == (c["T"], c["K"]), (args, c)
        assert int(opt["--n-tiles"]) == 2 * c["I"] // {"pingpong": 192, "coop": 256}[opt["--tile"]], args
        assert opt["--consumer"] == "wgmma" and opt["--mode"] in ("tma", "cpasync"), args
        seen.add((c["name"], opt["--tile"], opt["--mode"], "--contiguous" in args))
    assert len(seen) == 12, seen


def test_main_check_run42_ab_workloads_triple_each_shape_with_only_the_d_a_kind_in_variant_4_then_5(tmp_path):
    """Run 42's ab step: five shapes of mid-sized and small experts (issue 13's three with I <= 2048, OLMoE-1B-7B,
    GLM-4.5-Air), each by the rule, then with only the d_a + SwiGLU-backward kind in variant 4 (ping-pong in 1x2
    clusters), then in variant 5 (cooperative 256x128 in 1x2 clusters)."""
    from mok.fast._lib import GEMM_NN_SWIGLU_BWD
    shapes = forced_kind_groups("main_check_run42.sh", "ab-workloads", tmp_path,
                                [forced_entries((GEMM_NN_SWIGLU_BWD,), v) for v in ("4", "5")], n_shapes=5)
    names = [c["name"] for c in shapes]
    assert len(set(names)) == 5 and "qwen3-30b-a3b" in names and "olmoe-1b-7b" in names, names


def test_main_check_run42_split_workloads_force_the_down_then_the_d_x_kind_alone_into_variant_5(tmp_path):
    """Run 42's split step: four shapes the rule keeps out of variant 5 (I > 1536 or H > 4096), each by the rule, then
    with only the down kind (TN_BF16) in variant 5, then with only the d_x kind (NN_BF16)."""
    from mok.fast import _tiles
    from mok.fast._lib import GEMM_NN_BF16, GEMM_TN_BF16
    shapes = forced_kind_groups("main_check_run42.sh", "split-workloads", tmp_path,
                                [forced_entries((GEMM_TN_BF16,), "5"), forced_entries((GEMM_NN_BF16,), "5")],
                                n_shapes=4)
    for c in shapes:
        assert _tiles.variant(GEMM_TN_BF16, c["H"], c["I"]) != _tiles.COOPERATIVE_TALL_1X2, c


@pytest.mark.parametrize("script, fused_only", [
    ("main_check_run43.sh", True),   # fp32 [p | q] against 24 bits: only the fused gate/up and d_a kinds change
    ("main_check_run44.sh", False),  # the linear epilogue's store buffers: the down and d_x kinds of every shape
    ("main_check_run47.sh", False),  # the linear (B) and fused gate/up (C: 16-byte runs, D: staged, TMA) stores
    ("main_check_run48.sh", False),  # the d_a epilogue's [dg | du] stored by TMA (E): the d_a launch of every shape
    ("main_check_run49.sh", False),  # the down and d_x kinds' D staged and stored through ragged maps: every shape
])
def test_ab_workloads_are_five_shapes_with_nothing_forced(tmp_path, script, fused_only):
    """Runs 43's, 44's, 47's, 48's and 49's ab steps compare libraries process by process, so their workloads force
    nothing: five distinct shapes of configs.json and suite.json, few large experts (Mixtral-8x7B) to many small ones
    (Qwen3-30B-A3B); for run 43 each one whose gate/up and d_a launches take the SwiGLU into their epilogues (8
    splits I and S), where its change is."""
    from mok.fast import _tiles
    parse, configs = energy_probe()
    parsed = [parse(s, configs) for s in script_step(script, "ab-workloads", tmp_path)]
    names = [c["name"] for _, c, _ in parsed]
    assert len(set(names)) == 5 and "qwen3-30b-a3b" in names and "mixtral-8x7b" in names, names
    for kind, c, env in parsed:
        assert kind == "mok" and env == {}, (kind, c["name"], env)
        if fused_only:
            assert _tiles.fused_gate_up_fits(c["I"], c["S"]) and _tiles.fuse_swiglu_bwd(c["I"], c["S"]), c


def test_main_check_run44_dx_workloads_reach_the_d_x_kinds_variant_5(tmp_path):
    """Run 44's dx step changes only the d_x kind's variant 5 (library C): two shapes the rule keeps out of it, each as
    the rule runs it and with the d_x kind alone forced to 5, then two shapes the rule already runs it on."""
    from mok.fast import _tiles
    from mok.fast._lib import GEMM_NN_BF16
    parse, configs = energy_probe()
    parsed = [parse(s, configs) for s in script_step("main_check_run44.sh", "dx-workloads", tmp_path)]
    assert len(parsed) == 6 and all(k == "mok" for k, _, _ in parsed), parsed
    for (_, c0, env0), (_, c1, env1) in (parsed[0:2], parsed[2:4]):
        assert c0 == c1 and env0 == {} and _tiles.variant(GEMM_NN_BF16, c0["H"], c0["I"]) != 5, c0
        assert env1["MOK_FAST_GEMM_VARIANT"].split(",") == forced_entries((GEMM_NN_BF16,), "5"), env1
    for _, c, env in parsed[4:]:
        assert env == {} and _tiles.variant(GEMM_NN_BF16, c["H"], c["I"]) == 5, c


def test_main_check_run45_configs_and_workloads(tmp_path):
    """Run 45's calls: the group-change benchmark's configs are known shapes; the ab step's workloads parse as
    energy_probe reads them, each shape by the rule and then with only MOK_FAST_GEMM_CHUNK set (2 or 4)."""
    parse, configs = energy_probe()
    names = script_step("main_check_run45.sh", "groups-configs", tmp_path)[0].split(",")
    assert len(names) == 5 and set(names) <= set(configs), names
    parsed = [parse(s, configs) for s in script_step("main_check_run45.sh", "ab-workloads", tmp_path)]
    assert all(k == "mok" for k, _, _ in parsed), parsed
    plain = [c["name"] for _, c, env in parsed if env == {}]
    assert len(plain) == 4 and len(set(plain)) == 4, plain
    for _, c, env in parsed:
        assert env == {} or (set(env) == {"MOK_FAST_GEMM_CHUNK"} and env["MOK_FAST_GEMM_CHUNK"] in ("2", "4")), env
        assert c["name"] in plain, c["name"]


def test_device_budget_gives_each_step_the_smaller_of_its_limit_and_what_is_left():
    """benchmarks/device_budget.sh (sourced by main_check_run41.sh and later): cap LIMIT [MARGIN] is LIMIT while the
    call's BUDGET_S has more left, else what is left less MARGIN; energy passes its arguments to energy_probe.py, and
    group_changes runs the group-change benchmark under each library named."""
    import os
    import subprocess

    script = f'source {BENCH / "device_budget.sh"}; cap 50; cap 600; cap 600 5; type energy; type group_changes'
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, "BUDGET_S": "100"})
    assert r.returncode == 0, r.stderr
    small, left, less = (int(v) for v in r.stdout.split()[:3])
    assert small == 50 and 99 <= left <= 100 and less == left - 5, r.stdout
    assert 'energy_probe.py "$@"' in r.stdout, r.stdout
    assert 'MOK_FAST_LIB=$(lib "$l")' in r.stdout and "bench_group_changes.py" in r.stdout, r.stdout



def test_bits_against_a_saves_a_once_then_each_library_variant_run_and_compares_them_all_with_a(tmp_path):
    """device_budget.sh's bits_against_a (runs 48's and 49's bits steps): variant_bits.py --save under library A by
    the rule once a call, then under each LIB:VARIANT run (an empty variant: the rule), then one --compare of every
    run against A. A stub `python` records each call's arguments, library and variant."""
    import os
    import subprocess

    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python").write_text('#!/bin/bash\necho "$* | $MOK_FAST_LIB | $MOK_FAST_GEMM_VARIANT" >> "$OUT/calls"\n')
    (stub / "python").chmod(0o755)
    script = (f'source {BENCH / "device_budget.sh"}; rm -f /tmp/bits_A_vrule.pt; bits_against_a b.log B: B:3 M:; '
              'touch /tmp/bits_A_vrule.pt; bits_against_a c.log F:1; rm -f /tmp/bits_A_vrule.pt')
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "OUT": str(tmp_path), "MOK_FAST_LIB_A": "/a.so",
           "MOK_FAST_LIB_B": "/b.so", "MOK_FAST_LIB_M": "/m.so", "MOK_FAST_LIB_F": "/f.so"}
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    save = "benchmarks/variant_bits.py --save /tmp/bits_"
    assert (tmp_path / "calls").read_text().splitlines() == [
        f"{save}A_vrule.pt | /a.so | ", f"{save}B_vrule.pt | /b.so | ", f"{save}B_v3.pt | /b.so | 3",
        f"{save}M_vrule.pt | /m.so | ",
        "benchmarks/variant_bits.py --compare /tmp/bits_A_vrule.pt /tmp/bits_B_vrule.pt /tmp/bits_B_v3.pt "
        "/tmp/bits_M_vrule.pt |  | ",
        f"{save}F_v1.pt | /f.so | 1",  # A's bits saved already: not again
        "benchmarks/variant_bits.py --compare /tmp/bits_A_vrule.pt /tmp/bits_F_v1.pt |  | "]

def test_main_check_run49_group_change_configs_are_five_known_shapes(tmp_path):
    """Run 49's groups step (A against the staged linear epilogue): the group-change benchmark's configs are five
    known shapes."""
    _, configs = energy_probe()
    names = script_step("main_check_run49.sh", "groups-configs", tmp_path)[0].split(",")
    assert len(names) == 5 and set(names) <= set(configs), names


def test_main_check_run49_tall_workloads_pair_shapes_the_rule_runs_tall_with_down_and_d_x_in_ping_pong(tmp_path):
    """Run 49's tall step: four distinct shapes whose down (TN_BF16) and d_x (NN_BF16) GEMMs the rule runs in variant 5,
    each by the rule, then with only those two kinds forced to variant 3 (ping-pong 128x192)."""
    from mok.fast import _tiles
    from mok.fast._lib import GEMM_NN_BF16, GEMM_TN_BF16
    shapes = forced_kind_pairs("main_check_run49.sh", "tall-workloads", tmp_path, kind=(GEMM_TN_BF16, GEMM_NN_BF16),
                               variant=str(_tiles.PINGPONG), n_pairs=4)
    assert len({c["name"] for c in shapes}) == 4, shapes
    for c in shapes:
        for kind in (GEMM_TN_BF16, GEMM_NN_BF16):
            assert _tiles.variant(kind, c["H"], c["I"]) == _tiles.COOPERATIVE_TALL_1X2, c


def test_main_check_run46_configs_and_workloads(tmp_path):
    """Run 46's calls: the group-change benchmark's configs are known shapes; the ab step's workloads parse as
    energy_probe reads them, five distinct shapes, each by the rule (the two libraries differ, not the settings)."""
    parse, configs = energy_probe()
    names = script_step("main_check_run46.sh", "groups-configs", tmp_path)[0].split(",")
    assert len(names) == 5 and set(names) <= set(configs), names
    parsed = [parse(s, configs) for s in script_step("main_check_run46.sh", "ab-workloads", tmp_path)]
    assert all(k == "mok" and env == {} for k, _, env in parsed), parsed
    assert len({c["name"] for _, c, _ in parsed}) == 5, parsed


def test_main_check_run48_pp_workloads_force_the_fused_gate_up_kind_to_ping_pong_where_an_h100_runs_cooperative(
        tmp_path):
    """Run 48's pp step: three layers whose fused gate/up launch the rule runs in the cooperative tile on an H100
    (I > 1536 and H >= 4096), each as the rule runs it and with only that kind (GEMM_TN_SWIGLU_FWD) forced to the
    ping-pong tile, whose epilogue has stored by TMA since run 48."""
    from mok.fast import _tiles
    from mok.fast._lib import GEMM_TN_SWIGLU_FWD
    shapes = forced_kind_pairs("main_check_run48.sh", "pp-workloads", tmp_path, GEMM_TN_SWIGLU_FWD,
                               str(_tiles.PINGPONG), n_pairs=3)
    assert len({c["name"] for c in shapes}) == 3, shapes
    for c in shapes:
        assert _tiles.fused_gate_up_variant(c["H"], c["I"], c["S"]) == _tiles.COOPERATIVE, c
