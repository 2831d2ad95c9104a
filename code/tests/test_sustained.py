"""A capacity is a sustained capacity: the steady window of a run, its offered and served rates,
the growth of its wait, and the verdict; search's highest load is the highest sustained one."""
import unittest

from helpers import call_cli, main

H100 = main.HARDWARE["h100-sxm-80gb"]


def measured(i, sent, queue, service=1.0):
    """A finished request sent at `sent` that waited `queue` seconds, then took `service`."""
    r = main.Request(i, 100, 10, sent_s=sent)
    r.queue_s = queue
    r.first_token_s = sent + queue + 0.1
    r.last_token_s = sent + queue + service
    return r


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
        self.assertAlmostEqual(w["served_rate"], 1.0, places=6)
        self.assertAlmostEqual(w["wait_growth_s_per_s"], 1.0, places=6)    # one second more wait per second
        self.assertAlmostEqual(w["queue_growth_rps"], 1.0, places=6)      # offered 2, served 1
        self.assertFalse(w["sustained"])

    def test_the_thresholds_decide(self):
        requests = [measured(i, i * 0.5, i * 0.5 * 0.04) for i in range(400)]     # wait grows 0.04 s per s
        self.assertTrue(main.steady_window(requests, 0.2, 0.95, 0.05, False)["sustained"])
        self.assertFalse(main.steady_window(requests, 0.2, 0.95, 0.03, False)["sustained"])

    def test_a_closed_loop_is_sustained_by_construction(self):
        requests = [measured(i, i * 0.5, i * 0.5, 1.0) for i in range(200)]
        self.assertTrue(self.window(requests, closed_loop=True)["sustained"])

    def test_too_short_a_run_says_so(self):
        w = self.window([measured(i, i * 0.5, 0.1) for i in range(8)])
        self.assertIsNone(w["sustained"])
        self.assertIn("too short", w["note"])


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

    def test_an_overloaded_run_prints_one_clear_line(self):
        code, out, _ = call_cli("simulate", "--rate", "80", "--requests", "2000")
        self.assertEqual(code, 0)
        line = next(line for line in out.splitlines() if line.startswith("overloaded"))
        self.assertRegex(line, r"offered [78]\d\.\d\d req/s, served \d\d\.\d\d req/s, queue grows \d\d\.\d\d req/s")

    def test_thresholds_outside_their_range_are_refused(self):
        for flag, value in (("--min-served", "0"), ("--min-served", "1.5"), ("--max-queue-growth", "-0.1"),
                            ("--steady-skip", "0.95")):
            with self.subTest(flag=flag, value=value):
                code, _, err = call_cli("simulate", flag, value, "--requests", "10")
                self.assertEqual(code, 2)
                self.assertIn(flag, err)


if __name__ == "__main__":
    unittest.main()
