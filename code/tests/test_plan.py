"""Load that changes over time and replicas that come and go: a rate profile's arrivals, a
replica schedule's spans, the router that sends work only to replicas that are ready and not let
go, and what a schedule costs. Each checked on a case small enough to work out by hand."""
import contextlib
import io
import os
import random
import tempfile
import unittest
from unittest import mock

from helpers import FIXTURES, call_cli, main, run_cli, stopping_run


def write(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


class RateProfiles(unittest.TestCase):
    def test_arrivals_follow_each_window_and_none_falls_outside(self):
        windows, end = ((0.0, 2.0), (1000.0, 0.0), (2000.0, 10.0)), 3000.0
        times = main.profile_arrivals(windows, end, random.Random(1))
        counts = [sum(start <= t < stop for t in times) for start, stop in ((0, 1000), (1000, 2000), (2000, 3000))]
        self.assertEqual(counts[1], 0)                       # a window at rate 0 sends nothing
        self.assertAlmostEqual(counts[0] / 2000, 1, delta=0.1)   # Poisson: 2,000 +- 45
        self.assertAlmostEqual(counts[2] / 10000, 1, delta=0.05)
        self.assertLess(max(times), end)
        self.assertEqual(times, sorted(times))
        self.assertEqual(main.profile_arrivals(windows, end, random.Random(1), limit=5), times[:5])

    def test_the_profile_sets_the_requests_and_time_scale_stretches_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = write(tmp, "day.csv", "time_s,rate\n0,1\n100,3\n")
            profile = main.read_rate_profile(path)
            self.assertEqual(profile.end_s, 200)            # the last window as long as the one before
            self.assertEqual(profile.mean_rate(0, 200), 2.0)
            self.assertEqual(profile.mean_rate(50, 150), 2.0)
            spec = main.RunSpec(rate_profile=profile, prompt_tokens=main.TokenRange(10, 10),
                                output_tokens=main.TokenRange(5, 5))
            once = main.run(spec)
            self.assertEqual(once, main.run(spec))          # deterministic for a seed
            self.assertAlmostEqual(once["completed"] / 400, 1, delta=0.15)
            slow = main.run(main.replace(spec, time_scale=2.0))       # the same arrivals over twice the time
            self.assertEqual(slow["completed"], once["completed"])
            self.assertIn("rate profile", once["config"]["arrivals"])
            capped = main.run(main.replace(spec, requests=50))
            self.assertEqual(capped["completed"], 50)

    def test_a_bad_profile_is_one_line_naming_the_line(self):
        cases = {"time_s,rate\n0,1\n0,2\n": "line 3: time_s 0 is not after",
                 "time_s,rate\n5,1\n10,2\n": "a profile starts at 0",
                 "time_s,rate\n0,-1\n10,2\n": "'rate' must be a number from 0",
                 "time_s,rate\n0,abc\n10,2\n": "'rate' must be a number",
                 "time_s,rate\n0,1\n": "at least two rows",
                 "hour,requests\n0,1\n1,2\n": "line 1: the header 'hour,requests' has no time_s or rate column",
                 # helper-57: a comment above the header read "line 2: expected two columns"
                 "# a day\ntime_s,rate\n0,1\n1,2\n": "line 1: the header '# a day' has no time_s or rate column",
                 "time_s,rate\n0,0\n10,0\n": "sends no requests",
                 "time_s , rate\n0,0\n10,0\n": "sends no requests",     # (the header read, its spaces aside)
                 # blank lines before the header are none: the line named is the file's own
                 "\n\ntime_s,rate\n0,1\n10\n": "line 5: 1 cell where the header has 2 columns"}
        with tempfile.TemporaryDirectory() as tmp:
            # Every CSV servesim reads reads the same way: a header in any case, blank lines before it, a
            # space after a comma (a trace's reader did; a rate profile's and a replica schedule's refused)
            plain = main.run(main.RunSpec(rate_profile=main.read_rate_profile(write(tmp, "a.csv", "time_s,rate\n0,4\n5,1\n")),
                                          requests=30))
            loose = main.run(main.RunSpec(rate_profile=main.read_rate_profile(
                write(tmp, "b.csv", "\n \nTime_S, Rate\n0, 4\n5, 1\n")), requests=30))
            self.assertEqual(loose["completed"], 30)
            self.assertEqual(loose["median_ttft_ms"], plain["median_ttft_ms"])
            self.assertEqual(main.read_replica_schedule(write(tmp, "r.csv", "\nTIME_S, Replicas\n0, 2\n60, 3\n")).steps,
                             ((0.0, 2), (60.0, 3)))
            # a trace row short of a column servesim does not read is read (helper-67: it was refused)
            azure = write(tmp, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,note\n2023-11-16 18:17:03.97,100,20,a\n"
                                        "2023-11-16 18:17:04.0,120,30\n")
            self.assertEqual(main.run(main.RunSpec(trace=main.read_trace(azure)))["completed"], 2)
            # ... while a reader of every column (timeseries.csv) still names a short row (helper-69)
            with self.assertRaisesRegex(main.UserError, "line 3: 2 cells where the header has 4 columns"):
                main.read_timeline(write(tmp, "ts.csv", "t,running,waiting,kv_cache_pct\n0,1,2,3\n1,2\n"))
        with tempfile.TemporaryDirectory() as tmp:
            for text, said in cases.items():
                with self.subTest(text=text):
                    code, out, err = call_cli("simulate", "--rate-profile", write(tmp, "p.csv", text))
                    self.assertEqual(code, 2, err)
                    self.assertIn(said, err)
                    self.assertEqual(err.count("\n"), 1, err)
            code, _, err = call_cli("simulate", "--rate-profile", write(tmp, "p.csv", "time_s,rate\n0,1\n10,1\n"),
                                    "--rate", "2")
            self.assertEqual(code, 2)


class SeedsOfAProfile(unittest.TestCase):
    def test_the_title_gives_the_range_of_requests_the_seeds_sent(self):
        # helper-57: "288 requests" (the first seed's) over "requests 253 completed" (the mean)
        with tempfile.TemporaryDirectory() as tmp:
            code, out, err = call_cli("simulate", "--hardware", "l4-24gb", "--max-model-len", "4096", "--rate-profile",
                                      write(tmp, "p.csv", "time_s,rate\n0,1\n300,0\n"), "--seeds", "3", "--json")
        self.assertEqual(code, 0, err)
        report = __import__("json").loads(out)
        self.assertIn("  249 to 315 requests (by seed)  poisson rate profile", report["config"]["title"])
        self.assertAlmostEqual(report["completed"], (249 + 315 + 289) / 3, delta=1)


    def test_a_warmup_is_held_to_the_profiles_own_count_not_the_default_requests(self):
        # helper-75: --warmup 300 was refused ("send more --requests", which plan does not take)
        # against the 256 requests a run sends without a profile, where this profile sends ~500.
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "p.csv", "time_s,rate\n0,5\n100,0\n")
            code, out, err = call_cli("simulate", "--hardware", "l4-24gb", "--max-model-len", "4096",
                                      "--rate-profile", profile, "--warmup", "300", "--json")
            self.assertEqual(code, 0, err)
            report = __import__("json").loads(out)
            self.assertGreater(report["completed"], 100)      # measured: what the profile sent after the 300
            code, _, err = call_cli("simulate", "--hardware", "l4-24gb", "--rate-profile", profile, "--warmup", "5000")
            self.assertEqual(code, 2)
            self.assertIn("rate profile", err)


class ReplicaSchedules(unittest.TestCase):
    SCHEDULE = main.ReplicaSchedule("s", ((0.0, 1), (100.0, 3), (300.0, 2), (400.0, 1)))

    def test_rows_after_the_run_ends_change_nothing_and_say_so(self):
        # helper-57: a row at 5,000 s of a 95-s run made it "1 to 4 replicas", 4 of them all the time
        with tempfile.TemporaryDirectory() as tmp:
            code, out, err = call_cli("simulate", "--hardware", "l4-24gb", "--max-model-len", "4096", "--rate", "3",
                                      "--requests", "300", "--replica-schedule",
                                      write(tmp, "r.csv", "time_s,replicas\n0,1\n5000,4\n"))
        self.assertEqual(code, 0, err)
        self.assertIn("schedule    1 replica (mean 1.00)", out)
        self.assertIn("1 replica all the time", out)
        self.assertIn("its rows from 5,000 s come after the run ended, and change nothing", out)
        self.assertIn("(a mean of 1.00 GPUs over the schedule)", out)

    def test_a_router_for_a_schedule_of_one_replica_is_refused_as_without_one(self):
        # helper-57: refused without a schedule, run with a schedule that never asks for a second
        with tempfile.TemporaryDirectory() as tmp:
            for rows, refused in (("0,1\n", True), ("0,1\n50,2\n", False)):
                code, _, err = call_cli("simulate", "--router", "round-robin", "--replica-schedule",
                                        write(tmp, "r.csv", "time_s,replicas\n" + rows), "--rate", "1",
                                        "--requests", "5")
                self.assertEqual(code, 2 if refused else 0, err)
                self.assertEqual("there is one at every moment of the --replica-schedule" in err, refused)

    def test_a_replica_asked_for_serves_after_the_delay_and_the_last_added_leaves_first(self):
        spans = self.SCHEDULE.spans(30.0)
        self.assertEqual(spans[0], [(0.0, 0.0, float("inf"))])          # running from the start
        self.assertEqual(spans[1], [(100.0, 130.0, 400.0)])
        self.assertEqual(spans[2], [(100.0, 130.0, 300.0)])

    def test_the_router_sends_nothing_to_a_replica_before_it_is_ready_or_after_it_is_let_go(self):
        spans = self.SCHEDULE.spans(30.0)
        delivered = []
        deliver = main.Engine.deliver

        def recording(engine, at, request):
            delivered.append((at, engine))
            deliver(engine, at, request)

        spec = main.RunSpec(rate=2.0, requests=1000, replica_schedule=self.SCHEDULE, scale_up_delay=30.0,
                            router="round-robin", prompt_tokens=main.TokenRange(50, 50),
                            output_tokens=main.TokenRange(20, 20))
        main.Engine.deliver = recording
        try:
            result = main.run(spec)
            engines_seen = {}
            for at, engine in delivered:
                engines_seen.setdefault(engine, []).append(at)
        finally:
            main.Engine.deliver = deliver
        self.assertEqual(result["failed"], 0)
        self.assertEqual(result["completed"], 1000)          # a replica let go finishes what it has
        times = sorted(engines_seen.values(), key=len, reverse=True)
        self.assertEqual(len(times), 3)
        by_first = sorted(times, key=min)
        self.assertEqual(min(by_first[0]), min(t for t, _ in delivered))
        for sent in by_first[1:]:                            # replicas 2 and 3: only inside their spans
            self.assertGreaterEqual(min(sent), 130.0)
        self.assertLess(max(by_first[1] + by_first[2]), 400.0)
        self.assertTrue(any(t >= 300 for t in by_first[1] + by_first[2]))   # one serves until 400
        self.assertFalse(all(t >= 300 for t in by_first[1]) and all(t >= 300 for t in by_first[2]))

    def test_a_schedule_is_paid_from_asking_to_letting_go(self):
        report = main.schedule_report(self.SCHEDULE, self.SCHEDULE.spans(30.0), 30.0, 500.0, 2, 4.0)
        paid = 500 + (400 - 100) + (300 - 100)          # replica seconds
        self.assertAlmostEqual(report["gpu_hours"], paid * 2 / 3600)
        self.assertAlmostEqual(report["fixed_fleet_gpu_hours"], 3 * 500 * 2 / 3600)
        self.assertAlmostEqual(report["usd"], paid * 2 / 3600 * 4.0)
        self.assertAlmostEqual(report["mean_replicas"], paid / 500)

    def test_the_default_delay_is_start_up_and_the_weights_at_the_stated_bandwidth(self):
        spec = main.RunSpec(model=main.MODELS["llama-3.1-8b"], replica_schedule=self.SCHEDULE)
        self.assertAlmostEqual(main.scale_up_delay(spec), 48 + main.MODELS["llama-3.1-8b"].weight_bytes / 2e9)

    def test_a_bad_schedule_is_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            for text, said in {"time_s,replicas\n10,1\n": "starts at 0", "time_s,replicas\n0,0\n": "'replicas' must be",
                               "time_s,replicas\n0,1\n0,2\n": "not after", "a,b\n0,1\n": "time_s,replicas"}.items():
                with self.subTest(text=text):
                    code, _, err = call_cli("simulate", "--replica-schedule", write(tmp, "s.csv", text), "--rate", "1")
                    self.assertEqual(code, 2, err)
                    self.assertIn(said, err)
            path = write(tmp, "s.csv", "time_s,replicas\n0,1\n10,2\n")
            code, _, err = call_cli("simulate", "--replica-schedule", path, "-dp", "3", "--rate", "1")
            self.assertEqual(code, 2)
            self.assertIn("drop --data-parallel-size 3", err)
            code, _, err = call_cli("simulate", "--scale-up-delay", "10", "--rate", "1")
            self.assertEqual(code, 2)


class Plans(unittest.TestCase):
    def test_plan_offers_no_flag_it_cannot_use(self):
        # helper-43: --enable-expert-parallel asked for -dp, which plan refuses (it picks the replicas)
        code, out, _ = run_cli("plan", "--help")
        self.assertEqual(code, 0)
        for flag in ("--enable-expert-parallel", "--data-parallel-size", "--replica-schedule", "--requests",
                     "--goodput"):      # helper-48: taken and ignored (--hours-per-month now prices its month)
            self.assertNotIn("[" + flag, out)        # not in the usage line, nor as an option's own line
            self.assertNotRegex(out, r"(?m)^  " + flag + r"\b")      # an option line, not wrapped help

    def test_windows_shorter_than_a_minute_are_labelled_to_the_second(self):
        # helper-46: 30 s windows printed as 00:00-00:00, 00:00-00:01, ..., and 0.0 GPU-hours beside $0.13
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "p.csv")
            with open(path, "w") as f:
                f.write("time_s,rate\n0,2\n30,4\n")
            code, out, err = call_cli("plan", "--rate-profile", path, "--slo", "ttft_p95:500", "--window", "30",
                                      "--steady-requests", "100", "--recheck", "1", "--no-verify")
        self.assertEqual(code, 0, err)
        self.assertIn(" in 2 windows of 30 s ", out)          # helper-52: "of 0.5 min"
        self.assertRegex(out, r"(?m)^00:00:00-00:00:30 ")
        self.assertRegex(out, r"(?m)^00:00:30-00:01:00 ")
        self.assertRegex(out, r"schedule .*: 0\.017 GPU-hours, \$0\.07")

    def test_windows_take_the_profiles_mean_load(self):
        profile = main.RateProfile("p", ((0.0, 1.0), (600.0, 4.0)), 1200.0)
        windows = main.plan_windows(main.RunSpec(rate_profile=profile), 400.0)
        self.assertEqual([(a, b) for a, b, _ in windows], [(0, 400), (400, 800), (800, 1200)])
        self.assertEqual([load for _, _, load in windows], [1.0, (200 * 1 + 200 * 4) / 400, 4.0])

    def test_a_trace_shorter_than_a_window_is_planned_at_its_own_load(self):
        # 10 requests a second apart: 10 s of traffic, once counted over a 900 s window as 0.011 req/s.
        trace = main.Trace("t", tuple((float(i), 100, 10, ()) for i in range(10)))
        windows = main.plan_windows(main.RunSpec(trace=trace), 900.0)
        self.assertEqual(windows, [(0.0, 10.0, 1.0)])
        with tempfile.TemporaryDirectory() as tmp:          # titled with its own length, not --window's
            path = write(tmp, "t.jsonl", "".join(f'{{"arrival": {i}, "prompt_tokens": 100, "output_tokens": 10}}\n'
                                                 for i in range(10)))
            code, out, err = call_cli("plan", "--trace", path, "--slo", "ttft_p95:2000", "--steady-requests", "100",
                                      "--recheck", "1", "--no-verify")
        self.assertEqual(code, 0, err)
        self.assertIn(" in 1 window of 10 s ", out)
        # A last window the trace covers in part is counted over the part it covers.
        long = main.Trace("t", tuple((float(i), 100, 10, ()) for i in range(1000)))
        windows = main.plan_windows(main.RunSpec(trace=long), 600.0)
        self.assertEqual([(a, b) for a, b, _ in windows], [(0.0, 600.0), (600.0, 1000.0)])
        self.assertEqual([load for _, _, load in windows], [1.0, 1.0])
        # A sliver past the last whole window (10 s of 600) joins it rather than be planned on its own.
        sliver = main.Trace("t", tuple((float(i), 100, 10, ()) for i in range(610)))
        self.assertEqual(main.plan_windows(main.RunSpec(trace=sliver), 600.0), [(0.0, 610.0, 1.0)])

    def test_a_window_one_replica_meets_at_no_load_climbs_from_the_fewest_replicas(self):
        # Bunches of 8 requests sent at one moment every 4 s come together at any rate, so one replica
        # misses at every load; the window's replicas were then tried from --max-replicas down to none
        # (6 asked, where 4 meet the slo).
        with tempfile.TemporaryDirectory() as tmp:
            path = write(tmp, "bunches.jsonl", "".join(f'{{"arrival": {4 * b}, "prompt_tokens": 6000, '
                                                       f'"output_tokens": 20}}\n' for b in range(5) for _ in range(8)))
            code, out, err = call_cli("plan", "--trace", path, "--slo", "ttft_p95:700", "--steady-requests", "320",
                                      "--recheck", "1", "--no-verify", "--max-replicas", "6", "--json")
        self.assertEqual(code, 0, err)
        report = main.json.loads(out)
        self.assertEqual(report["one_replica_sustains"], 0)
        self.assertEqual([w["needs"] for w in report["windows"]], [4])

    def test_a_plan_that_misses_the_slo_exits_1_and_claims_no_saving(self):
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "day.csv", "time_s,rate\n0,5\n600,60\n1200,5\n")
            code, out, err = call_cli("plan", "--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens",
                                      "500", "--output-tokens", "100", "--slo", "ttft_p95:2000", "--window", "600",
                                      "--steady-requests", "200", "--max-replicas", "4", "--no-verify")
        self.assertEqual(code, 1, err)
        self.assertIn("no saving is claimed: the schedule misses the slo", out)
        self.assertNotIn("the schedule saves", out)
        self.assertEqual(err.strip().splitlines()[-1],
                         "servesim: the plan does not meet the slo: 1 window needs more than --max-replicas 4, from 00:10")

    @staticmethod
    def short_day(tmp, *flags):
        """A plan of two 10-minute windows on one L4 (0.5 then 1 req/s), unverified and unrechecked."""
        profile = write(tmp, "day.csv", "time_s,rate\n0,0.5\n600,1\n")
        return ["plan", "--rate-profile", profile, "--hardware", "l4-24gb", "--window", "600", "--recheck", "1",
                "--no-verify", *flags]

    def test_the_peak_fleet_keeps_min_replicas_and_a_deployment_vllm_refuses_is_said(self):
        # helper-75: with --min-replicas 4 the peak fleet was 3, below the schedule's least, and the
        # plan of an L4 whose cache cannot hold the model's own length said nothing of it.
        with tempfile.TemporaryDirectory() as tmp:
            args = self.short_day(tmp, "--prompt-tokens", "500", "--output-tokens", "100", "--slo", "ttft_p95:2000",
                                  "--steady-requests", "200", "--min-replicas", "4")
            code, out, err = call_cli(*args, "--json")
            self.assertEqual(code, 0, err)
            report = main.json.loads(out)
            self.assertEqual(report["totals"]["least"], 4)
            self.assertEqual(report["totals"]["peak_fleet"], 4)
            self.assertIn("vLLM would refuse to start this deployment", report["vllm_would_refuse"])
            # a month of periods like this one: 730 hours over its 20 minutes, as search prices a month
            totals = report["totals"]
            self.assertAlmostEqual(totals["usd_per_month"], totals["usd"] * 730 * 3, delta=0.01)
            self.assertAlmostEqual(totals["peak_fleet_usd_per_month"], totals["peak_fleet_usd"] * 730 * 3, delta=0.01)
            code, out, err = call_cli(*args, "--hours-per-month", 300, "--json")
            self.assertAlmostEqual(main.json.loads(out)["totals"]["usd_per_month"], totals["usd"] * 300 * 3, delta=0.01)
            code, out, err = call_cli(*args, "--csv")       # no room in a CSV: said on stderr
            self.assertIn("servesim: vLLM would refuse to start this deployment", err)
            code, out, err = call_cli(*args)
        self.assertIn("\nbeware: vLLM would refuse to start this deployment: one request of 131,072 tokens", out)
        self.assertNotIn("the schedule saves", out)

    def test_a_miss_no_load_moves_on_one_replica_ends_the_plan_as_no_replica_count_helps(self):
        # helper-78: an L4's TPOT floor (72 ms at any load, bound 60) climbed to --max-replicas and
        # read "needs more than --max-replicas 3", which invites raising it
        with tempfile.TemporaryDirectory() as tmp:
            code, out, err = call_cli(*self.short_day(tmp, "--model", "qwen2.5-7b", "--max-model-len", "4096",
                                                      "--prompt-tokens", "300", "--output-tokens", "300", "--slo",
                                                      "tpot_p95:60", "--steady-requests", "40", "--max-replicas", "3"))
        self.assertEqual((code, out), (1, ""), err)
        self.assertIn("no load meets the slo on one replica: halving the rate left tpot_p95 where it was", err)
        self.assertIn("more replicas cannot help", err)

    def test_more_windows_than_a_plan_takes_are_refused_before_it_runs(self):
        # helper-57: a year of 11-s windows ran for minutes at 950 MB, and ignored Ctrl-C
        with tempfile.TemporaryDirectory() as tmp:
            path = write(tmp, "year.csv", "time_s,rate\n0,0.05\n15000000,0.05\n")
            code, out, err = call_cli("plan", "--rate-profile", path, "--slo", "ttft_p95:2000", "--window", "60",
                                      "--no-verify")
        self.assertEqual((code, out), (2, ""), err)
        self.assertIn("cuts the 30,000,000-s period into 500,000 windows, more than the 100,000 a plan takes; give --window 300 or more", err)

    def test_a_year_of_windows_is_planned_and_its_hours_written_out(self):
        # helper-57: 35,040 windows took 3 min 22 s (the schedule looked through every window at
        # each moment) and the total read "over 8.76e+03 h"
        with tempfile.TemporaryDirectory() as tmp:
            code, out, err = call_cli("plan", "--rate-profile", write(tmp, "year.csv", "time_s,rate\n0,0.05\n15768000,0.05\n"),
                                      "--hardware", "l4-24gb", "--prompt-tokens", "200", "--output-tokens", "50",
                                      "--steady-requests", "50", "--recheck", "1", "--no-verify", "--slo", "ttft_p95:2000")
        self.assertEqual(code, 0, err)
        self.assertIn("in 35,040 windows of 15 min", out)
        self.assertIn("schedule    1 replica (mean 1.00) over 8,760 h: 8,760.0 GPU-hours", out)
        self.assertIn("peak fleet  1 replica all the time", out)

    def test_the_schedule_is_the_most_held_at_each_moment_as_the_rule_says(self):
        # The rule, read directly: at each moment a need starts or ends, the most of those held.
        def rule(needs, windows, scaling, lead):
            held = [(max(0.0, a - lead), b + scaling.scale_down_after, n) for n, (a, b, _) in zip(needs, windows)]
            steps = []
            for t in sorted({0.0, *(a for a, _, _ in held), *(b for _, b, _ in held if b < windows[-1][1])}):
                n = min(scaling.max_replicas, max([scaling.min_replicas, *(n for a, b, n in held if a <= t < b)]))
                if not steps or n != steps[-1][1]:
                    steps.append((t, n))
            return steps
        rng = main.random.Random(5)
        for case in range(300):
            width = rng.choice([60.0, 100.0, 900.0])
            windows = [(i * width, (i + 1) * width, 0) for i in range(rng.randint(1, 40))]
            needs = [rng.randint(1, 9) for _ in windows]
            scaling = main.Scaling(window_s=width, scale_down_after=rng.choice([0.0, 30.0, 150.0, 1000.0]),
                                   min_replicas=rng.randint(1, 3), max_replicas=rng.randint(3, 10))
            lead = rng.choice([0.0, 30.0, 500.0])
            with self.subTest(case=case):
                self.assertEqual(main.autoscaled(needs, windows, scaling, lead), rule(needs, windows, scaling, lead))

    def test_a_scale_down_waits_while_a_higher_need_is_recent(self):
        windows = [(i * 100.0, (i + 1) * 100.0, 0) for i in range(6)]
        needs = [1, 3, 1, 1, 1, 2]
        steps = main.autoscaled(needs, windows, main.Scaling(window_s=100, scale_down_after=150))
        # The need of 3 ends at 200: it is let go 150 s later, inside the window from 300 (helper-48:
        # the wait was rounded to whole windows, so 1 h windows scaled down at once and cost less).
        self.assertEqual(steps, [(0.0, 1), (100.0, 3), (350.0, 1), (500.0, 2)])
        capped = main.autoscaled(needs, windows, main.Scaling(window_s=100, scale_down_after=0, max_replicas=2,
                                                              min_replicas=2))
        self.assertEqual(capped, [(0.0, 2)])
        self.assertEqual(main.autoscaled(needs, windows, main.Scaling(scale_down_after=0), lead=30),
                         [(0.0, 1), (70.0, 3), (200.0, 1), (470.0, 2)])      # --ahead: asked 30 s early
        rows = [{"start_s": a, "end_s": b, "load": 0, "needs": n} for (a, b, _), n in zip(windows, needs)]
        main.scheduled(rows, main.Scaling(window_s=100, scale_down_after=150), 56.0, 3600.0)
        self.assertEqual([r["asked"] for r in rows], [1, 3, 3, 3, 1, 2])
        self.assertEqual([r["usd"] for r in rows], [100, 300, 300, 200, 100, 200])     # 3 x 50 s + 1 x 50 s
        self.assertEqual([r["short_s"] for r in rows], [0, 56, 0, 0, 0, 56])

    def test_a_plan_prices_its_schedule_and_its_csv_replays_in_simulate(self):
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "day.csv", "time_s,rate\n0,1\n600,8\n1200,2\n")
            flags = ("--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens", "500", "--output-tokens",
                     "100", "--slo", "ttft_p95:1000", "--window", "600", "--steady-requests", "100",
                     "--scale-down-after", "0", "--scale-up-delay", "30")
            code, out, err = call_cli("plan", *flags, "--json")
            self.assertEqual(code, 0, err)
            report = __import__("json").loads(out)
            rows = report["windows"]
            self.assertEqual([r["load"] for r in rows], [1.0, 8.0, 2.0])
            self.assertGreater(rows[1]["asked"], rows[0]["asked"])
            self.assertEqual(rows[1]["short_s"], 30.0)            # its added replicas start 30 s in
            per_gpu = main.HARDWARE["l4-24gb"].price_per_hour
            self.assertAlmostEqual(report["totals"]["usd"], sum(r["asked"] for r in rows) * per_gpu * 600 / 3600)
            peak = max(r["needs"] for r in rows)
            self.assertAlmostEqual(report["totals"]["peak_fleet_usd"], peak * per_gpu * 1800 / 3600)
            self.assertEqual(report["verified"]["failed"], 0)
            self.assertEqual(report["schedule"][0], {"time_s": 0.0, "replicas": rows[0]["asked"]})
            code, csv_text, err = call_cli("plan", *flags, "--csv", "--no-verify")
            self.assertEqual(code, 0, err)
            schedule = write(tmp, "plan.csv", csv_text)
            code, out, err = call_cli("simulate", "--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens",
                                      "500", "--output-tokens", "100", "--replica-schedule", schedule,
                                      "--scale-up-delay", "30", "--json")
            self.assertEqual(code, 0, err)
            replayed = __import__("json").loads(out)["replica_schedule"]
            self.assertAlmostEqual(replayed["mean_replicas"] * 1800, sum(r["asked"] for r in rows) * 600, delta=20)   # its own duration

    def test_a_probe_too_short_to_tell_is_not_a_miss_more_replicas_would_fix(self):
        # helper-57: with --steady-requests 50, 60 req/s "needed more than 16" replicas where 5 do:
        # a probe lengthened past 16 times its length was given up, and "too short to tell" read as
        # a miss, so the plan asked for replicas that cannot lengthen it.
        with tempfile.TemporaryDirectory() as tmp:
            flags = ("--hardware", "l4-24gb", "--prompt-tokens", "200", "--output-tokens", "50", "--slo",
                     "ttft_p95:2000", "--window", "600", "--recheck", "1", "--no-verify", "--json")
            code, out, err = call_cli("plan", "--rate-profile", write(tmp, "d60.csv", "time_s,rate\n0,5\n600,60\n"),
                                      "--steady-requests", "50", *flags)
            self.assertEqual(code, 0, err)
            self.assertEqual([r["needs"] for r in __import__("json").loads(out)["windows"]], [1, 5])
            code, out, err = call_cli("plan", "--rate-profile", write(tmp, "d200.csv", "time_s,rate\n0,5\n600,200\n"),
                                      "--steady-requests", "40", *flags)
            self.assertEqual((code, out), (2, ""), err)
            self.assertIn("at 200 req/s on 16 replicas, a probe of 816 requests, lengthened as far as a search lengthens one, is too short to "
                          "tell whether they keep up", err)
            self.assertIn("raise --steady-requests (now 40)", err)

    def test_a_start_up_that_outlasts_its_windows_is_a_miss_the_plan_names(self):
        # helper-57: with --scale-up-delay 1000 and 10-minute windows, no request of a window met
        # the replicas it needed, so "the requests sent once they serve meet the slo" held for none
        # and the plan claimed a saving, exit 0, over windows with TTFT p95 in the minutes.
        with tempfile.TemporaryDirectory() as tmp:
            flags = ("--rate-profile", write(tmp, "step.csv", "time_s,rate\n0,1\n600,20\n1200,20\n"), "--hardware",
                     "l4-24gb", "--prompt-tokens", "200", "--output-tokens", "50", "--window", "600",
                     "--steady-requests", "100", "--recheck", "1", "--slo", "ttft_p95:2000", "--scale-up-delay", "700")
            code, out, err = call_cli("plan", *flags)
            self.assertEqual(code, 1, err)
            self.assertIn("no saving is claimed: the schedule misses the slo", out)
            self.assertIn("miss the slo while the replicas they need start, all through, from 00:10: their 700-s "
                          "start-up outlasts what they send; give --ahead", err)
            code, out, err = call_cli("plan", *flags, "--ahead")
            self.assertEqual(code, 0, err)

    def test_the_deployment_command_keeps_the_router_its_schedule_will_use(self):
        # helper-59: the command for one replica dropped --router, which the replicas a schedule
        # adds are routed by
        with tempfile.TemporaryDirectory() as tmp:
            code, out, err = call_cli("plan", "--rate-profile", write(tmp, "p.csv", "time_s,rate\n0,1\n600,8\n"),
                                      "--hardware", "l4-24gb", "--prompt-tokens", "200", "--output-tokens", "50",
                                      "--slo", "ttft_p95:2000", "--window", "600", "--steady-requests", "100",
                                      "--recheck", "1", "--no-verify", "--router", "round-robin", "--json")
        self.assertEqual(code, 0, err)
        self.assertIn("--router round-robin", __import__("json").loads(out)["deployment"])

    def test_a_window_never_met_that_the_period_meets_says_why_both_hold(self):
        # helper-57: "0 of 1 windows miss the slo", then "1 window needs more than --max-replicas 16"
        code, out, err = call_cli("plan", "--trace", os.path.join(FIXTURES, "burst.jsonl"), "--slo", "ttft_p95:2000",
                                  "--window", "30", "--hardware", "l4-24gb")
        self.assertEqual(code, 1, err)
        self.assertIn("the whole-period simulation met the slo in 1 of them: it plays their load once, where a "
                      "window's probe asks for it sustained", out)
        self.assertIn("0 of 1 window misses the slo", out)
        # helper-64: the progress line said "needs 17 replicas" where the table says >16
        self.assertIn("needs more than --max-replicas 16", err)

    def test_a_plan_of_conversations_counts_them_in_conversations(self):
        # helper-57: plan --turns 3 said "2.81 req/s" where search says 2.81 conversations/s
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "day.csv", "time_s,rate\n0,0.3\n600,1.0\n")
            code, out, err = call_cli("plan", "--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens",
                                      "200", "--output-tokens", "50", "--slo", "ttft_p95:2000", "--window", "600",
                                      "--turns", "3", "--steady-requests", "100", "--recheck", "1", "--no-verify")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"one replica sustains up to [0-9.]+ conversations/s within the slo")
        self.assertIn("load conv/s", out)
        self.assertNotIn("req/s", out)

    def test_a_window_needing_more_than_the_most_says_so_in_the_csv_and_replays(self):
        # helper-57: the CSV wrote max + 1 (5 for --max-replicas 4) where the text says >4
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "d60.csv", "time_s,rate\n0,5\n600,60\n")
            flags = ("--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens", "200", "--output-tokens",
                     "50", "--slo", "ttft_p95:2000", "--window", "600", "--steady-requests", "100", "--recheck", "1",
                     "--max-replicas", "3", "--no-verify")
            code, csv_text, err = call_cli("plan", *flags, "--csv")
            self.assertEqual(code, 1, err)
            rows = list(__import__("csv").DictReader(csv_text.splitlines()))
            self.assertEqual([r["needs"] for r in rows], ["1", ">3"])
            code, _, err = call_cli("simulate", "--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens",
                                    "200", "--output-tokens", "50", "--replica-schedule", write(tmp, "p.csv", csv_text))
            self.assertEqual(code, 0, err)

    def test_an_interrupted_plan_prints_the_windows_it_planned_and_claims_no_saving(self):
        # helper-48: Ctrl-C or SIGTERM during plan printed nothing, even with every window planned.
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "day.csv", "time_s,rate\n0,1\n600,8\n1200,2\n")
            flags = ("plan", "--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens", "500",
                     "--output-tokens", "100", "--slo", "ttft_p95:1000", "--window", "600", "--steady-requests", "100")
            # (the whole period's run has no --requests; a window's probe of n replicas runs them as a schedule too)
            whole = lambda spec: spec.replica_schedule is not None and spec.requests is None
            for when, planned, rows in ((whole, "all 3 windows", 3),
                                        (lambda spec: not whole(spec) and spec.replica_schedule is not None
                                         and spec.replica_schedule.most > 1, "1 of 3 windows", 1)):
                with self.subTest(planned=planned), mock.patch.object(main, "run", stopping_run(when)):
                    code, out, err = call_cli(*flags)
                    self.assertEqual(code, 130, err)
                    self.assertEqual(len([line for line in out.splitlines() if line.startswith("00:")]), rows, out)
                    self.assertIn("no saving is claimed: the plan was interrupted", out)
                    self.assertIn(f"interrupted after planning {planned}, before the whole period was simulated", err)
                    code, out, err = call_cli(*flags, "--json")
                    self.assertEqual(code, 130, err)
                    report = __import__("json").loads(out)
                    self.assertEqual(len(report["windows"]), rows)
                    self.assertIsNone(report["verified"])
                    self.assertIn(planned, report["interrupted"])
            # Stopped before any window was planned (finding what one replica sustains): nothing to print.
            with mock.patch.object(main, "run", stopping_run(lambda spec: True)):
                code, out, err = call_cli(*flags)
            self.assertEqual((code, out, err.strip()), (130, "", "servesim: interrupted"))

    def test_a_miss_is_blamed_on_a_start_up_only_if_the_window_meets_the_slo_once_its_replicas_serve(self):
        # helper-48: a window that missed for another reason was excused as "while added replicas
        # start", and the plan claimed its saving with exit 0.
        def request(i, sent, ttft):
            r = main.Request(i, 100, 10, sent_s=sent)
            r.queue_s, r.first_token_s, r.last_token_s = 0.0, sent + ttft, sent + ttft + 0.5
            return r
        done = [request(i, float(i), 50.0 if i < 10 else 0.1) for i in range(100)]          # slow until 10 s in
        done += [request(100 + i, 100.0 + i, 50.0) for i in range(100)]                     # slow all along

        def run(spec, progress=None, requests_out=None):
            requests_out.extend(done)
            return {"completed": len(done), "failed": 0, "p95_ttft_ms": 1.0, "median_tpot_ms": 1.0,
                    "output_throughput": 1.0}
        rows = [{"start_s": 0.0, "end_s": 100.0, "short_s": 10.0}, {"start_s": 100.0, "end_s": 200.0, "short_s": 10.0}]
        probing = main.Probing(main.parse_slo("ttft_p95:1000"))
        with mock.patch.object(main, "run", run):
            verified = main.simulated_windows(main.RunSpec(), rows, main.ReplicaSchedule("plan", ((0.0, 1),)), 10.0,
                                              probing, None)
        self.assertEqual(verified["windows_missing_the_slo"], [0.0, 100.0])
        self.assertEqual(verified["of_them_scaling_up"], [0.0])
        report = {"never_met": [], "verified": verified, "max_replicas": 16,
                  "windows": [dict(r, asked=2) for r in rows]}
        self.assertIn("1 window misses the slo with the replicas serving, from 00:01", main.plan_misses(report))

    def test_a_scale_down_waits_into_the_next_window_and_is_paid_there(self):
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "day.csv", "time_s,rate\n0,1\n600,8\n1200,2\n")
            flags = ("plan", "--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens", "500",
                     "--output-tokens", "100", "--slo", "ttft_p95:1000", "--window", "600", "--steady-requests", "100",
                     "--scale-up-delay", "30", "--no-verify")
            code, out, err = call_cli(*flags, "--json")
            self.assertEqual(code, 0, err)
            report = __import__("json").loads(out)
            rows = report["windows"]
            self.assertLess(rows[2]["needs"], rows[1]["needs"])
            # The need falls at 1200; the default 300 s wait lets the replicas go at 1500, not 1200.
            self.assertEqual(report["schedule"][-1], {"time_s": 1500.0, "replicas": rows[2]["needs"]})
            self.assertEqual(rows[2]["asked"], rows[1]["needs"])
            per_gpu = main.HARDWARE["l4-24gb"].price_per_hour
            self.assertAlmostEqual(rows[2]["usd"], (rows[1]["needs"] * 300 + rows[2]["needs"] * 300) * per_gpu / 3600)
            self.assertAlmostEqual(report["totals"]["usd"], sum(r["usd"] for r in rows))
            code, csv_text, err = call_cli(*flags, "--csv")
            self.assertEqual(code, 0, err)
            self.assertIn(f"\n1500.0,{rows[2]['needs']},,", csv_text)

    def test_a_start_up_longer_than_a_window_is_counted_where_it_falls_and_nothing_is_added_unsimulated(self):
        # helper-50: with a 100 s start-up and 60 s windows the shortfall was cut to 60 s and its misses
        # counted as "with the replicas serving"; the last repair added a replica no schedule asked for.
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "p.csv", "time_s,rate\n0,0.5\n60,1.5\n120,0.4\n180,0.4\n240,1.2\n300,0.3\n")
            flags = ("plan", "--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens", "1500",
                     "--output-tokens", "300", "--slo", "ttft_p95:2000", "--window", "60", "--steady-requests",
                     "100", "--recheck", "1", "--scale-up-delay", "100")
            code, out, err = call_cli(*flags, "--json")
            self.assertIn(code, (0, 1), err)
            report = __import__("json").loads(out)
            rows = {r["start_s"]: r for r in report["windows"]}
            self.assertEqual((rows[60.0]["short_s"], rows[60.0]["serves_after_s"]), (60.0, 100.0))
            self.assertEqual(rows[120.0]["short_s"], 40.0)            # the replicas asked at 60 serve at 160
            self.assertIn(60.0, report["verified"]["of_them_scaling_up"])
            for r in rows.values():           # every need is asked for, so it was simulated
                self.assertLessEqual(r["needs"], r["asked"])
            code, out, err = call_cli(*flags)
            self.assertIn("the added replicas serve after 100 s, after the window", out)
            self.assertRegex(out, r"miss the slo \(00:01, [^)]*\), \d+ of them while added replicas start")
            # Let go 30 s after the need falls, before their 100 s start-up ends: they never serve.
            code, out, err = call_cli(*flags, "--scale-down-after", "30", "--json")
            rise = next(r for r in __import__("json").loads(out)["windows"] if r["start_s"] == 60.0)
            self.assertEqual((rise["short_s"], rise["serves_after_s"]), (60.0, None))
            # Asked for 200 s ahead: the windows before the rise need nothing more and are not short.
            quiet = write(tmp, "q.csv", "time_s,rate\n0,0.3\n60,0.3\n120,0.3\n180,0.3\n240,1.5\n300,0.3\n")
            code, out, err = call_cli(*(quiet if f == profile else f for f in flags[:-1]), "200", "--ahead",
                                      "--no-verify", "--json")
            rows = __import__("json").loads(out)["windows"]
            self.assertGreater(rows[0]["asked"], rows[0]["needs"])      # asked for the rise at 40 s
            self.assertEqual([r["short_s"] for r in rows], [0.0] * len(rows))

    def test_a_profile_stretched_by_time_scale_is_planned_at_its_stretched_load(self):
        # helper-50: --time-scale with --rate-profile was refused ("without either use --rate")
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "p.csv", "time_s,rate\n0,1\n60,3\n")
            code, out, err = call_cli("plan", "--rate-profile", profile, "--time-scale", "2", "--window", "60",
                                      "--slo", "ttft_p95:2000", "--steady-requests", "100", "--recheck", "1",
                                      "--no-verify", "--json")
        self.assertEqual(code, 0, err)
        self.assertEqual([r["load"] for r in __import__("json").loads(out)["windows"]], [0.5, 0.5, 1.5, 1.5])

    def test_plan_needs_changing_load_and_a_sane_range(self):
        code, _, err = call_cli("plan", "--slo", "ttft_p95:1000", "--rate", "1")
        self.assertEqual(code, 2)
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "day.csv", "time_s,rate\n0,1\n600,2\n")
            for flags, said in ((("--min-replicas", "4", "--max-replicas", "2"), "above --max-replicas"),
                                (("--window", "1"), "--window"), (("-dp", "2"), "-dp")):
                with self.subTest(flags=flags):
                    code, _, err = call_cli("plan", "--slo", "ttft_p95:1000", "--rate-profile", profile, *flags)
                    self.assertEqual(code, 2, err)
                    self.assertIn(said, err)
            # helper-48: a profile too big to simulate was told to "cap them with --requests", which plan has not
            big = write(tmp, "big.csv", "time_s,rate\n0,100\n86400,100\n")
            code, _, err = call_cli("plan", "--slo", "ttft_p95:1000", "--rate-profile", big)
            self.assertEqual(code, 2, err)
            self.assertIn("plan a part of it", err)
            self.assertNotIn("--requests", err)


if __name__ == "__main__":
    unittest.main()


class NoReplicaCountHelps(unittest.TestCase):
    def test_a_bound_missed_by_a_lone_request_is_said_at_once(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "day.csv")
            with open(path, "w") as f:
                f.write("time_s,rate\n0,0.5\n3600,1\n")
            code, out, err = call_cli("plan", "--rate-profile", path, "--hardware", "h100-sxm-80gb", "--prompt-tokens",
                                      "100", "--output-tokens", "10", "--reasoning-tokens", "5", "--slo", "ttfa_p95:5",
                                      "--steady-requests", "200")
        self.assertEqual(code, 1)
        self.assertIn("more replicas cannot help", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_a_window_probe_run_alone_ends_the_plan_with_a_line_not_a_traceback(self):
        # helper-48: a window's probe at its load (not a search) ran every request alone and missed;
        # Alone escaped replicas_needed as a traceback.
        spec = main.RunSpec(hardware=main.HARDWARE["h100-sxm-80gb"], prompt_tokens=main.TokenRange(100, 100),
                            output_tokens=main.TokenRange(10, 10), reasoning_tokens=main.TokenRange(5, 5))
        probing = main.Probing(main.parse_slo("ttfa_p95:5"), steady_requests=200, recheck=1)
        found = main.search_point(spec, {}, probing=main.replace(probing, target=0.01))    # no Alone raised
        self.assertIsNone(found["best"])
        self.assertTrue(found["probes"][-1]["alone"])
        with self.assertRaises(main.CapacityError) as caught:
            main.replicas_needed(spec, 0.01, probing, main.Scaling(), {}, 1)
        self.assertIn("more replicas cannot help", str(caught.exception))
        self.assertIn("faster deployment or shorter requests", str(caught.exception))
        # A served shortfall of a short window, with nothing shared or queued, is named as counting noise.
        probe = {"alone": True, "misses": ["overloaded: served 89.7% < 90.0% of offered"],
                 "steady_state": {"overloaded_on": ["served"]}}
        with mock.patch.object(main, "search_point", lambda *a, **k: {"probes": [probe], "best": None}):
            with self.assertRaises(main.CapacityError) as caught:
                main.replicas_needed(spec, 4.4, probing, main.Scaling(), {}, 9)
        self.assertIn("raise --steady-requests (now 200)", str(caught.exception))


class WindowProbes(unittest.TestCase):
    def test_a_windows_replicas_are_probed_as_the_separate_servers_the_plan_runs(self):
        # helper-66: a window's n replicas were probed as one server of n data-parallel ranks, which
        # for a mixture of experts step in lockstep and shard the experts (a quarter of the weights on
        # each of 4), while the period's schedule ran them as separate servers with the whole model.
        spec = main.RunSpec(model=main.MODELS["qwen3-30b-a3b"])
        asked = []

        def probe(spec_, settings, probing=None):
            asked.append(main.sweep_point(spec_, settings))
            return {"probes": [{"misses": [], "load": 1.0}], "best": {"load": 1.0}, "highest_load": 1.0}
        with mock.patch.object(main, "search_point", probe):
            main.replicas_needed(spec, 3.0, main.Probing(main.parse_slo("ttft_p95:1000")), main.Scaling(), {}, 4)
        self.assertEqual([s.replica_schedule.most for s in asked], [4])
        self.assertEqual(main.expert_ranks(main.replace(asked[0], data_parallel_size=4)), 1)
        self.assertEqual(main.expert_ranks(main.replace(spec, data_parallel_size=4)), 4)    # (as one server: lockstep)


class Needs(unittest.TestCase):
    def test_a_windows_need_is_the_loads_whatever_min_and_max_replicas_ask(self):
        # helper-64: with --max-replicas 2, windows whose load needs 3 were probed at 2, passed a short
        # probe and read "needs 2"; with --min-replicas 3, every window read "needs 3"
        spec, probing = main.RunSpec(), main.Probing(main.parse_slo("ttft_p95:1000"))
        tried = []

        def probe(spec_, settings, probing=None):
            tried.append(settings["replica_schedule"].most)
            return {"probes": [{"misses": [], "load": 1.0}], "best": {"load": 1.0}}
        with mock.patch.object(main, "search_point", probe):
            self.assertEqual(main.replicas_needed(spec, 2.5, probing, main.Scaling(max_replicas=2), {}, 3)[0], 3)
            self.assertEqual(tried, [])            # past the most allowed: not probed at the cap
            self.assertEqual(main.replicas_needed(spec, 1.5, probing, main.Scaling(min_replicas=3), {}, 2)[0], 2)
            self.assertEqual(tried, [2])

    def test_an_interrupted_plan_is_titled_with_the_whole_period_and_keys_stay(self):
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(tmp, "day.csv", "time_s,rate\n0,1\n600,8\n1200,2\n")
            flags = ("plan", "--rate-profile", profile, "--hardware", "l4-24gb", "--prompt-tokens", "500",
                     "--output-tokens", "100", "--slo", "ttft_p95:1000", "--window", "600", "--steady-requests", "100")
            with mock.patch.object(main, "run", stopping_run(lambda spec: spec.replica_schedule is not None
                                                             and spec.requests is not None and spec.replica_schedule.most > 1)):
                code, out, err = call_cli(*flags)
            self.assertEqual(code, 130, err)
            self.assertIn("in 3 windows of 10 min", out.splitlines()[0])     # (it said "in 1 window")
            code, out, err = call_cli(*flags, "--no-verify", "--json")
            self.assertEqual(code, 0, err)
            report = __import__("json").loads(out)
            self.assertEqual((report["verified"], report["interrupted"]), (None, None))   # there, as null
            self.assertTrue(all("simulated" in w for w in report["windows"]))
            zeros = write(tmp, "zeros.csv", "time_s,rate\n0,0\n3600,0\n")
            for more in ((), ("--no-verify",)):      # one verdict, verified or not
                code, _, err = call_cli("plan", "--rate-profile", zeros, "--slo", "ttft_p95:1000", *more)
                self.assertEqual(code, 2, err)
                self.assertIn("sends no requests", err)


class SaidFirst(unittest.TestCase):
    def test_a_trace_sent_at_once_and_flags_plan_lacks(self):
        # helper-64: a trace sent all at once was told to raise --steady-requests, and after that, that it
        # has no rate; plan's ramp message named --rate and --concurrency, which plan does not take
        with tempfile.TemporaryDirectory() as tmp:
            at_once = write(tmp, "t.jsonl", '{"arrival": 5, "prompt_tokens": 100, "output_tokens": 20}\n' * 50)
            code, _, err = call_cli("plan", "--trace", at_once, "--slo", "ttft_p95:2000", "--steady-requests", "100")
            self.assertEqual(code, 2)
            self.assertIn("its requests all arrive at once, so it has no rate to scale", err)
            profile = write(tmp, "day.csv", "time_s,rate\n0,1\n60,2\n")
            # helper-67: a plan of a disaggregated pair failed naming --replica-schedule, which was not given
            code, _, err = call_cli("plan", "--rate-profile", profile, "--slo", "ttft_p95:2000", "--disaggregate")
            self.assertEqual(code, 2)
            self.assertIn("plan adds and removes replicas, and --disaggregate runs one prefill and one decode", err)
            code, _, err = call_cli("plan", "--rate-profile", profile, "--slo", "ttft_p95:2000", "--ramp-up-strategy",
                                    "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2")
            self.assertEqual(code, 2)
            self.assertIn("--rate-profile sets the arrivals: drop the ramp", err)
            self.assertNotIn("--concurrency", err)
        text = main_help("plan")
        self.assertNotIn("a search's --rate target", text)
        for flag in ("--disaggregate", "--kv-link-gbs", "--ramp-up-strategy"):     # (helper-74: taken, refused, not offered)
            self.assertNotIn(flag, text)
        self.assertIn("more than 10, at most 86,400", text)


def main_help(command):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main.main([command, "--help"])
    return " ".join(out.getvalue().split())
