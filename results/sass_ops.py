"""Instructions by opcode in an address range of an nvdisasm listing (results/fwd_sass.py writes one);
register moves (MOV, IMAD.MOV) counted apart from other IMADs.

    python results/sass_ops.py FILE.sass LO HI [FILE2.sass LO2 HI2]   # addresses in hex; two ranges side by side
"""
import collections
import re
import sys


def ops(path, lo, hi):
    counts = collections.Counter()
    for line in open(path):
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m and lo <= int(m.group(1), 16) <= hi:
            op = re.sub(r"^@!?U?P\w+\s+", "", m.group(2).strip()).split()[0]     # drop a predicate
            counts[op if op.startswith(("IMAD.MOV", "MOV")) else op.split(".")[0]] += 1
    return counts


args = sys.argv[1:]
ranges = [ops(args[i], int(args[i + 1], 16), int(args[i + 2], 16)) for i in range(0, len(args), 3)]
for op in sorted(set().union(*ranges), key=lambda op: -sum(c[op] for c in ranges)):
    print(f"{op:16s}" + "".join(f"{c[op]:7d}" for c in ranges))
print(f"{'total':16s}" + "".join(f"{sum(c.values()):7d}" for c in ranges))
