"""loadgen against hostile servers, third pass (helper-60): an error body dripped a byte at a time
ends within --timeout; a key typed into a mistyped flag, or echoed by its first and last
characters, is never shown; a report of a server that sends no usage is one merge and compare
read; one /metrics scrape that stalls mid-run does not end the scraping; a run's duration is the
benchmark's, failures' time included. Each test runs main.py in its own process (bounded.py)
against a server of its own on 127.0.0.1."""
import json
import os
import tempfile
import time
import unittest

from bounded import run
from fake_server import chunk, data
from hostile_server import Drip, FakeServer, paced, scripted
from helpers import main

KEY = "myorgkey-7f3a9c2e5b1d4f6a8c0e"


class Deadlines(unittest.TestCase):
    def test_an_error_body_or_a_non_stream_dripped_ends_at_the_timeout_with_what_came(self):
        # helper-60: response.read() had no deadline: still waiting after 40 s at --timeout 3
        for status, kind in ((500, None), (200, "text/html")):
            pieces = ('{"error": "over', 30, 'loaded"}')
            if kind:
                def stream(handler, body):
                    handler.send_response(200)
                    handler.send_header("Content-Type", kind)
                    handler.end_headers()
                    handler.raw(pieces[0])
                    handler.server.fake.stopping.wait(30)
            else:
                stream = scripted(*pieces, status=status)
            with self.subTest(status=status), FakeServer(stream) as server:
                r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--timeout", 2, "--json",
                        "--scrape-interval", 100)
            self.assertEqual(r.code, 1, r.err)
            self.assertLess(r.took, 15)
            (error,) = r.json()["first_error_by_kind"].values()
            self.assertIn('{"error": "over (the rest of its body did not come within 2 s)', error)

    def test_a_request_timeout_before_the_answer_names_that_flag(self):
        def silent(handler, body):        # not even headers
            handler.server.fake.stopping.wait(30)
        with FakeServer(silent) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--timeout", 60,
                    "--request-timeout", 1, "--json")
        self.assertEqual(r.code, 1, r.err)
        (error,) = r.json()["first_error_by_kind"].values()
        self.assertEqual(error, "timeout: no answer within 1 s (--request-timeout)")


class Secrets(unittest.TestCase):
    def test_a_key_after_a_mistyped_or_unknown_flag_and_a_url_password_are_not_in_the_error(self):
        for words in (("loadgen", "--url", "http://127.0.0.1:9", "--apikey", KEY),
                      ("merge", "a.json", "--api-key", KEY),
                      ("loadgen", "--url", "http://127.0.0.1:9", f"--auth-token={KEY}"),
                      ("loadgen", "--url", "http://user:Sup3rSecretPw@127.0.0.1:9", "--bogus", "Sup3rSecretPw"),
                      ("loadgen", "--url=user:Sup3rSecretPw@127.0.0.1:9", "--bogus", "Sup3rSecretPw"),
                      ("loadgen", "--url", "http://127.0.0.1:9", "--api-kye", KEY),
                      ("loadgen", "--ur", f"http://127.0.0.1:9/?api_key={KEY}")):
            with self.subTest(words=words[:4]):
                r = run(*words)
                self.assertEqual(r.code, 2, r.err)
                self.assertIn("unrecognized arguments", r.err)
                for piece in (KEY[:6], KEY[-6:], "Sup3rS", "etPw"):
                    self.assertNotIn(piece, r.err)
        # a flag about tokens is no credential: helper-61 saw "unknown hardware 'h***00'" beside
        # --output-tokens 1
        r = run("simulate", "--requests", 4, "--output-tokens", 1, "--hardware", "h100")
        self.assertIn("unknown hardware 'h100' (did you mean h100-sxm-80gb?)", r.err)
        # a file name with an @ is not a URL: nothing of it is hidden
        r = run("simulate", "--trace", "me@example.jsonl")
        self.assertIn("trace me@example.jsonl: cannot read it", r.err)

    def test_a_key_echoed_by_its_first_and_last_few_characters_shows_neither(self):
        # helper-59's rule hid runs of 8 or more: "key myorgk... tail 6a8c0e" showed 12 of its 29
        self.assertEqual(main.hide_pieces(f"key {KEY[:6]}... tail {KEY[-6:]}.", [KEY]), "key ***... tail ***.")
        # what is not its start or its end, under 8 characters, is not a piece to hide; nor is a
        # word that shares the key's first 5 (helper-63: 4 hid "toke" of "tokens" for token-abc123)
        self.assertEqual(main.hide_pieces("7f3a9c2 seconds", [KEY]), "7f3a9c2 seconds")
        self.assertEqual(main.hide_pieces("8192 tokens, --prompt-tokens", ["token-abc123"]),
                         "8192 tokens, --prompt-tokens")


class ReportsMergeReads(unittest.TestCase):
    def test_a_server_without_usage_gives_prompt_lengths_merge_and_compare_read(self):
        # helper-60: input_lens 0 for every request, which merge refuses ("from 1 to 100,000,000")
        stream = scripted(data(chunk({"content": " tok"})), data(chunk({"content": " tok"})),
                          data(chunk(finish="length")), "data: [DONE]\n\n")
        with tempfile.TemporaryDirectory() as tmp, FakeServer(stream) as server:
            paths = []
            for i in range(2):
                r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 3, "--detailed",
                        "--no-size-prompts", "--seed", i, "--scrape-interval", 100)
                self.assertEqual(r.code, 0, r.err)
                self.assertTrue(all(n >= 1 for n in r.json()["input_lens"]), r.json()["input_lens"])
                paths.append(os.path.join(tmp, f"{i}.json"))
                with open(paths[-1], "w") as f:
                    f.write(r.out)
            merged = run("merge", *paths)
            self.assertEqual(merged.code, 0, merged.err)
            compared = run("compare", paths[0], "--hardware", "h100-sxm-80gb", "--model", "llama-3.1-8b")
            self.assertEqual(compared.code, 0, compared.err)

    def test_a_usage_count_past_what_a_report_holds_is_left_out_not_kept(self):
        with FakeServer(paced(prompt=500_000_000, tokens=3)) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 2, "--detailed",
                    "--no-size-prompts", "--scrape-interval", 100)
        self.assertEqual(r.code, 0, r.err)
        self.assertTrue(all(1 <= n < 1000 for n in r.json()["input_lens"]), r.json()["input_lens"])
        self.assertIn("usage", r.json()["client"]["server_figures_left_out"])


class Finishes(unittest.TestCase):
    def test_a_request_the_server_aborted_is_a_failure_not_a_completion(self):
        # helper-60: finish_reason "abort" after one token of 64 counted as completed, exit 0
        for reason in ("abort", "error"):
            stream = scripted(data(chunk({"content": " tok"})), data(chunk(finish=reason)), "data: [DONE]\n\n")
            with self.subTest(reason=reason), FakeServer(stream) as server:
                r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 2, "--no-size-prompts", "--json",
                        "--scrape-interval", 100)
            self.assertEqual(r.code, 1, r.err)
            self.assertEqual((r.json()["completed"], r.json()["failed"]), (0, 2))
            self.assertEqual(list(r.json()["first_error_by_kind"].values()),
                             [f"ended by the server: finish_reason '{reason}'"])


class StreamsAsTheyCome(unittest.TestCase):
    def test_cr_line_ends_an_error_object_without_message_and_a_compressed_body_are_read_right(self):
        # helper-60: CR-only lines (SSE allows them) read as "truncated"; {"error": {"code": 500}}
        # as "server error in stream: None"; a gzip body as "truncated ... before its first event"
        def events(eol):
            return [f"data: {json.dumps(chunk({'content': ' tok'}))}{eol}{eol}",
                    f"data: {json.dumps(chunk(finish='length'))}{eol}{eol}", f"data: [DONE]{eol}{eol}"]

        def gzipped(handler, body):
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Content-Encoding", "gzip")
            handler.end_headers()
            handler.raw(b"\x1f\x8b\x08\x00" + bytes(20))
        cases = (("cr", scripted(*events("\r")), None),
                 ("cr split from its lf", scripted(*[piece for e in events("\r\n") for piece in
                                                     (e[:-1], 0.05, e[-1:])]), None),
                 ("error object", scripted('data: {"error": {"code": 500}}\n\n'),
                  'server error in stream: {"error": {"code": 500}}'),
                 ("gzip", gzipped, "not an event stream: the body is compressed (Content-Encoding gzip), which a "
                                   "streaming client does not ask for; turn compression off for this route"))
        for name, stream, error in cases:
            with self.subTest(case=name), FakeServer(stream) as server:
                r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--no-size-prompts", "--json",
                        "--scrape-interval", 100)
                self.assertEqual(r.code, 1 if error else 0, r.err)
                self.assertEqual(list(r.json()["first_error_by_kind"].values()), [error] if error else [])


class Titles(unittest.TestCase):
    def test_the_title_caps_clients_by_the_requests_given_and_warm_up_failures_are_said(self):
        # helper-60: "(at most 256 at once)" came from the simulator's default request count
        calls = []

        def stream(handler, body):
            calls.append(1)
            if len(calls) == 1:
                return handler.reply(500, '{"error": {"message": "cold"}}')
            return paced(tokens=2)(handler, body)
        with FakeServer(stream) as server:      # (one client: the first request sent is the one that fails)
            r = run("loadgen", "--url", server.url, "--model", "m", "--concurrency", 1, "--requests", 2, "--warmup", 1,
                    "--no-size-prompts", "--scrape-interval", 100)
            self.assertEqual(r.code, 0, r.err)
            self.assertIn('the first 1 request sent is left out of every figure; 1 of them failed (the first: http '
                          '500: {"error": {"message": "cold"}})', r.out)
            r = run("loadgen", "--url", server.url, "--model", "m", "--concurrency", 3, "--requests", 2,
                    "--no-size-prompts", "--scrape-interval", 100)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("closed loop 3 clients (at most 2 at once: the requests)", r.out)


class Scrapes(unittest.TestCase):
    def test_a_scrape_that_stalls_mid_run_is_skipped_and_scraping_goes_on(self):
        # helper-60: the third scrape hung, and no scrape was tried after it, the last one included
        metrics = "vllm:num_requests_running 1\nvllm:generation_tokens_total {}\n"
        page = lambda n: Drip("x" * 100, every=5) if n == 1 else (200, metrics.format(100 * n), "text/plain")
        with FakeServer(paced(ttft=0.2, tokens=3), pages={"/metrics": page}) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 12, "--no-size-prompts",
                    "--timeout", 1, "--scrape-interval", 0.3, "--json")
        self.assertEqual(r.code, 0, r.err)
        window = r.json()["server"]
        self.assertNotIn("problem", window)
        self.assertGreaterEqual(window["scrapes"], 3)
        self.assertRegex(window["skipped_scrapes"], r"^1 scrape during the run failed and is missing from the peaks")


class NoSilence(unittest.TestCase):
    def test_a_long_request_and_a_slow_last_scrape_are_said_on_stderr(self):
        # helper-60: 12 s of one request with nothing on stderr; 15.8 s of final scrape and /props
        metrics = (200, "vllm:num_requests_running 1\n", "text/plain")
        page = lambda n: metrics if n == 0 else Drip("x" * 100, every=5)
        with FakeServer(paced(ttft=5.6, tokens=2), pages={"/metrics": page}) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--no-size-prompts",
                    "--timeout", 6, "--scrape-interval", 100)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("loadgen: 0 requests done, 0 failed, 1 in flight, 5.0 s", r.err)
        self.assertIn("loadgen: reading the server's last /metrics (up to 6 s, --timeout)", r.err)


class ReadWhereRead(unittest.TestCase):
    def test_prompts_counts_and_files_are_held_to_what_can_be(self):
        # helper-60: an empty prompt, a content of 5 and an empty role were all sent
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "p.jsonl")
            for row in ({"prompt": ""}, {"messages": [{"role": "user", "content": 5}]},
                        {"messages": [{"role": "", "content": None}]}):
                with self.subTest(row=row):
                    with open(path, "w") as f:
                        f.write(json.dumps(row) + "\n")
                    with self.assertRaises(main.UserError) as e:
                        main.read_prompts(path)
                    self.assertIn("each role and content not empty", str(e.exception))
        # a /metrics gauge of 10^14 requests waiting is no server's
        window = main.server_window([{"vllm:num_requests_waiting": 0.0}, {"vllm:num_requests_waiting": 1e14}])
        self.assertIsNone(window["peak_waiting"])
        self.assertIn("peak_waiting 1e+14", window["impossible"])
        # more clients than this process may open connections for: said before the run
        with self.assertRaises(main.UserError) as e:
            main.open_files(main.LoadConfig(concurrency=10**9, requests=10**9))
        self.assertIn("open files", str(e.exception))


class Duration(unittest.TestCase):
    def test_the_time_of_requests_that_failed_at_the_end_counts_in_the_duration(self):
        # helper-60: 6.6 s of run reported as "duration 0.61", 4.9 req/s; vllm bench serve divides
        # by the benchmark's whole time
        calls = []

        def stream(handler, body):
            calls.append(1)
            if len(calls) <= 2:
                return paced(ttft=0.05, tokens=2)(handler, body)
            handler.start_stream()
            handler.server.fake.stopping.wait(30)
        with FakeServer(stream) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 3, "--no-size-prompts",
                    "--timeout", 2, "--json", "--scrape-interval", 100)
        self.assertEqual(r.code, 1, r.err)
        report = r.json()
        self.assertEqual((report["completed"], report["failed"]), (2, 1))
        self.assertGreater(report["duration"], 2)
        self.assertAlmostEqual(report["request_throughput"], 2 / report["duration"])
        # helper-63: --detailed kept no failure's end, so merge (and compare) read the run as 0.6 s
        calls.clear()
        with FakeServer(stream) as server, tempfile.TemporaryDirectory() as tmp:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 3, "--no-size-prompts",
                    "--timeout", 2, "--detailed", "--scrape-interval", 100)
            path = os.path.join(tmp, "d.json")
            with open(path, "w") as f:
                f.write(r.out)
            merged = run("merge", path, "--json")
        self.assertEqual(merged.code, 1, merged.err)
        self.assertAlmostEqual(merged.json()["duration"], r.json()["duration"], delta=0.05)


if __name__ == "__main__":
    unittest.main()


class StatedRates(unittest.TestCase):
    def test_a_bench_file_without_start_times_is_measured_at_its_own_rates(self):
        # helper-60: "measured" 41.9 out tok/s, summed from the stand-in Poisson arrivals, where the
        # file says 257
        report = {"input_lens": [100] * 12, "output_lens": [50] * 12, "ttfts": [0.02] * 12,
                  "itls": [[0.005] * 49] * 12, "request_rate": 5, "output_throughput": 257.0, "duration": 2.3}
        measured = main.run_from_report(report, "b.json")
        self.assertEqual(measured.stated_rates["output_throughput"], 257.0)
        self.assertIsNone(measured.stated_rates["request_throughput"])
        rows = main.compare_run(measured, main.RunSpec())["rows"]
        self.assertEqual(rows["out tok/s"]["measured"], 257.0)
        with self.assertRaises(main.UserError):
            main.run_from_report({**report, "output_throughput": -1}, "b.json")


class MergedAgain(unittest.TestCase):
    def test_a_merged_report_merged_again_is_the_merge_of_all_its_runs(self):
        # helper-60: merge --detailed wrote no wall clock, so merged again its runs were put at 0
        # (or, with one, the gap between its runs counted as time measured)
        from helpers import call_cli

        def report(unix, perf, run_id):
            n = 4
            return {"input_lens": [100] * n, "output_lens": [20] * n, "ttfts": [0.05] * n,
                    "itls": [[0.01] * 19] * n, "start_times": [perf + 0.2 * i for i in range(n)],
                    "errors": [""] * n, "config": {"started_unix": unix, "started_perf": perf, "run_id": run_id}}
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for i, (unix, perf) in enumerate(((1.8e9, 100.0), (1.8e9 + 480, 580.0), (1.8e9 - 9, 91.0))):
                paths.append(os.path.join(tmp, f"{i}.json"))
                with open(paths[-1], "w") as f:
                    json.dump(report(unix, perf, f"run{i}"), f)
            code, out, err = call_cli("merge", paths[0], paths[1], "--detailed")
            self.assertEqual(code, 0, err)
            merged = os.path.join(tmp, "m.json")
            with open(merged, "w") as f:
                f.write(out)
            figures = []
            for inputs in ((merged, paths[2]), tuple(paths)):
                code, out, err = call_cli("merge", *inputs, "--json")
                self.assertEqual(code, 0, err)
                r = json.loads(out)
                figures.append((r["completed"], round(r["duration"], 9), round(r["output_throughput"], 6)))
            # helper-63: merged again with one of its own runs, that run was counted twice
            code, out, err = call_cli("merge", merged, paths[0])
            self.assertEqual(code, 2, err)
            self.assertIn("is the same run as", err)
        self.assertEqual(figures[0], figures[1])
        self.assertLess(figures[1][1], 5)       # three runs of under a second each, minutes apart


class BigPages(unittest.TestCase):
    def test_the_time_a_big_metrics_page_holds_the_client_counts_as_its_wake_delay(self):
        # helper-60: a 14.5 MiB page took ITL p99 from 22 to 167 ms, and the client line said
        # "worst wake delay 2.8 ms"
        page = "".join(f'vllm:some_series{{le="{i}"}} {i}\n' for i in range(200_000)).encode()

        class Stub:
            def get(self, path):
                return 200, page

            def redact(self, text):
                return text
        sampler = main.MetricsSampler(Stub(), 100)
        sampler.scrape()                    # before the run: no stream waits on it
        self.assertEqual(sampler.worst_wake_delay_s, 0.0)
        sampler.scrape(during=True)
        self.assertEqual(len(sampler.scrapes), 2)
        self.assertGreater(sampler.worst_wake_delay_s, 0.01)
        out = []
        main.print_server({"server": {}, "config": {}, "client": {"cpu_seconds": 0.1, "worst_wake_delay_ms": 90.0,
                                                    "finish_reasons": {}, "requests_without_usage": 0}}, out.append)
        self.assertIn("worst wake delay 90.0 ms (event times may be late by as much", "".join(out))


class Helper71(unittest.TestCase):
    """helper-71's hostile server: what a server sends is read as HTTP and SSE say, and every
    number it sends is held to what the client saw."""

    def loadgen(self, server, *flags):
        return run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--no-size-prompts", "--json",
                   "--scrape-interval", 100, *flags)

    def test_streams_as_http_and_sse_allow_them_are_read_right(self):
        events = [f"data: {json.dumps(chunk({'content': ' tok'}))}\n\n" for _ in range(3)] + \
            [f"data: {json.dumps(chunk(finish='length'))}\n\n", "data: [DONE]\n\n"]

        def headed(kind, first=""):
            def stream(handler, body):
                handler.wfile.write(first.encode())
                handler.send_response(200)
                handler.send_header("Content-Type", kind)
                handler.end_headers()
                for piece in events[:1] + ["data:\n\n", "data\n\n"] + events[1:]:    # keep-alives among events
                    handler.raw(piece)
            return stream
        for name, stream in (("mixed-case media type", headed("Text/Event-Stream; charset=UTF-8")),
                             ("103 Early Hints first", headed("text/event-stream",
                                                              "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")),
                             ("a byte-order mark", scripted("\ufeff" + events[0], *events[1:]))):
            with self.subTest(name), FakeServer(stream) as server:
                r = self.loadgen(server, "--detailed")
                self.assertEqual(r.code, 0, r.err)
                # every content event counted: the first token is the first event, not the second
                self.assertEqual(len(r.json()["itls"][0]), 2, name)

        def broken_chunks(handler, body):
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            handler.raw(b"zz\r\ngarbage\r\n")
        with FakeServer(broken_chunks) as server:
            r = self.loadgen(server)
        self.assertEqual(r.code, 1, r.err)
        self.assertEqual(list(r.json()["first_error_by_kind"].values()),
                         ["truncated: the body's chunked transfer encoding broke off"])

    def test_usage_and_timings_past_what_was_sent_or_streamed_are_left_out(self):
        timings = {"prompt_ms": 5000.0, "prompt_n": 999999999, "cache_n": 999999999, "predicted_n": 5}
        stream = paced(ttft=0.02, tokens=5, prompt=99_999_999, completion_tokens=64, timings=timings)
        with FakeServer(stream) as server:
            r = self.loadgen(server, "--max-tokens", 64)
        self.assertEqual(r.code, 0, r.err)
        report = r.json()
        self.assertEqual(report["total_output_tokens"], 5)           # 5 events of " tok": 20 bytes, not 64 tokens
        self.assertLess(report["total_input_tokens"], 1000)         # the words sent, not 99,999,999
        said = json.dumps(report)
        for name in ("usage.completion_tokens", "usage.prompt_tokens", "timings.prompt_ms", "timings.prompt_n",
                     "timings.cache_n"):
            self.assertIn(name, said)
        self.assertIsNone(report["timings"]["prompt_ms"]["p50"])
        # helper-73: with ignore_eos the tokens after an end stream no text, so the count stands
        with FakeServer(paced(ttft=0.02, tokens=5, completion_tokens=64)) as server:
            r = self.loadgen(server, "--max-tokens", 64, "--ignore-eos")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(r.json()["total_output_tokens"], 64)

    def test_scrapes_cut_short_restarted_or_impossible_are_not_believed(self):
        def cut(handler):
            handler.send_response(200)
            handler.send_header("Content-Type", "text/plain")
            handler.send_header("Content-Length", "500")
            handler.end_headers()
            handler.wfile.write(b"vllm:generation_tokens_total 12")
        with FakeServer(paced(), pages={"/metrics": lambda n: (200, "vllm:num_requests_running 1\n", "text/plain")}) \
                as server:
            server.httpd.RequestHandlerClass = type("H", (server.httpd.RequestHandlerClass,), {
                "do_GET": lambda handler: cut(handler)})
            client = main.Http(server.url, 5, None)
            with self.assertRaisesRegex(main.http.client.HTTPException,
                                        r"^/metrics was cut short: the connection closed after 31 of its 500 bytes$"):
                client.get("/metrics")
        # a counter that fell between two scrapes, then climbed past its first value: a restart
        window = main.server_window([{"vllm:generation_tokens_total": v} for v in (1000, 1500, 0, 300, 1100)])
        self.assertIsNone(window["generated_tokens"])
        self.assertIn("went down between two scrapes", window["went_down"])
        # a mean of 1,000 busy slots over one decode call of 2 tokens
        window = main.server_window([
            {"llamacpp:n_decode_total": 1000, "llamacpp:n_busy_slots_per_decode": 1.0,
             "llamacpp:prompt_tokens_total": 0, "llamacpp:tokens_predicted_total": 1000},
            {"llamacpp:n_decode_total": 1001, "llamacpp:n_busy_slots_per_decode": 1000.0,
             "llamacpp:prompt_tokens_total": 0, "llamacpp:tokens_predicted_total": 1002}])
        self.assertIsNone(window["mean_batch_per_decode"])
        self.assertIn("mean_batch_per_decode", window["impossible"])
        # one series with its labels in another order is one series, not two to add
        ignored = main.Counter()
        page = main.parse_prometheus('llamacpp:requests_processing{slot="0",server="a"} 2\n'
                                     'llamacpp:requests_processing{server="a",slot="0"} 2\n', ignored)
        self.assertEqual(page["llamacpp:requests_processing"], 2)
        self.assertEqual(list(ignored), ["llamacpp:requests_processing given twice"])

    def test_a_scrape_explain_reads_holds_whole_counts(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "m.txt")
            with open(path, "w") as f:
                f.write("vllm:num_requests_running 3\nvllm:num_requests_waiting 2.5\nvllm:num_preemptions_total 0.3\n"
                        "vllm:request_queue_time_seconds_sum 1\nvllm:request_queue_time_seconds_count 1e-300\n"
                        "vllm:time_to_first_token_seconds_sum 10\nvllm:time_to_first_token_seconds_count 1\n")
            r = run("explain", path, "--json")
        self.assertEqual(r.code, 0, r.err)
        e = r.json()[0]
        self.assertNotIn("kv-bound", e["symptom"])                  # 0.3 preemptions is no preemption count
        self.assertIsNone(e["phases_ms"]["queue"])
        self.assertRegex(r.err, r"left out 3 sample\(s\)")

    def test_a_short_key_is_hidden_where_it_stands_alone_not_inside_every_word(self):
        self.assertEqual(main.hide_pieces('{"error":{"message":"bad key e"}}', ["e"]), '{"error":{"message":"bad key ***"}}')
        self.assertEqual(main.hide_pieces("key=test rejected; latest", ["test"]), "key=*** rejected; latest")

    def test_odd_models_lists_compressed_pages_and_a_body_never_read_say_what_they_are(self):
        for models, said in (({"data": {"id": "m"}}, "its answer is not an object whose data lists models"),
                             ([{"id": "m"}], "its answer is not an object whose data lists models"),
                             ({"data": [{"id": 5}]}, "its first model id is 5")):
            with self.subTest(models=models), FakeServer(paced(), models=models) as server:
                r = run("loadgen", "--url", server.url, "--requests", 1, "--no-size-prompts")
                self.assertEqual(r.code, 1, r.err)
                self.assertIn(said, r.err)

        def gzipped(handler):
            handler.send_response(200)
            handler.send_header("Content-Type", "text/plain")
            handler.send_header("Content-Encoding", "gzip")
            handler.send_header("Content-Length", "4")
            handler.end_headers()
            handler.wfile.write(b"\x1f\x8b\x08\x00")
        with FakeServer(paced()) as server:
            server.httpd.RequestHandlerClass = type("H", (server.httpd.RequestHandlerClass,), {"do_GET": gzipped})
            with self.assertRaisesRegex(main.http.client.HTTPException, r"^/metrics is compressed \(Content-Encoding "
                                        r"gzip\), which servesim did not ask for$"):
                main.Http(server.url, 5, None).get("/metrics")

        def never_reads(handler):
            time.sleep(30)
        with FakeServer(paced()) as server:
            server.httpd.RequestHandlerClass = type("H", (server.httpd.RequestHandlerClass,), {"do_POST": never_reads})
            r = self.loadgen(server, "--prompt-tokens", 1_000_000, "--timeout", 20, "--request-timeout", 2)
        self.assertEqual(r.code, 1, r.err)
        self.assertLess(r.took, 12)      # the request ended at its 2 s, not at --timeout's 20
        self.assertEqual(list(r.json()["first_error_by_kind"].values()),
                         ["timeout: no answer within 2 s (--request-timeout)"])

    def test_a_second_choice_and_text_after_the_end_are_no_tokens_of_the_answer(self):
        tok = chunk({"content": " tok"})
        other = {**tok, "choices": [{**tok["choices"][0], "index": 1}]}
        events = [tok, other, tok, chunk(finish="length"), tok]
        stream = scripted(*[f"data: {json.dumps(e)}\n\n" for e in events], "data: [DONE]\n\n")
        with FakeServer(stream) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--no-size-prompts", "--detailed",
                    "--json", "--scrape-interval", 100)
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(len(r.json()["itls"][0]), 1)          # two tokens of the first choice, before its end
        self.assertIn("only the first was counted", r.out)
        self.assertIn("text after its finish_reason: not counted", r.out)

    def test_a_reply_of_megabytes_is_not_sent_back_whole_in_the_next_turn(self):
        big = [f"data: {json.dumps(chunk({'content': 'x' * 100_000}))}\n\n" for _ in range(3)]
        stream = scripted(*big, f"data: {json.dumps(chunk(finish='length'))}\n\n", "data: [DONE]\n\n")
        with FakeServer(stream) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 2, "--turns", 2, "--no-size-prompts",
                    "--max-tokens", 16, "--think-time", 0, "--json", "--scrape-interval", 100)
            self.assertEqual(r.code, 0, r.err)
            later = [b for b in server.bodies if len(b["messages"]) > 1]
        self.assertTrue(later)
        self.assertEqual(len(later[0]["messages"][-2]["content"]), 64 * 16)
        self.assertIn("the reply's 300,000 characters are more than 16 tokens hold", r.out)

    def test_a_truncated_or_empty_report_is_said_in_plain_words(self):
        # helper-71: "Unterminated string starting at at column 7"; /dev/null as "Expecting value"
        with self.assertRaisesRegex(main.UserError, r"^r: not valid JSON \(Unterminated string starting at column 7\); "
                                                    r"x$"):
            main.parse_json('{"a": "b', "r", "x")
        with self.assertRaisesRegex(main.UserError, r"^r: empty; x$"):
            main.parse_json(" \n", "r", "x")
