"""Where a kernel's warps stall, from Nsight Compute's source page:

    ncu --clock-control none --profile-from-start off --set full -o rep python results/ncu_target.py matched 2x16x8192x128
    ncu -i rep.ncu-rep --page source --csv --print-source sass -k regex:dkdv > dkdv.csv
    python results/ncu_stalls.py dkdv.csv 40

prints the warp-state samples by stall reason, the opcode mix (share of executed instructions and
of samples), and the `top` instructions with the most samples, with their three main reasons."""
import collections
import csv
import sys


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def opcode(source):
    words = source.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
table = list(csv.reader(open(path)))
header = table[1]
rows = [dict(zip(header, r)) for r in table[2:] if len(r) >= len(header)]
stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
samples = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
print(f"{table[0][1]}, samples {samples:.0f}, instructions executed {sum(num(r['Instructions Executed']) for r in rows):.0f}")
by_reason = collections.Counter({s: sum(num(r[s]) for r in rows) for s in stalls})
for s, v in by_reason.most_common():
    if v:
        print(f"  {s:24s} {v:9.0f} {v / samples:6.1%}")
executed, sampled = collections.Counter(), collections.Counter()
for r in rows:
    executed[opcode(r["Source"])] += num(r["Instructions Executed"])
    sampled[opcode(r["Source"])] += num(r["Warp Stall Sampling (All Samples)"])
total = sum(executed.values())
print("  opcode: share of executed / share of samples")
for op, v in executed.most_common(22):
    print(f"    {op:10s} {v / total:6.1%} {sampled[op] / samples:6.1%}")
if top:
    print("  hottest instructions (index, samples, executions, top stall reasons):")
    hot = sorted(range(len(rows)), key=lambda i: -num(rows[i]["Warp Stall Sampling (All Samples)"]))[:top]
    for i in sorted(hot):
        r = rows[i]
        reasons = sorted(((num(r[s]), s[6:]) for s in stalls), reverse=True)[:3]
        print(f"   {i:5d} {num(r['Warp Stall Sampling (All Samples)']):7.0f} ex {num(r['Instructions Executed']):10.0f} "
              f"{r['Source'].strip()[:60]:60s} " + " ".join(f"{n}:{v:.0f}" for v, n in reasons if v))
