"""
A model of how a causal launch's programs finish, for attention_fp8._grid (SPEED.md, "Launch order").
Programs of one launch start in grid order as slots free up (132 SMs x programs per SM); each takes
c0 + its tiles, in units of one tile's time, all at one rate. Compares the makespan of sections of G
heads, longest tile first within each (G = 1: one head after another, each longest first) against the
ideal sum / slots. A model: it leaves out that a program alone on an SM runs faster than one of two,
L2 misses, and launch overheads; only a GPU measures what the order buys.

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
