"""Which thread burns CPU while autograd runs a Python backward on its device thread?"""
import os, sys, threading, time
import torch

def snap():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            comm = open(f"/proc/self/task/{tid}/comm").read().strip()
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[tid] = (comm, int(f[11]) + int(f[12]), int(f[7 + 2]) if False else 0)
        except OSError:
            pass
    return out

def ctx_switches():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            st = dict(l.split(":\t") for l in open(f"/proc/self/task/{tid}/status").read().splitlines() if ":\t" in l)
            out[tid] = (int(st["voluntary_ctxt_switches"]), int(st["nonvoluntary_ctxt_switches"]))
        except OSError:
            pass
    return out

x = torch.zeros(1, device="cuda", requires_grad=True)

class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 1
    @staticmethod
    def backward(ctx, g):
        for _ in range(20):
            torch.empty(1 << 18, device="cuda")
        return g

def loop(n):
    for _ in range(n):
        y = F.apply(x)
        torch.autograd.grad(y, x, torch.ones_like(y))

loop(200)
tick = os.sysconf("SC_CLK_TCK")
for label, runner in (("main thread calls", lambda: loop(3000)),
                      ("python worker thread calls", lambda: (lambda t: (t.start(), t.join()))(threading.Thread(target=loop, args=(3000,))))):
    torch.cuda.synchronize()
    a, ca = snap(), ctx_switches()
    t = time.perf_counter(); c = time.process_time()
    runner()
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    b, cb = snap(), ctx_switches()
    print(f"\n{label}: {wall / 3000 * 1e6:.1f} us per fwd+bwd, process CPU/wall {cpu / wall:.2f}")
    for tid in sorted(b, key=lambda t: -(b[t][1] - a.get(t, (0, 0))[1])):
        d = (b[tid][1] - a.get(tid, (0, 0))[1]) / tick
        v = (cb.get(tid, (0, 0))[0] - ca.get(tid, (0, 0))[0], cb.get(tid, (0, 0))[1] - ca.get(tid, (0, 0))[1])
        if d > 0 or v[0] + v[1] > 100:
            print(f"  tid {tid:>8} {b[tid][0]:<20} cpu {d:6.2f} s  ({d / wall:4.0%} of wall)  ctx switches vol/invol {v}")
torch.autograd.set_multithreading_enabled(False)
torch.cuda.synchronize(); t = time.perf_counter(); loop(3000); torch.cuda.synchronize()
print(f"\nsingle-threaded autograd: {(time.perf_counter() - t) / 3000 * 1e6:.1f} us per fwd+bwd")
print("threads:", [th.name for th in threading.enumerate()], "switch interval", sys.getswitchinterval())
