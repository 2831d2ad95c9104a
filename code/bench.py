#!/usr/bin/env python3
"""Simulator speed: simulated requests and steps per wall-second, and peak memory.
Run: python3 code/bench.py   (figures, not a test: they depend on the machine)"""
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import main  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "burst.jsonl")
CASES = [
    ("10,000 requests, h100, --rate 30", ["simulate", "--rate", "30", "--requests", "10000"]),
    ("burst trace, l4", ["simulate", "--hardware", "l4-24gb", "--trace", FIXTURE]),
    ("256-client closed loop, 2,048 requests", ["simulate", "--concurrency", "256", "--requests", "2048"]),
]


def run(argv):
    args = main.build_parser().parse_args(argv)
    concurrency = main.simulate_concurrency(args)
    started = time.perf_counter()
    result = main.run_simulation(args, concurrency, args.rate)
    return result, time.perf_counter() - started


print(f"{'case':<42}{'wall s':>8}{'requests/s':>12}{'steps/s':>10}{'steps':>8}")
for name, argv in CASES:
    result, wall = run(argv)
    requests = result["completed"] + result["failed"]
    steps = result["engine"]["steps"]
    print(f"{name:<42}{wall:>8.2f}{requests / wall:>12,.0f}{steps / wall:>10,.0f}{steps:>8,}")
print(f"peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB  python {sys.version.split()[0]}")
