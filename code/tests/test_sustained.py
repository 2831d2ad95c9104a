"""A capacity is a sustained capacity: the steady window of a run, its offered and served rates,
the growth of its wait, and the verdict; search's highest load is the highest sustained one."""
import json
import os
import signal
import tempfile
import time
import unittest
from unittest import mock

from bounded import jsonl
from helpers import MAIN, call_cli, main, run_cli, stopping_run

H100 = main.HARDWARE["h100-sxm-80gb"]


def measured(i, sent, queue, service=1.0):
    """A finished request sent at `sent` that waited `queue` seconds, then took `service`."""
    r = main.Request(i, 100, 10, sent_s=sent)
    r.queue_s = queue
    r.first_token_s = sent + queue + 0.1
    r.last_token_s = sent + queue + service
    return r


def napping(settings, progress=None):
    """A point for a worker: the first sleeps until it is stopped, keeping a part; the rest end at once."""
    if settings["n"] == 0:
        try:
            time.sleep(60)
        except KeyboardInterrupt as e:
            e.partial = {"interrupted": True, "n": 0}
            raise
    return {"n": settings["n"]}


class SteadyWindow(unittest.TestCase):
    def window(self, requests, closed_loop=False):
        return main.steady_window(requests, 0.2, 0.95, 0.05, closed_loop)

    def test_a_server_that_keeps_up_serves_what_is_offered_and_its_wait_stays_flat(self):
        requests = [measured(i, i * 0.5, 0.1) for i in range(200)]       # 2 req/s, served in 1.1 s each
        w = self.window(requests)
        self.assertAlmostEqual(w["offered_rate"], 2.0, places=6)
        self.assertAlmostEqual(w["served_rate"], 2.0, places=6)
        self.assertAlmostEqual(w["wait_growth_s_per_s"], 0.0, places=9)
        self.assertTrue(w["sustained"])

    def test_a_server_at_half_the_offered_rate_is_overloaded(self):
        # Offered 2 req/s; served one a second: request i ends at i + 1, so it waited i + 1 - 0.5 i.
        requests = [measured(i, i * 0.5, i * 0.5, 1.0) for i in range(200)]
        w = self.window(requests)
        self.assertAlmostEqual(w["offered_rate"], 2.0, places=6)
        self.assertAlmostEqual(w["served_rate"], 1.0, delta=0.01)       # one end a second, counted in 80 s
        self.assertAlmostEqual(w["wait_growth_s_per_s"], 1.0, places=6)    # one second more wait per second
        self.assertAlmostEqual(w["queue_growth_rps"], 1.0, places=6)      # offered 2, served 1
        self.assertFalse(w["sustained"])

    def test_the_thresholds_decide(self):
        # Wait grows 0.04 s per s, 6.38 s over the 159.5 s window: less than a request's 10 s in service.
        requests = [measured(i, i * 0.5, i * 0.5 * 0.04, 10.0) for i in range(400)]
        self.assertTrue(main.steady_window(requests, 0.2, 0.95, 0.05, False)["sustained"])
        self.assertFalse(main.steady_window(requests, 0.2, 0.95, 0.03, False)["sustained"])

    def test_a_slow_growth_that_outgrows_a_requests_time_in_service_is_an_overload(self):
        # The same 0.04 s per s, under --max-queue-growth, on requests served in 1 s: their latency
        # is soon mostly the queue the run's length built.
        w = main.steady_window([measured(i, i * 0.5, i * 0.5 * 0.04) for i in range(400)], 0.2, 0.95, 0.05, False)
        self.assertFalse(w["sustained"])
        self.assertEqual(w["overloaded_on"], ["wait"])
        self.assertRegex(w["overloaded_by"][0], r"^wait grows 0.04 s per s, 6.38 s over the window > a request's "
                                                r"1 s in service$")
        # Shorter, it stays under the lifetime: 0.04 s per s over 16 s is 0.64 s.
        short = main.steady_window([measured(i, i * 0.5, i * 0.5 * 0.04) for i in range(40)], 0.2, 0.95, 0.05, False)
        self.assertIsNot(short["sustained"], False)
        # A wait that does not grow never trips it, however long the run.
        flat = main.steady_window([measured(i, i * 0.5, 0.3) for i in range(4000)], 0.2, 0.95, 0.05, False)
        self.assertTrue(flat["sustained"])
        # helper-39: 1-token outputs seen by a client (no queue time: TTFT is the wait) are served
        # in 0 s; a slope of a few microseconds a second through the wait's noise is no overload.
        def one_token(i):
            r = measured(i, i * 0.5, 0.0, 0.05 + 0.01 * (i % 7) + 2e-6 * i)
            r.queue_s, r.first_token_s = None, r.last_token_s
            return r
        noisy = main.steady_window([one_token(i) for i in range(4000)], 0.2, 0.95, 0.05, False)
        self.assertGreater(noisy["wait_growth_s_per_s"], 0)
        self.assertTrue(noisy["sustained"], noisy.get("overloaded_by"))
        # ... while the same requests with a wait that outgrows its swings are overloaded.
        def growing(i):
            r = one_token(i)
            r.first_token_s = r.last_token_s = r.last_token_s + 0.0005 * i
            return r
        self.assertFalse(main.steady_window([growing(i) for i in range(4000)], 0.2, 0.95, 0.05, False)["sustained"])

    def test_a_closed_loop_is_sustained_by_construction(self):
        requests = [measured(i, i * 0.5, i * 0.5, 1.0) for i in range(200)]
        self.assertTrue(self.window(requests, closed_loop=True)["sustained"])

    def test_too_short_a_run_says_so(self):
        w = self.window([measured(i, i * 0.5, 0.1) for i in range(8)])
        self.assertIsNone(w["sustained"])
        self.assertIn("too short", w["note"])

    def test_csv_keeps_an_overloads_reasons_in_one_cell(self):
        w = self.window([measured(i, i * 0.5, i * 0.5 * 0.06) for i in range(400)])
        flat = main.flatten({"steady_state": w, "requests": [{"id": 1}]})
        self.assertEqual(flat["steady_state.overloaded_on"], "wait; served")
        self.assertEqual(flat["steady_state.overloaded_by"], "; ".join(w["overloaded_by"]))
        self.assertNotIn("requests", flat)            # per-request rows are not one cell

    def test_a_run_sent_whole_before_its_first_end_is_one_burst_not_a_reversed_window(self):
        w = self.window([measured(i, i * 0.01, i * 0.5, 30.0) for i in range(100)])   # sent in 1 s, first end at 30 s
        self.assertIsNone(w["sustained"])
        self.assertIn("all 100 requests were sent before the first one ended (30.0 s in): one burst", w["note"])
        self.assertEqual(main.load_verdict({"steady_state": w}), "one burst")
        self.assertEqual(main.steady_lines(w), [f"{'steady':<12}{w['note']}"])
        # An empty window at the first end (helper-55: it ended at the last send, before it began).
        self.assertEqual((w["start_s"], w["end_s"], w["last_sent_s"]), (30.0, 30.0, 0.99))
        probing = main.Probing(main.parse_slo("ttft_p95:1e9"))
        self.assertEqual(probing.misses({"steady_state": w, "p95_ttft_ms": 1.0, "failed": 0}),
                         ["one burst: all 100 requests were sent before the first one ended (30.0 s in)"])
        merged = main.seeded([{"steady_state": w, "config": {"seed": seed}, "p95_ttft_ms": 1.0, "failed": 0}
                              for seed in (1, 2)])
        self.assertEqual(probing.misses(merged), ["one burst: " + merged["steady_state"]["note"]])
        self.assertIn("in all 2 seeds (2 of them one burst", merged["steady_state"]["note"])
        # A closed loop whose every request went out before the first ended has too few requests.
        closed = main.steady_window([measured(i, 0.0, 0.0, 30.0) for i in range(8)], 0.2, 0.95, 0.05, True)
        self.assertIn("send more requests than there are clients", closed["note"])

    def test_a_window_gets_a_verdict_only_where_one_request_at_each_edge_is_within_the_shortfall_allowed(self):
        self.assertEqual(main.window_floor(0.95), 40)
        self.assertEqual(main.window_floor(0.8), 10)
        self.assertEqual(main.window_floor(1.0), main.MAX_WINDOW_FLOOR)
        # 48 sent, 20% skipped: 38 in the window at 0.95, a verdict from 10 at 0.8.
        requests = [measured(i, i * 0.5, 0.1) for i in range(48)]
        self.assertIsNone(main.steady_window(requests, 0.2, 0.95, 0.05, False)["sustained"])
        self.assertIn("fewer than the 40 a verdict needs", main.steady_window(requests, 0.2, 0.95, 0.05, False)["note"])
        self.assertTrue(main.steady_window(requests, 0.2, 0.8, 0.05, False)["sustained"])

    def test_a_shortfall_within_the_edges_uncertainty_is_not_an_overload(self):
        # Latencies alternate 0.2 s and 4.2 s (median lag 4.2 s): requests sent near an edge end on the
        # wrong side of it. The wait grows a little (+0.001 s per s), well under the bound.
        requests = [measured(i, i * 0.5, 0.001 * i * 0.5, 0.2 if i % 2 else 4.2) for i in range(60)]
        w = self.window(requests)
        self.assertLess(w["served_rate"], 0.95 * w["offered_rate"])
        self.assertGreater(w["wait_growth_s_per_s"], 0)
        self.assertLess(w["least_served_share"], 0.95 * w["served_rate"] / w["offered_rate"] + 0.05)
        self.assertTrue(w["sustained"], w)
        # Every latency on its trend: no count of ends is uncertain, and the bound is the 0.95 itself.
        even = self.window([measured(i, i * 0.5, 0.001 * i * 0.5, 1.0) for i in range(60)])
        self.assertAlmostEqual(even["least_served_share"], 0.95, places=6)

    def test_bunches_sent_at_one_moment_count_their_sends_as_their_ends_are_counted(self):
        # 12 requests sent together every 3 s, served one after another in 2.4 s: the server keeps
        # up, and its wait grows by a hair. The bunch sent at the window's last moment belongs to the
        # next window, as its ends do (counting it read 4.09 req/s offered; in a window of 8 bunches,
        # 4.52 req/s and 88% served: overloaded).
        requests = [measured(12 * b + k, 3.0 * b, 0.2 * k + 1e-5 * b, 0.3) for b in range(50) for k in range(12)]
        w = self.window(requests)
        self.assertAlmostEqual(w["offered_rate"], 4.0, places=6)
        self.assertAlmostEqual(w["served_rate"], 4.0, places=6)
        self.assertGreater(w["wait_growth_s_per_s"], 0)
        self.assertTrue(w["sustained"], w)
        # One request at a time, the rule is as it was: the window's sends less one.
        single = self.window([measured(i, i * 0.5, 0.1) for i in range(200)])
        self.assertAlmostEqual(single["offered_rate"], (single["requests"] - 1) / (single["end_s"] - single["start_s"]))

    def test_a_window_whose_sends_all_fall_at_its_end_offers_nothing_and_gets_no_verdict(self):
        # Closed-loop clients in step: 10 sent at 0 end at 2 s, then 20 sent together at 5 s, the
        # window's last moment. Counted half-open, nothing was offered inside it (a rate of 0).
        requests = [measured(i, 0.0, 0.0, 2.0) for i in range(10)] + [measured(10 + i, 5.0, 0.0, 2.0) for i in range(20)]
        w = main.steady_window(requests, 0.2, 0.95, 0.05, True)
        self.assertIsNone(w["sustained"])
        self.assertIn("all at one moment", w["note"])

    def test_bunches_need_as_many_times_the_requests_for_a_verdict_and_widen_the_counts_spread(self):
        self.assertEqual(main.bunching([0.0, 1.0, 2.0]), 1.0)
        self.assertEqual(main.bunching([0.0] * 3 + [1.0]), 2.5)          # (9 + 1) / 4
        # Bunches of 12 every 3 s: a window of 96 requests holds 8 bunches, where 40 lone requests
        # would do, it needs 12 x 40 (one bunch more or fewer at each edge moves the counts by 24).
        bunched = [measured(12 * b + k, 3.0 * b, 0.2 * k, 0.3) for b in range(10) for k in range(12)]
        w = self.window(bunched)
        self.assertIsNone(w["sustained"])
        self.assertIn("fewer than the 480 a verdict needs (they are sent in bunches at one moment, 12 on average)",
                      w["note"])
        w = self.window([measured(12 * b + k, 3.0 * b, 0.2 * k, 0.3) for b in range(50) for k in range(12)])
        self.assertIsNotNone(w["sustained"])
        # The same latencies, sent one at a time at the same rate: the edges' spread is sqrt(12) narrower.
        lone = self.window([measured(i, 0.25 * i, 0.2 * (i % 12), 0.3) for i in range(600)])
        self.assertGreater(0.95 - w["least_served_share"], 3 * (0.95 - lone["least_served_share"]))

    def test_a_server_that_fell_behind_never_reads_as_serving_more_than_was_offered(self):
        # Ten sends a second; the wait grows 0.2 s per s. Only the first 40 requests end while load is
        # offered; the rest end in one burst after the last send (a drain, with no new prefills), and
        # the ends the rule counts, a median latency after the window, are that burst.
        requests = []
        for i in range(200):
            r = measured(i, i * 0.1, 0.2 * i * 0.1)
            r.last_token_s = r.sent_s + 6 if i < 40 else 24 + 0.01 * i
            requests.append(r)
        w = self.window(requests)
        self.assertEqual(w["overloaded_on"], ["wait", "served"])     # 1 / 1.2 of offered: 83%
        self.assertIn(f"served {1 / 1.2:.1%} < ", w["overloaded_by"][1])
        self.assertAlmostEqual(w["wait_growth_s_per_s"], 0.2, places=6)
        self.assertAlmostEqual(w["served_rate"], w["offered_rate"] / 1.2, places=6)     # what the wait's growth says
        self.assertAlmostEqual(w["served_rate"] + w["queue_growth_rps"], w["offered_rate"], places=6)

    def test_a_queue_the_wait_does_not_see_still_counts_and_failed_requests_never_queue(self):
        # The wait to be scheduled grows 0.1 s per s, but a later stage (a disaggregated decode, say)
        # ends only one request every 5 s, besides the one in ten that skips it: 0.4 of 2 req/s.
        requests, slow = [], 0
        for i in range(300):
            r = measured(i, i * 0.5, 0.1 * i * 0.5)
            if i % 10:
                r.last_token_s, slow = 10 + 5 * slow, slow + 1
            requests.append(r)
        w = self.window(requests)
        self.assertLess(w["served_rate"], 0.3 * w["offered_rate"])         # the count, not offered / 1.1
        self.assertEqual(w["overloaded_on"], ["wait", "served"])
        self.assertAlmostEqual(w["served_rate"] + w["queue_growth_rps"], w["offered_rate"], places=9)
        # A third fail outright: they never queue, so served and the queue's growth add up to the rest.
        for r in requests[::3]:
            r.error, r.last_token_s, r.first_token_s = "failed", None, None
        w = self.window(requests)
        share = 1 - sum(1 for r in requests if r.error) / len(requests)
        self.assertAlmostEqual((w["served_rate"] + w["queue_growth_rps"]) / w["offered_rate"], share, delta=0.01)

    def test_a_shortfall_beyond_what_the_edges_could_excuse_fails_though_the_wait_does_not_grow(self):
        # Nobody waits to be scheduled, but only half the requests end while load is offered.
        requests = [measured(i, i * 0.5, 0.0, 1.0 if i % 2 else 5_000.0) for i in range(300)]
        w = self.window(requests)
        self.assertLessEqual(w["wait_growth_s_per_s"], 0)
        self.assertEqual(w["overloaded_on"], ["served"])
        # A small shortfall with a flat wait is still the edges' noise.
        near = [measured(i, i * 0.5, 0.0, 1.0 if i % 25 else 5_000.0) for i in range(300)]
        self.assertTrue(self.window(near)["sustained"])

    def test_a_window_shorter_than_two_lifetimes_passes_nothing_and_fails_what_it_sees(self):
        # helper-37: a 10-second window of requests each 8 s in a batch counted the ends of the
        # transient and the drain; it passed. Two lifetimes long, the same requests pass.
        short = [measured(i, i * 0.1, 0.0, 8.0) for i in range(125)]
        w = self.window(short)
        self.assertIsNone(w["sustained"])
        self.assertIn("shorter than 2 request lifetimes (7.9 s each", w["note"])
        self.assertAlmostEqual(w["lifetime_s"], 7.9)
        self.assertTrue(self.window([measured(i, i * 0.1, 0.0, 8.0) for i in range(250)])["sustained"])
        # A wait growing past its bound in as short a window is still an overload.
        growing = [measured(i, i * 0.1, 0.2 * i * 0.1, 8.0) for i in range(125)]
        self.assertFalse(self.window(growing)["sustained"])
        self.assertTrue(self.window(short, closed_loop=True)["sustained"])       # a closed loop's is by construction

    def test_the_edges_never_excuse_more_than_the_shortfall_allowed(self):
        # Latencies spread over minutes in a short window: the uncertainty is capped at 1 - min served,
        # so the bound stays at 0.90 and a window a third of whose requests were never served fails.
        spread = [measured(i, i * 0.5, 0.0, 1.0 + (i % 7) * 30.0) for i in range(60)]
        self.assertAlmostEqual(self.window(spread)["least_served_share"], 0.90, places=6)
        unserved = [r for r in spread]
        for r in unserved[::3]:
            r.error, r.last_token_s = "failed", None
        w = self.window(unserved)
        self.assertLess(w["served_rate"], 0.8 * w["offered_rate"])
        self.assertFalse(w["sustained"])          # failed requests are not served, though nobody queued
        self.assertIn("of the window's requests failed", w["overloaded_by"][0])

    def test_an_overload_names_the_test_it_failed(self):
        requests = [measured(i, i * 0.5, i * 0.5 * 0.06) for i in range(400)]    # wait grows 0.06 s per s
        w = self.window(requests)
        self.assertFalse(w["sustained"])
        # A wait growing 0.06 s per s says at most 1 / 1.06 of what is offered is served: 94% fails too.
        self.assertEqual(w["overloaded_by"], ["wait grows 0.06 s per s > 0.05", "served 94.0% < 95.0% of offered"])
        self.assertEqual(main.load_verdict({"steady_state": w}), "overloaded (94% served)")
        self.assertIn("overloaded: wait grows 0.06 s per s > 0.05; served 94.0% < 95.0% of offered",
                      main.Probing(main.parse_slo("ttft_p95:1e9")).misses({"steady_state": w, "p95_ttft_ms": 1.0})[0])
        self.assertEqual(w["overloaded_on"], ["wait", "served"])
        only_wait = {**w, "overloaded_on": ["wait"]}
        self.assertEqual(main.load_verdict({"steady_state": only_wait}), "overloaded (wait +0.06 s/s)")


class Confidence(unittest.TestCase):
    def test_at_least_one_seed_must_pass_however_small_the_share(self):
        # helper-48: --seeds 3 --confidence 1e-10 needed 0 seeds, so every probe passed (602,931 req/s)
        slo = main.parse_slo("ttft_p95:1000")
        self.assertEqual(main.Probing(slo, seeds=3, confidence=1e-10).needed, 1)
        self.assertEqual(main.Probing(slo, seeds=5, confidence=0.6).needed, 3)
        self.assertEqual(main.Probing(slo, seeds=5).needed, 5)
        spec = main.RunSpec(hardware=main.HARDWARE["l4-24gb"], requests=60)
        found = main.search_point(spec, {}, probing=main.Probing(slo, sustained=False, seeds=3, confidence=1e-10))
        self.assertLess(found["highest_load"], 100)
        self.assertTrue(all(p["seeds_passed"] >= 1 for p in found["probes"] if not p["misses"]))


class SharesApart(unittest.TestCase):
    def test_two_shares_that_differ_read_differently(self):
        # helper-46: a miss explained as "served 90.9% < 90.9% of offered"
        self.assertEqual(main.shares_apart(0.90912, 0.90871), ["90.91%", "90.87%"])
        self.assertEqual(main.shares_apart(0.5, 0.9), ["50.0%", "90.0%"])
        self.assertEqual(main.shares_apart(0.25, 0.25), ["25.0%", "25.0%"])


class SimulatedVerdict(unittest.TestCase):
    def test_open_loop_at_twice_capacity_is_unsustained_and_at_half_it_is_sustained(self):
        # One H100 with llama-3.1-8b serves about 35 of these requests a second (closed loop, 256 clients).
        capacity = main.run(main.RunSpec(concurrency=256, requests=3000))["request_throughput"]
        over = main.run(main.RunSpec(rate=2 * capacity, requests=3000))["steady_state"]
        under = main.run(main.RunSpec(rate=capacity / 2, requests=3000))["steady_state"]
        self.assertFalse(over["sustained"])
        self.assertLess(over["served_rate"], 0.7 * over["offered_rate"])
        self.assertGreater(over["queue_growth_rps"], 0.3 * over["offered_rate"])
        self.assertTrue(under["sustained"])
        self.assertLess(abs(under["wait_growth_s_per_s"]), 0.01)

    def test_the_windows_rates_are_over_the_window(self):
        # helper-46: second turns sent 5,000 s in were the window's only requests, and its rates were
        # over their own 2.6 s (643.5 output tok/s, 3.87 req/s in a window that served 0.002 req/s)
        result = main.run(main.RunSpec(requests=20, turns=2, think_time=5000))
        window = result["steady_state"]
        span = window["end_s"] - window["start_s"]
        self.assertGreater(span, 4000)
        self.assertLessEqual(window["request_throughput"] * span, window["requests"] * 1.01)
        self.assertLess(window["output_throughput"], result["output_throughput"] * 2)

    def test_every_bound_a_probe_checks_but_itl_is_the_windows(self):
        # A burst of a server filling up sits before the window: its queue must not decide a
        # queue bound any more than its TTFT decides a TTFT bound.
        result = main.run(main.RunSpec(rate=30, requests=600))
        probing = main.Probing(main.parse_slo("queue_p95:1,ttft_p95:1,tpot_p95:1,e2el_p95:1"))
        figures = probing.figures(result)
        for key in ("p95_queue_ms", "p95_ttft_ms", "p95_tpot_ms", "p95_e2el_ms"):
            self.assertEqual(figures[key], result["steady_state"][key], key)
        self.assertNotEqual(result["steady_state"]["p95_queue_ms"], result["p95_queue_ms"])

    def test_an_overloaded_run_prints_one_clear_line(self):
        code, out, _ = call_cli("simulate", "--rate", "80", "--requests", "2000")
        self.assertEqual(code, 0)
        line = next(line for line in out.splitlines() if line.startswith("overloaded"))
        self.assertRegex(line, r"offered [78]\d\.\d\d req/s, served \d\d\.\d\d req/s, queue grows \d\d\.\d\d req/s")

    def test_a_closed_loop_in_step_says_so_and_one_that_drifts_does_not(self):
        def in_step(**changes):
            fixed = main.RunSpec(concurrency=8, requests=200, prompt_tokens=main.TokenRange(1024, 1024),
                                 output_tokens=main.TokenRange(128, 128))
            return main.run(main.replace(fixed, **changes))["steady_state"].get("clients_in_step")
        # Fixed lengths: requests that end in one step are sent again together, round after round.
        self.assertTrue(in_step())
        self.assertTrue(in_step(requests=201))                  # a last round cut short
        self.assertTrue(in_step(concurrency=10, requests=256))  # cohorts of 7 and 3, two TTFTs
        self.assertFalse(in_step(output_tokens=main.TokenRange(64, 192)))
        self.assertFalse(in_step(concurrency=1, requests=50))   # one client has nobody to keep step with
        # Prompts prefilled one at a time stagger the sends: not in step, though every TTFT is equal.
        self.assertFalse(in_step(engine="trtllm", concurrency=4, requests=40, prompt_tokens=main.TokenRange(8000, 8000),
                                 output_tokens=main.TokenRange(500, 500)))
        self.assertIsNone(in_step(concurrency=None, rate=5))    # an open loop has no clients
        code, out, _ = call_cli("simulate", "--concurrency", "8", "--requests", "200", "--prompt-tokens", "1024",
                                "--output-tokens", "128")
        self.assertEqual(code, 0)
        self.assertIn("clients in step: with fixed lengths, requests that end together are sent again together", out)
        code, out, _ = call_cli("simulate", "--concurrency", "8", "--requests", "200")
        self.assertNotIn("clients in step", out)

    def test_thresholds_outside_their_range_are_refused(self):
        for flag, value in (("--min-served", "0"), ("--min-served", "1.5"), ("--max-queue-growth", "-0.1"),
                            ("--steady-skip", "0.95")):
            with self.subTest(flag=flag, value=value):
                code, _, err = call_cli("simulate", flag, value, "--requests", "10")
                self.assertEqual(code, 2)
                self.assertIn(flag, err)


if __name__ == "__main__":
    unittest.main()


BURST = main.os.path.join(main.os.path.dirname(main.os.path.abspath(main.__file__)), "fixtures", "burst.jsonl")


class SustainedSearch(unittest.TestCase):
    ARGS = ("search", "--hardware", "l4-24gb", "--prompt-tokens", "1000", "--output-tokens", "200",
            "--slo", "ttft_p95:2000", "--steady-requests", "300", "--json", "--jobs", "1")

    def search(self, *extra):
        code, out, err = call_cli(*self.ARGS, *extra)
        self.assertEqual(code, 0, err)
        return main.json.loads(out)

    def test_the_answer_does_not_move_with_requests(self):
        short, long = self.search("--requests", "100"), self.search("--requests", "2000")
        self.assertEqual(short["deployments"][0]["highest_load"], long["deployments"][0]["highest_load"])

    def test_the_answer_rerun_ten_times_longer_is_still_sustained_and_within_the_slo(self):
        best = self.search()["deployments"][0]["best"]
        probe_requests = best["config"]["num_prompts"]
        rerun = main.RunSpec(hardware=main.HARDWARE["l4-24gb"], prompt_tokens=main.TokenRange(1000, 1000),
                             output_tokens=main.TokenRange(200, 200), rate=best["load"], requests=10 * probe_requests)
        steady = main.run(rerun)["steady_state"]
        self.assertTrue(steady["sustained"])
        self.assertLessEqual(steady["p95_ttft_ms"], 2000)

    def test_a_rate_a_probe_passes_but_a_run_ten_times_as_long_misses_is_stepped_down(self):
        # The default deployment and workload: the first search's answer (38.13 req/s) kept up and
        # met TTFT p95 1 s over its 1,251-request probe; 12,501 requests at that rate miss it. The
        # recheck steps down until a probe that long holds, and that probe is the answer's rerun.
        slo = main.parse_slo("ttft_p95:1000")
        spec = main.RunSpec(prompt_tokens=main.TokenRange(256, 1024), output_tokens=main.TokenRange(64, 256))
        found = main.search_point(spec, {}, probing=main.Probing(slo))
        first = max(p["load"] for p in found["probes"] if not p.get("recheck") and not p["misses"])
        long = main.Probing(slo).rechecking()
        self.assertEqual(long.steady_requests, 10_000)
        missed = main.run(long.probe(spec, first))
        self.assertTrue(long.misses(missed), "the first answer holds ten times as long: nothing to recheck here")
        rechecked = [p for p in found["probes"] if p.get("recheck")]
        self.assertEqual(rechecked[0]["load"], first)          # the recheck starts at the first answer
        # ... and stops once its miss is certain: a quarter of the way in, not at the end.
        self.assertEqual(rechecked[0]["misses"], long.misses(main.run(long.probe(spec, first), stop_on=slo)))
        self.assertEqual(rechecked[0]["stopped"]["slo"], "ttft_p95")
        self.assertLess(rechecked[0]["stopped"]["requests_ended"], long.requests(spec) / 2)
        best = found["best"]
        self.assertTrue(best["recheck"])
        self.assertEqual(best["probe_requests"], long.requests(spec))
        self.assertEqual(best["misses"], [])
        self.assertLess(found["highest_load"], first / 1.04)
        self.assertTrue(all(p["misses"] for p in rechecked if p["load"] > found["highest_load"]))
        # --recheck 1 keeps the first answer.
        once = main.search_point(spec, {}, probing=main.Probing(slo, recheck=1))
        self.assertEqual(once["highest_load"], first)
        self.assertFalse(any(p.get("recheck") for p in once["probes"]))

    def test_a_target_rate_is_probed_at_the_rechecks_length(self):
        report = self.search("--rate", "0.5")
        probe, = report["deployments"][0]["probes"]
        self.assertEqual(probe["probe_requests"], main.math.ceil(3000 / 0.8) + 1)
        self.assertTrue(probe["recheck"])
        self.assertIn("--requests 3751 ", probe["rerun"])
        _, out, _ = call_cli(*self.ARGS[:-3], "--rate", "0.5", "--recheck", "2", "--jobs", "1")
        self.assertIn("each probe: 751 requests or more", out)

    def test_a_recheck_with_nothing_to_recheck_or_too_long_is_refused(self):
        for extra, said in ((("--load", "concurrency", "--recheck", "3"), "sustained by construction"),
                            (("--concurrency", "8", "--recheck", "3"), "sustained by construction"),
                            (("--steady-requests", "500000", "--recheck", "3"), "1,500,000 requests in a recheck"),
                            (("--recheck", "0",), "--recheck"), (("--recheck", "101",), "--recheck")):
            with self.subTest(extra=extra):
                code, _, err = call_cli("search", "--slo", "ttft_p95:1000", *extra)
                self.assertEqual(code, 2, err)
                self.assertIn(said, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_a_recheck_of_1_is_no_recheck_for_a_closed_loop_too(self):
        code, out, err = call_cli("search", "--slo", "ttft_p95:1000", "--concurrency", "8", "--recheck", "1",
                                  "--steady-requests", "50", "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("cheapest that meets the slo at 8 clients", out)

    def test_a_closed_loop_probe_sends_its_clients_first_requests_as_well_as_its_window(self):
        # helper-58: each probe sent --steady-requests / 0.8 whatever its clients, so with 40 steady
        # requests 42 clients were "too short a run" and the answer was 40 (280 with 400 or more).
        answers = []
        for steady in ("40", "400"):
            code, out, err = call_cli("search", "--slo", "ttft_p95:1000", "--load", "concurrency",
                                      "--steady-requests", steady, "--json", "--jobs", "1")
            self.assertEqual(code, 0, err)
            item = main.json.loads(out)["deployments"][0]
            answers.append(item["highest_load"])
            for probe in item["probes"]:
                self.assertEqual(probe["probe_requests"],
                                 main.math.ceil(probe["load"] + int(steady) / 0.8) + 1)
                self.assertNotIn("too short", " ".join(probe["misses"]))
        self.assertLessEqual(abs(answers[0] - answers[1]), 0.05 * answers[1], answers)
        # A target of more clients than a window's requests is a verdict, not one burst.
        code, out, err = call_cli("search", "--slo", "ttft_p95:3000", "--concurrency", "300", "--steady-requests",
                                  "100", "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("--requests 426 --concurrency 300", out)
        code, out, err = call_cli("search", "--slo", "ttft_p95:1000", "--concurrency", "1000000", "--turns", "3")
        self.assertEqual((code, out), (2, ""), err)        # (3,001,251 requests: refused before it runs)
        self.assertIn("3,001,251 requests, more than the 2,000,000 a run holds; lower --concurrency or --turns", err)
        # Conversations: each client holds one, so a probe sends a conversation a client; the search
        # stops where a probe would pass 16 times its usual length (it held up to 524,288 clients).
        code, out, err = call_cli("search", "--slo", "ttft_p95:1000000", "--load", "concurrency", "--turns", "3",
                                  "--steady-requests", "100", "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("the slo holds up to the highest concurrency tried, 630 clients (more clients would make a "
                      "probe over 16 times its usual length)", out)

    def test_the_recheck_is_x_times_the_probe_that_passed_when_that_probe_was_lengthened(self):
        # helper-39: with 40 steady requests the probe is lengthened (its window must last two
        # lifetimes) past what a recheck of twice the window sends; the recheck sends twice the probe.
        code, out, err = call_cli("search", "--slo", "ttft_p95:1000", "--steady-requests", "40", "--recheck", "2",
                                  "--json", "--jobs", "1")
        self.assertEqual(code, 0, err)
        item = main.json.loads(out)["deployments"][0]
        short = max((p for p in item["probes"] if not p.get("recheck") and not p["misses"]), key=lambda p: p["load"])
        self.assertGreater(short["probe_requests"], main.math.ceil(40 / 0.8) + 1)        # lengthened
        first_recheck = next(p for p in item["probes"] if p.get("recheck"))
        self.assertEqual(first_recheck["load"], short["load"])
        self.assertGreaterEqual(first_recheck["probe_requests"], 2 * short["probe_requests"])

    def test_every_probe_reruns_as_shown(self):
        item = self.search()["deployments"][0]
        for probe in item["probes"][:3]:
            code, out, err = call_cli(*probe["rerun"].split()[2:], "--json")
            self.assertEqual(code, 0, err)
            self.assertEqual(main.json.loads(out)["steady_state"], probe["steady_state"])

    def test_a_trace_search_repeats_the_whole_trace_whatever_requests_says(self):
        # helper-49: --requests 20 cut the Monday trace to 20 rows before the sustained probes
        # repeated it (the answer moved), while their rerun commands repeated all 48 (overloaded).
        # --requests counts the burst's requests only, and every probe reruns as shown.
        flags = ("search", "--hardware", "l4-24gb", "--trace", BURST, "--slo", "ttft_p95:2000", "--steady-requests",
                 "200", "--recheck", "1", "--json", "--jobs", "1")
        answers = []
        for extra in ((), ("--requests", "20")):
            code, out, err = call_cli(*flags, *extra)
            self.assertEqual(code, 0, err)
            answers.append(main.json.loads(out)["deployments"][0])
        whole, cut = answers
        self.assertEqual(cut["highest_load"], whole["highest_load"])
        self.assertIn("--requests 20 ", cut["burst"]["best"]["rerun"] + " ")
        for probe in (cut["best"], cut["burst"]["best"]):
            code, out, err = call_cli(*probe["rerun"].split()[2:], "--json")
            self.assertEqual(code, 0, err)
            self.assertAlmostEqual(main.json.loads(out)["p95_ttft_ms"], probe["p95_ttft_ms"], places=6)

    def test_a_burst_of_requests_that_arrive_at_once_is_refused_before_the_search(self):
        # helper-50: the first 5 rows of a conversation trace share one send time; the search ran its
        # sustained probes, then died on the burst with a message that blamed the whole trace
        for requests, said in (("5", "its first 5 requests (--requests 5) arrive at once"),
                               ("1", "its first request alone (--requests 1) has no rate")):
            code, out, err = call_cli("search", "--trace", main.os.path.join(main.os.path.dirname(BURST), "traces",
                                      "mooncake_conversation_100.jsonl"), "--requests", requests,
                                      "--slo", "ttft_p95:2000")
            self.assertEqual((code, out), (2, ""), err)
            self.assertIn(said, err)
            self.assertNotIn("search:", err)          # no probe ran
        # helper-51: copies of a trace sent all at once are spaced apart, which gave it a rate to scale
        once = main.Trace("once", tuple((0.0, 10, 5, ()) for _ in range(5)))
        with self.assertRaises(main.UserError):
            main.trace_rate(main.RunSpec(trace=once, trace_repeats=2))

    def test_a_steady_window_too_short_for_a_traces_bunches_is_refused_before_the_search(self):
        # helper-52: a plan of a conversation trace (bunches of 3 to 16 requests sent at one moment) with
        # --steady-requests 100 called 16 replicas overloaded ("served 88.9% < 90%") on the noise of
        # one bunch at an edge of a window of six
        code, out, err = call_cli("search", "--trace", main.os.path.join(main.os.path.dirname(BURST), "traces",
                                  "mooncake_conversation_100.jsonl"), "--slo", "ttft_p95:2000",
                                  "--steady-requests", "100")
        self.assertEqual((code, out), (2, ""), err)
        self.assertIn("--steady-requests 100 is fewer than the 409 requests", err)
        self.assertIn("times 10.2, the mean size of the bunch", err)

    def test_a_window_too_short_for_its_own_bunches_is_run_longer_not_missed(self):
        # helper-56: a long trace whose first rows come in bunches of 50: its probe's window (its first
        # rows) needed more requests than the whole trace's bunching asked for, read "too short" at
        # every rate, and search answered that no load is sustained (79 req/s before bunches counted).
        rows = tuple((float(t), 100, 10, ()) for t in range(40) for _ in range(50)) + \
            tuple((40 + i * 0.1, 100, 10, ()) for i in range(38_000))
        spec = main.RunSpec(trace=main.Trace("front", rows))
        probing = main.Probing(main.parse_slo("ttft_p95:2000"), steady_requests=1000)
        probe = probing.probe(spec, 10.0)
        short = {"steady_state": {"requests": 1003, "needs_requests": 2000, "sustained": None, "start_s": 5.0,
                                  "end_s": 105.0, "lifetime_s": 1.0, "closed_loop": False}}
        longer = probing.longer(probe, short, 10.0)
        self.assertIsNotNone(longer)
        self.assertGreaterEqual(longer.requests, probe.requests + 997)

    def test_a_trace_ranked_at_its_own_rate_has_a_time_scale_of_1(self):
        # helper-52: --rate equal to the trace's own rate left time_scale out of the run's config, and
        # the table's column raised KeyError
        with tempfile.TemporaryDirectory() as tmp:
            path = jsonl(os.path.join(tmp, "t.jsonl"), ({"arrival": round(i * 0.2, 1), "prompt_tokens": 200,
                                                          "output_tokens": 20} for i in range(200)))
            code, out, err = call_cli("search", "--trace", path, "--slo", "ttft_p95:2000", "--steady-requests", "100",
                                      "--recheck", "1", "--jobs", "1", "--rate", "5")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"(?m)^ +1 +1 +[\d.]+ +200 ")

    def test_a_trace_too_long_to_play_whole_offers_the_load_its_probe_is_labelled_with(self):
        # helper-50: a probe of a trace's first rows, timed at the whole trace's rate, offered 2.69
        # req/s under a 4.4 req/s label. Here the first 1,000 rows come 1 a second, the rest 5.
        with tempfile.TemporaryDirectory() as tmp:
            path = jsonl(os.path.join(tmp, "long.jsonl"), ({"arrival": round(t, 2), "prompt_tokens": 200,
                                                             "output_tokens": 20}
                                                            for t in [i * 1.0 for i in range(1000)]
                                                            + [1000 + i * 0.2 for i in range(2000)]))
            code, out, err = call_cli("search", "--trace", path, "--slo", "ttft_p95:2000", "--steady-requests", "100",
                                      "--recheck", "1", "--jobs", "1", "--json")
        self.assertEqual(code, 0, err)
        for probe in json.loads(out)["deployments"][0]["probes"]:
            if probe["steady_state"].get("sustained"):
                self.assertAlmostEqual(probe["steady_state"]["offered_rate"] / probe["load"], 1, delta=0.15)
                self.assertLess(probe["probe_requests"], 3000)          # its first rows, not the whole trace

    def test_the_burst_says_which_requests_it_plays(self):
        # helper-50: with --trace-repeats 2 --requests 60 it said "the trace played once"
        flags = ("search", "--hardware", "l4-24gb", "--trace", BURST, "--trace-repeats", "2", "--slo", "ttft_p95:2000",
                 "--steady-requests", "200", "--recheck", "1", "--jobs", "1")
        for extra, said in ((("--requests", "60"), "the first 60 requests (--requests), played once, meet the slo"),
                            ((), "the trace x 2 (--trace-repeats), played once, meets the slo")):
            code, out, err = call_cli(*flags, *extra)
            self.assertEqual(code, 0, err)
            self.assertIn(said, out)

    def test_a_probe_whose_window_falls_short_is_run_longer_and_reruns_so(self):
        # 60 req/s of 2,000-token outputs on an H100: the first request ends after most of the
        # usual probe's sends, so the window starts late; the probe is lengthened until it holds 200.
        code, out, err = call_cli("search", "--slo", "ttft_p95:100000", "--rate", "60", "--output-tokens", "2000",
                                  "--steady-requests", "200", "--json", "--jobs", "1")
        self.assertEqual(code, 1, err)             # it misses: the search has no answer
        self.assertEqual(err.strip().splitlines()[-1], "servesim: no deployment meets the slo at 60 req/s")
        probe = main.json.loads(out)["deployments"][0]["probes"][0]
        self.assertGreater(probe["probe_requests"], 251)
        self.assertGreaterEqual(probe["steady_state"]["requests"], 200)
        self.assertIn(f"--requests {probe['probe_requests']} ", probe["rerun"] + " ")

    def test_the_rerun_starts_main_py_where_it_was_started_from(self):
        # Started by its absolute path (as from another directory), the rerun names that path.
        code, out, err = run_cli("search", "--slo", "ttft_p95:1000", "--rate", "5", "--steady-requests", "100",
                                 "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn(f"rerun it: python3 {MAIN} simulate --requests ", out)

    def test_few_steady_requests_do_not_pass_a_rate_past_what_the_server_serves(self):
        # helper-37: --steady-requests 40 answered 43.7 req/s where every overloaded probe served 37.
        code, out, err = call_cli("search", "--slo", "ttft_p95:1000", "--steady-requests", "40", "--json", "--jobs", "1")
        self.assertEqual(code, 0, err)
        deployment = main.json.loads(out)["deployments"][0]
        served = [p["steady_state"]["served_rate"] for p in deployment["probes"]
                  if p["steady_state"].get("sustained") is False]
        self.assertTrue(served, "no probe overloaded: nothing to compare with")
        self.assertLessEqual(deployment["highest_load"], 1.05 * max(served), (deployment["highest_load"], served))

    def test_jobs_leave_out_the_seeds_one_process_would_not_run(self):
        # Several processes run every seed at once; the report keeps those one process runs in turn.
        probing = main.Probing(main.parse_slo("ttft_p95:1000"), seeds=5, steady_requests=200)
        spec = main.RunSpec(prompt_tokens=main.TokenRange(256, 1024), output_tokens=main.TokenRange(64, 256))
        everyone = lambda fn, items: [fn(item) for item in items]
        one = main.search_point(spec, {}, probing=probing)
        many = main.search_point(spec, {}, probing=probing, mapper=everyone)
        self.assertEqual(one, many)
        self.assertTrue(any(p["seeds_run"] < 5 for p in one["probes"]))

    def test_seeds_count_and_confidence_decide_a_probe(self):
        report = self.search("--seeds", "3")
        for probe in report["deployments"][0]["probes"]:
            # Every seed runs for a pass; a miss stops at the first seed that misses.
            self.assertEqual(probe["misses"] == [], probe["seeds_passed"] == probe["seeds_run"] == 3)
            if probe["misses"]:
                self.assertEqual(probe["seeds_passed"], probe["seeds_run"] - 1)
                self.assertRegex(probe["misses"][0], r"^seed \d+: ")     # the columns are a mean; this is one seed's
            if probe["misses"] and probe["seeds_run"] > 1:
                # ... and that seed alone, rerun, shows the figure the miss quotes.
                seed = int(probe["misses"][0].split()[1].rstrip(":"))
                self.assertEqual(probe["missed_seed"], seed)
                code, out, err = call_cli(*probe["rerun_missed_seed"].split()[2:], "--json")
                self.assertIn(f"--seed {seed}", probe["rerun_missed_seed"])
                alone = main.Probing(main.parse_slo("ttft_p95:2000")).misses(main.json.loads(out))
                self.assertEqual(alone[0], probe["misses"][0].split(": ", 1)[1], probe)
            # The rerun runs the seeds the probe ran, so it prints the row's figures.
            if probe["seeds_run"] > 1:
                self.assertTrue(probe["rerun"].endswith(f" --seeds {probe['seeds_run']}"), probe["rerun"])
            else:
                self.assertNotIn("--seeds", probe["rerun"])
        lenient = self.search("--seeds", "3", "--confidence", "0.5")
        self.assertGreaterEqual(lenient["deployments"][0]["highest_load"], report["deployments"][0]["highest_load"])

    def test_an_slo_a_workload_cannot_have_is_refused(self):
        code, _, err = call_cli("search", "--output-tokens", "1", "--slo", "tpot_p95:50", "--jobs", "1")
        self.assertEqual(code, 2)
        self.assertIn("undefined", err)

    def test_bad_seeds_and_confidence_are_one_line(self):
        for extra in (("--seeds", "0"), ("--seeds", "5000"), ("--confidence", "0"), ("--confidence", "1.2"),
                      ("--steady-requests", "3"), ("--steady-requests", "39"), ("--steady-requests", "100",
                                                                               "--min-served", "0.99"),
                      ("--rate", "5", "--concurrency", "4"), ("--rate", "5", "--load", "concurrency"),
                      ("--confidence", "0.5")):
            with self.subTest(extra=extra):
                code, _, err = call_cli(*self.ARGS, *extra)
                self.assertEqual(code, 2)
                self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_a_warm_up_is_checked_against_what_a_probe_sends_not_against_requests(self):
        code, _, err = call_cli("search", "--slo", "ttft_p95:1000", "--warmup", "300", "--steady-requests", "60",
                                "--recheck", "5")
        self.assertEqual(code, 2)
        self.assertIn("in a probe, which sends 76", err)
        self.assertIn("raise --steady-requests", err)
        # 300 is more than --requests' default (256) and less than a probe's 1,251: it runs.
        code, out, err = call_cli("search", "--slo", "ttft_p95:1000", "--warmup", "300", "--recheck", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("--warmup 300", out)

    def test_what_an_interrupted_search_kept_and_a_miss_at_one_client_read_right(self):
        self.assertEqual(main.kept_of(0, 1, "deployment"), "0 of 1 deployment: none had finished, so the output holds none")
        self.assertEqual(main.kept_of(3, 8, "point"), "3 of 8 points; the output holds the finished ones")
        self.assertEqual(main.kept_of(2, 5, "deployment", 6, 2),
                         "2 of 5 deployments; the output holds the finished ones and the 6 ended probes of the 2 "
                         "interrupted")
        self.assertEqual(main.kept_of(0, 1, "deployment", 1),
                         "0 of 1 deployment: none had finished, so the output holds the 1 ended probe of the one "
                         "interrupted")
        self.assertEqual(main.answer_text({"interrupted": True, "probes": [{}, {}], "highest_load": None,
                                           "lowest_missing_load": None}, "req/s", "rate", None, "highest"),
                         ["highest: interrupted before an answer; its 2 probes that ended are in the table"])
        self.assertEqual(main.answer_text({"interrupted": True, "probes": [{}], "highest_load": None,
                                           "lowest_missing_load": None}, "req/s", "rate", None, "highest"),
                         ["highest: interrupted before an answer; its one probe that ended is in the table"])
        item = {"highest_load": None, "lowest_missing_load": 1}
        self.assertEqual(main.answer_text(item, "clients", "concurrency", None, "highest"),
                         ["highest: the slo is missed even at 1 client"])

    def test_an_interrupted_deployment_keeps_its_ended_probes_and_only_a_finished_answer(self):
        slo = main.parse_slo("ttft_p95:1000")
        calls = []
        with mock.patch.object(main, "run", stopping_run(lambda spec: calls.append(spec) or len(calls) > 3)):
            with self.assertRaises(KeyboardInterrupt) as caught:
                main.search_point(main.RunSpec(), {}, probing=main.Probing(slo))
        partial = caught.exception.partial
        self.assertTrue(partial["interrupted"])
        whole = main.search_point(main.RunSpec(), {}, probing=main.Probing(slo))
        self.assertGreaterEqual(len(partial["probes"]), 2)      # 3 runs: a probe may have been run longer
        self.assertEqual(partial["probes"], whole["probes"][:len(partial["probes"])])
        self.assertIsNone(partial["highest_load"])       # the first answer had not been rechecked
        # Interrupted in the burst search, after the sustained one ended: its answer stands.
        trace = main.replace(main.RunSpec(hardware=main.HARDWARE["l4-24gb"]), trace=main.read_trace(BURST))
        with mock.patch.object(main, "run", stopping_run(lambda spec: spec.trace_repeats == 1)):
            with self.assertRaises(KeyboardInterrupt) as caught:
                main.search_point(trace, {}, probing=main.Probing(main.parse_slo("ttft_p95:2000"), recheck=1))
        partial = caught.exception.partial
        self.assertIsNotNone(partial["highest_load"])
        self.assertEqual(partial["burst"]["probes"], [])
        self.assertTrue(partial["burst"]["interrupted"])

    def test_a_worker_stopped_in_a_point_returns_what_the_point_kept(self):
        # stoppable and stop_worker, in this process: the stop signal inside a point cuts it, keeping
        # its partial; one between points cuts nothing, and no point starts after it.
        def kept(settings):
            e = KeyboardInterrupt()
            e.partial = {"probes": [settings]}
            raise e

        def signalled(settings):
            os.kill(os.getpid(), main.STOP_SIGNAL)
            time.sleep(10)
            return "ended"
        old = signal.signal(main.STOP_SIGNAL, main.stop_worker)
        try:
            self.assertEqual(main.stoppable(kept, {"x": 1}), main.Cut({"probes": [{"x": 1}]}))
            self.assertEqual(main.stoppable(lambda settings: "ended", {}), "ended")
            self.assertFalse(main.worker_state["stopping"])
            started = time.monotonic()
            self.assertEqual(main.stoppable(signalled, {}), main.Cut())
            self.assertLess(time.monotonic() - started, 5)
            self.assertTrue(main.worker_state["stopping"])
            self.assertEqual(main.stoppable(lambda settings: self.fail("a point started after the stop"), {}),
                             main.Cut())
            main.worker_state["stopping"] = False
            os.kill(os.getpid(), main.STOP_SIGNAL)           # between points: noted, nothing raised
            self.assertTrue(main.worker_state["stopping"])
        finally:
            signal.signal(main.STOP_SIGNAL, old)
            main.worker_state.update(busy=False, stopping=False)

    def test_a_stop_keeps_points_done_behind_a_running_one_and_what_the_running_one_kept(self):
        runner = main.map_points(napping, [{"n": 0}, {"n": 1}, {"n": 2}], jobs=2)
        deadline = time.monotonic() + 60
        while not all(f.done() for f in runner.futures[1:]) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        self.assertEqual(runner.finished(), [(0, {"interrupted": True, "n": 0}), (1, {"n": 1}), (2, {"n": 2})])
        self.assertLess(time.monotonic() - started, main.STOP_WAIT_S)

    def test_an_interrupted_target_search_counts_only_the_deployments_it_finished(self):
        real, calls = main.run, []

        def run(spec, *args, **kwargs):
            calls.append(spec)
            if len(calls) > 1:
                raise KeyboardInterrupt
            return real(spec, *args, **kwargs)
        with mock.patch.object(main, "run", run):
            code, out, err = call_cli("search", "--slo", "ttft_p95:1000", "--hardware", "l4-24gb,h100-sxm-80gb",
                                      "--jobs", "1", "--rate", "1")
        self.assertEqual(code, 130, err)
        self.assertIn("among the 1 of 2 deployments tried before the stop", out)
        self.assertIn("interrupted before a probe ended", out)
        self.assertIn("interrupted after 1 of 2 deployments", err)

    def test_an_interrupted_searchs_or_sweeps_picture_says_so_and_none_replaces_a_whole_one(self):
        # helper-65: Ctrl-C replaced a whole run's --plot with "no data", or with 1 of 5 points, unmarked
        with tempfile.TemporaryDirectory() as tmp:
            plot = os.path.join(tmp, "p.svg")
            with open(plot, "w") as f:
                f.write("<svg>an earlier run's</svg>")
            with mock.patch.object(main, "run", stopping_run(lambda spec: True)):
                code, _, err = call_cli("search", "--slo", "ttft_p95:1000", "--hardware", "l4-24gb,h100-sxm-80gb",
                                        "--jobs", "1", "--rate", "1", "--plot", plot)
            self.assertEqual(code, 130, err)
            with open(plot) as f:
                self.assertEqual(f.read(), "<svg>an earlier run's</svg>")
            with mock.patch.object(main, "run", stopping_run(lambda spec: spec.concurrency == 8)):
                code, _, err = call_cli("sweep", "--requests", "20", "--concurrency", "1,8", "--jobs", "1", "--plot", plot)
            self.assertEqual(code, 130, err)
            with open(plot) as f:
                self.assertIn("(interrupted: 1 of 2 points)", f.read())

    def test_a_search_that_never_passes_stops_above_a_year_of_arrivals(self):
        # 70,000 requests at the lowest rates would span years; a probe's size is the search's own.
        code, out, err = call_cli("search", "--slo", "ttft_p95:0.001", "--requests", "70000",
                                  "--output-tokens", "8", "--jobs", "1")
        self.assertEqual(code, 1, err)             # no answer: exit 1, one line on stderr
        self.assertEqual(err.strip().splitlines()[-1], "servesim: no deployment meets the slo at any load tried")
        self.assertIn("the slo is missed even at", out)


class CertainMiss(unittest.TestCase):
    """A run stopped once it misses an SLO for certain: the whole run misses it too, and a run
    that is not stopped is the same run."""

    def test_a_run_stops_only_where_the_whole_run_misses_that_bound(self):
        rng = main.random.Random(7)
        stopped = kept = 0
        for trial in range(24):
            stat = rng.choice(["p50", "p90", "p95", "p99"])
            metric = rng.choice(["ttft", "e2el", "tpot", "queue", "ttfa"])
            bound = {"ttft": rng.choice([300, 800, 2000]), "e2el": rng.choice([3000, 8000]),
                     "tpot": rng.choice([15, 30, 60]), "queue": rng.choice([50, 500]),
                     "ttfa": rng.choice([300, 1000])}[metric]
            slo = main.parse_slo(f"{metric}_{stat}:{bound}")
            spec = main.RunSpec(rate=rng.choice([20, 35, 40, 50]), requests=rng.choice([600, 1500]),
                                seed=trial, warmup=rng.choice([0, 100]),
                                data_parallel_size=rng.choice([1, 1, 2]), steady_skip=rng.choice([0.1, 0.2, 0.3]))
            if spec.data_parallel_size > 1:
                spec = main.replace(spec, rate=2 * spec.rate)
            whole, early = main.run(spec), main.run(spec, stop_on=slo)
            key = slo.bounds[0][1]
            if early.get("stopped"):
                stopped += 1
                self.assertEqual(early["stopped"]["slo"], f"{metric}_{stat}")
                self.assertTrue(main.Probing(slo).misses(whole))
                if whole["steady_state"]["sustained"] is not None:     # else a miss for being too short
                    self.assertGreater(main.Probing(slo).figures(whole)[key], bound, (trial, spec, slo))
                self.assertLess(early["stopped"]["requests_ended"], spec.requests)
            else:
                kept += 1
                self.assertEqual(early, whole, (trial, spec, slo))
        self.assertGreater(stopped, 3)
        self.assertGreater(kept, 3)

    def test_a_bound_equal_to_the_runs_own_figure_is_met_and_never_stops_it(self):
        # The watch works each latency out as the report does: the same float, to the last bit.
        spec = main.RunSpec(hardware=main.HARDWARE["l4-24gb"], rate=1, requests=300, seed=3)
        whole = main.run(spec)
        for key, name in (("p95_tpot_ms", "tpot_p95"), ("p90_ttft_ms", "ttft_p90"), ("p99_e2el_ms", "e2el_p99")):
            slo = main.parse_slo(f"{name}:{whole['steady_state'][key]!r}")
            self.assertEqual(main.Probing(slo).misses(whole), [], name)
            self.assertNotIn("stopped", main.run(spec, stop_on=slo), name)

    def test_a_stopped_run_shows_no_latency_it_did_not_run_to_the_end(self):
        stopped = main.run(main.RunSpec(rate=60, requests=3000), stop_on=main.parse_slo("ttft_p95:1000"))
        self.assertTrue(stopped["stopped"])
        self.assertTrue(all(stopped[k] is None for k in stopped if k.endswith("_ms")))
        self.assertGreater(stopped["output_throughput"], 0)
        self.assertFalse(main.ran_alone(stopped))

    def test_a_failed_request_in_the_window_stops_a_run(self):
        spec = main.RunSpec(rate=5, requests=400, prompt_tokens=main.TokenRange(100, 3000), max_model_len=2500)
        early = main.run(spec, stop_on=main.parse_slo("ttft_p99:100000"))
        self.assertIn("a request in the steady window failed", early["stopped"]["why"])
        self.assertIsNone(early["stopped"]["slo"])
        self.assertTrue(main.Probing(main.parse_slo("ttft_p99:100000")).misses(early))

    def test_means_and_closed_loops_never_stop(self):
        overloaded = main.RunSpec(rate=200, requests=1000)
        self.assertNotIn("stopped", main.run(overloaded, stop_on=main.parse_slo("ttft_mean:100")))
        closed = main.RunSpec(concurrency=256, requests=1000)
        self.assertNotIn("stopped", main.run(closed, stop_on=main.parse_slo("ttft_p50:1")))

    def test_a_rechecked_search_gives_the_answer_it_gives_running_every_probe_whole(self):
        slo = main.parse_slo("ttft_p95:1000")
        spec = main.RunSpec(prompt_tokens=main.TokenRange(256, 1024), output_tokens=main.TokenRange(64, 256))
        found = main.search_point(spec, {}, probing=main.Probing(slo))
        with mock.patch.object(main.Probing, "stop_on", lambda self: None):
            whole = main.search_point(spec, {}, probing=main.Probing(slo))
        self.assertEqual(found["highest_load"], whole["highest_load"])
        self.assertEqual(found["best"], whole["best"])
        self.assertEqual([p["load"] for p in found["probes"]], [p["load"] for p in whole["probes"]])
        self.assertTrue(any(p.get("stopped") for p in found["probes"]))
        self.assertFalse(any(p.get("stopped") for p in whole["probes"]))
        self.assertTrue(all(p["misses"] for p in found["probes"] if p.get("stopped")))


class TraceRepeats(unittest.TestCase):
    def rows(self):
        # Two requests share a system prompt ("sys"); each has a message of its own.
        return ((0.0, 96, 4, (("sys", 64), ("a", 32))), (1.0, 96, 4, (("sys", 64), ("b", 32))))

    def test_copies_keep_their_pace_and_share_only_what_was_shared(self):
        rows = main.repeated_rows(self.rows(), 3)
        self.assertEqual([row[0] for row in rows], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])     # span 1 + mean gap 1
        keys = [[key for key, _ in row[3]] for row in rows]
        self.assertTrue(all(k[0] == "sys" for k in keys))
        own = [k[1] for k in keys]
        self.assertEqual(len(set(map(repr, own))), 6)          # each copy's messages are new

    def test_block_hits_follow_the_rule(self):
        trace = main.Trace("t", self.rows())
        spec = main.RunSpec(trace=trace, trace_repeats=5, prefix_caching=True, block_size=16, time_scale=100)
        result = main.run(spec)
        # Every request after the first finds the 64-token system prompt (4 blocks) and nothing else:
        # its own message, even in a later copy of the same row, is new.
        self.assertAlmostEqual(result["engine"]["prefix_hit_rate"], 9 * 64 / (10 * 96))

    def test_seeds_too_short_for_a_verdict_neither_hide_the_others_nor_count_as_them(self):
        # 75 requests at 1.5 req/s on an L4: some seeds' windows are too short to judge, others overloaded.
        runs = {seed: main.run(main.RunSpec(hardware=main.HARDWARE["l4-24gb"], prompt_tokens=main.TokenRange(1000, 1000),
                                            output_tokens=main.TokenRange(200, 200), rate=1.5, requests=75, seed=seed))
                for seed in range(7, 15)}
        short = [seed for seed, r in runs.items() if r["steady_state"]["sustained"] is None]
        over = [seed for seed, r in runs.items() if r["steady_state"]["sustained"] is False]
        self.assertTrue(short and over, (short, over))
        # The first seed too short, or the first overloaded: the merged window is the judged seeds'.
        for chosen in ([runs[short[0]], runs[over[0]], runs[over[-1]]], [runs[over[0]], runs[short[0]], runs[short[-1]]]):
            merged = main.seeded(chosen)
            judged = [r["steady_state"] for r in chosen if r["steady_state"]["sustained"] is not None]
            steady = merged["steady_state"]
            self.assertFalse(steady["sustained"])
            self.assertEqual(steady["seeds_too_short"], len(chosen) - len(judged))
            self.assertEqual(merged["seeds"]["too_short"], len(chosen) - len(judged))
            self.assertAlmostEqual(steady["offered_rate"], sum(w["offered_rate"] for w in judged) / len(judged))
            self.assertIn("wait", steady["overloaded_on"])
            self.assertIn(f"too short to tell in {len(chosen) - len(judged)} of {len(chosen)} seeds",
                          main.steady_lines(steady)[0])

    def test_seeds_none_of_which_can_be_judged_say_so_in_their_own_words(self):
        runs = [main.run(main.RunSpec(hardware=main.HARDWARE["l4-24gb"], prompt_tokens=main.TokenRange(1000, 1000),
                                      output_tokens=main.TokenRange(200, 200), rate=1.6, requests=40, seed=seed))
                for seed in range(7, 13)]
        self.assertTrue(all(r["steady_state"]["sustained"] is None for r in runs))
        bursts = sum(1 for r in runs if r["steady_state"].get("one_burst"))
        self.assertTrue(0 < bursts < len(runs), bursts)
        steady = main.seeded(runs)["steady_state"]
        self.assertIn("too short to tell whether the server keeps up in all 6 seeds "
                      f"({bursts} of them one burst", main.steady_lines(steady)[0])
        self.assertEqual(main.load_verdict({"steady_state": steady}), "too short")     # not every seed a burst

    def test_a_closed_loop_with_seeds_too_short_says_so_without_failing(self):
        code, out, err = call_cli("simulate", "--hardware", "l4-24gb", "--concurrency", "4", "--requests", "15",
                                  "--prompt-tokens", "100-4000", "--output-tokens", "20-400", "--max-model-len", "2500",
                                  "--seeds", "6")
        self.assertNotIn("Traceback", err)
        self.assertEqual(code, 1, err)                  # some requests are longer than --max-model-len
        self.assertRegex(out, r"sustained by construction; too short to tell in \d of 6 seeds\)")

    def test_a_figure_every_seed_agrees_on_keeps_its_value_and_type(self):
        merged = main.mean_report([{"completed": 160, "block_size": 16, "ttft": 2.0}, {"completed": 160, "block_size": 16,
                                                                                       "ttft": 3.0}])
        self.assertEqual(merged, {"completed": 160, "block_size": 16, "ttft": 2.5})
        self.assertIsInstance(merged["completed"], int)
        code, out, _ = call_cli("simulate", "--seeds", "3", "--requests", "200")
        self.assertEqual(code, 0)
        self.assertRegex(out, r"kv cache    [\d,]+ blocks x 16 tokens ")

    def test_seeds_that_disagree_on_keeping_up_say_so_not_their_mean(self):
        kept = main.run(main.RunSpec(rate=10, requests=400))
        over = main.run(main.RunSpec(rate=80, requests=2000, seed=8))
        merged = main.seeded([kept, over])
        self.assertFalse(merged["steady_state"]["sustained"])
        self.assertEqual(merged["steady_state"]["overloaded_by"],       # by the test failed, not one seed's figures
                         ["the wait grows past the bound in 1 of 2 seeds",
                          "it serves too little of what is offered in 1 of 2 seeds"])
        line = main.steady_lines(merged["steady_state"])[0]
        self.assertTrue(line.startswith("mixed       sustained in 1 of 2 seeds, overloaded in 1; their mean"), line)
        self.assertEqual(main.load_verdict(merged), "sustained in 1/2 seeds")

    def test_a_sweeps_table_of_seeds_says_so_and_gives_each_points_spread(self):
        # helper-46: the table looked like one seed's, and its spread was only in --json and --csv
        code, out, err = call_cli("sweep", "--requests", "60", "--rate", "5,20", "--seeds", "3", "--jobs", "1")
        self.assertEqual(code, 0, err)
        _, js, _ = call_cli("sweep", "--requests", "60", "--rate", "5,20", "--seeds", "3", "--jobs", "1", "--json")
        lines = out.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("seeds"))
        self.assertIn("3 runs a point, seeds 7-9: every figure above is their mean", lines[at])
        for point, rate in zip(json.loads(js), ("5", "20")):
            spread = point["seeds"]["spread"]["output_throughput"]
            said = f"  rate {rate}, sustained in {point['seeds']['sustained']} of 3"
            short = point["seeds"].get("too_short")
            self.assertIn(said + (f", too short to tell in {short}" if short else ""), lines)
            self.assertIn(f"out tok/s {main.number(spread['min'])}-{main.number(spread['max'])}", out)
        _, single, _ = call_cli("sweep", "--requests", "60", "--rate", "5,20", "--jobs", "1")
        self.assertNotIn("seeds", single)

    def test_percentiles_of_the_seeds_are_given_only_where_they_are_not_the_min_and_max(self):
        # helper-49: from 5 seeds a p10-p90 line was printed, always equal to the min-max line above it
        runs = [main.run(main.RunSpec(rate=20, requests=60, seed=seed)) for seed in range(12)]
        for n in (5, 10):
            spread = main.seeded(runs[:n])["seeds"]["spread"]["p95_ttft_ms"]
            self.assertNotIn("p10", spread)
            # helper-48: seeds.too_short was there only when it was not 0, so a script's key came and went
            self.assertIsInstance(main.seeded(runs[:n])["seeds"]["too_short"], int)
        spread = main.seeded(runs[:11])["seeds"]["spread"]["p95_ttft_ms"]
        values = sorted(r["p95_ttft_ms"] for r in runs[:11])
        self.assertEqual((spread["p10"], spread["p90"]), (values[1], values[9]))
        self.assertNotEqual((spread["p10"], spread["p90"]), (spread["min"], spread["max"]))

    def test_search_refuses_seeds_that_would_be_copies_of_one_trace_run(self):
        # helper-48: search --trace --seeds 3 ran three identical runs and said "3 of 3 seeds" meet
        code, out, err = call_cli("search", "--trace", BURST, "--hardware", "l4-24gb", "--slo", "ttft_p95:2000",
                                  "--seeds", "3")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("replays the same requests at the same times", err)
        trace = main.RunSpec(trace=main.read_trace(BURST))
        self.assertFalse(main.draws_from_seed(trace))
        self.assertTrue(main.draws_from_seed(main.replace(trace, speculative_tokens=3)))     # its acceptances
        self.assertTrue(main.draws_from_seed(main.RunSpec(rate=5)))

    def test_a_fixed_trace_has_no_spread_across_seeds_and_poisson_has(self):
        trace = main.RunSpec(trace=main.read_trace(BURST), hardware=main.HARDWARE["l4-24gb"])
        spread = main.run_seeds(trace, 3)["seeds"]["spread"]["p95_ttft_ms"]
        self.assertEqual(spread["min"], spread["max"])
        poisson = main.run_seeds(main.RunSpec(rate=20, requests=300), 3)["seeds"]["spread"]["p95_ttft_ms"]
        self.assertLess(poisson["min"], poisson["max"])
        # helper-62: simulate and sweep showed that zero spread as if it were agreement; they say why
        for command in (("simulate",), ("sweep", "--max-num-seqs", "4,8")):
            code, out, err = call_cli(*command, "--trace", BURST, "--hardware", "l4-24gb", "--seeds", "2")
            self.assertEqual(code, 0, err)
            self.assertIn("the 2 runs are one run 2 times, and their spread is 0 by construction", err)


class ConversationWindow(unittest.TestCase):
    def test_a_conversations_window_is_while_they_start_and_after_the_first_ends(self):
        # helper-64: 105 conversations at 13.3 a second all started in 8 s; the window (to the last send)
        # saw 60 s of their later turns draining at 4.4 req/s and called the probe sustained
        spec = main.RunSpec(hardware=main.HARDWARE["l40s-48gb"], requests=314, rate=13.3, turns=3, think_time=2.0,
                            detailed=True)
        done = []
        result = main.run(spec, requests_out=done)
        steady = result["steady_state"]
        self.assertIsNone(steady["sustained"])
        self.assertIn("all 105 conversations started before the first one ended", steady["note"])
        # long enough, the window runs from the first conversation's end to the last one's start
        spec = main.replace(spec, requests=2400, rate=1.5)
        done = []
        steady = main.run(spec, requests_out=done)["steady_state"]
        t0 = min(r.sent_s for r in done)
        first_end = min(r.last_token_s for r in done if r.turn > 1 and r.next_turn is None)
        last_start = max(r.sent_s for r in done if r.turn == 1)
        self.assertAlmostEqual(steady["end_s"], last_start - t0, places=6)
        self.assertGreaterEqual(steady["start_s"], first_end - t0 - 1e-9)
        self.assertTrue(steady["sustained"])
        self.assertAlmostEqual(steady["offered_rate"], 3 * 1.5, delta=0.5)      # three turns a conversation
        # a measured run's records do not link their turns (helper-69): the window still ends at the last
        # conversation's start, starts no later than for the linked turns, and counts conversations by turn 1
        records = [main.StreamRecord(r.id, turn=r.turn, sent_s=r.sent_s) for r in done]
        for record, r in zip(records, done):
            record.first_token_s, record.last_token_s, record.error = r.first_token_s, r.last_token_s, r.error
            record.queue_s = r.queue_s
        measured = main.steady_window(records, spec.steady_skip, spec.min_served, spec.max_queue_growth, False)
        self.assertAlmostEqual(measured["end_s"], steady["end_s"], places=6)
        self.assertLessEqual(measured["start_s"], steady["start_s"])
