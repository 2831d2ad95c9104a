"""Production-shaped load: arrivals (burstiness, ramps), content-addressed prefixes, multi-turn
conversations, trace formats, warm-up and steady state, loadgen's replay and merge. Rules are
checked on cases small enough to work out independently of the simulator."""
import json
import math
import os
import random
import statistics
import tempfile
import time
import unittest

from helpers import FIXTURES, call_cli, main
from fake_server import FakeServer, paced

TRACES = os.path.join(FIXTURES, "traces")
MOONCAKE = os.path.join(TRACES, "mooncake_synthetic_300.jsonl")
AZURE = os.path.join(TRACES, "azure_conv_2023_300.csv")


class Arrivals(unittest.TestCase):
    def gaps(self, burstiness, rate=10.0, n=20000):
        times = main.arrival_times(n, random.Random(1), rate, burstiness)
        return [b - a for a, b in zip(times, times[1:])]

    def test_burstiness_keeps_the_mean_rate_and_sets_the_spread(self):
        for burstiness in (0.5, 1.0, 4.0):
            gaps = self.gaps(burstiness)
            mean = statistics.fmean(gaps)
            cv = statistics.pstdev(gaps) / mean
            self.assertAlmostEqual(mean, 0.1, delta=0.003, msg=burstiness)             # 10 requests/s
            self.assertAlmostEqual(cv, 1 / math.sqrt(burstiness), delta=0.04, msg=burstiness)

    def test_poisson_is_unchanged_by_the_gamma_path(self):
        # Burstiness 1 draws exponential gaps, as every earlier run did: same seed, same times.
        rng = random.Random(3)
        expected, clock = [], 0.0
        for _ in range(50):
            expected.append(clock)
            clock += rng.expovariate(4.0)
        self.assertEqual(main.arrival_times(50, random.Random(3), 4.0), expected)

    def test_a_linear_ramp_goes_from_start_to_end_rate_by_request(self):
        times = main.arrival_times(4001, random.Random(2), None, 1.0, ("linear", 2.0, 40.0))
        gaps = [b - a for a, b in zip(times, times[1:])]
        # The gap before request i is drawn at 2 + 38 i / 4000 requests/s.
        self.assertAlmostEqual(statistics.fmean(gaps[-400:]), statistics.fmean(
            1 / (2 + 38 * i / 4000) for i in range(3601, 4001)), delta=0.003)
        self.assertAlmostEqual(statistics.fmean(gaps[:400]), statistics.fmean(
            1 / (2 + 38 * i / 4000) for i in range(1, 401)), delta=0.03)

    def test_bad_arrival_flags_are_one_line(self):
        cases = [(("simulate", "--burstiness", "0.5"), "add --rate"),
                 (("simulate", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"), "needs all three"),
                 (("simulate", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "9", "--ramp-up-end-rps", "2"),
                  "must not exceed"),
                 (("simulate", "--rate", "3", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1",
                   "--ramp-up-end-rps", "2"), "drop --rate"),
                 (("simulate", "--rate", "3", "--burstiness", "0"), "--burstiness"),
                 (("simulate", "--think-time", "2"), "add --turns"),
                 (("simulate", "--requests", "10", "--warmup", "10"), "leaves no request"),
                 (("simulate", "--trace", MOONCAKE, "--turns", "3"), "brings its own"),
                 (("loadgen", "--trace", MOONCAKE, "--rate", "3"), "brings its own")]
        for args, words in cases:
            code, _, err = call_cli(*args)
            self.assertEqual(code, 2, args)
            self.assertIn(words, err, args)
            self.assertEqual(len(err.strip().splitlines()), 1, args)


class ContentAddressedPrefixes(unittest.TestCase):
    def test_whole_block_hash_ids_as_dynamos_generator_writes_them_are_read_too(self):
        # 1,300 tokens: 3 ids counting the partial block (Mooncake), 2 counting whole blocks only
        # (Dynamo's data generator); then the last 276 tokens are the request's own.
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "t.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"timestamp": 0, "input_length": 1300, "output_length": 2, "hash_ids": [1, 2, 3]})
                        + "\n")
                f.write(json.dumps({"timestamp": 10, "input_length": 1300, "output_length": 2, "hash_ids": [1, 2]})
                        + "\n")
                f.write(json.dumps({"timestamp": 20, "input_length": 300, "output_length": 2, "hash_ids": []}) + "\n")
            trace = main.read_trace(path)
            self.assertEqual([sum(t for _, t in row[3]) for row in trace.rows], [1300, 1024, 0])
            with open(path, "a") as f:
                f.write(json.dumps({"timestamp": 30, "input_length": 1300, "output_length": 2, "hash_ids": [1]}) + "\n")
            code, _, err = call_cli("simulate", "--trace", path)
            self.assertEqual(code, 2)
            self.assertIn("so 3 (a partial last block counted) or 2", err)

    def test_mooncake_hash_ids_hit_as_their_shared_runs_imply(self):
        # The fixture's requests that share hash ids with an earlier one, and those earlier ones,
        # spread out so each runs alone in a cache that holds them all: a request hits exactly the
        # full 16-token blocks of its longest run of hash ids (of equal lengths) shared with an
        # earlier request, short of its last token.
        with open(MOONCAKE) as f:
            every = [json.loads(line) for line in f]
        rows = [every[i] for i in (1, 3, 15, 42, 49, 57, 58, 61, 74, 87, 90, 104, 121, 123, 137)]
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "t.jsonl")
            with open(path, "w") as f:
                for i, row in enumerate(rows):
                    f.write(json.dumps({**row, "timestamp": i * 600_000, "output_length": 2}) + "\n")
            trace = main.read_trace(path)
            result = main.run(main.RunSpec(trace=trace, prefix_caching=True, max_model_len=200_000,
                                           hardware=main.HARDWARE["h200-141gb"], detailed=True))
        self.assertEqual(result["engine"]["evictions"], 0)
        hits = queries = 0
        for i, row in enumerate(rows):
            runs = [(h, min(512, row["input_length"] - 512 * k)) for k, h in enumerate(row["hash_ids"])]
            best = 0
            for earlier in rows[:i]:
                theirs = [(h, min(512, earlier["input_length"] - 512 * k)) for k, h in enumerate(earlier["hash_ids"])]
                shared = 0
                for (a, la), (b, lb) in zip(runs, theirs):
                    if a != b:
                        break
                    shared += min(la, lb)
                    if la != lb:
                        break
                best = max(best, shared)
            hits += min(best, row["input_length"] - 1) // 16 * 16
            queries += row["input_length"]
        self.assertGreater(hits, 0)
        self.assertAlmostEqual(result["engine"]["prefix_hit_rate"], hits / queries, places=12)

    def test_a_named_system_prompt_is_one_run_and_keeps_its_results(self):
        a = main.Request(0, 100, 5, content=(("sys", 64),))
        b = main.Request(1, 90, 5, content=(("sys", 64),))
        self.assertEqual([main.block_key(a, i, 16) for i in range(4)], [main.block_key(b, i, 16) for i in range(4)])
        self.assertNotEqual(main.block_key(a, 4, 16), main.block_key(b, 4, 16))      # past the prompt: their own

    def test_keys_walked_in_order_are_the_keys_one_by_one(self):
        # block_keys (the pool's walk over a run of blocks) against block_key (the rule), on runs
        # that end inside blocks, on block edges, and blocks past every run.
        rng = random.Random(5)
        for case in range(300):
            runs = tuple((f"run-{i}", rng.choice([1, 3, 16, 17, 32, rng.randint(1, 100)]))
                         for i in range(rng.randint(0, 5)))
            content = sum(tokens for _, tokens in runs)
            request = main.Request(case, content + rng.randint(0, 40), 5, content=runs)
            size = rng.choice([1, 2, 16])
            stop = request.total // size + 1
            start = rng.randint(0, stop)
            self.assertEqual(list(main.block_keys(request, start, stop, size)),
                             [main.block_key(request, i, size) for i in range(start, stop)], (case, runs, size, start))


class Conversations(unittest.TestCase):
    def test_each_turn_carries_the_history_and_hits_more_of_it(self):
        result = main.run(main.RunSpec(turns=4, think_time=1.5, rate=1, requests=200, prefix_caching=True,
                                       prompt_tokens=main.TokenRange(100, 200), output_tokens=main.TokenRange(50, 100),
                                       detailed=True))
        turns = result["turns"]
        self.assertEqual([t["turn"] for t in turns], [1, 2, 3, 4])
        self.assertEqual(turns[0]["prefix_hit_rate"], 0.0)
        rates = [t["prefix_hit_rate"] for t in turns]
        self.assertEqual(rates, sorted(rates))
        self.assertGreater(rates[3], 0.7)
        prompts = [t["mean_prompt_tokens"] for t in turns]
        self.assertEqual(prompts, sorted(prompts))

    def test_the_next_turn_is_sent_think_time_after_the_last_answer(self):
        spec = main.RunSpec(turns=3, think_time=2.0, rate=0.5, requests=30, prompt_tokens=main.TokenRange(50, 60),
                            output_tokens=main.TokenRange(10, 20))
        engines, _ = main.build_engines(spec)
        requests = main.make_requests(spec)
        main.simulate(engines[0], requests, spec.clients())
        for r in requests:
            if r.next_turn:
                self.assertAlmostEqual(r.next_turn.sent_s, r.last_token_s + 2.0, places=9)
                history = sum(tokens for _, tokens in r.content)
                self.assertEqual(r.next_turn.prompt_tokens - r.next_turn.content[-2][1], history)

    def test_a_failed_turn_stops_its_conversation_and_says_so(self):
        result = main.run(main.RunSpec(turns=5, concurrency=2, requests=10, max_model_len=600,
                                       prompt_tokens=main.TokenRange(150, 150), output_tokens=main.TokenRange(20, 20)))
        self.assertEqual(result["completed"] + result["failed"], 10)
        self.assertIn("conversation stopped", result["errors_by_kind"])


class TraceFormats(unittest.TestCase):
    def write(self, name, text):
        folder = tempfile.mkdtemp()
        self.addCleanup(lambda: [os.remove(os.path.join(folder, f)) for f in os.listdir(folder)] and os.rmdir(folder))
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_each_format_is_told_and_read(self):
        mooncake = main.read_trace(MOONCAKE)
        self.assertEqual((mooncake.format, len(mooncake.rows)), ("mooncake", 300))
        with open(MOONCAKE) as f:
            first = json.loads(f.readline())
        self.assertEqual(mooncake.rows[0][:3], (first["timestamp"] / 1000, first["input_length"], first["output_length"]))
        azure = main.read_trace(AZURE)
        self.assertEqual((azure.format, len(azure.rows), azure.rows[0][0]), ("azure", 300, 0.0))
        # 2023-11-16 18:15:46.6805900 then 18:15:50.9951690: 4.314579 s apart, to the 100 ns tick.
        self.assertAlmostEqual(azure.rows[1][0], 4.314579, places=6)
        burst = main.read_trace(self.write("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,"
                                                    "Log Type\n5,ChatGPT,472,18,490,Conversation log\n"
                                                    "45,GPT-4,1087,0,1087,API log\n"))
        self.assertEqual((burst.format, burst.rows, len(burst.notes)), ("burstgpt", ((5.0, 472, 18, ()),), 1))
        bailian = main.read_trace(self.write("q.jsonl", json.dumps(
            {"chat_id": 1, "parent_chat_id": -1, "timestamp": 2.5, "input_length": 40, "output_length": 7,
             "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}) + "\n"))
        self.assertEqual(bailian.format, "bailian")
        self.assertEqual(bailian.rows[0][3], ((("hash", 1), 16), (("hash", 2), 16), (("hash", 3), 8)))

    def test_a_vllm_bench_result_replays_its_starts_and_lengths(self):
        code, out, err = call_cli("simulate", "--requests", "20", "--rate", "5", "--detailed")
        report = json.loads(out)
        trace = main.read_trace(self.write("v.json", json.dumps(report, indent=1)))
        self.assertEqual(trace.format, "vllm-bench")
        self.assertEqual([r[1] for r in trace.rows], report["input_lens"])
        self.assertEqual([round(r[0], 9) for r in trace.rows],
                         [round(t - min(report["start_times"]), 9) for t in report["start_times"]])

    def test_bad_lines_name_the_file_line_and_field(self):
        cases = [('{"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [1, 2, 3]}\n', "3 hash_ids? ", "line 1"),
                 ('{"timestamp": 1, "input_length": 600, "output_length": 2}\n', "'hash_ids'", "line 1"),
                 ('{"timestamp": -5, "input_length": 6, "output_length": 2, "hash_ids": [1]}\n', "'timestamp'", "line 1"),
                 ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,1\nyesterday,5,1\n", "TIMESTAMP", "line 3"),
                 ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,5\n", "has no GeneratedTokens column", "trace"),
                 ("Timestamp,Model,Request tokens,Response tokens\n5,x,many,3\n", "'Request tokens'", "line 2")]
        for text, field, where in cases:
            path = self.write("t.jsonl" if text.startswith("{") else "t.csv", text)
            code, _, err = call_cli("simulate", "--trace", path)
            self.assertEqual(code, 2, text)
            self.assertIn(where, err)
            self.assertIn(field.split("?")[0].strip(), err) if "?" not in field else self.assertIn("hash_ids", err)
            self.assertEqual(len(err.strip().splitlines()), 1)

    def test_time_scale_multiplies_the_send_times(self):
        trace = main.read_trace(AZURE)
        slow = main.make_requests(main.RunSpec(trace=trace))
        fast = main.make_requests(main.RunSpec(trace=trace, time_scale=0.25))
        self.assertEqual([r.sent_s * 0.25 for r in slow], [r.sent_s for r in fast])


    def test_a_bad_vllm_bench_result_is_one_line_not_a_hang(self):
        base = {"input_lens": [10, 10, 10], "output_lens": [5, 5, 5], "ttfts": [0.1, 0.1, 0.1],
                "itls": [[0.01] * 4] * 3, "start_times": [0.0, 0.5, 1.0], "errors": ["", "", ""]}
        cases = [({"start_times": [0.0, float("nan"), 1.0]}, "start_times[1]"),
                 ({"start_times": [0.0, None, 1.0]}, "start_times[1]"),
                 ({"itls": [[0.01], ["x"], []]}, "itls[1][0]"),
                 ({"ttfts": [0.1, -3, 0.1]}, "ttfts[1]"),
                 ({"input_lens": [True, 10, 10]}, "input_lens[0]")]
        for change, words in cases:
            path = self.write("v.json", json.dumps({**base, **change}))
            for command in ("simulate", "merge"):
                code, _, err = call_cli(command, *(["--trace", path] if command == "simulate" else [path]))
                self.assertEqual(code, 2, (change, command))
                self.assertIn(words, err)
                self.assertEqual(len(err.strip().splitlines()), 1)

    def test_warmup_is_checked_against_the_traces_own_length(self):
        code, _, err = call_cli("simulate", "--trace", AZURE, "--warmup", "300")
        self.assertEqual(code, 2)
        self.assertIn("leaves no request", err)


class WarmupAndSteadyState(unittest.TestCase):
    def test_warmup_requests_leave_every_figure(self):
        full = main.run(main.RunSpec(concurrency=8, requests=100))
        warm = main.run(main.RunSpec(concurrency=8, requests=100, warmup=20))
        self.assertEqual((warm["completed"], warm["warmup_requests"]), (80, 20))
        self.assertNotEqual(warm["median_ttft_ms"], full["median_ttft_ms"])


class LoadgenReplay(unittest.TestCase):
    def test_equal_hash_ids_are_equal_text_and_others_differ(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "t.jsonl")
            with open(path, "w") as f:
                for i, ids in enumerate(([7, 8], [7, 9], [5, 6])):
                    f.write(json.dumps({"timestamp": 20 * i, "input_length": 1000, "output_length": 3,
                                        "hash_ids": ids}) + "\n")
            with FakeServer(paced(tokens=3)) as server:
                code, out, err = call_cli("loadgen", "--url", server.url, "--trace", path, "--no-size-prompts", "--json")
                bodies = [b for b in server.bodies if b["max_tokens"] != 1]
        self.assertEqual(code, 0, err)
        texts = [b["messages"][0]["content"].split() for b in sorted(bodies, key=lambda b: len(b["messages"][0]["content"]))]
        words = {len(t) for t in texts}
        self.assertEqual(words, {512 + 488})                              # one word a token, without the probe
        by_first = sorted(texts, key=lambda t: t[0])
        firsts = [t[:512] for t in texts]
        self.assertEqual(sum(firsts.count(f) for f in firsts), 3 + 2)     # two share block 7's text, one does not
        self.assertTrue(all(b["max_tokens"] == 3 and b["ignore_eos"] for b in bodies))
        self.assertTrue(by_first)

    def test_a_conversation_carries_the_servers_replies(self):
        with FakeServer(paced(tokens=4)) as server:
            code, out, err = call_cli("loadgen", "--url", server.url, "--turns", "3", "--requests", "6",
                                      "--concurrency", "2", "--json")
            bodies = list(server.bodies)
        self.assertEqual(code, 0, err)
        report = json.loads(out)
        self.assertEqual([t["requests"] for t in report["turns"]], [2, 2, 2])
        third = [b for b in bodies if len(b["messages"]) == 5]
        self.assertEqual(len(third), 2)
        self.assertEqual([m["role"] for m in third[0]["messages"]], ["user", "assistant", "user", "assistant", "user"])
        self.assertEqual(third[0]["messages"][1]["content"].split(), ["tok"] * 4)    # the fake server's reply

    def test_a_conversation_sends_its_system_prompt_once(self):
        with FakeServer(paced(tokens=2)) as server:
            code, out, err = call_cli("loadgen", "--url", server.url, "--turns", "3", "--requests", "3",
                                      "--prefix-tokens", "10", "--no-size-prompts", "--json")
            bodies = list(server.bodies)
        self.assertEqual(code, 0, err)
        self.assertEqual([[m["role"] for m in b["messages"]].count("system") for b in bodies], [1, 1, 1])

    def test_a_stopped_conversation_does_not_stretch_the_window(self):
        def stream(handler, body):
            if sum(m["role"] == "user" for m in body["messages"]) > 1:
                handler.reply(500, json.dumps({"error": {"message": "turn two"}}))
            else:
                paced(tokens=3)(handler, body)
        with FakeServer(stream) as server:
            code, out, err = call_cli("loadgen", "--url", server.url, "--turns", "3", "--requests", "6",
                                      "--concurrency", "2", "--json")
        report = json.loads(out)
        self.assertEqual(code, 1)
        self.assertEqual((report["completed"], report["failed"]), (2, 4))
        self.assertIn("conversation stopped", report["errors_by_kind"])
        self.assertLess(report["duration"], 30)
        self.assertGreater(report["request_throughput"], 0.05)

    def test_an_open_loop_reports_its_offered_rate_and_dispatch_lag(self):
        with FakeServer(paced(ttft=0.01, gap=0.002, tokens=3)) as server:
            code, out, err = call_cli("loadgen", "--url", server.url, "--rate", "50", "--requests", "100",
                                      "--warmup", "10", "--json")
        self.assertEqual(code, 0, err)
        report = json.loads(out)
        client = report["client"]
        self.assertAlmostEqual(client["offered_rate"], 50, delta=15)
        self.assertGreaterEqual(client["dispatch_lag_ms"]["p50"], 0)
        self.assertEqual((report["completed"], report["warmup_requests"]), (90, 10))


class Merge(unittest.TestCase):
    def record(self, server, folder, requests, gap=0.0):
        """Two loadgen --detailed reports from one fake server, the second `gap` seconds later."""
        paths = []
        for seed in (1, 2):
            code, out, err = call_cli("loadgen", "--url", server.url, "--rate", "20", "--requests", requests,
                                      "--seed", seed, "--detailed")
            self.assertEqual(code, 0, err)
            paths.append(os.path.join(folder, f"{seed}.json"))
            with open(paths[-1], "w") as f:
                f.write(out)
            if seed == 1:
                time.sleep(gap)
        return paths

    def test_reports_from_two_clients_become_one_run(self):
        with tempfile.TemporaryDirectory() as folder, FakeServer(paced(tokens=3)) as server:
            paths = self.record(server, folder, 15)
            code, out, err = call_cli("merge", *paths, "--json")
            self.assertEqual(code, 0, err)
            merged = json.loads(out)
            parts = []
            for path in paths:
                with open(path) as f:
                    parts.append(json.load(f))
            bad = os.path.join(folder, "bad.json")
            with open(bad, "w") as f:
                json.dump({"completed": 3}, f)
            code2, _, err2 = call_cli("merge", paths[0], bad)
        self.assertEqual(merged["completed"], 30)
        self.assertEqual(merged["config"]["clock"], "wall clock")
        ttfts = sorted(t * 1000 for p in parts for t in p["ttfts"])
        self.assertAlmostEqual(merged["median_ttft_ms"], ttfts[math.ceil(0.5 * len(ttfts)) - 1], places=6)
        self.assertEqual(code2, 2)
        self.assertIn("--detailed", err2)
        self.assertEqual(merged["config"]["model"], parts[0]["config"]["model"])

    def test_an_edited_start_time_or_more_gaps_than_tokens_are_refused(self):
        # helper-38: a start 100 s early merged into a 22-hour run; 57 gaps for 8 tokens halved tok/s
        with tempfile.TemporaryDirectory() as folder, FakeServer(paced(tokens=3)) as server:
            paths = self.record(server, folder, 5)
            with open(paths[0]) as f:
                report = json.load(f)
            for edit, said in ((lambda r: r["start_times"].__setitem__(0, r["config"]["started_perf"] - 100),
                                "is before the run started"),
                               (lambda r: r["itls"].__setitem__(0, [0.01] * 57), "57 gaps between tokens where output_lens[0]")):
                bad = json.loads(json.dumps(report))
                edit(bad)
                with open(paths[1], "w") as f:
                    json.dump(bad, f)
                with self.subTest(said=said):
                    code, out, err = call_cli("merge", paths[1])
                    self.assertEqual(code, 2, err)
                    self.assertIn(said, err)

    def test_reports_of_two_models_are_refused(self):
        # helper-38: merged into one set of percentiles, the model dropped from the report
        with tempfile.TemporaryDirectory() as folder, FakeServer(paced(tokens=3)) as server:
            paths = self.record(server, folder, 5)
            with open(paths[1]) as f:
                other = json.load(f)
            other["config"]["model"] = "llama-3.1-70b"
            with open(paths[1], "w") as f:
                json.dump(other, f)
            code, out, err = call_cli("merge", *paths)
        self.assertEqual((code, out), (2, ""))
        self.assertIn("is of model llama-3.1-70b", err)

    def test_a_report_merged_with_itself_is_refused_and_gaps_do_not_count(self):
        with tempfile.TemporaryDirectory() as folder, FakeServer(paced(tokens=3)) as server:
            paths = self.record(server, folder, 10, gap=1.5)      # the second run starts after a gap
            code, out, err = call_cli("merge", paths[0], paths[0])
            self.assertEqual(code, 2)
            self.assertIn("same run", err)
            code, out, err = call_cli("merge", *paths, "--json")
            merged = json.loads(out)
            spans = []
            for path in paths:
                with open(path) as f:
                    spans.append(json.load(f)["duration"])
        self.assertIn("did not all overlap", err)
        self.assertAlmostEqual(merged["duration"], sum(spans), delta=0.05)

if __name__ == "__main__":
    unittest.main()


class ReasoningModels(unittest.TestCase):
    """The first --reasoning-tokens of each output are thinking: the user waits for the token after
    them. TTFA is TTFT plus the gaps of the thinking tokens, request by request."""

    def test_ttfa_is_ttft_plus_the_thinking_tokens_gaps(self):
        result = main.run(main.RunSpec(hardware=main.HARDWARE["l4-24gb"], prompt_tokens=main.TokenRange(100, 400),
                                       output_tokens=main.TokenRange(40, 80), reasoning_tokens=main.TokenRange(30, 30),
                                       rate=4.0, requests=60, detailed=True))
        self.assertEqual(result["answered"], 60)
        self.assertEqual(result["total_reasoning_tokens"], 60 * 30)
        for ttft, ttfa, gaps in zip(result["ttfts"], result["ttfas"], result["itls"]):
            self.assertAlmostEqual(ttfa - ttft, sum(gaps[:30]), places=9)
        self.assertGreater(result["p95_ttfa_ms"], result["p95_ttft_ms"] + 29 * result["median_tpot_ms"] * 0.9)

    def test_thinking_changes_no_request_but_when_its_answer_starts(self):
        base = main.RunSpec(hardware=main.HARDWARE["l4-24gb"], rate=2.0, requests=40, detailed=True,
                            output_tokens=main.TokenRange(64, 256))
        plain = main.run(base)
        thinking = main.run(main.replace(base, reasoning_tokens=main.TokenRange(10, 60)))
        for key in ("ttfts", "itls", "input_lens", "output_lens", "latencies"):
            self.assertEqual(plain[key], thinking[key], key)
        self.assertNotIn("ttfas", plain)
        self.assertNotIn("p95_ttfa_ms", plain)

    def test_a_ttfa_slo_binds_where_the_ttft_slo_does_not(self):
        args = ["search", "--hardware", "l4-24gb", "--prompt-tokens", "500", "--output-tokens", "1200",
                "--reasoning-tokens", "1000", "--json", "--jobs", "1"]
        by_ttft = json.loads(call_cli(*args, "--slo", "ttft_p95:3000")[1])["deployments"][0]
        by_answer = json.loads(call_cli(*args, "--slo", "ttft_p95:3000,ttfa_p95:85000")[1])["deployments"][0]
        self.assertLess(by_answer["highest_load"], by_ttft["highest_load"])
        # Without reasoning, the first answer token is the first token: the bounds are the same.
        plain = ["search", "--hardware", "l4-24gb", "--prompt-tokens", "500", "--output-tokens", "200", "--json",
                 "--jobs", "1"]
        self.assertEqual(json.loads(call_cli(*plain, "--slo", "ttft_p95:3000")[1])["deployments"][0]["highest_load"],
                         json.loads(call_cli(*plain, "--slo", "ttfa_p95:3000")[1])["deployments"][0]["highest_load"])

    def test_goodput_seeds_and_compare_carry_ttfa(self):
        spec = main.RunSpec(hardware=main.HARDWARE["l4-24gb"], prompt_tokens=main.TokenRange(100, 400),
                            output_tokens=main.TokenRange(100, 200), reasoning_tokens=main.TokenRange(50, 90),
                            rate=4.0, requests=40, detailed=True)
        one = main.run(spec)
        bound = sorted(one["ttfas"])[19] * 1000        # the 20th of 40 first answers
        counted = main.run(main.replace(spec, goodput=(("ttfa", bound),)))
        self.assertEqual(round(counted["goodput_share"] * 40), 20)
        # Without thinking, a ttfa bound is a ttft bound (one that half the requests meet).
        plain = main.replace(spec, reasoning_tokens=None)
        median = main.run(plain)["median_ttft_ms"]
        by_ttfa = main.run(main.replace(plain, goodput=(("ttfa", median),)))["goodput_share"]
        self.assertTrue(0.3 < by_ttfa < 0.7, by_ttfa)
        self.assertEqual(by_ttfa, main.run(main.replace(plain, goodput=(("ttft", median),)))["goodput_share"])
        # A request that thought and never answered has met no ttfa bound.
        cut = main.Request(0, 100, 50, 0.0, reasoning_tokens=40)
        cut.first_token_s, cut.last_token_s = 0.1, 0.5
        self.assertFalse(main.meets_slos(cut, {"ttfa": 1e9}))
        self.assertTrue(main.meets_slos(cut, {"ttft": 1e9}))
        seeds = main.seeded([main.run(main.replace(spec, seed=s)) for s in (1, 2)])
        self.assertLess(seeds["seeds"]["spread"]["p95_ttfa_ms"]["min"], seeds["seeds"]["spread"]["p95_ttfa_ms"]["max"])
        rows = main.compared_rows(one, one)
        self.assertEqual(rows["ttfa p50 ms"]["error"], 0.0)

    def test_the_first_answer_never_comes_before_the_first_token(self):
        for extra in ({"disaggregate": True, "kv_link_gbs": 1.0}, {"data_parallel_size": 2},
                      {"speculative_tokens": 3}):
            result = main.run(main.RunSpec(rate=4.0, requests=40, detailed=True, reasoning_tokens=main.TokenRange(1, 20),
                                           **extra))
            self.assertTrue(all(a >= t for a, t in zip(result["ttfas"], result["ttfts"])), extra)
            plain = main.run(main.RunSpec(rate=4.0, requests=40, detailed=True, **extra))
            self.assertNotIn("ttfas", plain)

    def test_a_trace_row_gives_its_own_thinking_and_bad_thinking_is_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "t.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"arrival": 0, "prompt_tokens": 50, "output_tokens": 20, "reasoning_tokens": 15})
                        + "\n" + json.dumps({"arrival": 5, "prompt_tokens": 50, "output_tokens": 20}) + "\n")
            result = main.run(main.RunSpec(trace=main.read_trace(path), detailed=True))
            self.assertEqual(result["total_reasoning_tokens"], 15)
            self.assertAlmostEqual(result["ttfas"][0] - result["ttfts"][0], sum(result["itls"][0][:15]), places=9)
            self.assertEqual(result["ttfas"][1], result["ttfts"][1])
            with open(path, "a") as f:
                f.write(json.dumps({"arrival": 9, "prompt_tokens": 50, "output_tokens": 20, "reasoning_tokens": 20})
                        + "\n")
            cases = [(("simulate", "--trace", path), "line 3: reasoning_tokens 20 is not below output_tokens 20"),
                     (("simulate", "--reasoning-tokens", "300", "--output-tokens", "64-256"), "below the shortest"),
                     (("simulate", "--reasoning-tokens", "10", "--turns", "2"), "--turns"),
                     (("simulate", "--reasoning-tokens", "0"), "--reasoning-tokens")]
            for args, words in cases:
                code, _, err = call_cli(*args)
                self.assertEqual(code, 2, args)
                self.assertIn(words, err, args)
                self.assertEqual(len(err.strip().splitlines()), 1, err)


class HostTier(unittest.TestCase):
    """--kv-offloading-size: HBM holds 4 blocks of 16 tokens, so a second document evicts the
    first; host memory still has it, and the third request loads it back instead of computing it."""

    def run_three(self, folder, offload):
        path = os.path.join(folder, "t.jsonl")
        with open(path, "w") as f:
            for at, doc in ((0, "doc"), (10, "other"), (20, "doc")):
                f.write(json.dumps({"arrival": at, "prompt_tokens": 56, "output_tokens": 2, "prefix": doc,
                                    "prefix_tokens": 48}) + "\n")
        spec = main.RunSpec(hardware=main.HARDWARE["h100-sxm-80gb"], trace=main.read_trace(path), kv_tokens=64,
                            prefix_caching=True, kv_offloading_size=offload, detailed=True)
        return main.run(spec)

    def test_a_prefix_evicted_from_hbm_loads_from_host_memory_at_the_links_speed(self):
        with tempfile.TemporaryDirectory() as folder:
            tiered = self.run_three(folder, 0.02)       # 10 blocks of 2 MiB (16 tokens x 128 KiB)
            plain = main.run(main.replace(main.RunSpec(hardware=main.HARDWARE["h100-sxm-80gb"], kv_tokens=64,
                                                       prefix_caching=True, detailed=True),
                                          trace=main.read_trace(os.path.join(folder, "t.jsonl"))))
        host, block = tiered["host_tier"], 16 * 128 * 1024
        self.assertEqual((host["blocks"], host["loads"], host["host_hit_tokens"]), (10, 1, 48))
        self.assertAlmostEqual(host["loaded_gb_per_gpu"], 3 * block / 1e9)
        # Every full block computed is written through: 3 + 3 + the third request's own 0 new ones.
        self.assertAlmostEqual(host["stored_gb_per_gpu"], 6 * block / 1e9)
        queries = 3 * 56
        self.assertAlmostEqual(host["host_hit_rate"], 48 / queries)
        self.assertAlmostEqual(tiered["engine"]["prefix_hit_rate"], 48 / queries)     # HBM had none of it
        self.assertEqual(plain["engine"]["prefix_hit_rate"], 0.0)
        # The third request waited exactly for its 3 blocks over 63 GB/s x 0.8, then computed its 8
        # own tokens, as it does when a cache big enough for both documents still holds its prefix.
        load = 3 * block / (63e9 * main.HOST_LINK_EFFICIENCY)
        with tempfile.TemporaryDirectory() as folder:
            self.run_three(folder, 0.02)
            roomy = main.run(main.RunSpec(hardware=main.HARDWARE["h100-sxm-80gb"], kv_tokens=4096, prefix_caching=True,
                                          detailed=True, trace=main.read_trace(os.path.join(folder, "t.jsonl"))))
        self.assertAlmostEqual(roomy["engine"]["prefix_hit_rate"], 48 / queries)
        self.assertAlmostEqual(tiered["ttfts"][2], load + roomy["ttfts"][2], places=12)
        # (56 tokens recomputed cost an H100 no more than 8: a 48-token prefix is not worth loading;
        # the multi-turn case in the README is where it is.)
        self.assertEqual(tiered["ttfts"][:2], plain["ttfts"][:2])     # nothing to load for the first two

    def test_where_hbm_evicts_conversation_histories_a_host_tier_finds_them(self):
        base = main.RunSpec(hardware=main.HARDWARE["l4-24gb"], turns=4, think_time=5.0, rate=0.3, requests=600,
                            prefix_caching=True, prompt_tokens=main.TokenRange(200, 400),
                            output_tokens=main.TokenRange(100, 300))
        plain, tiered = main.run(base), main.run(main.replace(base, kv_offloading_size=8))
        self.assertGreater(plain["engine"]["evictions"], 0)
        self.assertGreater(tiered["engine"]["prefix_hit_rate"], plain["engine"]["prefix_hit_rate"] + 0.2)
        self.assertGreater(tiered["host_tier"]["host_hit_rate"], 0.1)
        self.assertLess(tiered["p95_ttft_ms"], plain["p95_ttft_ms"] / 2)
        self.assertEqual(tiered["turns"][0]["prefix_hit_rate"], 0.0)       # a first turn has no history to find

    def test_a_loaded_request_keeps_its_place_ahead_of_later_arrivals(self):
        with tempfile.TemporaryDirectory() as folder:
            self.run_three(folder, 0.02)
            path = os.path.join(folder, "t.jsonl")
            with open(path, "a") as f:       # ten more documents right behind the one that loads
                for i in range(10):
                    f.write(json.dumps({"arrival": 20.00001, "prompt_tokens": 56, "output_tokens": 2,
                                        "prefix": f"late{i}", "prefix_tokens": 48}) + "\n")
            result = main.run(main.RunSpec(hardware=main.HARDWARE["h100-sxm-80gb"], trace=main.read_trace(path),
                                           kv_tokens=64, prefix_caching=True, kv_offloading_size=0.02, detailed=True))
        self.assertEqual(result["host_tier"]["loads"], 1)
        # Back from its load it is the head of the queue: of the ten that came after it, only one
        # (started while it loaded, when the cache was free) goes first.
        first = [sent + ttft for sent, ttft in zip(result["start_times"], result["ttfts"])]
        self.assertLess(first[2], sorted(first[3:])[1])

    def test_preempted_reloads_do_not_count_as_hits_again(self):
        result = main.run(main.RunSpec(requests=60, concurrency=32, prefix_caching=True, kv_offloading_size=2,
                                       num_gpu_blocks=300))
        self.assertGreater(result["engine"]["preemptions"], 0)
        self.assertLessEqual(result["host_tier"]["host_hit_rate"], result["engine"]["prefix_hit_rate"])

    def test_a_tier_below_one_block_or_a_link_below_any_pcie_is_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            slow = os.path.join(folder, "slow.json")
            with open(slow, "w") as f:
                json.dump({**main.preset_fields(main.HARDWARE["h100-sxm-80gb"]), "name": "slow", "host_link_gbs": 1e-9}, f)
            for args, words in ((("--kv-offloading-size", "0.000001"), "less than one KV block"),
                                (("--kv-offloading-size", "8", "--hardware", slow), "below any PCIe link's")):
                code, _, err = call_cli("simulate", "--prefix-caching", *args)
                self.assertEqual(code, 2, args)
                self.assertIn(words, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_where_everything_fits_in_hbm_a_host_tier_changes_nothing(self):
        base = main.RunSpec(hardware=main.HARDWARE["h100-sxm-80gb"], turns=3, think_time=1.0, rate=2.0,
                            requests=60, prefix_caching=True, detailed=True)
        plain, tiered = main.run(base), main.run(main.replace(base, kv_offloading_size=8))
        self.assertEqual(tiered["host_tier"]["loads"], 0)
        for key in ("ttfts", "itls", "latencies"):
            self.assertEqual(plain[key], tiered[key], key)

    def test_bad_offloading_is_one_line(self):
        cases = [(("simulate", "--kv-offloading-size", "8"), "add --prefix-caching"),
                 (("simulate", "--hardware", "l4-24gb", "--prefix-caching", "--kv-offloading-size", "64"),
                  "16 GiB of host memory"),
                 (("simulate", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--prefix-caching",
                   "--kv-offloading-size", "1"), "no host_link_gbs"),
                 (("simulate", "--prefix-caching", "--kv-offloading-size", "8", "--disaggregate"), "paged, continuous"),
                 (("simulate", "--prefix-caching", "--kv-offloading-size", "-1"), "--kv-offloading-size")]
        for args, words in cases:
            code, _, err = call_cli(*args)
            self.assertEqual(code, 2, args)
            self.assertIn(words, err, args)
            self.assertEqual(len(err.strip().splitlines()), 1, err)


class Sessions(unittest.TestCase):
    """A trace row may continue an earlier one (its parent), sent when the parent ends plus its
    delay, or at its own time but never before the parent has ended."""

    def write(self, folder, rows, name="t.jsonl"):
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write("".join(json.dumps(row) + "\n" for row in rows))
        return path

    def test_a_turn_is_released_by_its_parents_end_and_shares_its_history(self):
        rows = [{"arrival": 0, "prompt_tokens": 1000, "output_tokens": 50, "id": "a1"},
                {"arrival": 0.5, "prompt_tokens": 800, "output_tokens": 50, "id": "b1"},
                {"arrival": 1, "prompt_tokens": 1250, "output_tokens": 50, "id": "a2", "parent": "a1", "delay": 2},
                {"arrival": 60, "prompt_tokens": 1050, "output_tokens": 50, "id": "b2", "parent": "b1"}]
        with tempfile.TemporaryDirectory() as folder:
            trace = main.read_trace(self.write(folder, rows))
        self.assertEqual((trace.parents, trace.delays), ((-1, -1, 0, 1), (None, None, 2.0, None)))
        done = []
        main.run(main.RunSpec(hardware=main.HARDWARE["l4-24gb"], trace=trace, prefix_caching=True), requests_out=done)
        by_id = {r.id: r for r in done}
        a1, b1, a2, b2 = (by_id[i] for i in range(4))
        self.assertAlmostEqual(a2.sent_s, a1.last_token_s + 2)        # the delay after its parent's end
        self.assertEqual(b2.sent_s, 60.0)                              # its own time: the parent ended long before
        self.assertEqual((a1.turn, a2.turn, b1.turn, b2.turn), (1, 2, 1, 2))
        # a2's prompt is a1's prompt and reply, then 200 new tokens: the history is in the cache.
        self.assertEqual(a2.cached_tokens, (1000 + 50) // 16 * 16)
        self.assertEqual(b2.cached_tokens, (800 + 50) // 16 * 16)

    def test_a_turn_never_goes_before_its_parent_has_ended(self):
        rows = [{"arrival": 0, "prompt_tokens": 3000, "output_tokens": 400, "id": "a"},
                {"arrival": 0.1, "prompt_tokens": 3500, "output_tokens": 10, "id": "b", "parent": "a"}]
        with tempfile.TemporaryDirectory() as folder:
            trace = main.read_trace(self.write(folder, rows))
        done = []
        main.run(main.RunSpec(hardware=main.HARDWARE["l4-24gb"], trace=trace), requests_out=done)
        a, b = sorted(done, key=lambda r: r.id)
        self.assertGreater(a.last_token_s, 0.1)
        self.assertEqual(b.sent_s, a.last_token_s)

    def test_bailian_chats_continue_their_parent_chat_and_a_chat_from_before_the_trace_starts_afresh(self):
        base = {"input_length": 40, "output_length": 8, "type": "text", "hash_ids": [1, 2, 3]}
        rows = [{**base, "chat_id": 7, "parent_chat_id": -1, "timestamp": 0, "turn": 1},
                {**base, "chat_id": 9, "parent_chat_id": 3, "timestamp": 1, "turn": 2},
                {**base, "chat_id": 8, "parent_chat_id": 7, "timestamp": 2, "turn": 2, "input_length": 60,
                 "hash_ids": [1, 2, 3, 4]}]
        with tempfile.TemporaryDirectory() as folder:
            trace = main.read_trace(self.write(folder, rows), "bailian")
        self.assertEqual(trace.parents, (-1, -1, 0))
        self.assertIn("1 row continues a chat from before the trace starts", " ".join(trace.notes))

    def test_a_missing_or_later_parent_or_a_repeated_id_is_one_line(self):
        cases = [([{"arrival": 0, "prompt_tokens": 9, "output_tokens": 2, "id": "x", "parent": "y"}],
                  "row 1: its parent 'y' is not an earlier row's id"),
                 ([{"arrival": 0, "prompt_tokens": 9, "output_tokens": 2, "id": "x"},
                   {"arrival": 1, "prompt_tokens": 9, "output_tokens": 2, "id": "x"}], "id 'x' names more than one row"),
                 ([{"arrival": 0, "prompt_tokens": 9, "output_tokens": 2, "delay": 3}], "add the parent's id"),
                 ([{"arrival": 0, "prompt_tokens": 9, "output_tokens": 2, "id": ["x"]}], "field 'id' must be"),
                 # One system prompt's name with two lengths: which is it?
                 ([{"arrival": 0, "prompt_tokens": 90, "output_tokens": 2, "prefix": "s", "prefix_tokens": 50},
                   {"arrival": 1, "prompt_tokens": 90, "output_tokens": 2, "prefix": "s", "prefix_tokens": 80}],
                  "prefix 's' is 80 tokens here and 50 at")]
        with tempfile.TemporaryDirectory() as folder:
            for rows, words in cases:
                code, _, err = call_cli("simulate", "--trace", self.write(folder, rows))
                self.assertEqual(code, 2, rows)
                self.assertIn(words, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_a_turn_too_short_to_hold_its_history_is_sent_as_itself_by_both(self):
        rows = [{"arrival": 0, "prompt_tokens": 30, "output_tokens": 3, "id": "a"},
                {"arrival": 0.01, "prompt_tokens": 20, "output_tokens": 3, "id": "b", "parent": "a"}]
        with tempfile.TemporaryDirectory() as folder, FakeServer(paced(ttft=0.01, gap=0.005, tokens=3)) as server:
            path = self.write(folder, rows)
            code, _, err = call_cli("loadgen", "--url", server.url, "--trace", path, "--no-size-prompts", "--json",
                                    env={"OPENAI_API_KEY": ""})
            self.assertEqual(code, 0, err)
            self.assertEqual([len(b["messages"]) for b in server.bodies], [1, 1])
            done = []
            trace = main.read_trace(path)
            main.run(main.RunSpec(trace=trace, prefix_caching=True), requests_out=done)
        self.assertEqual(sorted(done, key=lambda r: r.id)[1].cached_tokens, 0)
        self.assertIn("1 turn is shorter than the prompt and reply before it", " ".join(trace.notes))   # not silent

    def test_loadgen_sends_each_turn_with_the_servers_own_replies_after_the_delay(self):
        rows = [{"arrival": 0, "prompt_tokens": 30, "output_tokens": 3, "id": "a"},
                {"arrival": 0.01, "prompt_tokens": 50, "output_tokens": 3, "id": "b", "parent": "a", "delay": 0.3}]
        with tempfile.TemporaryDirectory() as folder, FakeServer(paced(ttft=0.01, gap=0.005, tokens=3)) as server:
            code, out, err = call_cli("loadgen", "--url", server.url, "--trace", self.write(folder, rows),
                                      "--no-size-prompts", "--json", env={"OPENAI_API_KEY": ""})
            self.assertEqual(code, 0, err)
            first, second = server.log
            bodies = server.bodies
        self.assertEqual([m["role"] for m in bodies[1]["messages"]], ["user", "assistant", "user"])
        self.assertEqual(bodies[1]["messages"][1]["content"], " tok" * 3)        # the reply the server gave
        self.assertEqual(bodies[1]["messages"][0], bodies[0]["messages"][0])
        self.assertGreaterEqual(second["received"] - first["written"][-1], 0.3)
        self.assertEqual([t["turn"] for t in json.loads(out)["turns"]], [1, 2])
