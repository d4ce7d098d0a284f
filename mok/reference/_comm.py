"""Bit-preserving collectives for the reference's expert parallelism, and the pre-flight check that
every rank of a group is making the same call.

Tensors travel as raw bytes (a uint8 view), so no backend converts or reduces them:
what arrives is bitwise what was sent. Only all_gather is used (gloo and nccl both have it).

Pre-flight: before its first collective, each layer call gathers one fixed-size int64 descriptor
per rank (`preflight`): which call it is, whether this rank's arguments passed their local checks,
and the sizes every rank must agree on. So when one rank's arguments are bad or differ from the
others', every rank raises the same error (naming the argument and the ranks) instead of one rank
raising while the others wait in a collective until the group's timeout, or gloo aborting on
mismatched sizes. Only when some rank failed does a second exchange (sizes first, then bytes) carry
the error messages. Every collective that can follow a mismatch has a size all ranks agree on.
The layer calls that begin with one are `forward`, `backward` and `load_context` (which gathers the
inputs again, the first step of an autograd backward), so ranks out of step (one in a backward while
another runs a forward, e.g. mok.MoE with `recompute` differing between ranks) raise a RuntimeError
naming each rank's call before any tensor is exchanged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Imported with mok.reference, normally before any process group exists, so that it binds none:
# torch.distributed.nn.functional evaluates `group.WORLD` into its functions' default arguments when
# first imported. Imported after init_process_group (PyTorch imports it lazily, e.g. through
# torch._dynamo on the first call of any torch.library custom op, such as mok.nn.ops'), it keeps the
# default group alive after destroy_process_group, with its gloo threads, until interpreter shutdown
# tears them down, which can abort the process. See docs/reliability.md.
import torch.distributed.nn.functional  # noqa: E402,F401

DESC_LEN = 64  # int64 slots per rank in every pre-flight exchange
_MAGIC = 0x6D6F6B  # "mok"
_OPS = {"forward": 1, "backward": 2, "check_same_across_ranks": 3, "load_context": 4, "router": 5}
_OP_NAMES = {1: "forward", 2: "backward", 3: "check_same_across_ranks", 4: "backward (load_context)",
             5: "mok.MoE's router settings check"}
_OK, _FAILED = 0, 1


def world(group) -> tuple[int, int]:
    """(W, rank) of `group`; (1, 0) for None.

    Raises TypeError when `group` is neither None nor a torch.distributed ProcessGroup, and
    ValueError when it is not usable (torch.distributed not initialised, or the group destroyed).
    """
    if group is None:
        return 1, 0
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group: expected a torch.distributed ProcessGroup or None, got {type(group).__name__} "
                        f"{_short(group)}")
    try:
        return dist.get_world_size(group), dist.get_rank(group)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"group: expected a live process group this process belongs to, got {group!r} ({e})") from e


def _short(v, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def _gather_bytes(t: torch.Tensor, group) -> list[torch.Tensor]:
    W, _ = world(group)
    raw = t.contiguous().view(-1).view(torch.uint8)
    out = [torch.empty_like(raw) for _ in range(W)]
    dist.all_gather(out, raw, group=group)
    return [o.view(t.dtype).view(t.shape) for o in out]


def all_gather_cat(t: torch.Tensor, group) -> torch.Tensor:
    """Concatenate every rank's `t` (same shape on all ranks) along dim 0, in rank order."""
    if world(group)[0] == 1:
        return t
    return torch.cat(_gather_bytes(t, group), dim=0)


def all_gather_varlen(t: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's `t` ([n_r, ...], same trailing shape, any n_r), as a list in rank order."""
    W, _ = world(group)
    if W == 1:
        return [t]
    n = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    counts = [int(c) for c in _gather_bytes(n, group)]
    n_max = max(counts)
    if n_max == 0:
        return [t.new_empty((0, *t.shape[1:])) for _ in counts]
    pad = t.new_zeros((n_max, *t.shape[1:]))
    pad[: t.shape[0]] = t
    return [g[:c] for g, c in zip(_gather_bytes(pad, group), counts)]


def _comm_device(group) -> torch.device:
    """Where small control tensors live: the current GPU for nccl, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _by_rank(values: list) -> str:
    """'3 on rank 0, 4 on ranks [1, 2]': each distinct value with the ranks that have it."""
    groups: dict = {}
    for r, v in enumerate(values):
        groups.setdefault(v, []).append(r)
    return ", ".join(f"{v} on rank {rs[0]}" if len(rs) == 1 else f"{v} on ranks {rs}" for v, rs in groups.items())


def _exchange(op: str, failed: bool, values: list[int], group, device) -> list[list[int]]:
    """All ranks' descriptors [MAGIC, op, status, n, *values, 0...] (DESC_LEN int64 each), rank order."""
    if len(values) > DESC_LEN - 4:
        raise ValueError(f"values: expected at most {DESC_LEN - 4} ints, got {len(values)}")
    desc = torch.zeros(DESC_LEN, dtype=torch.int64)
    desc[:4] = torch.tensor([_MAGIC, _OPS[op], _FAILED if failed else _OK, len(values)])
    desc[4 : 4 + len(values)] = torch.tensor(values, dtype=torch.int64)
    rows = [g.cpu().tolist() for g in _gather_bytes(desc.to(device), group)]
    ops = [row[1] if row[0] == _MAGIC else -1 for row in rows]
    if len(set(ops)) != 1:
        hint = ""
        if _OPS["forward"] in ops and ({_OPS["backward"], _OPS["load_context"]} & set(ops)):
            hint = (" (ranks out of step: every rank must run each forward and each backward of the layer "
                    "together; with mok.moe / mok.MoE also with the same recompute)")
        elif _OPS["router"] in ops:
            hint = (" (ranks out of step: mok.MoE checks its router settings across the group on its first expert "
                    "computation and after score or normalize change; every rank must make that change, or create "
                    "the module, together)")
        raise RuntimeError("group: expected every rank in the same mok call, got "
                           + _by_rank([_OP_NAMES.get(o, "an unknown collective") for o in ops]) + hint)
    return rows


_EXC = {"TypeError": TypeError, "ValueError": ValueError}


def _raise_failed(failed: list[int], messages: list[str], own: BaseException | None) -> None:
    """Raise the lowest failing rank's error on every rank: same type (TypeError, ValueError, else
    RuntimeError) and text, plus which rank(s) failed; chained to this rank's own error if it had one."""
    r = failed[0]
    kind, _, text = messages[r].partition(": ")
    where = f"on rank {r} of the group" + (f"; ranks {failed} failed" if len(failed) > 1 else "")
    raise _EXC.get(kind, RuntimeError)(f"{text} ({where})") from own


def preflight(op: str, error: BaseException | None, facts: list[tuple[str, str, int]], group) -> None:
    """Make every rank of `group` agree before the call's first collective, or raise on every rank.

    Args:
        op: the call ("forward", "backward", "load_context"; "router": mok.MoE's check of its router settings).
        error: this rank's local argument error (TypeError/ValueError), or None if its arguments passed.
        facts: (argument, what, value) that must be equal on every rank, e.g. ("x", "tokens per rank T", 6);
            the same list layout on every rank (values 0 where unknown because of a local error).
        group: a ProcessGroup, or None (W = 1: `error` is raised as it is).
    Raises:
        on every rank, when any rank had a local error: the lowest failing rank's error (its type and text,
        plus the failing ranks); when all passed but a fact differs: ValueError naming the argument and each
        rank's value; when ranks are in different mok calls: RuntimeError.
    """
    if world(group)[0] == 1:
        if error is not None:
            raise error
        return
    device = _comm_device(group)
    rows = _exchange(op, error is not None, [v for _, _, v in facts], group, device)
    failed = [r for r, row in enumerate(rows) if row[2] != _OK]
    if failed:
        text = "" if error is None else f"{type(error).__name__}: {error}"
        msg = torch.tensor(list(text.encode()), dtype=torch.uint8, device=device)
        messages = [bytes(m.cpu().tolist()).decode(errors="replace") for m in all_gather_varlen(msg, group)]
        _raise_failed(failed, messages, error)
    for i, (arg, what, _) in enumerate(facts):
        vals = [row[4 + i] for row in rows]
        if len(set(vals)) != 1:
            raise ValueError(f"{arg}: expected the same {what} on every rank of the group, got {_by_rank(vals)} "
                             f"(by rank: {vals})")


def check_same_across_ranks(value: int, name: str, group) -> None:
    """Raise on every rank if `value` (an int) differs between ranks (e.g. a config digest)."""
    if world(group)[0] == 1:
        return
    rows = _exchange("check_same_across_ranks", False, [int(value)], group, _comm_device(group))
    vals = [row[4] for row in rows]
    if len(set(vals)) != 1:
        raise ValueError(f"{name}: expected the same value on every rank of the group, got {vals} by rank")
