"""Goodput, search (highest load within an SLO, cheapest deployment for a load), cost, and the
pictures. Rules are checked on cases worked out by hand; every picture is parsed back with
xml.etree and its points compared with the numbers the same command reports as data."""
import csv
import io
import json
import os
import re
import random
import subprocess
import sys
import tempfile
import unittest
from unittest import mock
import xml.etree.ElementTree as ET

from bounded import jsonl
from helpers import CODE, FIXTURES, ROOT, call_cli, main
from fake_server import FakeServer, paced

BURST = os.path.join(FIXTURES, "burst.jsonl")
SVG = "{http://www.w3.org/2000/svg}"


class Done:
    """A finished request as summarize() reads one."""
    def __init__(self, sent, first, last, output, error=None):
        self.sent_s, self.first_token_s, self.last_token_s = sent, first, last
        self.output_tokens, self.prompt_tokens, self.error = output, 10, error
        self.queue_s, self.token_times = None, []


def series(svg_text):
    """{series name: [(x, y), ...]} and the marks, from a figure's data attributes."""
    root = ET.fromstring(svg_text)
    found = {}
    for panel in root.iter(f"{SVG}g"):
        if panel.get("class") != "panel":
            continue
        for g in panel.iter(f"{SVG}g"):
            if g.get("class") == "series":
                points = [(float(c.get("data-x")), float(c.get("data-y"))) for c in g.iter(f"{SVG}circle")]
                found[(panel.get("data-title"), g.get("data-name"))] = points
    marks = [(m.get("data-name"), float(m.get("data-x")), float(m.get("data-y")))
             for m in root.iter(f"{SVG}g") if m.get("class") == "mark"]
    levels = [float(m.get("data-y")) for m in root.iter(f"{SVG}g") if m.get("class") == "level"]
    return found, marks, levels


def close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))



class ExpertParallelGrid(unittest.TestCase):
    def test_expert_parallel_on_one_gpu_is_left_out_of_a_grid_that_tries_it_on_and_off(self):
        spec = main.RunSpec(model=main.MODELS["qwen3-30b-a3b"])
        points = [{"data_parallel_size": dp, "enable_expert_parallel": ep} for dp in (2, 1) for ep in (True, False)]
        with mock.patch.object(main.sys, "stderr", io.StringIO()) as said:
            kept = main.applicable(spec, points, "deployment")
        self.assertEqual(len(kept), 3)
        self.assertNotIn({"data_parallel_size": 1, "enable_expert_parallel": True}, kept)
        self.assertIn("1 deployment with --enable-expert-parallel on and one GPU left out", said.getvalue())
        self.assertEqual(main.applicable(spec, [{"data_parallel_size": 2}], "deployment"), [{"data_parallel_size": 2}])

class Goodput(unittest.TestCase):
    def test_a_request_is_good_when_every_bound_holds_with_vllms_tpot(self):
        # TTFT 100 ms, E2E 1,100 ms, 11 tokens: TPOT (1,100 - 100) / 10 = 100 ms.
        request = Done(0.0, 0.1, 1.1, 11)
        self.assertTrue(main.meets_slos(request, {"ttft": 100, "tpot": 100, "e2el": 1100}))
        self.assertFalse(main.meets_slos(request, {"tpot": 99.9}))
        self.assertTrue(main.meets_slos(Done(0.0, 0.1, 5.0, 1), {"tpot": 1}))     # one token: TPOT 0

    def test_goodput_is_good_requests_over_the_duration(self):
        requests = [Done(0.0, 0.1, 1.1, 11), Done(0.0, 0.5, 2.0, 11), Done(1.0, None, None, 0, error="http 500")]
        result = main.summarize(requests, slos={"ttft": 200})
        self.assertEqual((result["good_requests"], result["completed"], result["failed"]), (1, 2, 1))
        self.assertAlmostEqual(result["request_goodput"], 1 / 2.0)
        self.assertAlmostEqual(result["goodput_share"], 1 / 3)
        self.assertIsNone(main.summarize(requests)["request_goodput"])      # vllm bench's key, None when off

    def test_the_flag_reports_vllms_keys_and_refuses_bad_bounds(self):
        code, out, err = call_cli("simulate", "--requests", "60", "--goodput", "ttft:100", "tpot:9", "--json")
        self.assertEqual(code, 0, err)
        result = json.loads(out)
        self.assertEqual(result["goodput_slos_ms"], {"ttft": 100.0, "tpot": 9.0})
        self.assertAlmostEqual(result["request_goodput"], result["good_requests"] / result["duration"])
        for bad in ("ttft", "itl:5", "ttft:-3", "ttft:abc"):
            code, _, err = call_cli("simulate", "--goodput", bad)
            self.assertEqual(code, 2, bad)
            self.assertIn("--goodput", err)


class Bisection(unittest.TestCase):
    def test_a_monotone_curve_is_bracketed_within_the_tolerance(self):
        probes = []
        low, high = main.highest_passing(lambda x: probes.append(x) or x <= 7.3, 1.0, 0.05)
        self.assertLessEqual(low, 7.3)
        self.assertGreater(high, 7.3)
        self.assertLessEqual(high - low, 0.05 * low)
        self.assertEqual(probes[:4], [1.0, 2.0, 4.0, 8.0])      # doubling, then bisecting

    def test_whole_numbers_end_within_the_tolerance_or_one_apart(self):
        self.assertEqual(main.highest_passing(lambda n: n <= 37, 1, 0.05, integer=True), (37, 38))
        self.assertEqual(main.highest_passing(lambda n: n <= 0, 1, 0.05, integer=True), (None, 1))
        low, high = main.highest_passing(lambda n: n <= 241, 1, 0.05, integer=True)
        self.assertTrue(low <= 241 < high and high - low <= 0.05 * low, (low, high))
        self.assertGreater(high - low, 1)            # 240 and 248 are within 5%: no probe more

    def test_starting_above_the_answer_halves_down(self):
        low, high = main.highest_passing(lambda x: x <= 0.3, 1.0, 0.01)
        self.assertTrue(low <= 0.3 < high and high - low <= 0.01 * low)

    def test_always_failing_and_always_passing(self):
        low, high = main.highest_passing(lambda x: False, 1.0, 0.05)
        self.assertIsNone(low)
        self.assertLess(high, 0.002)
        self.assertEqual(main.highest_passing(lambda x: True, 1.0, 0.05, highest=100)[1], None)

    def test_a_factor_steps_down_a_tolerance_at_a_time_then_faster(self):
        # The recheck's walk: from a start that fails, down by the factor twice, then by its square,
        # its fourth power...; a pass one or two steps down ends it without narrowing.
        probes = []
        low, high = main.highest_passing(lambda x: probes.append(x) or x <= 35, 38.13, 0.05, highest=39,
                                         factor=1 + 0.98 * 0.05)
        self.assertEqual(probes, [38.13, 36.35, 34.65])
        self.assertEqual((low, high), (34.65, 36.35))
        # Far below, the steps grow, then the bracket is narrowed as usual: helper-39's tolerance
        # of 0.1% took 116 steps of 0.1% to walk 10% down.
        for tolerance, answer in ((0.05, 20.0), (1e-3, 34.3), (1e-3, 0.5)):
            probes = []
            low, high = main.highest_passing(lambda x: probes.append(x) or x <= answer, 38.13, tolerance, highest=39,
                                             factor=1 + 0.98 * tolerance)
            self.assertTrue(low <= answer < high and high - low <= tolerance * low, (tolerance, answer, low, high))
            self.assertLess(len(probes), 30, (tolerance, answer, probes))
        # A start that passes stops at `highest` rather than step up past the first search's miss.
        self.assertEqual(main.highest_passing(lambda x: True, 38.13, 0.05, highest=39, factor=1.049), (38.13, None))
        # A search of clients reaches its highest (helper-59: it stopped at 512 under a limit of 630).
        tried = []
        self.assertEqual(main.highest_passing(lambda x: tried.append(x) or True, 1, 0.05, integer=True, highest=630,
                                              reach=True), (630, None))
        self.assertEqual(tried[-2:], [512, 630])

    def test_on_a_curve_that_is_not_monotone_it_returns_a_true_boundary(self):
        # Noisy curves: pass/fail flips at random. Whatever the curve, the answer passed, the
        # bound above it failed, and the two are within the tolerance.
        for seed in range(200):
            rng = random.Random(seed)
            flips = sorted(rng.uniform(0.01, 200) for _ in range(rng.randint(1, 9)))
            passes = lambda x: sum(x > f for f in flips) % 2 == 0      # passes below the first flip
            low, high = main.highest_passing(passes, rng.choice([0.5, 1.0, 30.0]), 0.02)
            if low is None or high is None:
                continue
            self.assertTrue(passes(low), seed)
            self.assertFalse(passes(high), seed)
            self.assertLessEqual(high - low, 0.02 * low + 1e-12, seed)


class GuidedBisection(unittest.TestCase):
    """A guess at where the answer changes (what search makes of its probes' margins and served
    rates) saves probes when it is good and costs a bounded number when it is bad; the answer
    keeps its meaning either way."""

    def test_a_good_guess_closes_the_bracket_in_two_probes(self):
        plain, guided = [], []
        self.assertIsNotNone(main.highest_passing(lambda x: plain.append(x) or x <= 7.3, 1.0, 0.05)[0])
        low, high = main.highest_passing(lambda x: guided.append(x) or x <= 7.3, 1.0, 0.05,
                                         guess=lambda low, high: 7.3)
        self.assertTrue(low <= 7.3 < high and high - low <= 0.05 * low, (low, high))
        self.assertEqual(guided[:4], [1.0, 2.0, 4.0, 8.0])          # doubling takes no guess
        self.assertEqual(len(guided), 6, guided)                     # at the guess, then closing
        self.assertLessEqual(high - low, 0.025 * low + 1e-12)         # half the tolerance: tighter than bisection
        self.assertGreater(len(plain), len(guided) + 1, plain)

    def test_a_guess_that_is_not_a_number_is_no_guess(self):
        nan = float("nan")
        for guess in (nan, float("inf"), -1.0, 0.0):
            low, high = main.highest_passing(lambda x: x <= 7.3, 1.0, 0.05, guess=lambda low, high: guess)
            self.assertTrue(low <= 7.3 < high and high - low <= 0.05 * low, (guess, low, high))
        self.assertEqual(main.tidy(nan, 0.01) != main.tidy(nan, 0.01), True)       # NaN stays NaN, no error
        self.assertEqual(main.tidy(12.345678, 0.0), 12.345678)

    def test_a_guess_when_halving_is_tried_before_half(self):
        probes = []
        low, high = main.highest_passing(lambda x: probes.append(x) or x <= 0.62, 1.0, 0.05,
                                         guess=lambda low, high: 0.61)
        self.assertEqual(probes[:2], [1.0, 0.61])
        self.assertTrue(low <= 0.62 < high and high - low <= 0.05 * low, (low, high, probes))

    def test_any_guess_on_any_curve_returns_a_true_boundary_at_bounded_cost(self):
        for seed in range(300):
            rng = random.Random(seed)
            flips = sorted(rng.uniform(0.01, 200) for _ in range(rng.randint(1, 9)))
            passes = lambda x: sum(x > f for f in flips) % 2 == 0      # passes below the first flip
            start, tolerance = rng.choice([0.5, 1.0, 30.0]), rng.choice([0.02, 0.05, 0.2])
            plain = []
            main.highest_passing(lambda x: plain.append(x) or passes(x), start, tolerance)
            probes = []
            guess = lambda low, high: rng.choice([None, rng.uniform(0, 300), flips[0], high * 0.999,
                                                  (low or 0) * 1.001])
            low, high = main.highest_passing(lambda x: probes.append(x) or passes(x), start, tolerance, guess=guess)
            self.assertEqual(len(probes), len(set(probes)), seed)        # no load tried twice
            self.assertLessEqual(len(probes), 3 * len(plain) + 2, seed)
            # Loads read well: a few significant digits, not a float's seventeen.
            self.assertTrue(all(len(f"{x:.15g}".replace(".", "").strip("0")) <= 6 for x in probes), (seed, probes))
            if low is None or high is None:
                continue
            self.assertTrue(passes(low), seed)
            self.assertFalse(passes(high), seed)
            self.assertLessEqual(high - low, tolerance * low + 1e-12, seed)

    def test_search_guesses_from_the_bound_missed_first_and_from_what_an_overload_served(self):
        probing = main.Probing(main.parse_slo("ttft_p95:2000,tpot_p95:100"))
        ln = __import__("math").log
        # A figure of 0 counts as a hundredth of its bound, not as minus infinity.
        self.assertAlmostEqual(probing.margins([{"p95_ttft_ms": 0.0, "p95_tpot_ms": 50.0, "failed": 0,
                                                 "steady_state": None}])[0], ln(0.01))
        # TTFT crosses its bound at 1.54 req/s, TPOT at 1.28: the first to be missed decides.
        below, above = [ln(415 / 2000), ln(91.4 / 100)], [ln(2857 / 2000), ln(109.3 / 100)]
        self.assertAlmostEqual(probing.boundary(0.85, below, 1.7, above, {}), 1.277, places=2)
        # A server that could not keep up served 3.6 req/s: no more than that is sustained.
        overloaded = {"sustained": False, "served_rate": 3.6}
        self.assertEqual(probing.boundary(None, None, 6.2, above, overloaded), 3.6)
        tpot = 0.85 + 5.35 * -below[1] / (above[1] - below[1])
        self.assertAlmostEqual(probing.boundary(0.85, below, 6.2, above, overloaded), min(3.6, tpot))
        self.assertLess(tpot, 3.6)
        # Ends counted over a short window can bunch and read above what was offered: the wait's
        # growth says what was served.
        bunched = {"sustained": False, "served_rate": 187.0, "offered_rate": 125.0, "wait_growth_s_per_s": 0.611}
        self.assertAlmostEqual(probing.boundary(None, None, 124.0, above, bunched), 125.0 / 1.611)
        # Nothing to go on: no probe passed and it kept up, or a figure is missing.
        self.assertIsNone(probing.boundary(None, None, 6.2, above, {"sustained": True, "served_rate": 6.2}))
        self.assertIsNone(probing.boundary(0.85, None, 1.7, above, {}))
        # Each bound on the worst of a probe's seeds.
        runs = [{"p95_ttft_ms": 500.0, "p95_tpot_ms": 120.0, "failed": 0},
                {"p95_ttft_ms": 2500.0, "p95_tpot_ms": 90.0, "failed": 0}]
        margins = probing.margins([dict(r, steady_state=None) for r in runs])
        self.assertAlmostEqual(margins[0], ln(2500 / 2000))
        self.assertAlmostEqual(margins[1], ln(120 / 100))


class Cost(unittest.TestCase):
    def test_price_counts_every_gpu_and_a_million_tokens_at_the_throughput(self):
        spec = main.RunSpec(tensor_parallel_size=2, data_parallel_size=3)
        h100 = main.HARDWARE["h100-sxm-80gb"]
        self.assertAlmostEqual(main.deployment_price(spec, [h100] * 3, 2), 6 * 3.99)
        l4 = main.HARDWARE["l4-24gb"]
        self.assertAlmostEqual(main.deployment_price(main.RunSpec(), [l4, h100], 1), 0.80 + 3.99)   # prefill + decode
        self.assertIsNone(main.deployment_price(main.RunSpec(), [main.HARDWARE["cpu-4vcpu"]], 1))
        # $3.60 an hour at 1,000 tokens/s: 3.6 M tokens an hour, so $1 per million.
        self.assertAlmostEqual(main.cost_report(3.6, 1000)["usd_per_million_output_tokens"], 1.0)

    def test_reports_carry_the_cost_and_the_flag_overrides_it(self):
        code, out, err = call_cli("simulate", "--requests", "40", "-tp", "2", "--price-per-hour", "2", "--json")
        self.assertEqual(code, 0, err)
        result = json.loads(out)
        self.assertAlmostEqual(result["cost"]["usd_per_hour"], 4.0)
        expected = 4.0 / (result["output_throughput"] * 3600) * 1e6
        self.assertAlmostEqual(result["cost"]["usd_per_million_output_tokens"], expected)
        code, _, err = call_cli("sweep", "--hardware", "l4-24gb,h100-sxm-80gb", "--price-per-hour", "2")
        self.assertEqual(code, 2)
        self.assertIn("--price-per-hour", err)

    def test_a_month_is_730_hours_unless_told(self):
        for flags, hours in (((), 730), (("--hours-per-month", "200"), 200)):
            code, out, err = call_cli("simulate", "--requests", "20", "--price-per-hour", "2", *flags, "--json")
            self.assertEqual(code, 0, err)
            self.assertAlmostEqual(json.loads(out)["cost"]["usd_per_month"], 2 * hours)


class Search(unittest.TestCase):
    def test_highest_rate_on_the_monday_incident_and_each_probe_reruns(self):
        code, out, err = call_cli("search", "--hardware", "l4-24gb", "--trace", BURST, "--slo", "ttft_p95:2000",
                                  "--prefix-caching", "on,off", "--json", "--jobs", "1")
        self.assertEqual(code, 0, err)
        report = json.loads(out)
        on, off = report["deployments"]
        self.assertEqual((on["settings"], off["settings"]), ({"prefix_caching": True}, {"prefix_caching": False}))
        # Played once, the burst is absorbed at many times the rate with prefix caching; sustained, the gain
        # is what the cache saves on every request, and smaller.
        self.assertGreater(on["burst"]["highest_load"], 5 * off["burst"]["highest_load"])
        self.assertGreater(on["highest_load"], 2 * off["highest_load"])
        self.assertLess(on["highest_load"], on["burst"]["highest_load"])
        for item in (on, off):
            best = item["best"]
            self.assertTrue(best["steady_state"]["sustained"])
            self.assertLessEqual(best["steady_state"]["p95_ttft_ms"], 2000)
            above = [p for p in item["probes"] if p["load"] == item["lowest_missing_load"]][0]
            self.assertTrue(above["steady_state"]["p95_ttft_ms"] > 2000 or not above["steady_state"]["sustained"])
            self.assertLessEqual(item["lowest_missing_load"] - item["highest_load"], 0.05 * item["highest_load"])
        # The probe is exactly the simulate its rerun line shows.
        words = on["best"]["rerun"].split()[2:] + ["--json"]
        proc = subprocess.run([sys.executable, os.path.join(CODE, "main.py"), *words], capture_output=True,
                              text=True, cwd=ROOT)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(json.loads(proc.stdout)["steady_state"], on["best"]["steady_state"])

    def test_cheapest_deployment_ranks_the_grid_and_lists_what_does_not_fit(self):
        code, out, err = call_cli("search", "--model", "llama-3.3-70b", "--hardware", "l4-24gb,h100-sxm-80gb",
                                  "-tp", "1,4", "--rate", "1", "--requests", "60", "--slo", "ttft_p95:3000",
                                  "--json", "--jobs", "1")
        self.assertEqual(code, 0, err)
        found = json.loads(out)["deployments"]
        self.assertEqual(len(found), 4)
        verdicts = [("meets" if d["best"] else "unfit" if d.get("does_not_fit") else "misses") for d in found]
        self.assertEqual(verdicts[0], "meets")
        self.assertEqual(found[0]["settings"], {"hardware": "h100-sxm-80gb", "tensor_parallel_size": 4})
        self.assertEqual(sorted(verdicts[1:]), ["unfit", "unfit", "unfit"])
        self.assertIn("does not fit", found[-1]["does_not_fit"])
        self.assertAlmostEqual(found[0]["best"]["cost"]["usd_per_hour"], 4 * 3.99)

    def test_nothing_fits_is_exit_1_and_a_bad_slo_is_exit_2(self):
        code, out, err = call_cli("search", "--model", "llama-3.3-70b", "--hardware", "l4-24gb", "--rate", "1",
                                  "--slo", "ttft_p95:100", "--requests", "20")
        self.assertEqual(code, 1)
        self.assertIn("does not fit", out)
        for bad in ("ttft:5", "ttft_p97:5", "speed_p95:5", "ttft_p95:-1", "ttft_p95:x"):
            code, _, err = call_cli("search", "--slo", bad)
            self.assertEqual(code, 2, bad)
            self.assertIn("--slo", err)

    def test_a_request_no_load_can_serve_ends_the_search_on_its_first_probe(self):
        # Halving the rate cannot serve a prompt longer than the context: one probe, the cause
        # named, and exit 1 as simulate gives.
        code, out, err = call_cli("search", "--prompt-tokens", "140000", "--output-tokens", "10",
                                  "--slo", "ttft_p95:1000", "--steady-requests", "40", "--json")
        self.assertEqual(code, 1, err)
        found = json.loads(out)["deployments"][0]
        self.assertEqual(len(found["probes"]), 0)        # refused at its first probe, none kept
        self.assertIn("longer than --max-model-len", found["does_not_fit"])
        self.assertIn("no load can serve", err)

    def test_every_kind_of_request_no_load_can_serve_ends_the_search(self):
        # A llama.cpp slot too small for a request, whatever its words: before, the search halved
        # the rate to 1/200 of its start and called it "every request ran alone". A conversation's
        # later turns fail after it; those are not the cause named.
        for extra in ([], ["--turns", "3"]):
            with self.subTest(extra=extra):
                code, out, err = call_cli("search", "--slo", "ttft_p95:5000", "--kv-layout", "slots", "--kv-tokens",
                                          "8192", "--max-num-seqs", "8", "--prompt-tokens", "256-1500",
                                          "--steady-requests", "200", "--json", "--jobs", "1", *extra)
                self.assertEqual(code, 1, err)
                found = json.loads(out)["deployments"][0]
                self.assertEqual(found["probes"], [])
                self.assertIn("the request exceeds the available context size", found["does_not_fit"])
                self.assertNotIn(main.TURN_FAILED, found["does_not_fit"])
        self.assertEqual(main.never_served({"first_error_by_kind": {main.TURN_FAILED: "conversation stopped: turn 1 "
                                                                                       "failed"}}), None)

    def test_a_figure_just_over_its_bound_shows_that_it_is(self):
        slo = main.parse_slo("tpot_p95:25,ttft_p95:1000")
        self.assertEqual(slo.misses({"p95_tpot_ms": 25.0312, "p95_ttft_ms": 1234.56, "failed": 0}),
                         ["tpot_p95 25.03 > 25", "ttft_p95 1,234.6 > 1000"])

    def test_a_miss_by_failed_requests_names_their_reason(self):
        slo = main.parse_slo("ttft_p95:1000")
        result = {"p95_ttft_ms": 10.0, "failed": 1, "first_error_by_kind": {"timeout": "timeout: after 600 s"}}
        self.assertEqual(slo.misses(result), ["1 request failed (timeout: after 600 s)"])
        self.assertEqual(slo.misses({**result, "failed": 3}), ["3 requests failed (timeout: after 600 s)"])

    def test_jobs_do_not_change_the_answer(self):
        args = ["search", "--hardware", "l4-24gb,a100-sxm-80gb", "--rate", "3", "--requests", "200",
                "--slo", "ttft_p95:1000,tpot_p95:80", "--json"]
        one = json.loads(call_cli(*args, "--jobs", "1")[1])
        two = json.loads(call_cli(*args, "--jobs", "2")[1])
        self.assertEqual(one, two)

    def test_confirm_sends_the_chosen_load_and_compares(self):
        with FakeServer(paced(ttft=0.02, gap=0.005, tokens=8)) as server:
            code, out, err = call_cli("search", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0",
                                      "--kv-tokens", "4096", "--max-num-seqs", "4", "--prompt-tokens", "40",
                                      "--output-tokens", "8", "--requests", "30", "--slo", "ttft_p95:500",
                                      "--confirm", server.url, "--confirm-requests", "12", "--json", "--jobs", "1")
            self.assertEqual(code, 0, err)
            report = json.loads(out)
            sent = [b for b in server.bodies if b["max_tokens"] != 1]     # two probes size the prompts first
            self.assertEqual((len(sent), len(server.bodies)), (12, 14))
        confirm = report["confirm"]
        self.assertEqual(confirm["load"], report["deployments"][0]["highest_load"])
        self.assertEqual(confirm["measured"]["completed"], 12)
        self.assertIn("ttft p50 ms", confirm["rows"])
        code, _, err = call_cli("search", "--slo", "ttft_p95:500", "--prompt-tokens", "10-20", "--confirm",
                                "http://127.0.0.1:9")
        self.assertEqual(code, 2)
        self.assertIn("fixed lengths", err)


class ConfirmSendsWhatWasSearched(unittest.TestCase):
    """search --confirm sends the search's own arrivals: a trace at the searched rate, bursty gaps,
    conversations; loadgen's replay code sends them."""
    SMALL = ["--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--kv-tokens", "4096", "--max-num-seqs", "4",
             "--slo", "ttft_p95:2000", "--json", "--jobs", "1", "--steady-requests", "200"]

    def search(self, server, *args):
        code, out, err = call_cli("search", *self.SMALL, "--confirm", server.url, "--confirm-requests", "8", *args)
        self.assertEqual(code, 0, err)
        return json.loads(out), server.bodies

    def test_a_trace_is_replayed_at_the_time_scale_of_the_rate_found(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "small.jsonl")
            with open(path, "w") as f:
                for i in range(20):
                    f.write(json.dumps({"arrival": i * 0.5, "prompt_tokens": 30 + i, "output_tokens": 3 + i % 4}) + "\n")
            with FakeServer(paced(ttft=0.01, gap=0.002, tokens=3)) as server:
                report, bodies = self.search(server, "--trace", path)
        load = report["deployments"][0]["highest_load"]
        measured = report["confirm"]["measured"]["config"]
        self.assertEqual(measured["trace"], path)
        # The trace's mean rate is 19 / 9.5 s = 2 req/s: played at `load` it is stretched by 2 / load.
        self.assertAlmostEqual(measured["time_scale"], 2 / load, delta=1e-5 * 2 / load)
        replayed = [b["max_tokens"] for b in bodies if b["max_tokens"] != 1]
        self.assertEqual(replayed, [3 + i % 4 for i in range(8)])

    def test_turns_and_burstiness_are_sent_as_searched(self):
        with FakeServer(paced(ttft=0.01, gap=0.002, tokens=3)) as server:
            report, bodies = self.search(server, "--prompt-tokens", "20", "--output-tokens", "3", "--turns", "2",
                                         "--burstiness", "0.5")
        measured = report["confirm"]["measured"]["config"]
        self.assertEqual((measured["turns"], measured["burstiness"]), (2, 0.5))
        sent = [b for b in bodies if b["max_tokens"] == 3]
        self.assertEqual(len(sent), 8)
        later = [b for b in sent if any(m["role"] == "assistant" for m in b["messages"])]
        self.assertEqual(len(later), 4)         # each second turn carries the first turn's answer


class NoLoadMeetsIt(unittest.TestCase):
    def test_a_bound_missed_by_requests_that_ran_alone_stops_the_search_and_says_so(self):
        args = ["search", "--hardware", "h100-sxm-80gb", "--prompt-tokens", "100", "--output-tokens", "10",
                "--steady-requests", "200", "--jobs", "1"]
        # The halving stops sooner, where the miss stopped moving (MissedAtEveryLoad): without that
        # rule the probes go on until their requests run alone, and that rule stops them.
        flat = json.loads(call_cli(*args, "--slo", "ttft_p95:1", "--json")[1])["deployments"][0]
        self.assertIn("halving the rate left ttft_p95 where it was", flat["floor"])
        with mock.patch.object(main, "unmoved_by_load", return_value=""):
            code, out, err = call_cli(*args, "--slo", "ttft_p95:1")
            self.assertIn("where every request ran alone: no load meets it", out)
            report = json.loads(call_cli(*args, "--slo", "ttft_p95:1", "--json")[1])["deployments"][0]
        self.assertGreater(len(report["probes"]), len(flat["probes"]))
        last = report["probes"][-1]
        self.assertTrue(report["alone"])
        self.assertLessEqual(last["engine"]["mean_batch"], 1.01)
        self.assertEqual(last["p99_queue_ms"], 0)
        # A probe that misses alone after a lower one passed does not end the search: the pass stands.
        code, out, err = call_cli("search", "--hardware", "h100-sxm-80gb", "--prompt-tokens", "100", "--output-tokens",
                                  "10", "--steady-requests", "200", "--jobs", "1", "--slo", "e2el_p99:140", "--json")
        found = json.loads(out)["deployments"][0]
        if found["highest_load"] is None:
            self.assertFalse(any(not p["misses"] for p in found["probes"]), "a probe passed, yet nothing was found")
        # A bound a lower rate can meet is bisected as before: no "alone" verdict.
        met = json.loads(call_cli(*args, "--slo", "ttft_p95:40", "--json")[1])["deployments"][0]
        self.assertIsNotNone(met["highest_load"])
        self.assertNotIn("alone", met)


class BurstySearch(unittest.TestCase):
    def test_the_highest_rate_under_bursty_arrivals_is_lower_and_its_rerun_is_bursty(self):
        args = ["search", "--hardware", "l4-24gb", "--prompt-tokens", "1000", "--output-tokens", "200",
                "--slo", "ttft_p95:2000", "--json", "--jobs", "1"]
        poisson = json.loads(call_cli(*args)[1])["deployments"][0]
        code, out, err = call_cli(*args, "--burstiness", "0.25")
        self.assertEqual(code, 0, err)
        bursty = json.loads(out)["deployments"][0]
        self.assertLess(bursty["highest_load"], poisson["highest_load"])
        best = next(p for p in bursty["probes"] if p["load"] == bursty["highest_load"])
        self.assertIn("--burstiness 0.25", best["rerun"])


class Pictures(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.addCleanup(self.folder.cleanup)

    def path(self, name):
        return os.path.join(self.folder.name, name)

    def test_sweep_plot_holds_the_sweeps_numbers_and_its_knee(self):
        args = ["sweep", "--requests", "256", "--concurrency", "1,8,32,128,256", "--jobs", "1"]
        results = json.loads(call_cli(*args, "--json")[1])
        code, _, err = call_cli(*args, "--plot", self.path("s.svg"))
        self.assertEqual(code, 0, err)
        with open(self.path("s.svg")) as f:
            found, marks, _ = series(f.read())
        ttft = found[("TTFT against throughput", "concurrency p95")]
        self.assertEqual(len(ttft), 5)
        for (x, y), r in zip(ttft, results):
            self.assertTrue(close(x, r["output_throughput"]) and close(y, r["p95_ttft_ms"]))
        tpot = found[("TPOT against throughput", "concurrency p50")]
        self.assertTrue(all(close(y, r["median_tpot_ms"]) for (_, y), r in zip(tpot, results)))
        # 128 -> 256 clients buys under 10% more throughput: the knee is at 128.
        self.assertIn(("knee: concurrency 128", round(results[3]["output_throughput"], 1)),
                      [(name, round(x, 1)) for name, x, _ in marks])

    def test_search_plot_holds_each_deployment_and_the_slo(self):
        args = ["search", "--hardware", "l4-24gb,rtx-4090-24gb,a100-sxm-80gb", "--trace", BURST, "--rate", "2",
                "--slo", "ttft_p95:2000", "--jobs", "1"]
        report = json.loads(call_cli(*args, "--json")[1])
        code, _, err = call_cli(*args, "--plot", self.path("c.svg"))
        self.assertEqual(code, 0, err)
        with open(self.path("c.svg")) as f:
            found, marks, levels = series(f.read())
        self.assertEqual(levels, [2000.0])
        plotted = sorted(found[("ttft p95 against cost", "meets the slo")]
                         + found.get(("ttft p95 against cost", "misses it"), []))
        expected = sorted((d["best"] or d["probes"][-1])["cost"]["usd_per_hour"] for d in report["deployments"])
        self.assertEqual([round(x, 6) for x, _ in plotted], [round(x, 6) for x in expected])
        cheapest = report["deployments"][0]
        self.assertTrue(any(close(x, cheapest["best"]["cost"]["usd_per_hour"]) for _, x, _ in marks))

    def test_simulate_plot_and_timeline_agree(self):
        code, _, err = call_cli("simulate", "--hardware", "l4-24gb", "--trace", BURST, "--plot", self.path("t.svg"),
                                "--timeline", self.path("t.csv"))
        self.assertEqual(code, 0, err)
        with open(self.path("t.csv")) as f:
            rows = list(csv.DictReader(f))
        with open(self.path("t.svg")) as f:
            found, _, _ = series(f.read())
        running = found[("requests", "running")]
        self.assertEqual(len(running), len(rows))
        self.assertTrue(all(close(y, float(r["running"])) for (_, y), r in zip(running, rows)))
        kv = found[("KV cache", "kv cache %")]
        self.assertEqual(max(y for _, y in kv), 100.0)       # the incident fills the cache

    def test_loadgen_timeline_reads_the_servers_gauges(self):
        metrics = lambda n: (f"vllm:num_requests_running 3\nvllm:num_requests_waiting 2\n"
                             f"vllm:kv_cache_usage_perc 0.25\nvllm:generation_tokens_total {n}\n")
        with FakeServer(paced(ttft=0.02, gap=0.01, tokens=10), metrics=metrics) as server:
            code, out, err = call_cli("loadgen", "--url", server.url, "--requests", "20", "--concurrency", "2",
                                      "--max-tokens", "10", "--scrape-interval", "0.2",
                                      "--timeline", self.path("l.csv"), "--plot", self.path("l.svg"))
        self.assertEqual(code, 0, err)
        with open(self.path("l.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertGreaterEqual(len(rows), 1)
        self.assertEqual({(r["running"], r["waiting"], r["kv_cache_pct"]) for r in rows}, {("3.0", "2.0", "25.0")})
        self.assertEqual(sum(float(r["gen_throughput"]) for r in rows), 200)     # 20 requests x 10 tokens
        with open(self.path("l.svg")) as f:
            ET.fromstring(f.read())


class Shards(unittest.TestCase):
    """search --shard K/N and --collect: the shards of a search, collected, print what the whole
    search prints, byte for byte; a collect set that misses, repeats or mixes shards is refused."""
    SEARCH = ("search", "--slo", "ttft_p95:2000", "--hardware", "l4-24gb,rtx-4090-24gb", "--max-num-seqs", "16,64",
              "--prompt-tokens", "500", "--output-tokens", "100", "--steady-requests", "100", "--jobs", "1")

    def test_a_shard_refuses_outputs_it_would_not_write(self):
        # helper-58: --shard 1/2 --csv printed JSON without a word (and --plot, --confirm wrote nothing)
        for extra in (("--csv",), ("--plot", "x.svg"), ("--confirm", "http://127.0.0.1:9")):
            with self.subTest(flag=extra[0]):
                code, out, err = call_cli(*self.SEARCH, *extra, "--shard", "1/2")
                self.assertEqual((code, out), (2, ""), err)
                self.assertIn(f"--shard writes the JSON that --collect reads; {extra[0]} belongs on the --collect run",
                              err)

    def shards(self, tmp, n, *extra):
        paths = []
        for k in range(1, n + 1):
            code, out, err = call_cli(*self.SEARCH, *extra, "--shard", f"{k}/{n}")
            self.assertEqual(code, 0, err)
            paths.append(os.path.join(tmp, f"shard{k}.json"))
            with open(paths[-1], "w") as f:
                f.write(out)
        return paths

    def test_collected_shards_print_what_the_whole_search_prints(self):
        with tempfile.TemporaryDirectory() as tmp:
            paths = self.shards(tmp, 3)
            with open(paths[0]) as f:
                self.assertEqual(len(json.load(f)["found"]), 2)      # deployments 1 and 4 of 4
            for fmt in ((), ("--json",), ("--csv",)):
                with self.subTest(fmt=fmt):
                    # stderr's progress lines come when a probe takes seconds, as it may on a loaded machine
                    whole, collected = [(code, out, re.sub(r"(?m)^search: .*\n", "", err)) for code, out, err in
                                        (call_cli(*self.SEARCH, *fmt),
                                         call_cli(*self.SEARCH, *fmt, "--collect", *reversed(paths)))]
                    self.assertEqual(collected, whole)

    def test_a_target_rate_search_collects_the_same_ranking(self):
        with tempfile.TemporaryDirectory() as tmp:
            paths = self.shards(tmp, 2, "--rate", "0.5")
            whole, collected = [(code, out, re.sub(r"(?m)^search: .*\n", "", err)) for code, out, err in
                                (call_cli(*self.SEARCH, "--rate", "0.5", "--collect", *paths),
                                 call_cli(*self.SEARCH, "--rate", "0.5"))]
            self.assertEqual(collected, whole)

    def test_a_set_that_misses_repeats_or_mixes_shards_is_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            paths = self.shards(tmp, 2)
            other = os.path.join(tmp, "other.json")
            with open(other, "w") as f:
                f.write(call_cli(*self.SEARCH, "--slo", "tpot_p95:1000", "--shard", "2/2")[1])     # (both bounds)
            with open(paths[1]) as f:
                report = json.load(f)
            report["found"][0]["settings"]["hardware"] = "evil\x1b[2J"    # a name not in the grid, drawn raw
            tampered = os.path.join(tmp, "tampered.json")
            with open(tampered, "w") as f:
                json.dump(report, f)
            cases = {"missing": ([paths[0]], "shard 2/2 is missing"),
                     "repeated": ([paths[0], paths[0], paths[1]], "shard 1/2 again"),
                     "another search": ([paths[0], other], "from another search"),
                     "changed": ([paths[0], tampered], "its deployment 2 is not this grid's")}
            for name, (given, said) in cases.items():
                with self.subTest(name):
                    code, out, err = call_cli(*self.SEARCH, "--collect", *given)
                    self.assertEqual(code, 2)
                    self.assertEqual(out, "")
                    self.assertIn(said, err)
                    self.assertEqual(err.count("\n"), 1, err)
        for bad in ("0/2", "3/2", "x", "1/0"):
            with self.subTest(shard=bad):
                code, _, err = call_cli(*self.SEARCH, "--shard", bad)
                self.assertEqual(code, 2)
                self.assertIn("--shard", err)
        code, _, err = call_cli(*self.SEARCH, "--shard", "5/8")      # 4 deployments: shard 5 has none
        self.assertEqual(code, 2)
        self.assertIn("use at most 4 shards", err)


if __name__ == "__main__":
    unittest.main()


class PicturesOfOddRuns(unittest.TestCase):
    """helper-54 and helper-55: a timeline of a trace that starts long after 0 was every second
    zero, and a sweep whose outputs are one token (no TPOT) died drawing its knee."""

    def test_a_timeline_counts_from_the_first_arrival_and_holds_every_measured_token(self):
        with tempfile.TemporaryDirectory() as tmp:
            trace = jsonl(os.path.join(tmp, "late.jsonl"), ({"arrival": 1000 + i * 0.5, "prompt_tokens": 1000,
                                                             "output_tokens": 200} for i in range(60)))
            for extra, measured in (((), 60), (("--warmup", "10"), 50)):
                timeline = os.path.join(tmp, "t.csv")
                code, out, err = call_cli("simulate", "--trace", trace, "--timeline", timeline, *extra)
                self.assertEqual(code, 0, err)
                with open(timeline) as f:
                    rows = list(csv.DictReader(f))
                self.assertEqual(rows[0]["t"], "1.0")
                self.assertLess(len(rows), 40)                       # 30 s of arrivals, not 1,030 s
                self.assertEqual(sum(float(r["prompt_throughput"]) for r in rows), measured * 1000)
                self.assertEqual(sum(float(r["gen_throughput"]) for r in rows), measured * 200)
                self.assertGreater(max(int(r["running"]) for r in rows), 0)

    def test_a_sweep_without_tpot_draws_what_it_has(self):
        with tempfile.TemporaryDirectory() as tmp:
            picture = os.path.join(tmp, "s.svg")
            code, _, err = call_cli("sweep", "--output-tokens", "1", "--concurrency", "8,16", "--seeds", "2",
                                    "--requests", "20", "--plot", picture, "--jobs", "1")
            self.assertEqual(code, 0, err)
            with open(picture) as f:
                found, _, _ = series(f.read())
        self.assertEqual(len(found[("TTFT against throughput", "concurrency p95")]), 2)
        self.assertFalse([key for key in found if key[0] == "TPOT against throughput"])


class CarelessSearches(unittest.TestCase):
    """helper-64's and helper-65's: what a hurried user types, read as meant or refused in one line."""

    def test_slo_bounds_as_a_user_writes_them(self):
        for slo, said in (("ttft_p95:2,000", "'2,000' reads as two items here (a comma separates the bounds): write 2000"),
                          ("ttft_p95:2000ms", "without a unit: write ttft_p95:2000"),
                          ("ttft_p95:2s", "without a unit: write ttft_p95:2000")):
            with self.subTest(slo=slo):
                code, _, err = call_cli("search", "--slo", slo)
                self.assertEqual(code, 2)
                self.assertIn(said, err)
        self.assertEqual(main.parse_slo("ttft_p95:500,tpot_p95:50").bounds[1][2], 50.0)
        for slo in ("ttft_p95:.s", "ttft_p95:1.2.3ms", "ttft_p95:0s"):      # helper-67: tracebacks, or "write :0"
            with self.assertRaisesRegex(main.UserError, "expected METRIC_STAT:MS"):
                main.parse_slo(slo)
        # --slo twice: both's bounds (the first was dropped); a sub-millisecond bound is said
        code, out, err = call_cli("search", "--slo", "ttft_p95:2000", "--slo", "tpot_p95:0.05", "--rate", "5",
                                  "--steady-requests", "50", "--recheck", "1")
        self.assertEqual(code, 1, err)
        self.assertIn("slo ttft_p95 <= 2000 ms, tpot_p95 <= 0.05 ms", out)
        self.assertIn("--slo tpot_p95:0.05 is 0.05 ms (bounds are milliseconds): 50 ms was meant?", err)

    def test_flags_that_would_change_nothing_are_refused(self):
        for flags, said in ((("--confirm-requests", "10"), "--confirm-requests is for the --confirm run: add --confirm"),
                            (("--timeout", "5"), "--timeout is for the --confirm run")):
            with self.subTest(flags=flags):
                code, _, err = call_cli("search", "--slo", "ttft_p95:2000", *flags)
                self.assertEqual(code, 2)
                self.assertIn(said, err)
        code, _, err = call_cli("plan", "--slo", "ttft_p95:2000", "--rate-profile", os.path.join(FIXTURES, "burst.jsonl"))
        self.assertEqual(code, 2)
        self.assertIn("is JSON, which looks like a trace (give it as --trace)", err)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "s.csv")
            with open(path, "w") as f:
                f.write("time_s,replicas\n0,2\n")
            code, _, err = call_cli("search", "--slo", "ttft_p95:2000", "--replica-schedule", path)
        self.assertEqual(code, 2)
        self.assertIn("a --replica-schedule's replicas change over time", err)

    def test_the_cheapest_names_those_that_meet_the_slo_with_no_price(self):
        code, out, err = call_cli("search", "--slo", "ttft_p95:5000", "--model", "smollm2-135m-q8_0", "--hardware",
                                  "cpu-4vcpu,l4-24gb", "--rate", "0.5", "--steady-requests", "100", "--recheck", "1",
                                  "--prompt-tokens", "200", "--output-tokens", "50")
        self.assertEqual(code, 0, err)
        self.assertIn("with a price (1 more meets it with none, hardware cpu-4vcpu: give its price_per_hour): "
                      "hardware l4-24gb", out)


class SearchPicture(unittest.TestCase):
    def test_a_stopped_probe_is_drawn_open_and_the_answer_has_its_unit(self):
        # helper-64: "probes rechecked" and "... stopped: over the slo" had one marker; "highest: 0.867" no unit
        with tempfile.TemporaryDirectory() as tmp:
            plot = os.path.join(tmp, "s.svg")
            code, _, err = call_cli("search", "--slo", "ttft_p95:2000", "--hardware", "l4-24gb", "--prompt-tokens",
                                    "1000", "--output-tokens", "200", "--steady-requests", "100", "--recheck", "2",
                                    "--plot", plot)
            self.assertEqual(code, 0, err)
            with open(plot) as f:
                text = f.read()
        root = ET.fromstring(text)
        fills = {g.get("data-name"): {c.get("fill") for c in g.iter(f"{SVG}circle")}
                 for g in root.iter(f"{SVG}g") if g.get("class") == "series"}
        stopped = [name for name in fills if name.endswith("stopped: over the slo")]
        self.assertTrue(stopped, fills)
        self.assertEqual(fills[stopped[0]], {"white"})
        self.assertEqual(fills["probes rechecked"], {None})          # (filled by the series' colour)
        _, marks, _ = series(text)
        self.assertTrue(all(name.endswith(" req/s") for name, _, _ in marks), marks)


class PicturesReadable(unittest.TestCase):
    """helper-72: pictures whose series, legends and labels could not be told apart or ran off."""

    def test_a_sweep_of_many_values_keeps_its_legend_inside_and_its_points_apart(self):
        panel = main.Panel("t", "x", "y")
        for i in range(24):
            panel.add(f"seqs {i} p95", [(1, i + 1)], "line", i)
        root = ET.fromstring(main.svg_figure("t", [panel], columns=1, width=640, height=374))
        height = float(root.get("height"))
        texts = [(float(t.get("x")), float(t.get("y"))) for t in root.iter(f"{SVG}text") if t.get("x")]
        self.assertTrue(all(y <= height for _, y in texts))
        legend = {float(t.get("x")) for t in root.iter(f"{SVG}text") if (t.text or "").startswith("seqs")}
        self.assertEqual(len(legend), 2)          # the legend in two columns
        # helper-73: sixteen long names took more than the panel, and the plot a negative width
        panel = main.Panel("t", "x", "y")
        for i in range(32):
            panel.add(f"hardware rtx-pro-6000-server-96gb  tokens {i} p95", [(1, i + 1)])
        root = ET.fromstring(main.svg_figure("t", [panel], columns=1, width=640, height=374))
        self.assertTrue(all(float(r.get("width")) > 100 for r in root.iter(f"{SVG}rect")))
        self.assertTrue(all(0 <= float(t.get("x")) <= 640 for t in root.iter(f"{SVG}text") if t.get("x")))
        names = [t.text for t in root.iter(f"{SVG}text") if "\u2026" in (t.text or "")]
        self.assertEqual(len(set(names)), 32)            # cut, each keeps both ends: its group and its value
        self.assertTrue(names[0].startswith("hard") and names[-1].endswith("31 p95"), names[-1])
        colors = [g.get("stroke") for g in root.iter(f"{SVG}g") if g.get("class") == "series"]
        self.assertEqual(len(set(colors[:16])), 16)

    def test_p50_and_p95_differ_without_a_load_axis_and_labels_do_not_overprint(self):
        results = main.sweep(main.RunSpec(requests=20, concurrency=4), "max_num_seqs", [2, 4], jobs=1)
        root = ET.fromstring(main.sweep_svg("t", ["max_num_seqs"], results))
        fills = {g.get("data-name"): {c.get("fill") for c in g.iter(f"{SVG}circle")} for g in root.iter(f"{SVG}g")
                 if g.get("class") == "series"}
        self.assertEqual(fills["seqs 2 p50"], {"white"})
        self.assertEqual(fills["seqs 2 p95"], {None})                # (the series' own colour)
        panel = main.Panel("t", "x", "y")
        panel.marks += [(1.0, 10.0, "highest sustained: 0.4926"), (1.0, 10.05, "highest played once: 0.4823")]
        root = ET.fromstring(main.svg_figure("t", [panel], columns=1))
        ys = [float(t.get("y")) for g in root.iter(f"{SVG}g") if g.get("class") == "mark" for t in g.iter(f"{SVG}text")]
        self.assertGreaterEqual(abs(ys[0] - ys[1]), 14)
        panel = main.Panel("t", "x", "y")         # six labels at the bottom: stacked up, not off the chart
        panel.add("s", [(0, 1.0), (10, 100.0)])
        panel.marks += [(5.0, 1.2, f"label {i}") for i in range(6)]
        root = ET.fromstring(main.svg_figure("t", [panel], columns=1, width=760, height=420))
        ys = [float(t.get("y")) for g in root.iter(f"{SVG}g") if g.get("class") == "mark" for t in g.iter(f"{SVG}text")]
        self.assertLess(max(ys), 420 + 34 - 48)
        self.assertEqual(len(set(ys)), 6)

    def test_ticks_stacked_axes_and_styles(self):
        self.assertEqual([main.tick_text(v) for v in (1e5, 1e6, 1e7, 2.5, 0.001)],
                         ["100,000", "1,000,000", "1e7", "2.5", "1e-3"])
        # panels in a column share one plot width whatever their legends say, so time lines up
        short, long = main.Panel("a", "t", "y"), main.Panel("b", "t", "y")
        short.add("x", [(0, 1), (1, 2)])
        long.add("a much longer series name", [(0, 1), (1, 2)])
        root = ET.fromstring(main.svg_figure("t", [short, long], columns=1))
        widths = {r.get("width") for r in root.iter(f"{SVG}rect") if r.get("stroke") == "#444"}
        self.assertEqual(len(widths), 1)
        rows = [{"t": 1.0, "running": 1, "waiting": 0, "kv_cache_pct": 5, "gen_throughput": 100,
                 "prompt_throughput": 9000}]
        titles = [g.get("data-title") for g in ET.fromstring(main.timeline_svg("t", rows)).iter(f"{SVG}g")
                  if g.get("class") == "panel"]
        self.assertEqual(len(titles), 4)
        self.assertIn("counted when each prefill ends", titles[3])


class AnswersToBuyAgainst(unittest.TestCase):
    """helper-74: an answer named a deployment vLLM would refuse to start, and "cheapest" of a grid
    read as cheapest of all."""

    def test_the_cheapest_line_says_of_how_many_and_its_gpus_and_what_vllm_needs(self):
        flags = ("search", "-dp", "1,2", "--prompt-tokens", "200", "--output-tokens", "50", "--slo", "ttft_p95:2000",
                 "--steady-requests", "40", "--recheck", "1")
        code, out, err = call_cli(*flags, "--hardware", "l4-24gb", "--rate", "0.5")
        self.assertEqual(code, 0, err)
        self.assertIn("cheapest that meets the slo at 0.5 req/s of the 2 deployments tried: data-parallel-size 1:", out)
        self.assertIn("beware (data-parallel-size 1): vLLM would refuse to start this deployment", out)
        self.assertIn("vLLM needs --max-model-len 31056 or less", out)
        code, out, err = call_cli(*flags, "--hardware", "l4-24gb", "--rate", "0.5", "--max-model-len", "4096")
        self.assertNotIn("beware", out)
        code, out, err = call_cli(*flags[:2], "2", *flags[3:], "--hardware", "h100-sxm-80gb", "--rate", "0.5")
        self.assertIn("cheapest that meets the slo at 0.5 req/s: the one tried (2 GPUs): $", out)


class SeedsSpreadAsTheVerdictReadsThem(unittest.TestCase):
    def test_a_search_answer_gives_each_bounds_range_over_the_seeds_steady_windows(self):
        # helper-76: "2 of 2 seeds run meet ... tpot_p95 <= 40" beside a spread of 38.59-40.35, the
        # whole runs' (transient and drain in), where the windows the verdict read had 38.8 and 39.9
        code, out, err = call_cli("search", "--slo", "ttft_p95:1000,tpot_p95:40", "--steady-requests", 200, "--seeds", 2,
                                  "--hardware", "l40s-48gb", "--json")
        self.assertEqual(code, 0, err)
        best = json.loads(out)["deployments"][0]["best"]
        window = best["seeds"]["steady_spread"]["p95_tpot_ms"]
        self.assertLessEqual(window["max"], 40)
        self.assertGreater(best["seeds"]["spread"]["p95_tpot_ms"]["max"], window["max"])     # what misled
        runs = [main.run(main.replace(main.RunSpec(hardware=main.HARDWARE["l40s-48gb"], rate=best["load"],
                                                   requests=best["probe_requests"]), seed=7 + i)) for i in range(2)]
        self.assertEqual(sorted(r["steady_state"]["p95_tpot_ms"] for r in runs), [window["min"], window["max"]])
        code, out, err = call_cli("search", "--slo", "ttft_p95:1000,tpot_p95:40", "--steady-requests", 200, "--seeds", 2,
                                  "--hardware", "l40s-48gb")
        self.assertRegex(out, r"2 of 2 seeds run meet ttft_p95 <= 1000 ms, tpot_p95 <= 40 ms \(ttft p95 [\d.]+-[\d.]+, "
                              r"tpot p95 [\d.]+-[\d.]+ in their steady windows\) and keep up")

    def test_seeds_too_short_say_they_were_one_burst_as_the_table_does(self):
        code, out, err = call_cli("sweep", "--trace", BURST, "--hardware", "l4-24gb", "--max-num-seqs", "16,64",
                                  "--seeds", 2)
        self.assertEqual(code, 0, err)
        self.assertIn("sustained in 0 of 2, too short to tell in 2 (all one burst)", out)


class MissedAtEveryLoad(unittest.TestCase):
    def test_halving_stops_once_the_miss_does_not_move_and_the_summary_keeps_the_row(self):
        # helper-76, helper-77: a miss the load does not cause (a 2,500-token prefill alone takes 1.1 s
        # on an A100 TP2) was halved 13 times, to rates whose arrivals span weeks, and the deployment
        # was left out of the summary table
        code, out, err = call_cli("search", "--model", "llama-3.1-70b", "--hardware", "a100-sxm-80gb", "-tp", "2,4",
                                  "--prompt-tokens", "1500-2500", "--output-tokens", "150-400", "--slo",
                                  "ttft_p95:1000,tpot_p95:60", "--steady-requests", 200, "--recheck", 1, "--json")
        self.assertEqual(code, 0, err)
        tp2 = json.loads(out)["deployments"][0]
        loads = [p["load"] for p in tp2["probes"]]
        self.assertLess(len(loads), 9, loads)
        self.assertGreater(min(loads), 0.01)
        self.assertIn("halving the rate left ttft_p95 where it was", tp2["floor"])
        figures = [p["steady_state"]["p95_ttft_ms"] for p in tp2["probes"][-2:]]
        self.assertLess(abs(figures[0] / figures[1] - 1), main.FLOOR_MOVE)
        code, out, err = call_cli("search", "--model", "llama-3.1-70b", "--hardware", "a100-sxm-80gb", "-tp", "2,4",
                                  "--prompt-tokens", "1500-2500", "--output-tokens", "150-400", "--slo",
                                  "ttft_p95:1000,tpot_p95:60", "--steady-requests", 200, "--recheck", 1)
        summary = out.split("\n\n")[0]
        self.assertRegex(summary, rf"\n\s+2\s+-.*misses the slo at every load tried, down to {min(loads):.4g}\n")
        self.assertRegex(out, r"tensor-parallel-size 2: highest sustained rate meeting the slo: the slo is missed even "
                              r"at [\d.]+ req/s; halving the rate left ttft_p95 where it was")

    def test_a_rechecks_small_steps_are_not_halvings(self):
        # helper-78: the recheck's 4.7% steps moved a TPOT near its bound by 0.4%, read as a floor:
        # "no lower rate meets it" of a search whose answer, 1.07 req/s, was one step lower
        code, out, err = call_cli("search", "--hardware", "l4-24gb", "--model", "qwen2.5-7b", "--max-model-len", 4096,
                                  "--prompt-tokens", 300, "--output-tokens", "100-500", "--slo", "tpot_p95:74",
                                  "--steady-requests", 40, "--recheck", 2, "--seed", 3, "--seeds", 2, "--json")
        self.assertEqual(code, 0, err)
        found = json.loads(out)["deployments"][0]
        self.assertNotIn("floor", found)
        self.assertAlmostEqual(found["highest_load"], 1.07, delta=0.01)

    def test_a_miss_that_falls_with_the_load_is_still_halved(self):
        # the rule stops only a flat miss: an overloaded H100 at 64 req/s halves until it passes
        code, out, err = call_cli("search", "--slo", "ttft_p95:300", "--steady-requests", 100, "--recheck", 1, "--json")
        self.assertEqual(code, 0, err)
        found = json.loads(out)["deployments"][0]
        self.assertIsNotNone(found["highest_load"])
        self.assertNotIn("floor", found)


class TiesOnPrice(unittest.TestCase):
    def test_of_deployments_of_one_price_the_one_with_most_room_under_the_slo_is_named(self):
        # helper-77: three 8-GPU layouts at one price were ranked by $/M tok 0.1-0.4% apart (what
        # each happened to finish at one load), and the one with the least headroom won
        code, out, err = call_cli("search", "--hardware", "h100-sxm-80gb", "-tp", "1,2", "-dp", "1,2", "--rate", 40,
                                  "--slo", "ttft_p95:1000,tpot_p95:60", "--steady-requests", 100, "--json")
        self.assertEqual(code, 0, err)
        probing = main.Probing(main.parse_slo("ttft_p95:1000,tpot_p95:60"))
        met = [d for d in json.loads(out)["deployments"] if d["best"]]
        two = [d for d in met if d["best"]["cost"]["usd_per_hour"] == met[0]["best"]["cost"]["usd_per_hour"]]
        self.assertEqual(len(two), 2)
        rooms = [main.slo_room(d["best"], probing) for d in two]
        self.assertLess(rooms[0], rooms[1])
        code, out, err = call_cli("search", "--hardware", "h100-sxm-80gb", "-tp", "1,2", "-dp", "1,2", "--rate", 40,
                                  "--slo", "ttft_p95:1000,tpot_p95:60", "--steady-requests", 100)
        self.assertEqual([d["slo_room"] for d in json.loads(call_cli(
            "search", "--hardware", "h100-sxm-80gb", "-tp", "1,2", "-dp", "1,2", "--rate", 40, "--slo",
            "ttft_p95:1000,tpot_p95:60", "--steady-requests", 100, "--json")[1])["deployments"] if d["best"]][:2], rooms)
        self.assertRegex(out, r"\nas cheap: tensor-parallel-size \d  data-parallel-size \d; this one has the most room "
                              rf"under the slo \(its tightest bound at {rooms[0]:.0%} of it, the next {rooms[1]:.0%}\)\n")

    def test_a_tie_of_room_too_is_called_a_tie(self):
        # helper-78: two identical runs read "this one has the most room under the slo (its tightest
        # bound at 0% of it, the next 0%)"
        code, out, err = call_cli("search", "--hardware", "l4-24gb", "--max-model-len", 4096, "--max-num-seqs", "64,256",
                                  "--rate", 0.05, "--slo", "queue_p50:20000", "--steady-requests", 40, "--recheck", 1)
        self.assertEqual(code, 0, err)
        self.assertIn("\nas cheap, with as much room under the slo (its tightest bound at under 1% of it): "
                      "max-num-seqs 256\n", out)
        self.assertNotIn("most room", out)
