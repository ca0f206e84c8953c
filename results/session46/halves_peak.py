"""Peak memory of one forward + backward, the backward in one pass against two halves of the heads
(attention_fp8.SPLIT_BYTES = inf / 0), beside cuDNN's, at the speed table's shapes. Measured as
bench_attention.bench_shape measures it (above what is held before the call). Session 46, after step 23:
do halves now cost little enough at the small shapes to be the default there?"""
import sys

import torch

sys.path.insert(0, ".")
import attention_fp8  # noqa: E402
import bench_attention as ba  # noqa: E402


def peak_mib(f, q, k, v, do):
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

    def fwd_bwd():
        f(qg, kg, vg, True).backward(do)
    fwd_bwd()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd_bwd()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


print(f"{'shape':>16} | {'one pass':>9} {'halves':>9} {'cuDNN':>9}  (peak MiB of forward + backward)")
for s in sys.argv[1:] or ba.DEFAULT_SHAPES:
    q, k, v, do = ba.inputs(*map(int, s.split("x")))
    row = []
    for split in (float("inf"), 0):
        attention_fp8.SPLIT_BYTES = split
        row.append(peak_mib(ba.METHODS["fp8_matched"], q, k, v, do))
    row.append(peak_mib(ba.METHODS["cudnn"], q, k, v, do))
    print(f"{s:>16} | {row[0]:9.0f} {row[1]:9.0f} {row[2]:9.0f}", flush=True)
