"""examples/train_tiny_moe.py on a short schedule: it learns, reruns are bitwise identical, and expert
parallelism over 2 gloo processes gives the single-process bits (loss curve and final weights)."""

import importlib.util
import os
import platform
import re
import sys

import pytest
import torch

from mok.testing.bits import assert_bitwise_equal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def example():
    path = os.path.join(ROOT, "examples", "train_tiny_moe.py")
    spec = importlib.util.spec_from_file_location("train_tiny_moe", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_tiny_moe"] = mod  # spawned workers unpickle functions by module name
    sys.path.insert(0, os.path.dirname(path))
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(os.path.dirname(path))


def _small(example, **kw):
    args = dict(steps=20, seq=32, micro_batch=2, n_micro=4, layers=2, hidden=32, heads=2, experts=4, top_k=2,
                expert_hidden=32, shared_hidden=16, warmup=5, corpus_bytes=300_000)
    return example.Config(**{**args, **kw})


def _assert_same(a, b, what):
    (la, wa), (lb, wb) = a, b
    assert_bitwise_equal(lb, la, f"{what}: loss curve")
    assert wa.keys() == wb.keys()
    for name in wa:
        assert_bitwise_equal(wb[name], wa[name], f"{what}: {name}")


@pytest.mark.slow
def test_rerun_and_world_size_bitwise_identical(example):
    cfg = _small(example)
    first = example.run(cfg, 1, progress=False)
    losses = first[0]
    assert losses.shape == (20,) and losses.dtype == torch.float32
    assert losses[-3:].mean() < losses[:3].mean() - 0.5, losses  # it learns
    _assert_same(first, example.run(cfg, 1, progress=False), "rerun")
    ep = example.run(cfg, 2, progress=False)
    assert ep[1]["blocks.0.moe.w_gate_up_L2IH"].shape[0] == cfg.experts  # gathered from both ranks
    _assert_same(first, ep, "W=1 vs W=2")


def test_different_seed_changes_the_bits(example):
    """The equality above is not vacuous: another seed gives another curve."""
    a = example.run(_small(example, seed=0, steps=2), 1, progress=False)[0]
    b = example.run(_small(example, seed=1, steps=2), 1, progress=False)[0]
    assert not torch.equal(a, b)


def test_main_writes_curve_and_weights(example, tmp_path):
    pytest.importorskip("matplotlib")
    assert example.main(["--steps", "2", "--out", str(tmp_path)]) == 0
    png = tmp_path / "loss_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "weights_w1.safetensors").stat().st_size > 0
    assert torch.load(tmp_path / "losses_w1.pt").shape == (2,)


_FIGURE = re.compile(r"`python examples/train_tiny_moe.py --steps (\d+)`\s+prints\s+`w1: final loss ([0-9.]+)`")
_ENVIRONMENT = re.compile(r"\(Python\s+(\S+),\s+whose\s+standard\s+library\s+is\s+the\s+text;\s+torch\s+(\S+);\s+CPU\s+"
                          r"capability\s+(\w+)\)")


def test_documented_final_loss_is_what_the_example_prints(example):
    """docs/usage.md's short-run figure is what the command beside it prints, in the environment the page names
    (the text is the Python standard library's source; the dense ops' bits depend on torch and the CPU's ISA)."""
    text = open(os.path.join(ROOT, "docs", "usage.md"), encoding="utf-8").read()
    steps, loss = _FIGURE.search(text).groups()
    documented = _ENVIRONMENT.search(text).groups()
    here = (platform.python_version(), torch.__version__, torch.backends.cpu.get_cpu_capability())
    if here != documented:
        pytest.skip(f"docs/usage.md's figure is for Python, torch, CPU capability {documented}; here {here}")
    losses, _ = example.run(example.Config(steps=int(steps)), 1, progress=False)
    assert f"{losses[-1].item():.4f}" == loss


def test_world_size_must_divide_micro_batches(example):
    with pytest.raises(ValueError, match="world_size: expected a divisor"):
        example.train(_small(example, n_micro=3), group=_FakeGroup(2), progress=False)


@pytest.mark.parametrize("kw, W, parts", [
    (dict(n_micro=3), 2, ("world_size", "n_micro = 3", "got 2")),   # W does not divide the micro-batches
    (dict(experts=3), 2, ("world_size", "experts = 3", "got 2")),   # nor the experts
    ({}, 0, ("world_size", "int >= 1", "got 0")),                    # no processes at all
    (dict(steps=0), 1, ("steps", "int >= 1", "got 0")),              # nothing to train
    (dict(heads=3), 1, ("heads", "divisor of hidden = 32", "got 3")),  # heads that do not split the hidden size
    (dict(device="cuda"), 2, ("world_size", "gloo on the CPU", "'cuda'")),  # W > 1 runs gloo on the CPU only
])
def test_run_checks_settings_before_starting_processes(example, monkeypatch, kw, W, parts):
    def no_launch(*a, **k):
        raise AssertionError("a process was started for bad settings")

    import mok.testing.dist

    monkeypatch.setattr(mok.testing.dist, "launch", no_launch)
    with pytest.raises(ValueError) as info:
        example.run(_small(example, **kw), W, progress=False)
    for p in parts:
        assert p in str(info.value), str(info.value)


def test_main_exits_2_on_a_bad_world_size(example, capsys):
    with pytest.raises(SystemExit) as info:
        example.main(["--world-size", "3", "--steps", "1"])
    assert info.value.code == 2 and "--world-size: expected a divisor" in capsys.readouterr().err


def _differing_seed(rank, world_size, group):
    import train_tiny_moe as ex

    cfg = ex.Config(steps=1, seq=8, micro_batch=1, n_micro=2, layers=1, hidden=16, heads=2, experts=2, top_k=1,
                    expert_hidden=8, shared_hidden=0, warmup=1, corpus_bytes=20_000, seed=rank)
    ex.train(cfg, group, progress=False)


def test_ranks_with_different_configs_fail_at_once(example):
    """The example's pre-flight: a rank whose Config differs makes every rank raise before training."""
    from mok.testing.dist import WorkerError, launch

    with pytest.raises(WorkerError) as info:
        launch(_differing_seed, (), 2, timeout_s=60)
    assert "cfg (a digest of the whole Config): expected the same value on every rank" in str(info.value)
    assert "by rank" in str(info.value)  # each rank's digest, in rank order


class _FakeGroup:
    def __init__(self, w):
        self.w = w


@pytest.fixture(autouse=True)
def _fake_world(monkeypatch):
    import torch.distributed as dist

    orig_ws, orig_rank = dist.get_world_size, dist.get_rank
    monkeypatch.setattr(dist, "get_world_size", lambda g=None: g.w if isinstance(g, _FakeGroup) else orig_ws(g))
    monkeypatch.setattr(dist, "get_rank", lambda g=None: 0 if isinstance(g, _FakeGroup) else orig_rank(g))


def test_compare_precisions_trains_both_recipes(example, tmp_path, capsys):
    """--compare-precisions trains bf16 then fp8 from the same seed and batches, and gates on the logged gap."""
    pytest.importorskip("matplotlib")
    assert example.main(["--compare-precisions", "--steps", "4", "--log-every", "2", "--out", str(tmp_path)]) == 0
    bf16, fp8 = torch.load(tmp_path / "losses_w1_bf16.pt"), torch.load(tmp_path / "losses_w1_fp8.pt")
    assert bf16.shape == fp8.shape == (4,)
    assert not torch.equal(bf16, fp8)  # the fp8 recipe really ran
    assert "within 1.00% at every logged step" in capsys.readouterr().out
    # a bound below the measured gap fails the run
    assert example.main(["--compare-precisions", "--steps", "4", "--log-every", "2", "--max-rel-diff", "0",
                         "--out", str(tmp_path)]) == 1


def test_logged_loss_and_gap(example):
    losses = torch.tensor([1.0, 3.0, 2.0, 6.0])
    assert torch.equal(example.logged(losses, 2), torch.tensor([2.0, 4.0]))
    gap = example.precision_gap(torch.tensor([2.0, 4.0]), torch.tensor([2.02, 3.0]))
    assert torch.allclose(gap, torch.tensor([0.01, 0.25]))


@pytest.mark.parametrize("argv, needle", [(["--log-every", "7", "--compare-precisions"], "--log-every"),
                                          (["--max-rel-diff", "nan", "--compare-precisions"], "--max-rel-diff"),
                                          (["--precision", "fp16"], "--precision"),
                                          (["--prove", "--compare-precisions"], "not allowed")])
def test_bad_arguments_name_the_option(example, argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        example.main(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err
