"""Is Python slower in autograd's device thread, in any non-main thread, or only there? Loops with and
without function calls, and torch.empty; wall, thread CPU time, and the thread's user/system split."""
import os, sys, threading, time
import torch

TICK = os.sysconf("SC_CLK_TCK")


def ut_st():
    f = open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]), int(f[12])


def f_small(i):
    return i + 1


def loop(n=20000):
    s = 0
    for i in range(n):
        s += i * i


def calls(n=20000):
    for i in range(n):
        f_small(i)


def empties(n=200):
    for _ in range(n):
        torch.empty(1 << 18, device="cuda")


WORK = {"loop": loop, "calls": calls, "empty x200": empties}


def measure(fn):
    t, c, (u0, s0) = time.perf_counter(), time.thread_time(), ut_st()
    fn()
    u1, s1 = ut_st()
    return (time.perf_counter() - t) * 1e6, (time.thread_time() - c) * 1e6, u1 - u0, s1 - s0


res = {}
x = torch.zeros(1, device="cuda", requires_grad=True)
current = [None]


class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 1

    @staticmethod
    def backward(ctx, g):
        name, fn = current[0]
        res.setdefault((name, where[0]), []).append(measure(fn))
        return g


where = [None]
for _ in range(3):
    for name, fn in WORK.items():
        current[0] = (name, fn)
        for _ in range(30):
            res.setdefault((name, "main thread"), []).append(measure(fn))
        th = threading.Thread(target=lambda: [res.setdefault((name, "plain thread"), []).append(measure(fn))
                                              for _ in range(30)])
        th.start(); th.join()
        where[0] = "autograd device thread"
        for _ in range(30):
            y = F.apply(x); torch.autograd.grad(y, x, torch.ones_like(y))
        where[0] = "single-threaded autograd"
        with torch.autograd.set_multithreading_enabled(False):
            for _ in range(30):
                y = F.apply(x); torch.autograd.grad(y, x, torch.ones_like(y))


def med(v):
    v = sorted(v)
    return v[len(v) // 2]


for (name, w), v in res.items():
    print(f"{name:>10} {w:>26}: wall {med([a[0] for a in v]):8.1f} us, thread CPU {med([a[1] for a in v]):8.1f} us, "
          f"user/sys ticks over {len(v)} runs {sum(a[2] for a in v)}/{sum(a[3] for a in v)}")
print(sys.version, "switch interval", sys.getswitchinterval(), "clock ticks/s", TICK)
