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
