import math
import unittest
from collections import Counter
from types import SimpleNamespace

from helpers import FIXTURES, main


def record(sent, times, output=None, prompt=10, queue=None, error=None):
    return SimpleNamespace(sent_s=sent, first_token_s=times[0] if times else None,
                           last_token_s=times[-1] if times else None, token_times=times,
                           output_tokens=len(times) if output is None else output,
                           prompt_tokens=prompt, queue_s=queue, error=error)


class Percentiles(unittest.TestCase):
    def test_nearest_rank(self):
        d = main.distribution(Counter(range(1, 101)))
        self.assertEqual((d["p50"], d["p90"], d["p95"], d["p99"]), (50, 90, 95, 99))
        d = main.distribution(Counter([1, 2, 3, 4]))
        self.assertEqual((d["p50"], d["p90"], d["p99"]), (2, 4, 4))   # ceil(0.5*4)=2nd, ceil(0.9*4)=4th

    def test_counts_weigh_like_repeated_values(self):
        self.assertEqual(main.distribution(Counter({1.0: 3, 10.0: 1})),
                         main.distribution(Counter([1.0, 1.0, 1.0, 10.0])))
        d = main.distribution(Counter({1.0: 3, 10.0: 1}))
        self.assertAlmostEqual(d["mean"], 3.25)
        self.assertAlmostEqual(d["std"], (3 * 2.25 ** 2 + 6.75 ** 2) ** 0.5 / 2)

    def test_empty_is_none_not_zero(self):
        self.assertIsNone(main.distribution(Counter())["p50"])


class Definitions(unittest.TestCase):
    def test_ttft_tpot_itl_e2e(self):
        r = record(0.0, [0.5, 0.6, 0.8, 0.9])
        s = main.summarize([r])
        self.assertAlmostEqual(s["mean_ttft_ms"], 500)
        self.assertAlmostEqual(s["mean_tpot_ms"], 400 / 3)        # the first token is excluded
        self.assertAlmostEqual(s["median_itl_ms"], 100)
        self.assertAlmostEqual(s["p99_itl_ms"], 200)
        self.assertAlmostEqual(s["mean_e2el_ms"], 900)

    def test_tpot_divides_by_the_token_count_not_the_events(self):
        # Two events carrying 5 tokens: a server may put several tokens in one chunk.
        s = main.summarize([record(0.0, [0.1, 0.5], output=5)])
        self.assertAlmostEqual(s["mean_tpot_ms"], 100)

    def test_throughput_runs_from_first_send_to_last_token(self):
        s = main.summarize([record(1.0, [1.5, 2.0]), record(2.0, [2.5, 3.0], prompt=20)])
        self.assertAlmostEqual(s["duration"], 2.0)
        self.assertAlmostEqual(s["output_throughput"], 2.0)
        self.assertAlmostEqual(s["total_token_throughput"], 17.0)
        self.assertAlmostEqual(s["request_throughput"], 1.0)

    def test_failed_requests_are_counted_by_kind_and_kept_out_of_the_averages(self):
        s = main.summarize([record(0.0, [1.0, 2.0]), record(0.0, [], error="http 400: too long"),
                            record(0.0, [], error="http 400: other")])
        self.assertEqual((s["completed"], s["failed"]), (1, 2))
        self.assertEqual(s["errors_by_kind"], {"http 400": 2})
        self.assertAlmostEqual(s["mean_ttft_ms"], 1000)

    def test_itl_counts_from_the_engine_give_the_same_answer_as_token_times(self):
        records = [record(0.0, [0.5, 0.6, 0.8]), record(0.0, [0.2, 0.3])]
        from_times = main.summarize(records)
        counted = main.summarize(records, Counter({0.1: 2, 0.2: 1}))
        for key in ("mean_itl_ms", "median_itl_ms", "p99_itl_ms"):
            self.assertAlmostEqual(from_times[key], counted[key])


class EngineItl(unittest.TestCase):
    def test_simulated_itl_counts_match_the_detailed_token_times(self):
        result = main.run(main.RunSpec(hardware=main.HARDWARE["l4-24gb"], detailed=True,
                                       trace=main.read_trace(f"{FIXTURES}/burst.jsonl")))
        gaps = sorted(g for row in result["itls"] for g in row)
        n = len(gaps)
        # The engine counts gaps to the microsecond (main.ITL_DIGITS): 0.0005 ms at most apart.
        self.assertAlmostEqual(result["p99_itl_ms"], gaps[math.ceil(0.99 * n) - 1] * 1000, delta=0.0005)
        self.assertAlmostEqual(result["mean_itl_ms"], sum(gaps) / n * 1000, delta=0.0005)
        self.assertNotAlmostEqual(result["p99_itl_ms"], gaps[math.ceil(0.9 * n) - 1] * 1000, delta=0.0005)



class ServerWindow(unittest.TestCase):
    """helper-38: a cache 300% full, a 500% prefix hit rate and a negative mean batch were printed
    as measured; a counter that went down (a restart) left its figures blank without a word."""

    def test_what_no_server_gives_is_left_out_and_said(self):
        before = {"vllm:num_requests_running": 1, "vllm:kv_cache_usage_perc": 0.5, "vllm:prefix_cache_queries_total": 10,
                  "vllm:prefix_cache_hits_total": 0, "vllm:generation_tokens_total": 100}
        after = {**before, "vllm:kv_cache_usage_perc": 3.0, "vllm:prefix_cache_queries_total": 20,
                 "vllm:prefix_cache_hits_total": 50, "vllm:generation_tokens_total": 50}
        w = main.server_window([before, after])
        self.assertEqual((w["peak_kv_cache_usage"], w["prefix_hit_rate"], w["generated_tokens"]), (None, None, None))
        self.assertEqual(w["impossible"], "left out, as no server gives them: peak_kv_cache_usage 3, prefix_hit_rate 5")
        self.assertIn("vllm:generation_tokens_total went down", w["went_down"])
        self.assertEqual(w["peak_running"], 1)
        llama = [{"llamacpp:n_decode_total": 100, "llamacpp:n_busy_slots_per_decode": 5.0},
                 {"llamacpp:n_decode_total": 120, "llamacpp:n_busy_slots_per_decode": 0.5}]
        w = main.server_window(llama)
        self.assertIsNone(w["mean_batch_per_decode"])      # (0.5 x 120 - 5 x 100) / 20 = -22
        self.assertIn("mean_batch_per_decode -22", w["impossible"])
        # helper-53: a counter stuck at -4 read as 0 tokens, and 1.5 requests as a peak.
        stuck = [{"llamacpp:prompt_tokens_total": -4, "llamacpp:requests_processing": 1.5},
                 {"llamacpp:prompt_tokens_total": -4, "llamacpp:requests_processing": 1.0}]
        w = main.server_window(stuck)
        self.assertEqual((w["prompt_tokens"], w["peak_requests_processing"]), (None, None))
        self.assertEqual(w["impossible"], "left out, as no server gives them: peak_requests_processing 1.5, "
                                          "llamacpp:prompt_tokens_total -4")
        # One series twice is left out, not added (it doubled the tokens); several engines' series add up.
        ignored = Counter()
        page = ('vllm:generation_tokens_total{model_name="a"} 30\nvllm:generation_tokens_total{model_name="a"} 30\n'
                'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n')
        self.assertEqual(main.parse_prometheus(page, ignored),
                         {"vllm:generation_tokens_total": 30.0, "vllm:num_requests_running": 7.0})
        self.assertEqual(ignored, Counter({"vllm:generation_tokens_total given twice": 1}))
        fine = main.server_window([before, {**before, "vllm:generation_tokens_total": 130}])
        self.assertNotIn("impossible", fine)
        self.assertEqual(fine["generated_tokens"], 30)


if __name__ == "__main__":
    unittest.main()
