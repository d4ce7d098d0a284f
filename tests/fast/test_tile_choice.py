"""The tile-variant choice (mok/fast/_tiles.py) on the CPU: the MOK_FAST_GEMM_VARIANT override is parsed
strictly, and the choice depends on the GEMM kind and the model constants only. That every variant gives
the same bits is checked on the GPU (tests/gpu/test_fast_tiles.py)."""
import inspect

import pytest
import torch

from mok.fast import _lib, _tiles

KINDS = sorted(_lib.GEMM_KINDS.values())


@pytest.mark.parametrize("text, want", [
    ("2", [2] * len(KINDS)),                                  # one variant for every kind
    (",".join("3210"[k % 4] for k in KINDS), [3 - k % 4 for k in KINDS]),  # one per kind, MokGemmKind order
    (" 1 ", [1] * len(KINDS)),                                # surrounding blanks are fine
    (",3" + "," * (len(KINDS) - 2), [3 if k == 1 else None for k in KINDS]),  # empty entries: the rule's choice
])
def test_override_gives_each_kind_its_variant(monkeypatch, text, want):
    monkeypatch.delenv(_tiles.ENV, raising=False)
    rule = [_tiles.variant(k, 2048, 768) for k in KINDS]
    monkeypatch.setenv(_tiles.ENV, text)
    assert [_tiles.variant(k, 2048, 768) for k in KINDS] == [r if w is None else w
                                                             for r, w in zip(rule, want, strict=True)]


@pytest.mark.parametrize("text", [
    "6",            # out of range
    "-1",           # negative
    "1,2",          # neither one value nor one per kind
    "a",            # not an integer
    "1,2,3,0,1,2,0,1,x",  # one bad entry
    "1,2,3,0,1,2,0,1",  # one per kind of an older library (eight kinds)
    ",",            # an empty entry is only for a per-kind list
    "1,,3",         # ... and such a list has one entry per kind
])
def test_bad_override_raises_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(_tiles.ENV, text)
    with pytest.raises(ValueError, match=_tiles.ENV):
        _tiles.variant(_lib.GEMM_TN_F32, 2048, 768)


def test_choice_takes_no_token_count_and_is_a_valid_variant(monkeypatch):
    monkeypatch.delenv(_tiles.ENV, raising=False)
    # model constants and the card, never the token count
    assert list(inspect.signature(_tiles.variant).parameters) == ["kind", "H", "I", "device"]
    assert list(inspect.signature(_tiles.fused_gate_up_variant).parameters) == ["H", "I", "S", "device"]
    for kind in KINDS:
        for H, I in ((2048, 768), (4096, 1536), (7168, 2048), (4096, 14336), (6144, 16384), (8, 8)):
            assert 0 <= _tiles.variant(kind, H, I) < _lib.NUM_GEMM_VARIANTS


@pytest.mark.parametrize("variant, exc", [
    (-1, ValueError), (6, ValueError),    # out of range: the binding's check names it
    (1.0, TypeError), (None, TypeError),  # not an int: the binding's signature refuses it, naming it
])
def test_grouped_gemm_rejects_a_bad_variant_before_any_launch(mok_binding, variant, exc):
    import torch

    with pytest.raises(exc, match="variant"):
        _lib.grouped_gemm(_lib.GEMM_TN_F32, [_segment(False)], torch.device("cpu"), variant)


def _segment(aux: bool):
    import torch

    t = torch.zeros(8, 16)
    op = _lib.Operand(t, 0, 16, 16)
    return _lib.Segment.all_rows(8, 8, 16, op, op, op, aux=op if aux else None)


@pytest.mark.parametrize("kind, aux", [
    (_lib.GEMM_NN_SWIGLU_BWD, False),  # the fused SwiGLU backward needs its [g | u] input
    (_lib.GEMM_NN_F32, True),          # a plain GEMM reads no aux operand: refusing it beats ignoring it
])
def test_grouped_gemm_checks_the_aux_operand_before_any_launch(mok_binding, kind, aux):
    import torch

    with pytest.raises(ValueError, match="operand aux"):
        _lib.grouped_gemm(kind, [_segment(aux)], torch.device("cpu"), 0)


@pytest.mark.parametrize("text, I, S, want", [
    (None, 768, 0, True),        # unset, Qwen3-30B-A3B: many small experts fuse too since the fp32 [p | q] form
    (None, 1024, 0, True),       # unset, OLMoE-1B-7B
    (None, 1536, 1536, True),    # unset, mid-64e: large experts fuse
    (None, 14336, 0, True),      # unset, Mixtral-8x7B
    (None, 1540, 0, False),      # unset, 8 does not split I: the kind cannot copy [p | q] in 16-byte chunks
    (None, 2048, 1028, False),   # ... nor S
    ("0", 14336, 0, False),      # forced off
    ("1", 768, 0, True),         # forced on
    (" 0 ", 768, 0, False),      # surrounding blanks are fine
    ("1", 1540, 0, False),       # forced on, but the kind cannot run this I: the pair (same bits)
])
def test_fuse_switch(monkeypatch, text, I, S, want):
    if text is None:
        monkeypatch.delenv(_tiles.FUSE_ENV, raising=False)
    else:
        monkeypatch.setenv(_tiles.FUSE_ENV, text)
    assert _tiles.fuse_swiglu_bwd(I, S) is want


@pytest.mark.parametrize("text", ["2", "yes", "true"])  # anything but 0 or 1 is refused, never read as a wish
def test_bad_fuse_switch_raises_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(_tiles.FUSE_ENV, text)
    with pytest.raises(ValueError, match=_tiles.FUSE_ENV):
        _tiles.fuse_swiglu_bwd(2048, 0)


@pytest.mark.parametrize("H, I, S, want", [
    (2048, 768, 0, _tiles.PINGPONG),        # Qwen3-30B-A3B: 768 = 8 x 96
    (4096, 1536, 1536, _tiles.PINGPONG),    # mid-64e with a shared expert: 1536 = 16 x 96
    (2048, 1024, 0, _tiles.PINGPONG),       # OLMoE: 96 does not split 1024 (the last tile 64 of 96 columns)
    (2048, 1544, 0, _tiles.PINGPONG),       # nor 1544 (8 of 96)
    (7168, 2048, 2048, _tiles.COOPERATIVE), # DeepSeek-V3 slice: the cooperative tile (128 columns of gate, of up)
    (4096, 14336, 0, _tiles.COOPERATIVE),   # Mixtral-8x7B likewise
    (4096, 1544, 8, _tiles.COOPERATIVE),    # 128 does not split 1544 (the last tile 8 of 128 columns)
    (512, 136, 72, _tiles.PINGPONG),        # I and S multiples of 8 are enough
    (512, 132, 0, None),                    # 8 does not split I: whole 8-column blocks only
    (2048, 768, 4, None),                   # nor the shared expert's S
])
def test_fused_gate_up_variant_needs_8_to_split_i_and_s(monkeypatch, H, I, S, want):
    monkeypatch.delenv(_tiles.ENV, raising=False)
    monkeypatch.delenv(_tiles.FUSE_FWD_ENV, raising=False)
    assert _tiles.fused_gate_up_variant(H, I, S) == want
    assert _tiles.fused_gate_up_fits(I, S) == (want is not None)
    monkeypatch.setenv(_tiles.FUSE_FWD_ENV, "1")  # the same with the switch on
    assert _tiles.fused_gate_up_variant(H, I, S) == want


@pytest.mark.parametrize("H, I, want", [
    (2048, 768, _tiles.PINGPONG),        # Qwen3-30B-A3B: cooperative 1.6-3.2% slower steps
    (4096, 1536, _tiles.PINGPONG),       # mid-64e: I = PINGPONG_MAX_I, a tie
    (4096, 1408, _tiles.PINGPONG),       # GLM-4.5-Air: I below it
    (2880, 2880, _tiles.PINGPONG),       # gpt-oss-20b / -120b: H below FUSED_GATE_UP_COOP_MIN_H, a tie
    (4088, 14336, _tiles.PINGPONG),      # just below it
    (4096, 1544, _tiles.COOPERATIVE),    # I just past PINGPONG_MAX_I, H at the minimum
    (7168, 2048, _tiles.COOPERATIVE),    # DeepSeek-V3 slice: cooperative 1.9-6.0% faster burst steps
    (4096, 14336, _tiles.COOPERATIVE),   # Mixtral-8x7B: 1.4-3.1%
    (6144, 10752, _tiles.COOPERATIVE),   # DBRX: 7.9%
    (5120, 8192, _tiles.COOPERATIVE),    # Llama-4-Scout: 2.8%
    (4096, 6400, _tiles.COOPERATIVE),    # Phi-3.5-MoE: 5.4%
])
@pytest.mark.parametrize("card", [
    None,                     # no device named: the rule measured on an H100
    "NVIDIA H100 80GB HBM3",  # the H100 of runs 33 and 34
])
def test_fused_gate_up_runs_cooperative_for_long_reductions_of_large_experts(monkeypatch, H, I, want, card):
    """GEMM_TN_SWIGLU_FWD (reduction K = H) takes the cooperative 128x256 tile where I > PINGPONG_MAX_I and
    H >= FUSED_GATE_UP_COOP_MIN_H, the ping-pong 128x192 one elsewhere; a forced variant still wins."""
    monkeypatch.delenv(_tiles.ENV, raising=False)
    monkeypatch.delenv(_tiles.FUSE_FWD_ENV, raising=False)
    monkeypatch.setattr(_tiles, "_card_name", lambda index: card)
    device = None if card is None else torch.device("cuda", 0)
    assert _tiles.fused_gate_up_variant(H, I, 0, device) == want
    assert _tiles.variant(_lib.GEMM_TN_SWIGLU_FWD, H, I, device) == want  # what bench_fused.py forces as the rule
    other = _tiles.PINGPONG if want == _tiles.COOPERATIVE else _tiles.COOPERATIVE
    monkeypatch.setenv(_tiles.ENV, ",,,,,,," + str(other) + ",")
    assert _tiles.fused_gate_up_variant(H, I, 0, device) == other


@pytest.mark.parametrize("H, I", [
    (4096, 14336),  # Mixtral-8x7B: ping-pong 1.7% (burst) and 1.9% (steady) faster on an H200
    (7168, 2048),   # DeepSeek-V3 slice: a tie there
    (6144, 10752),  # DBRX: ping-pong on the H200, as every layer had
    (2048, 768),    # Qwen3-30B-A3B: ping-pong on every card
])
@pytest.mark.parametrize("card", [
    "NVIDIA H200",         # the H200 of issue 13's runs
    "NVIDIA GH200 480GB",  # its name contains H200 too
])
def test_fused_gate_up_keeps_ping_pong_on_the_h200(monkeypatch, H, I, card):
    """On a card named in FUSED_GATE_UP_PINGPONG_CARDS the fused gate/up kind runs the ping-pong tile for every layer;
    a forced variant still wins, and the other kinds' choices do not depend on the card."""
    monkeypatch.delenv(_tiles.ENV, raising=False)
    monkeypatch.delenv(_tiles.FUSE_FWD_ENV, raising=False)
    monkeypatch.setattr(_tiles, "_card_name", lambda index: card)
    device = torch.device("cuda", 0)
    assert _tiles.gate_up_pingpong_card(device)
    assert _tiles.fused_gate_up_variant(H, I, 0, device) == _tiles.PINGPONG
    for kind in KINDS:
        if kind != _lib.GEMM_TN_SWIGLU_FWD:
            assert _tiles.variant(kind, H, I, device) == _tiles.variant(kind, H, I), kind
    monkeypatch.setenv(_tiles.ENV, ",".join("0" if k == _lib.GEMM_TN_SWIGLU_FWD else "" for k in KINDS))
    assert _tiles.fused_gate_up_variant(H, I, 0, device) == _tiles.COOPERATIVE


def test_only_cuda_devices_have_a_card(monkeypatch):
    """A CPU device or none names no card (the H100 rule); a CUDA device without an index asks for the current
    device's name."""
    monkeypatch.setattr(_tiles, "_card_name", lambda index: "NVIDIA H200")
    assert not _tiles.gate_up_pingpong_card(None)
    assert not _tiles.gate_up_pingpong_card(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert _tiles.gate_up_pingpong_card(torch.device("cuda"))


@pytest.mark.parametrize("H, I, want, tall", [
    (2048, 768, _tiles.PINGPONG, True),        # Qwen3-30B-A3B: short reductions, ping-pong; down, d_x tall
    (2048, 1024, _tiles.PINGPONG, True),       # OLMoE-1B-7B: down and d_x 3.8% / 1.0% faster steps tall
    (4096, 1408, _tiles.PINGPONG, True),       # GLM-4.5-Air: 0.4-0.9% faster steps than cooperative
    (4096, 1536, _tiles.PINGPONG, True),       # mid-64e: PINGPONG_MAX_I itself, 0.9% faster steps
    (2048, 512, _tiles.PINGPONG, False),       # Granite-3.0-3B-A800M: I below TALL_MIN_I, slower tall
    (5120, 1536, _tiles.PINGPONG, False),      # DeepSeek-V2: H past TALL_MAX_H, slower tall
    (4096, 1544, _tiles.COOPERATIVE, False),   # just past PINGPONG_MAX_I
    (7168, 2048, _tiles.COOPERATIVE, False),   # DeepSeek-V3 slice: a tie at steady state, cooperative kept
    (4096, 6400, _tiles.COOPERATIVE, False),   # Phi-3.5-MoE: a tie
    (4096, 14336, _tiles.COOPERATIVE, False),  # Mixtral-8x7B: long reductions, ~10% faster cooperative
])
def test_row_tiled_gemms_take_ping_pong_up_to_pingpong_max_i(monkeypatch, H, I, want, tall):
    """The forward, down, d_a and d_x GEMMs (rows an expert's, reduction over H, I or 2I) pick their tile from I;
    the down and d_x GEMMs (bf16 out) of mid-sized experts take the cooperative 256x128 tile in 1x2 clusters."""
    monkeypatch.delenv(_tiles.ENV, raising=False)
    for kind in (_lib.GEMM_TN_F32, _lib.GEMM_NN_F32):
        assert _tiles.variant(kind, H, I) == want, kind
    for kind in (_lib.GEMM_TN_BF16, _lib.GEMM_NN_BF16):
        assert _tiles.variant(kind, H, I) == (_tiles.COOPERATIVE_TALL_1X2 if tall else want), kind


def test_the_fused_swiglu_backward_runs_the_ping_pong_tile(monkeypatch):
    """GEMM_NN_SWIGLU_BWD's ping-pong variants load [p | q] into shared memory ahead of the epilogue (the epilogue load
    warp, epilogue_swiglu_bwd_loaded.cuh); when the switch asks for the fused launch, the rule picks the one without
    clusters, on every shape."""
    monkeypatch.delenv(_tiles.ENV, raising=False)
    for H, I in ((2048, 768), (4096, 1536), (2048, 1024), (7168, 2048), (4096, 14336)):
        assert _tiles.variant(_lib.GEMM_NN_SWIGLU_BWD, H, I) == _tiles.PINGPONG


def test_fused_gate_up_switch_and_forced_variant(monkeypatch):
    monkeypatch.delenv(_tiles.ENV, raising=False)
    monkeypatch.setenv(_tiles.FUSE_FWD_ENV, "0")  # off: always apart
    assert _tiles.fused_gate_up_variant(2048, 768, 0) is None
    monkeypatch.setenv(_tiles.FUSE_FWD_ENV, "1")
    assert _tiles.fused_gate_up_variant(2048, 768, 0) == _tiles.PINGPONG
    monkeypatch.setenv(_tiles.ENV, "0")  # a forced variant is taken ...
    assert _tiles.fused_gate_up_variant(2048, 1024, 0) == _tiles.COOPERATIVE
    assert _tiles.fused_gate_up_variant(2048, 1020, 0) is None  # ... where the kind fits
    monkeypatch.setenv(_tiles.FUSE_FWD_ENV, "yes")
    with pytest.raises(ValueError, match=_tiles.FUSE_FWD_ENV):
        _tiles.fused_gate_up_variant(2048, 768, 0)


@pytest.mark.parametrize("M, N, want", [
    (768, 2048, _tiles.PINGPONG_TALL_1X2),   # Qwen3-30B-A3B gate/up [I, H]: 2048 is 10 2/3 x 192 but 8 x 256
    (2048, 768, _tiles.PINGPONG_2X1),        # its down [H, I]: 2048 = 8 x 256 rows, 768 = 4 x 192 columns: no waste
    (1536, 4096, _tiles.PINGPONG_TALL_1X2),  # mid-64e gate/up: 1536 = 8 x 192, 4096 = 16 x 256
    (2048, 7168, _tiles.PINGPONG_2X1),       # DeepSeek-V3 slice gate/up: 2048 rows over 192 waste more than 7168 cols
    (7168, 2048, _tiles.PINGPONG_TALL_1X2),  # its down: 2048 columns over 192 waste 1/33, 7168 rows over 192 1/56
    (2048, 1024, _tiles.PINGPONG_TALL_1X2),  # OLMoE down: 1024 columns over 192 leave a tile a third full
    (1024, 2048, _tiles.PINGPONG_2X1),       # its gate/up: 1024 rows over 192 would
    (8, 8, _tiles.PINGPONG_2X1),             # one cluster either way
])
def test_weight_gradient_tile_covers_the_fewest_elements(monkeypatch, M, N, want):
    monkeypatch.delenv(_tiles.ENV, raising=False)
    for kind in (_lib.GEMM_TT_F32, _lib.GEMM_TT_BF16):
        assert _tiles.wgrad_variant(kind, [(M, N, 1)]) == want
    monkeypatch.setenv(_tiles.ENV, "3")  # a forced variant is taken
    assert _tiles.wgrad_variant(_lib.GEMM_TT_BF16, [(M, N, 1)]) == _tiles.PINGPONG
    per_kind = ["0"] * len(KINDS)
    per_kind[_lib.GEMM_TT_F32] = ""  # an empty entry leaves this kind to the rule, the other forced
    monkeypatch.setenv(_tiles.ENV, ",".join(per_kind))
    assert _tiles.wgrad_variant(_lib.GEMM_TT_F32, [(M, N, 1)]) == want
    assert _tiles.wgrad_variant(_lib.GEMM_TT_BF16, [(M, N, 1)]) == _tiles.COOPERATIVE


def test_weight_gradient_launch_chooses_over_all_its_outputs(mok_binding, monkeypatch):
    """`_tiles.grouped_gemm` of a weight-gradient kind takes `wgrad_variant` over every segment's outputs (groups
    weighted), so the layer's launches and the expert-parallel shared-expert launch (down and gate/up segments in one)
    go through one rule."""
    import torch

    seen = []
    monkeypatch.setattr(_lib, "grouped_gemm", lambda kind, segs, dev, v: seen.append(v))
    monkeypatch.delenv(_tiles.ENV, raising=False)
    op = _lib.Operand(torch.zeros(1), 0, 0, 1)
    offsets = torch.zeros(129, dtype=torch.int32)

    def wgrad(m, n, groups=1):
        return _lib.Segment.expert_wgrad(offsets, groups, m, n, op, op, op)

    for segs in ([wgrad(768, 2048, 128)] * 2,               # Qwen3-30B-A3B gate/up: the 192x128 tile
                 [wgrad(2048, 768, 128)],                   # its down: 128x192
                 [wgrad(2048, 768, 128), wgrad(8, 8)],      # a small extra output does not move the choice
                 # mixed, one group each: 2048 x 1152 + 1536 x 2112 covered in 2x1 clusters of 128x192, fewer in 1x2
                 # of 192x128 (2112 x 1024 + 1536 x 2048)
                 [wgrad(2048, 1024), wgrad(1536, 2048)],
                 [wgrad(2048, 1024), wgrad(1024, 2048)]):   # mixed, the same area either way: the first on a tie
        _tiles.grouped_gemm(_lib.GEMM_TT_BF16, segs, None, 2048, 768)
    assert seen == [_tiles.PINGPONG_TALL_1X2, _tiles.PINGPONG_2X1, _tiles.PINGPONG_2X1, _tiles.PINGPONG_TALL_1X2,
                    _tiles.PINGPONG_2X1]
    monkeypatch.setenv(_tiles.ENV, "0")  # forced: taken as it is
    _tiles.grouped_gemm(_lib.GEMM_TT_F32, [wgrad(768, 2048, 128)], None, 2048, 768)
    assert seen[-1] == _tiles.COOPERATIVE
