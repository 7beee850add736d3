"""cubecl's per-kernel profile (`CUBECL_DEBUG_OPTION=profile
CUBECL_DEBUG_LOG=FILE`, one line `| 1.2ms | Name | ... ` per kernel, each
synchronised and timed) summed by kernel name: launches, seconds, share.

    python3 scripts/bench/cubecl_profile.py FILE [TOP]
"""
import collections
import re
import sys

UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
LINE = re.compile(r"^\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*([^|]+?)\s*(\|.*)?$")


def main(path, top):
    seconds = collections.defaultdict(float)
    launches = collections.Counter()
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                name = m.group(3)
                seconds[name] += float(m.group(1)) * UNITS[m.group(2)]
                launches[name] += 1
    total = sum(seconds.values())
    print(f"{sum(launches.values())} kernels, {len(seconds)} names, {total:.3f} s of kernel time")
    print(f"{'seconds':>9} {'share':>6} {'launches':>9}  kernel")
    for name, t in sorted(seconds.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{t:9.4f} {100 * t / max(total, 1e-12):5.1f}% {launches[name]:9d}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
