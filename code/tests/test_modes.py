"""The lesson's exercises and the reference engine's batching modes, each on a case that can be
worked out on paper."""
import json
import unittest

from helpers import FIXTURES, call_cli, main, run_cli

H100, LLAMA = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]


def engine(blocks=1000, block_size=16, hardware=H100, **config):
    """An engine stepping the per-step rule, with the variation the config names."""
    spec = main.RunSpec(hardware=hardware, num_gpu_blocks=blocks, block_size=block_size, simulator="step", **config)
    return main.build_engines(spec)[0][0]


def req(id, prompt, output, **kw):
    return main.Request(id, prompt, output, **kw)


class MaxTokensInFlight(unittest.TestCase):
    """The Easy exercise."""

    def run_four(self, cap):
        e = engine(max_tokens_in_flight=cap)
        requests = [req(i, 890, 10) for i in range(4)]        # 900 tokens each
        for r in requests:
            e.scheduler.add(r)
        most = 0
        while e.has_work():
            e.step()
            most = max(most, len(e.scheduler.running))
        return most, requests

    def test_a_2000_token_cap_runs_two_of_four_900_token_requests_at_once(self):
        most, requests = self.run_four(2000)
        self.assertEqual(most, 2)
        self.assertEqual(sum(1 for r in requests if r.queue_s > 0), 2)

    def test_without_the_cap_all_four_run(self):
        most, requests = self.run_four(None)
        self.assertEqual(most, 4)
        self.assertTrue(all(r.queue_s == 0 for r in requests))

    def test_on_the_burst_trace_the_cap_removes_preemptions_at_the_price_of_ttft(self):
        code, out, _ = run_cli("sweep", "--hardware", "l4-24gb", "--trace", f"{FIXTURES}/burst.jsonl",
                               "--max-tokens-in-flight", "0,24000", "--json")
        uncapped, capped = json.loads(out)
        self.assertGreater(uncapped["engine"]["preemptions"], 0)
        self.assertEqual(capped["engine"]["preemptions"], 0)
        self.assertGreater(capped["median_ttft_ms"], uncapped["median_ttft_ms"])

    def test_a_request_over_the_cap_fails(self):
        e = engine(max_tokens_in_flight=500)
        r = req(0, 890, 10)
        e.scheduler.add(r)
        self.assertIn("--max-tokens-in-flight", r.error)


class Disaggregation(unittest.TestCase):
    """The Hard exercise."""

    def simulate(self, requests, **spec):
        engines, link = main.build_engines(main.RunSpec(max_model_len=16384, detailed=True, **spec))
        main.simulate(main.Replicas(engines), requests)
        return engines, link

    def test_hardware_named_for_neither_engine_is_refused_and_left_out_of_a_grid(self):
        # helper-57: --hardware was silently unused beside --prefill-hardware and --decode-hardware
        both = ("--prefill-hardware", "h100-sxm-80gb", "--decode-hardware", "a100-sxm-80gb", "--requests", "5")
        code, out, err = call_cli("simulate", "--hardware", "l4-24gb", *both)
        self.assertEqual((code, out), (2, ""), err)
        self.assertIn("--hardware changes nothing: --prefill-hardware and --decode-hardware name both", err)
        code, out, err = call_cli("sweep", "--hardware", "l4-24gb,h100-sxm-80gb", *both, "--json")
        self.assertEqual(code, 0, err)
        self.assertIn("1 point left out: --hardware changes nothing there", err)
        self.assertEqual(len(json.loads(out)), 1)

    def test_the_timeline_holds_the_prefill_engines_queue(self):
        # helper-57: a queue of 191 prompts at the prefill engine drew as 0 waiting (its timeline
        # was the decode engine's alone)
        spec = main.RunSpec(prompt_tokens=main.TokenRange(2000, 2000), output_tokens=main.TokenRange(300, 300), rate=5,
                            requests=300, disaggregate=True, prefill_hardware=main.HARDWARE["l4-24gb"],
                            max_model_len=4096)
        result = main.run(spec, timeline=True)
        rows = result["timeline"]
        self.assertEqual(max(r["waiting"] for r in rows), result["prefill_engine"]["peak_waiting"])
        self.assertEqual(sum(r["gen_throughput"] for r in rows), result["total_output_tokens"])     # none twice

    def test_a_2000_token_prompt_waits_about_10_ms_on_a_25_gbs_link(self):
        alone, together = req(0, 2000, 5), req(0, 2000, 5)
        self.simulate([alone])
        _, link = self.simulate([together], disaggregate=True, kv_link_gbs=25)
        wait_ms = (together.first_token_s - alone.first_token_s) * 1000
        self.assertAlmostEqual(wait_ms, 2000 * 131072 / 25e9 * 1000, delta=0.01)
        self.assertAlmostEqual(wait_ms, 10.5, delta=0.1)
        self.assertEqual(link.transfers, 1)

    def test_transfers_queue_on_the_link(self):
        a, b = req(0, 2000, 5), req(1, 2000, 5)
        _, link = self.simulate([a, b], disaggregate=True, kv_link_gbs=25)
        self.assertAlmostEqual(b.first_token_s - a.first_token_s, 2000 * 131072 / 25e9, delta=1e-6)
        self.assertGreater(link.wait_s, 2 * 2000 * 131072 / 25e9)

    def test_decode_side_itl_no_longer_spikes_when_a_long_prompt_arrives(self):
        def chats():
            return [req(i, 100, 200) for i in range(8)] + [req(8, 8000, 10, sent_s=0.5)]
        colocated, split = chats(), chats()
        self.simulate(colocated)
        self.simulate(split, disaggregate=True)
        worst = lambda rs: max(max(b - a for a, b in zip(r.token_times[1:], r.token_times[2:])) for r in rs[:8])
        decode_step = main.step_seconds(H100, LLAMA, 9, 9 * 300, 9)
        self.assertGreater(worst(colocated), 10 * decode_step)     # a 8,000-token prefill landed in a step
        self.assertLess(worst(split), 2 * decode_step)

    def test_the_sweep_finds_the_bandwidth_below_which_colocation_wins(self):
        code, out, err = run_cli("sweep", "--trace", f"{FIXTURES}/mixed.jsonl", "--max-model-len", "16384",
                                 "--kv-link-gbs", "1,5,25,100")
        self.assertEqual(code, 0, err)
        rows = {line.split()[0]: line.split() for line in out.splitlines()[2:7]}
        p95 = {name: float(cells[3].replace(",", "")) for name, cells in rows.items()}
        self.assertLess(p95["colocated"], p95["1"])
        self.assertLess(p95["colocated"], p95["5"])
        self.assertGreater(p95["colocated"], p95["100"])
        self.assertIn("the colocated engine wins on ttft p95 below 100 GB/s", out)

    def test_flags_that_cannot_combine_with_disaggregation_exit_2(self):
        code, _, err = run_cli("simulate", "--disaggregate", "--batching", "static")
        self.assertEqual(code, 2)
        self.assertIn("disaggregation", err)


class StaticBatching(unittest.TestCase):
    def test_outputs_of_10_and_100_in_one_batch_of_2_cost_198_rows_for_108_useful(self):
        e = engine(batching="static", max_num_seqs=2)
        e.scheduler.add(req(0, 50, 10))
        e.scheduler.add(req(1, 50, 100))
        while e.has_work():
            e.step()
        self.assertEqual(e.stats.steps, 100)                      # one prefill, 99 decode steps
        self.assertEqual((e.stats.decode_rows, e.stats.useful_rows), (198, 108))
        self.assertAlmostEqual(e.report(1)["row_utilisation"], 108 / 198)

    def test_the_prefill_is_left_padded_to_the_longest_prompt(self):
        e = engine(batching="static", max_num_seqs=2)
        e.scheduler.add(req(0, 10, 5))
        e.scheduler.add(req(1, 100, 5))
        e.step()
        self.assertAlmostEqual(e.clock, main.step_seconds(H100, LLAMA, 200, 200, 2))

    def test_the_next_batch_waits_for_the_slowest_row(self):
        e = engine(batching="static", max_num_seqs=2)
        quick, slow, next_one = req(0, 50, 2), req(1, 50, 40), req(2, 50, 2)
        main.simulate(e, [quick, slow, next_one])
        self.assertEqual(next_one.queue_s, slow.last_token_s)
        self.assertLess(quick.last_token_s, next_one.queue_s)

    def test_a_prompt_longer_than_the_token_budget_runs_because_the_batch_is_prefilled_whole(self):
        e = engine(batching="static", max_num_seqs=2, max_num_batched_tokens=2048, chunked_prefill=False)
        long = req(0, 3000, 5)
        main.simulate(e, [long])
        self.assertIsNone(long.error)
        self.assertEqual(long.generated, 5)
        paged = engine(max_num_batched_tokens=2048, chunked_prefill=False)
        refused = req(0, 3000, 5)
        main.simulate(paged, [refused])
        self.assertIn("longer than --max-num-batched-tokens without chunked prefill", refused.error)

    def test_kv_reserved_is_every_row_padded_to_prompt_plus_longest_output(self):
        e = engine(batching="static", max_num_seqs=2)
        main.simulate(e, [req(0, 10, 5), req(1, 100, 50)])
        self.assertEqual(e.stats.kv_reserved_peak, 2 * (100 + 50))


class SlotLayout(unittest.TestCase):
    """llama.cpp with --parallel 4 --ctx-size 4096: four fixed 1,024-token contexts."""

    def slots(self, kv_layout="slots"):
        spec = main.RunSpec(hardware=main.HARDWARE["cpu-4vcpu"], model=main.MODELS["smollm2-135m-q8_0"],
                            kv_tokens=4096, max_num_seqs=4, kv_layout=kv_layout, simulator="step")
        return main.build_engines(spec)[0][0]

    def test_a_request_longer_than_one_slot_fails_even_with_idle_slots(self):
        e = self.slots()
        too_long, fits = req(0, 1000, 100), req(1, 900, 100)
        e.scheduler.add(too_long)
        e.scheduler.add(fits)
        self.assertIn("the request exceeds the available context size", too_long.error)
        self.assertIsNone(fits.error)
        self.assertEqual(e.scheduler.done, [too_long])

    def test_a_fifth_request_waits_for_a_free_slot_and_nobody_is_preempted(self):
        e = self.slots()
        requests = [req(i, 900, 100) for i in range(5)]
        main.simulate(e, requests)
        self.assertEqual(e.scheduler.preemptions, 0)
        self.assertEqual(requests[4].queue_s, min(r.last_token_s for r in requests[:4]))
        self.assertEqual(e.stats.kv_reserved_peak, 4096)           # the whole cache, set aside up front

    def test_the_refusal_blames_the_engine_only_where_its_default_turned_caching_on(self):
        for extra, blamed in (((), True), (("--prefix-caching", "on"), False)):
            for layout in (("--kv-layout", "slots"), ("--batching", "static")):
                with self.subTest(extra=extra, layout=layout):
                    code, out, err = call_cli("simulate", "--engine", "sglang", *layout, *extra, "--requests", "4")
                    self.assertEqual(code, 2, err)
                    self.assertIn("add --prefix-caching off", err)
                    self.assertEqual("--engine sglang turns prefix caching on" in err, blamed, err)

    def test_the_paged_cache_of_the_same_size_runs_what_slots_reject(self):
        e = self.slots(kv_layout="paged")
        r = req(0, 1000, 100)
        main.simulate(e, [r])
        self.assertIsNone(r.error)


class CompareTable(unittest.TestCase):
    def test_one_table_for_static_slots_and_paged(self):
        code, out, err = run_cli("sweep", "--compare", "static,slots,paged", "--hardware", "cpu-4vcpu",
                                 "--model", "smollm2-135m-q8_0", "--kv-tokens", "4096", "--max-num-seqs", "4",
                                 "--prompt-tokens", "300-1000", "--output-tokens", "10-200", "--requests", "16",
                                 "--concurrency", "8")
        lines = out.strip().splitlines()
        self.assertEqual(lines[1].split(), ["compare", "out", "tok/s", "ttft", "p50", "ttft", "p95", "tpot", "p50",
                                            "row", "util", "wasted", "rows", "kv", "reserved", "kv", "used", "failed"])
        rows = {line.split()[0]: line.split() for line in lines[2:]}
        self.assertEqual(set(rows), {"static", "slots", "paged"})
        self.assertEqual(rows["paged"][5], "100.0%")
        self.assertNotEqual(rows["static"][5], "100.0%")
        self.assertGreater(int(rows["slots"][-1]), 0)          # some requests exceed a 1,024-token slot
        self.assertEqual(rows["paged"][-1], "0")
        self.assertEqual(code, 1)                              # failed requests make the exit code 1


if __name__ == "__main__":
    unittest.main()
