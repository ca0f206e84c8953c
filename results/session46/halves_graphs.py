"""Forward + backward replayed from a CUDA graph (bench_attention.graphed: no Python, autograd or
launch overhead), the backward in one pass against two halves of the heads (attention_fp8.SPLIT_BYTES
= inf / 0), twice in turn, beside cuDNN and flash. Session 46: is the halves' cost at the small shapes
the host's alone, so that a caller replaying graphs pays only their GPU time?"""
import sys

sys.path.insert(0, ".")
import attention_fp8  # noqa: E402
import bench_attention as ba  # noqa: E402

shapes = sys.argv[1:] or ["8x16x1024x64", "4x16x2048x128", "4x16x4096x64"]
sdpa = {name: ba.METHODS[name] for name in ("cudnn", "flash")}
for round_ in range(2):
    for label, split in (("fp8 onepass", float("inf")), ("fp8 halves", 0)):
        attention_fp8.SPLIT_BYTES = split
        ba.METHODS = {label: ba.fp8("matched")}
        ba.graphed(shapes, True)
ba.METHODS = sdpa
ba.graphed(shapes, True)
