"""What the device scripts run and apply, checked on the CPU: the probe diffs still apply to the tree, the GPU
benchmarks refuse bad arguments before touching a GPU, and benchmarks/ncu_table.py reads Nsight Compute logs of both
mok's and SonicMoE's launches."""
import subprocess
import sys

import pytest

from bench_scripts import BENCH


@pytest.mark.parametrize("diff", [
    "stages_probe.diff",  # benchmarks/stages_probe.sh patches a copy of csrc with it
    "pdl_run39.diff",     # programmatic dependent launch (run 39, not kept): main_check_run39.sh's pdl-ab step
    "d_a_shared_a_run42.diff",  # the d_a kind in 1x2 clusters (run 42, not kept): main_check_run42.sh's tiles, ab
    "epi_stages_run44.diff",  # the linear epilogue's bf16 D in 4 store buffers (run 44, not kept): library B
    "dx_tall_wide_run44.diff",  # the d_x kind's variant 5 in 256x192 tiles (run 44, not kept): library C
    "linear_staged_run49.diff",  # the down and d_x kinds' D staged, stored through ragged maps: main_check_run49.sh's B
])  # (tile64_run39.diff and tall_tile_run40.diff each added a variant 5; run 41 merged the latter's. Run 48 merged
#    swiglu_fwd_staged_run47.diff, run 49 d_a_staged_run48.diff. These apply to 4475e7b's tree and no longer to
#    this one: pq24_run43.diff, chunked_order_run45.diff, reg_epilogue_run46.diff and swiglu_fwd_wide_run47.diff, not
#    kept, and reg_epilogue16_run46.diff, never run: run 46's register stores lost to the linear epilogue's TMA stores.
#    swiglu_fwd_staged_coop_run48.diff, level in run 49 and not kept, applies to eb34c1b, before run 49's review mend)
def test_probe_diffs_still_apply_to_this_tree(diff):
    """Device steps build libraries from main with these diffs applied: a change to the tree that a diff no longer
    fits would stop such a build in a device session."""
    r = subprocess.run(["git", "apply", "--check", str(BENCH / diff)], capture_output=True, text=True,
                       cwd=BENCH.parent)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script, args, says", [
    ("ncu_peer_steps.py", ["dsv3-ep8-slice", "grouped_mm"], "usage"),  # a method it does not profile
    ("ncu_peer_steps.py", ["dsv3-ep8-slice"], "usage"),                # no method
    ("ncu_peer_steps.py", ["no-such-config", "sonic"], "no-such-config"),  # an unknown config, named
    ("ncu_peer_steps.py", ["dsv3-ep8-slice", "sonic", "two"], "WARMUPS"),  # warm-up steps not a whole number
    ("bench_group_changes.py", ["--variants", "0,99"], "--variants"),  # a tile variant the library does not have
    ("bench_group_changes.py", ["--variants", "0,x"], "--variants"),   # not an integer
    ("bench_group_changes.py", ["--configs", "no-such-config"], "no-such-config"),  # an unknown config, named
    ("bench_group_changes.py", ["--rounds", "0"], "--rounds"),         # nothing would be timed
    ("bench_group_changes.py", ["--chunks", "1,0"], "--chunks"),       # a chunk of no tiles
    ("bench_group_changes.py", ["--chunks", "1,17"], "--chunks"),      # more than the library takes
])
def test_gpu_benchmarks_refuse_bad_arguments_before_touching_a_gpu(script, args, says):
    """Run 44's ncu step (ncu_peer_steps.py, mok_gu and sonic only) and run 45's group-change benchmark stop at once
    on a bad argument, naming it, before any GPU work: a typo costs no device time."""
    r = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                       cwd=BENCH.parent)
    assert r.returncode != 0 and says in r.stderr, (r.returncode, r.stderr[-500:])


def _ncu_rows(log: str) -> list[list[str]]:
    """benchmarks/ncu_table.py's rows of logs/<log>."""
    sys.path.insert(0, str(BENCH))
    import ncu_table

    return ncu_table.rows((BENCH.parent / "logs" / log).read_text())


def test_ncu_table_reads_each_launch_of_a_survey_log():
    """On run 37's survey of Qwen3-30B-A3B (main's library): one row per GEMM launch of the step, in launch order,
    each named by its kernel's types, with its tile and every metric read (no '?')."""
    rows = _ncu_rows("ncu_survey_qwen3-30b-a3b_main_run37_h100.log")
    assert [r[0] for r in rows] == ["gate/up + SwiGLU", "bf16 out", "d_a + SwiGLU bwd", "d_x", "fp32 out",
                                    "fp32 out"], rows
    assert [r[1] for r in rows] == ["128x192"] * 4 + ["192x128", "128x192"], rows
    assert all("?" not in r for r in rows), rows
    assert rows[2][2:4] == ["887.46 us", "75.85"], rows[2]  # the d_a launch: duration, DRAM throughput


def test_ncu_table_reads_sonicmoe_launches_by_their_quack_names():
    """On run 45's log of one SonicMoE step of Qwen3-30B-A3B: its six QuACK GEMM launches in launch order, each named
    by its epilogue, with its wgmma shape, clock and cycles read."""
    rows = _ncu_rows("ncu_qwen3-30b-a3b_sonic_run45_h100.log")
    assert [r[0] for r in rows] == ["gate/up (gathered) + SwiGLU", "bf16 out", "d_a + SwiGLU bwd + d_w"] + \
        ["bf16 out"] * 3, rows
    assert [r[1] for r in rows] == ["wgmma 64x256", "wgmma 64x128", "wgmma 64x256", "wgmma 64x160"] + \
        ["wgmma 64x128"] * 2, rows
    assert all("?" not in r for r in rows), rows
    assert rows[1][2] == "658.85 us" and rows[1][-2:] == ["1.61", "1,074,097"], rows[1]  # the down GEMM
