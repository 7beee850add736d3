#!/usr/bin/env python3
"""Where a process's resident set lives, at its peak: runs a command, reads
/proc/PID/smaps every INTERVAL seconds, and prints the breakdown of the
sample with the largest RSS (and the largest of each class over the run).

Why: the estimator's "runtime" remainder is resident memory that is not
live tagged heap. prunemem's heap is measured by its own allocator; this
says what the rest is made of — the binary's and libraries' file pages,
the brk heap, anonymous mappings (glibc arenas, large blocks, thread
stacks) — without touching the program under test.

    scripts/bench/rss_breakdown.py [--interval 0.1] [--json] [--timeline CSV] -- CMD ARGS...

Classes: `binary` (file pages of the executable), `libraries` (.so
files), `mapped files` (other files: the checkpoint, the text, the
tokenizer when mapped), `brk heap` ([heap]), `anonymous` (every private
anonymous mapping: glibc's thread arenas, mmap'd large blocks, thread
stacks, [stack]), `other` ([vdso], [vvar], ...). Linux only.
"""
import argparse
import json
import os
import subprocess
import sys
import time

CLASSES = ("binary", "libraries", "mapped files", "brk heap", "anonymous", "other")


def classify(name, exe):
    if name == exe:
        return "binary"
    if name.startswith("/"):
        return "libraries" if ".so" in os.path.basename(name) else "mapped files"
    if name == "[heap]":
        return "brk heap"
    if name == "" or name.startswith("[anon") or name == "[stack]":
        return "anonymous"
    return "other"


def sample(pid, exe):
    """Resident kB per class, with the count of anonymous mappings of 1 MiB+."""
    out = dict.fromkeys(CLASSES, 0)
    big_anon = 0
    name = ""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):
                    parts = line.split(None, 5)
                    name = parts[5].strip() if len(parts) > 5 else ""
                    size_kb = None
                elif first == "Size:":
                    size_kb = int(line.split()[1])
                elif first == "Rss:":
                    kb = int(line.split()[1])
                    cls = classify(name, exe)
                    out[cls] += kb
                    if cls == "anonymous" and size_kb and size_kb >= 1024:
                        big_anon += kb
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out["anonymous, mappings of 1 MiB+"] = big_anon
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--timeline", metavar="CSV", help="every sample, MiB per class, to this file")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("give the command after --")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    best, best_total, maxima = None, -1, {}
    timeline = open(a.timeline, "w") if a.timeline else None
    if timeline:
        timeline.write(",".join(("seconds",) + CLASSES) + "\n")
    start = time.monotonic()
    while proc.poll() is None:
        # Read each time: right after the fork the child is still this interpreter.
        try:
            exe = os.readlink(f"/proc/{proc.pid}/exe")
        except OSError:
            break
        s = sample(proc.pid, exe)
        if s:
            total = sum(s[c] for c in CLASSES)
            if timeline:
                row = [f"{time.monotonic() - start:.2f}"] + [f"{s[c] / 1024:.1f}" for c in CLASSES]
                timeline.write(",".join(row) + "\n")
            if total > best_total:
                best, best_total = s, total
            for k, v in s.items():
                maxima[k] = max(maxima.get(k, 0), v)
        time.sleep(a.interval)
    if timeline:
        timeline.close()
    if best is None:
        sys.exit(f"rss_breakdown: no sample taken (exit {proc.returncode})")
    mib = lambda kb: round(kb / 1024, 1)
    result = {
        "exit": proc.returncode,
        "peak_rss_mib": mib(best_total),
        "at_peak_mib": {k: mib(v) for k, v in best.items()},
        "max_over_run_mib": {k: mib(v) for k, v in maxima.items()},
    }
    if a.json:
        print(json.dumps(result))
    else:
        print(f"exit {proc.returncode}; largest sampled RSS {result['peak_rss_mib']} MiB")
        for k in best:
            print(f"  {k:32} {mib(best[k]):8.1f} MiB at peak   {mib(maxima[k]):8.1f} MiB max")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
