"""
A model of how a causal launch's programs finish, for attention_fp8._grid (SPEED.md, "Launch order").
Programs of one launch start in grid order as slots free up (132 SMs x programs per SM); each takes
c0 + its tiles, in units of one tile's time, all at one rate. Compares the makespan of sections of G
heads, longest tile first within each (G = 1: one head after another, each longest first) against the
ideal sum / slots. Then, for the forward, an event simulation in which a program alone on its SM runs
ALONE times as fast as one of two (or three): grid order's time over the sections'. A model: it leaves
out L2 misses and launch overheads; only a GPU measures what the order buys.

    python results/launch_order_model.py
"""
import heapq, math
def makespan(durs, S):
    slots=[0.0]*S; heapq.heapify(slots); end=0
    for d in durs:
        t=heapq.heappop(slots)+d; end=max(end,t); heapq.heappush(slots,t)
    return end
def order(BH, nblk, work, G, c0):
    # sections of G heads; within a section, block index heavy -> light, heads innermost. G=1: the kernels' order now
    out=[]
    for s0 in range(0,BH,G):
        for b in range(nblk):
            for h in range(s0,min(BH,s0+G)): out.append(c0+work(b))
    return out
for c0 in (0.5, 2.0):
  print("c0 =", c0)
  for B,H,N,D in [(4,16,4096,128),(2,16,8192,128),(1,16,16384,128),(4,16,4096,64),(2,16,8192,64),(8,16,1024,64),(16,6,1024,128)]:
    BH=B*H
    kernels={
     "fwd": (N//64, lambda b: math.ceil((N-64*b)/128), 132*(2 if D==128 else 3)),
     "dq": ((N//128, lambda b: 2*(N//128-b), 132) if D==128 else (N//64, lambda b: 2*(N//64-b), 264)),
     "dkdv": (N//64, lambda b: N//64-b, 132*(2 if D==128 else 3)),
    }
    line=[]
    for k,(nb,w,S) in kernels.items():
        base=order(BH,nb,w,1,c0); ideal=sum(base)/S
        r=[makespan(order(BH,nb,w,G,c0),S)/ideal for G in (1,4,16,BH)]
        line.append(f"{k}: " + "/".join(f"{x:.3f}" for x in r))
    print(f"  {B}x{H}x{N}x{D}  (G = 1/4/16/all)  " + "  ".join(line))


def simulate(durs, n_sm, k, alone):
    """Time to finish programs started in list order on the first SM with one of its k slots free; a
    program's remaining work drains at rate alone^((k - m) / (k - 1)) with m programs on its SM."""
    rem = [[] for _ in range(n_sm)]
    t, i = 0.0, 0

    def rate(m):
        return 1.0 if k == 1 else alone ** ((k - m) / (k - 1))
    while i < len(durs) or any(rem):
        for s in range(n_sm):
            while len(rem[s]) < k and i < len(durs):
                rem[s].append(durs[i])
                i += 1
        dt = min(min(r) / rate(len(r)) for r in rem if r)
        t += dt
        rem = [[x - dt * rate(len(r)) for x in r if x - dt * rate(len(r)) > 1e-9] for r in rem]
    return t


for alone in (1.0, 1.6):
    print(f"forward, a program alone on its SM {alone}x as fast: grid order's time / the sections' (G = all)")
    for B, H, N, D in [(4, 16, 4096, 128), (2, 16, 8192, 128), (4, 16, 4096, 64)]:
        k = 2 if D == 128 else 3
        w = lambda b, N=N: math.ceil((N - 64 * b) / 128)
        t1 = simulate(order(B * H, N // 64, w, 1, 1.0), 132, k, alone)
        tg = simulate(order(B * H, N // 64, w, B * H, 1.0), 132, k, alone)
        print(f"  {B}x{H}x{N}x{D}: {t1 / tg:.3f}")
