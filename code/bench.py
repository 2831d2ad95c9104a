#!/usr/bin/env python3
"""Simulator speed and memory, measured in one run so the ratios hold on a noisy machine.

1. The event engine against the per-step rule it is tested against (same results, checked
   here too), in every mode the issue names (Poisson, long outputs, prefix caching, 1 and 4
   closed-loop clients, speculative decoding, --warmup, --timeline, replicas): wall seconds, best
   of 2. The target is 10x in each.
2. Peak memory (tracemalloc) when every request's output is 10x longer: it follows requests and
   steps, not tokens; and --warmup and --timeline against the same run without them (they count
   per request and per second, so the target is within 1.5x the time and memory).
3. A sweep with --jobs 1 and --jobs N.
4. The highest sustained rate of 100 deployments (5 GPUs x TP 1/2 x 5 --max-num-seqs x 2 token
   budgets), 2 seeds a probe: the target is under a minute; how far into their runs the rechecks
   that missed stopped; the same without the recheck (what it costs, and how far it moves the
   answers); and that narrowing by bisection alone, for the probes its guesses save.
5. loadgen's dispatch lag at 50 requests/s against the scripted test server (code/tests/fake_server.py):
   how late each send left its schedule; the target is under 5 ms.

Run: python3 code/bench.py   (figures, not a test: they depend on the machine)"""
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import main  # noqa: E402

TIMED = [     # (name, spec, with a timeline)
    ("10,000 requests, h100, --rate 30", main.RunSpec(rate=30, requests=10000), False),
    ("1,000 requests, outputs 1,024-2,048, 64 clients",
     main.RunSpec(concurrency=64, requests=1000, output_tokens=main.TokenRange(1024, 2048)), False),
    ("prefix caching, 4 shared 1,000-token prefixes",
     main.RunSpec(rate=20, requests=3000, prefix_tokens=1000, num_prefixes=4, prefix_caching=True), False),
    ("1 closed-loop client, 300 requests", main.RunSpec(concurrency=1, requests=300), False),
    ("4 closed-loop clients, 1,000 requests", main.RunSpec(concurrency=4, requests=1000), False),
    ("speculative decoding, 4 proposals, 32 clients",
     main.RunSpec(concurrency=32, requests=1000, speculative_tokens=4), False),
    ("5,000 requests at 30 req/s, --warmup 500", main.RunSpec(rate=30, requests=5000, warmup=500), False),
    ("5,000 requests at 30 req/s, --timeline", main.RunSpec(rate=30, requests=5000), True),
    ("4 replicas, 5,000 requests at 100 req/s", main.RunSpec(rate=100, requests=5000, data_parallel_size=4), False),
]
MEMORY = [
    ("1,000 requests, outputs 64-256, 64 clients",
     main.RunSpec(concurrency=64, requests=1000, output_tokens=main.TokenRange(64, 256))),
    ("1,000 requests, outputs 640-2,560, 64 clients",
     main.RunSpec(concurrency=64, requests=1000, output_tokens=main.TokenRange(640, 2560))),
]
SWEEP = (main.RunSpec(requests=1000), "concurrency", [1, 8, 32, 128, 256])


def best_of(runs, fn):
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def peak_mib(spec):
    tracemalloc.start()
    main.run(spec)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


print(f"{'per-step rule vs event engine':<50}{'step s':>8}{'event s':>9}{'ratio':>7}{'steps':>9}  same output")
for name, spec, timeline in TIMED:
    step_s, step = best_of(2, lambda: main.run(main.replace(spec, simulator="step"), timeline=timeline))
    event_s, event = best_of(2, lambda: main.run(spec, timeline=timeline))
    print(f"{name:<50}{step_s:>8.2f}{event_s:>9.3f}{step_s / event_s:>6.1f}x{event['engine']['steps']:>9,}  "
          f"{'yes' if step == event else 'NO'}")

print()
print(f"{'peak memory, event engine':<50}{'MiB':>8}{'output tokens':>15}")
peaks = []
for name, spec in MEMORY:
    result = main.run(spec)
    peaks.append(peak_mib(spec))
    print(f"{name:<50}{peaks[-1]:>8.1f}{result['total_output_tokens']:>15,}")
print(f"{'10x the tokens costs':<50}{peaks[1] / peaks[0]:>7.2f}x the memory")

print()
print(f"{'--warmup and --timeline, event engine':<50}{'s':>8}{'MiB':>8}{'x time':>8}{'x memory':>9}")
base = main.RunSpec(rate=30, requests=5000)
plain_s, _ = best_of(3, lambda: main.run(base))
plain_mib = peak_mib(base)
print(f"{'5,000 requests at 30 req/s':<50}{plain_s:>8.3f}{plain_mib:>8.1f}")
for name, spec, timeline in (("  with --warmup 500", main.replace(base, warmup=500), False),
                             ("  with --timeline", base, True)):
    took, _ = best_of(3, lambda: main.run(spec, timeline=timeline))
    tracemalloc.start()
    main.run(spec, timeline=timeline)
    mib = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    print(f"{name:<50}{took:>8.3f}{mib:>8.1f}{took / plain_s:>7.2f}x{mib / plain_mib:>8.2f}x  (target within 1.5x)")

print()
spec, axis, values = SWEEP
jobs = os.cpu_count() or 1
one_s, one = best_of(1, lambda: main.sweep(spec, axis, values, jobs=1))
many_s, many = best_of(1, lambda: main.sweep(spec, axis, values, jobs=jobs))
print(f"sweep of {len(values)} concurrencies, 1,000 requests: --jobs 1 {one_s:.2f} s, --jobs {jobs} {many_s:.2f} s "
      f"({one_s / many_s:.1f}x), same output: {'yes' if one == many else 'NO'}")

print()
GRID = {"hardware": [main.HARDWARE[h] for h in ("h100-sxm-80gb", "a100-sxm-80gb", "l40s-48gb", "rtx-4090-24gb",
                                                   "l4-24gb")],
        "tensor_parallel_size": [1, 2], "max_num_seqs": [32, 64, 128, 256, 512],
        "max_num_batched_tokens": [2048, 8192]}
points = [dict(zip(GRID, values)) for values in main.itertools.product(*GRID.values())]
slo = main.parse_slo("ttft_p95:2000,tpot_p95:100")
probing = main.Probing(slo, seeds=2)
spec = main.RunSpec()
one_s, _ = best_of(1, lambda: main.run(main.replace(main.sweep_point(spec, points[0]), rate=20,
                                                    requests=probing.requests(spec))))


def searched(found: list) -> str:
    probes = sum(len(item["probes"]) for item in found)
    runs = sum(p.get("seeds_run", 1) for item in found for p in item["probes"])
    widths = [(item["lowest_missing_load"] - item["highest_load"]) / item["highest_load"] for item in found
              if item.get("highest_load") and item.get("lowest_missing_load")]
    return f"{probes} probes ({runs} runs), " + (f"brackets {100 * sum(widths) / len(widths):.1f}% wide on average"
                                                 if widths else "no brackets")


search_s, found = best_of(1, lambda: list(main.search_points(spec, points, probing, jobs=jobs)))
long = sum(1 for item in found for p in item["probes"] if p.get("recheck"))
stops = [p["stopped"]["requests_ended"] / p["stopped"]["requests"] for item in found for p in item["probes"]
         if p.get("stopped")]
print(f"highest sustained rate of {len(points)} deployments, 2 seeds, {probing.requests(spec):,}-request probes, "
      f"rechecked with {probing.rechecking().requests(spec):,}-request probes, --jobs {jobs}: {search_s:.1f} s for "
      f"{searched(found)}, {long} of them rechecks (one run {one_s:.2f} s); target under 60 s: "
      f"{'met' if search_s < 60 else 'NOT met'}")
print(f"  {len(stops)} rechecks stopped once their miss was certain, with "
      + (f"{100 * sum(stops) / len(stops):.0f}% of their requests ended on average" if stops else "none stopped"))
once = main.replace(probing, recheck=1)
once_s, unchecked = best_of(1, lambda: list(main.search_points(spec, points, once, jobs=jobs)))
drops = [(u["highest_load"] - f["highest_load"]) / u["highest_load"] for u, f in zip(unchecked, found)
         if u.get("highest_load") and f.get("highest_load")]
print(f"  without the recheck (--recheck 1): {once_s:.1f} s for {searched(unchecked)}; " +
      (f"the recheck lowered {sum(d > 0 for d in drops)} of {len(drops)} answers, by "
       f"{100 * sum(drops) / len(drops):.1f}% on average (at most {100 * max(drops):.1f}%)" if drops else
       "no deployment had an answer both ways"))
bisect_s, bisected = best_of(1, lambda: list(main.search_points(spec, points, main.replace(once, guided=False),
                                                                jobs=jobs)))
print(f"  without the recheck, by bisection alone: {bisect_s:.1f} s for {searched(bisected)}")

print()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
from fake_server import FakeServer, paced  # noqa: E402
with FakeServer(paced(ttft=0.02, gap=0.005, tokens=16)) as server:
    result, _, _ = main.run_load(main.LoadConfig(url=server.url, rate=50, requests=1000, max_tokens=16))
lag = result["client"]["dispatch_lag_ms"]
print(f"loadgen at 50 req/s, 1,000 requests: offered {result['client']['offered_rate']:.1f} req/s, dispatch lag "
      f"p50 {lag['p50']:.2f} ms, p99 {lag['p99']:.2f} ms, max {lag['max']:.2f} ms (target under 5 ms: "
      f"{'met' if lag['p99'] < 5 else 'NOT met'} at p99)")
print(f"python {sys.version.split()[0]}, {jobs} cores")
