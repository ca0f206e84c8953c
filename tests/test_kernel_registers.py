"""kernel_registers.py's arithmetic, which its subprocess runs in test_attention.py print but do not check:
how many programs an SM holds, and which kernels ask for more shared memory than a block may have."""
import pytest

pytest.importorskip("triton")
import kernel_registers as kr  # noqa: E402


def test_programs_per_sm_counts_registers_per_warp_and_the_systems_shared_memory(monkeypatch):
    monkeypatch.setattr(kr, "TARGET", 90)
    # 100 registers are allocated as 104: 104 x 32 x 4 warps = 13,312 per program, 4 in 64K (5 if not rounded)
    assert kr.programs_per_sm(100, 0, 4) == 4
    # 113.5 KiB of shared memory plus the 1 KiB each program takes for the system: one fits in 228 KiB, not two
    assert kr.programs_per_sm(64, 116224, 4) == 1
    assert kr.programs_per_sm(16, 0, 16) == 4           # 64 warps an SM: 4 programs of 16 warps (8 by registers)
    assert kr.programs_per_sm(255, 0, 8) == 1           # 256 x 32 x 8 = 64K: the backward's two-per-SM ceiling


def test_a_block_over_the_targets_limit_is_too_big(monkeypatch, capsys):
    """Ada's block may ask for 99 KiB, less than its SM's 100: 102,000 bytes fits the SM, not a block."""
    monkeypatch.setattr(kr, "TARGET", 89)
    monkeypatch.setattr(kr, "TOO_BIG", [])
    kr.row(128, "dq", "tiling", 128, 0, 101376, 4)
    assert kr.TOO_BIG == []
    kr.row(128, "dq", "tiling", 128, 0, 102000, 4)
    assert len(kr.TOO_BIG) == 1 and "102,000 bytes" in kr.TOO_BIG[0], kr.TOO_BIG
    assert capsys.readouterr().out.rstrip().endswith("none")


def test_head_dim_strides_compile_as_the_constant_1(monkeypatch):
    """Every launch passes head_dim's stride as 1, which Triton compiles as a constant (vector loads):
    compiled as an i32 instead, the quantize kernel at D = 128 read 255 registers and 120 spilled bytes,
    against 241 and none as launched. Every kernel argument that is a head-dim stride must be one."""
    import attention_fp8 as A
    strides = {n for fn in (A._quantize_kernel, A._fwd_kernel, A._bwd_dq_kernel, A._bwd_dkdv_kernel)
               for n in fn.arg_names if n.startswith(("stride_", "sx", "sy")) and n.endswith("d")}
    assert strides == kr.STRIDE_ONE
    seen = []
    monkeypatch.setattr(kr, "ASTSource", lambda fn, signature, constexprs=None, attrs=None:
                        seen.append((signature, constexprs)))
    monkeypatch.setattr(kr.triton, "compile", lambda src, target=None, options=None: None)
    kr.compile_for_target(A._quantize_kernel, dict(TILE=64, D=64, X_ROWS=True, X_COLS=True, Y_ROWS=True, Y_COLS=True,
                                                   PERMUTE_COLS=True), 4, 1)
    names = A._quantize_kernel.arg_names
    ((signature, constexprs),) = seen
    assert {names[i]: v for (i,), v in constexprs.items() if names[i] in ("sxd", "syd", "sxn")} == {"sxd": 1, "syd": 1}
    assert signature["sxd"] == signature["syd"] == "constexpr" and signature["sxn"] == "i32"
