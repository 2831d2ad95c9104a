"""loadgen against a scripted in-process server: timing, stream formats, failures, /metrics."""
import json
import os
import socket
import shutil
import tempfile
import threading
import time
import unittest

from fake_server import FakeServer, chunk, data, paced, scripted, usage
from helpers import call_cli, main, run_cli

LLAMA_BEFORE = """# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 100
llamacpp:n_busy_slots_per_decode 1.5
llamacpp:prompt_tokens_total 1000
llamacpp:tokens_predicted_total 500
llamacpp:requests_processing 0
llamacpp:requests_deferred 0
"""
LLAMA_DURING = LLAMA_BEFORE.replace("requests_processing 0", "requests_processing 4").replace(
    "requests_deferred 0", "requests_deferred 3")
# 300 more decodes; running mean moves from 1.5 to 3.0: window mean = (3.0*400 - 1.5*100) / 300 = 3.5
LLAMA_AFTER = """llamacpp:n_decode_total 400
llamacpp:n_busy_slots_per_decode 3.0
llamacpp:prompt_tokens_total 1600
llamacpp:tokens_predicted_total 1100
llamacpp:requests_processing 0
llamacpp:requests_deferred 0
"""

VLLM_BEFORE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
vllm:num_requests_running{engine="1",model_name="m"} 0.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 50.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="0",model_name="m"} 10.0
vllm:generation_tokens_total{engine="1",model_name="m"} 10.0
"""
VLLM_AFTER = """vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 90.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.9
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 3000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1100.0
vllm:generation_tokens_total{engine="0",model_name="m"} 60.0
vllm:generation_tokens_total{engine="1",model_name="m"} 60.0
"""


def loadgen(server, *args, key=None, own_process=False):
    """loadgen --json against a scripted server. Timing tests run it in its own process, as a user
    does: in this one its threads would share the interpreter with the server's."""
    env = {"OPENAI_API_KEY": ""} if key is None else {"OPENAI_API_KEY": key}
    run = run_cli if own_process else call_cli
    code, out, err = run("loadgen", "--url", server.url, "--json", *args, env=env)
    try:
        return code, json.loads(out), err
    except ValueError:
        raise AssertionError(f"not JSON (exit {code}): {out[:300]} {err[:300]}") from None


class Timing(unittest.TestCase):
    def check_pace(self, concurrency):
        """Against the times the server really wrote each event: perf_counter is the system's
        monotonic clock, the same in the server (this process) and loadgen (a subprocess)."""
        with FakeServer(paced(ttft=0.1, gap=0.02, tokens=10)) as server:
            # At least five requests, so the median error below is a median (of two it was the worse
            # one, which one late wake-up on this shared machine could push over the bound).
            requests = max(5, concurrency * 2)
            code, r, err = loadgen(server, "--concurrency", concurrency, "--requests", requests,
                                   "--max-tokens", 10, "--detailed", "--no-size-prompts", own_process=True)
            log = server.log
        self.assertEqual(code, 0, err)
        self.assertEqual(r["completed"], requests)
        truth = {int(entry["prompt"].split()[0].split("-")[1]): entry for entry in log}
        ttft_error, tpot_error, itl_error = [], [], []
        for index, (start, ttft, itls) in enumerate(zip(r["start_times"], r["ttfts"], r["itls"])):
            written, received = truth[index]["written"], truth[index]["received"]
            self.assertLess(start, received)                 # the send is stamped before it leaves
            # The first token's arrival stamp against the moment the server wrote it.
            ttft_error.append(abs(start + ttft - written[0]) * 1000)
            tpot_error.append(abs(sum(itls) / 9 - (written[-1] - written[0]) / 9) * 1000)
            gaps = [b - a for a, b in zip(written, written[1:])]
            itl_error += [abs(x - y) * 1000 for x, y in zip(itls, gaps)]
        for name, errors in (("ttft", ttft_error), ("tpot", tpot_error), ("itl", itl_error)):
            errors.sort()
            self.assertLess(errors[len(errors) // 2], 2.0, (name, errors))
        # And the pace itself comes through. A sleep never ends early but can end late on a busy
        # machine, so these bounds are one-sided with room above.
        self.assertTrue(100 <= r["median_ttft_ms"] < 150, r["median_ttft_ms"])
        self.assertTrue(20 <= r["median_itl_ms"] < 30, r["median_itl_ms"])

    def test_known_pace_is_recovered_at_concurrency_1(self):
        self.check_pace(1)

    def test_known_pace_is_recovered_at_concurrency_16(self):
        self.check_pace(16)

    def test_the_role_only_first_chunk_does_not_count_as_the_first_token(self):
        stream = scripted(data(chunk({"role": "assistant", "content": None})), data(chunk({"role": "assistant", "content": ""})),
                          0.2, data(chunk({"content": "a"})), 0.05, data(chunk({"content": "b"})),
                          data(chunk(finish="stop")), data(usage(5, 2)), "data: [DONE]\n\n")
        with FakeServer(stream) as server:
            code, r, _ = loadgen(server, "--requests", 1, own_process=True)
        self.assertEqual(code, 0)
        self.assertTrue(200 <= r["mean_ttft_ms"] < 250, r["mean_ttft_ms"])

    def test_reasoning_content_counts_as_a_token(self):
        with FakeServer(paced(ttft=0.05, gap=0.01, tokens=4, field="reasoning_content")) as server:
            code, r, _ = loadgen(server, "--requests", 1, own_process=True)
        self.assertEqual(code, 0)
        self.assertTrue(50 <= r["mean_ttft_ms"] < 100, r["mean_ttft_ms"])

    def test_tpot_divides_by_usage_tokens_when_chunks_carry_several(self):
        with FakeServer(paced(ttft=0.02, gap=0.06, tokens=10, per_event=5)) as server:
            code, r, _ = loadgen(server, "--requests", 1, "--max-tokens", 10, own_process=True)
        self.assertEqual(code, 0)
        self.assertEqual(r["total_output_tokens"], 10)
        # 60 ms between the two events, over 9 gaps between tokens: not 60 / 1. (On a loaded machine
        # the client can read the first event late and the second at once: the gap then measures a
        # little under 60 ms, 58.2 in one CI run.)
        self.assertTrue(40 / 9 <= r["mean_tpot_ms"] < 90 / 9, r["mean_tpot_ms"])
        self.assertTrue(40 <= r["mean_itl_ms"] < 90, r["mean_itl_ms"])

    def test_keep_alive_comments_crlf_lines_and_chunked_encoding(self):
        stream = scripted(": keep-alive\r\n\r\n", data(chunk({"content": "a"}), "\r\n"), ": ping\r\n\r\n",
                          data(chunk({"content": "b"}), "\r\n"), data(chunk(finish="stop"), "\r\n"),
                          data(usage(3, 2), "\r\n"), "data: [DONE]\r\n\r\n")
        with FakeServer(stream, chunked=True) as server:
            code, r, err = loadgen(server, "--requests", 2)
        self.assertEqual(code, 0, err)
        self.assertEqual((r["completed"], r["total_output_tokens"]), (2, 4))


class Failures(unittest.TestCase):
    def assert_failed(self, stream, kind, *args):
        with FakeServer(stream) as server:
            code, r, err = loadgen(server, "--requests", 2, *args)
        self.assertEqual(code, 1, err)
        self.assertEqual(r["failed"], 2)
        self.assertEqual(r["completed"], 0)
        self.assertEqual(list(r["errors_by_kind"]), [kind])
        return r

    def test_a_stream_cut_before_done_is_an_error_not_a_short_answer(self):
        self.assert_failed(scripted(data(chunk({"content": "a"})), data(chunk(finish="stop")), data(usage(3, 1))), "truncated")

    def test_a_stream_without_finish_reason_is_truncated(self):
        self.assert_failed(scripted(data(chunk({"content": "a"})), "data: [DONE]\n\n"), "truncated")

    def test_an_in_band_error_event(self):
        r = self.assert_failed(scripted(data(chunk({"content": "a"})), data({"error": {"message": "out of memory", "code": 500}})),
                               "server error in stream")
        self.assertEqual(r["total_output_tokens"], 0)

    def test_llama_cpp_error_field(self):
        self.assert_failed(scripted('error: {"code": 500, "message": "boom"}\n\n'), "server error in stream")

    def test_http_400_and_503_keep_the_status_and_body(self):
        for status in (400, 503):
            body = json.dumps({"error": {"message": "the request exceeds the available context size"}})
            with FakeServer(scripted(body, status=status)) as server:
                code, r, _ = loadgen(server, "--requests", 2, "--detailed")
            self.assertEqual(code, 1)
            self.assertEqual(list(r["errors_by_kind"]), [f"http {status}"])
            self.assertIn("exceeds the available context size", r["errors"][0])

    def test_a_server_that_stalls_past_the_timeout(self):
        self.assert_failed(scripted(data(chunk({"content": "a"})), 1.5, data(chunk({"content": "b"}))), "timeout",
                           "--timeout", "0.3")

    def test_garbage_lines_are_ignored_but_a_garbage_event_fails_the_request(self):
        ok = scripted("hello there\n", "xyz: 12\n\n", data(chunk({"content": "a"})), data(chunk(finish="stop")),
                      data(usage(2, 1)), "data: [DONE]\n\n")
        with FakeServer(ok) as server:
            code, r, _ = loadgen(server, "--requests", 1)
        self.assertEqual((code, r["completed"]), (0, 1))
        self.assert_failed(scripted(data(chunk({"content": "a"})), "data: {not json\n\n"), "bad stream")

    def test_an_answer_with_no_content_is_empty(self):
        self.assert_failed(scripted(data(chunk(finish="stop")), data(usage(2, 0)), "data: [DONE]\n\n"), "empty answer")

    def test_failures_are_kept_apart_from_successes(self):
        calls = []

        def every_other(handler, body):
            calls.append(1)
            (paced(tokens=3) if len(calls) % 2 else scripted("{}", status=503))(handler, body)
        with FakeServer(every_other) as server:
            code, r, _ = loadgen(server, "--requests", 6)
        self.assertEqual(code, 1)
        self.assertEqual((r["completed"], r["failed"]), (3, 3))
        self.assertEqual(r["total_output_tokens"], 9)

    def test_a_refused_port_exits_1_with_one_line(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        code, out, err = run_cli("loadgen", "--url", f"http://127.0.0.1:{port}", "--requests", "2")
        self.assertEqual(code, 1)
        self.assertEqual(out, "")
        self.assertEqual(len(err.strip().splitlines()), 1)
        self.assertIn("connection refused", err)
        self.assertNotIn("Traceback", err)


class ServerMetrics(unittest.TestCase):
    def test_llama_cpp_window_mean_batch_from_the_lessons_formula(self):
        w = main.server_window([main.parse_prometheus(t) for t in (LLAMA_BEFORE, LLAMA_DURING, LLAMA_AFTER)])
        self.assertEqual(w["server"], "llama.cpp")
        self.assertAlmostEqual(w["mean_batch_per_decode"], 3.5)
        self.assertEqual(w["decode_calls"], 300)
        self.assertAlmostEqual(w["tokens_per_decode"], (600 + 600) / 300)
        self.assertEqual((w["peak_requests_processing"], w["peak_requests_deferred"]), (4, 3))
        self.assertEqual(w["generated_tokens"], 600)

    def test_vllm_label_sets_are_summed_and_names_matched_exactly(self):
        w = main.server_window([main.parse_prometheus(t) for t in (VLLM_BEFORE, VLLM_AFTER)])
        self.assertEqual(w["server"], "vllm")
        self.assertEqual(w["peak_running"], 7)          # two engines summed
        self.assertEqual(w["peak_waiting"], 2)          # not the _by_reason series
        self.assertEqual(w["preemptions"], 5)           # _created ignored
        self.assertAlmostEqual(w["prefix_hit_rate"], 0.5)
        self.assertAlmostEqual(w["peak_kv_cache_usage"], 0.9)
        self.assertEqual(w["generated_tokens"], 100)

    def test_sglang_names(self):
        before = "sglang:num_running_reqs{model_name=\"m\"} 0\nsglang:generation_tokens_total{model_name=\"m\"} 5\n"
        after = "sglang:num_running_reqs{model_name=\"m\"} 6\nsglang:num_queue_reqs{model_name=\"m\"} 2\n" \
                "sglang:token_usage{model_name=\"m\"} 0.4\nsglang:generation_tokens_total{model_name=\"m\"} 25\n"
        w = main.server_window([main.parse_prometheus(before), main.parse_prometheus(after)])
        self.assertEqual((w["server"], w["peak_running"], w["peak_queued"], w["generated_tokens"]), ("sglang", 6, 2, 20))

    def test_end_to_end_scrapes_before_during_after_and_cross_checks_tokens(self):
        texts = [LLAMA_BEFORE, LLAMA_DURING]
        with FakeServer(paced(ttft=0.05, gap=0.05, tokens=10), metrics=lambda n: texts[n] if n < 2 else LLAMA_AFTER) as server:
            code, r, _ = loadgen(server, "--requests", 3, "--max-tokens", 10, "--scrape-interval", "0.2")
            scrapes = len(server.scrapes)
        self.assertEqual(code, 0)
        self.assertGreaterEqual(scrapes, 3)
        self.assertAlmostEqual(r["server"]["mean_batch_per_decode"], 3.5)
        self.assertEqual(r["server"]["client_output_tokens"], 30)
        self.assertEqual(r["server"]["client_minus_server_tokens"], 30 - 600)

    def test_vllms_cache_config_is_kept_as_the_servers_shape_and_compare_simulates_it(self):
        info = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
                'engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="2048"} 1.0\n')
        with FakeServer(paced(tokens=4), metrics=VLLM_AFTER + info) as server:
            code, r, err = loadgen(server, "--requests", 3, "--max-tokens", 4, "--detailed")
        self.assertEqual(code, 0, err)
        self.assertEqual(r["server"]["shape"], {"kv_tokens": 32768, "block_size": 16, "prefix_caching": True,
                                                "source": "vLLM vllm:cache_config_info"})
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.json")
            with open(path, "w") as f:
                json.dump(r, f)
            code, out, err = call_cli("compare", path, "--hardware", "l4-24gb", "--model", "llama-3.1-8b", "--json")
        self.assertEqual(code, 0, err)
        self.assertIn("from vLLM vllm:cache_config_info: 32,768 KV tokens, 16-token blocks, prefix caching on", err)
        self.assertEqual(json.loads(out)["servesim"]["config"]["kv_tokens"], 32768)
        # The cache was that deployment's: a what-if on another drops it.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.json")
            with open(path, "w") as f:
                json.dump(r, f)
            code, out, err = call_cli("compare", path, "--hardware", "l4-24gb", "--model", "llama-3.1-8b",
                                      "--gpu-memory-utilization", "0.8", "--json")
        self.assertEqual(code, 0, err)
        self.assertNotEqual(json.loads(out)["servesim"]["config"]["kv_tokens"], 32768)

    def test_simulated_requests_that_fail_on_the_servers_shape_are_said_beside_the_figures(self):
        info = 'vllm:cache_config_info{block_size="8",enable_prefix_caching="False",num_gpu_blocks="1"} 1.0\n'
        with FakeServer(paced(tokens=4), metrics=info) as server:
            code, r, err = loadgen(server, "--requests", 3, "--max-tokens", 4, "--simulate", "h100-sxm-80gb",
                                   "llama-3.1-8b")
        self.assertEqual(code, 0, err)
        self.assertIn("3 of 3 simulated requests failed", r["side_by_side"]["title"])

    def test_the_simulation_beside_the_run_takes_the_servers_engine(self):
        info = 'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_gpu_blocks="2048"} 1.0\n'
        with FakeServer(paced(tokens=4), metrics=info) as server:
            # --model is loadgen's (the served model's name), not a simulator preset, engine or not.
            code, r, err = loadgen(server, "--requests", 3, "--max-tokens", 4, "--model", "served-name",
                                   "--simulate", "h100-sxm-80gb", "llama-3.1-8b", "--engine", "trtllm")
        self.assertEqual(code, 0, err)
        side = r["side_by_side"]
        self.assertIn("llama-3.1-8b, trtllm, 2048 seqs", side["title"])
        config = side["servesim"]["config"]
        # The engine's rules and its defaults for what the server did not say; the server's own cache kept.
        self.assertEqual((config["engine"], config["cost_model"], config["chunked_prefill"]), ("trtllm", "roofline", False))
        self.assertEqual(config["kv_tokens"], 2048 * 16)

    def test_a_simulation_setting_without_simulate_or_a_bad_engine_costs_no_request(self):
        with FakeServer(paced(tokens=2)) as server:
            code, _, err = run_cli("loadgen", "--url", server.url, "--requests", 2, "--engine", "trtllm")
            self.assertEqual(code, 2)
            self.assertIn("--engine sets up the simulation beside the run: add --simulate HARDWARE MODEL", err)
            code, _, err = run_cli("loadgen", "--url", server.url, "--requests", 2, "--simulate", "h100-sxm-80gb",
                                   "llama-3.1-8b", "--engine", "tgi")
            self.assertEqual(code, 2)
            self.assertIn("tgi", err)
            # A model that cannot fit on the simulated device is a simulation that cannot run: exit 1, unsent.
            code, _, err = run_cli("loadgen", "--url", server.url, "--requests", 2, "--simulate", "l4-24gb",
                                   "llama-3.1-70b")
            self.assertEqual(code, 1)
            self.assertIn("weights (141.2 GB) do not fit in one l4-24gb", err)
            self.assertEqual(server.bodies, [])

    def test_a_cache_config_that_is_no_cache_leaves_the_shape_unknown_and_says_why(self):
        for labels in ('block_size="16",num_gpu_blocks="lots",enable_prefix_caching="True"',
                       'block_size="0",num_gpu_blocks="10",enable_prefix_caching="False"',
                       'block_size="16",num_gpu_blocks="10"',
                       'block_size="16",num_gpu_blocks="2_7997",enable_prefix_caching="True"',
                       'block_size="16",num_gpu_blocks="10",enable_prefix_caching="True"} 1.0\n'
                       'vllm:cache_config_info{block_size="16",num_gpu_blocks="20",enable_prefix_caching="True"'):
            with FakeServer(paced(tokens=2), metrics=f"vllm:cache_config_info{{{labels}}} 1.0\n") as server:
                code, r, err = loadgen(server, "--requests", 1, "--max-tokens", 2)
            self.assertEqual(code, 0, err)
            self.assertIn("simulator defaults", r["server"]["shape"]["unknown"], labels)

    def test_no_metrics_endpoint_is_reported_once_and_the_run_goes_on(self):
        with FakeServer(paced(tokens=3)) as server:
            code, out, err = run_cli("loadgen", "--url", server.url, "--requests", "2")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count("/metrics answered HTTP 404"), 1)
        self.assertIn("2 completed", out)

    def test_llama_cpp_timings_are_summarised(self):
        timings = {"prompt_n": 12, "prompt_ms": 40.0, "cache_n": 3, "predicted_n": 5, "predicted_per_token_ms": 10.0}
        with FakeServer(paced(ttft=0.1, tokens=5, timings=timings)) as server:
            code, r, _ = loadgen(server, "--requests", 2, own_process=True)
        self.assertEqual(code, 0)
        self.assertEqual(r["timings"]["cache_n"], 6)
        self.assertAlmostEqual(r["timings"]["prompt_ms"]["p50"], 40.0)
        self.assertTrue(60 <= r["timings"]["ttft_minus_prompt_ms"]["p50"] < 110)


class Requests(unittest.TestCase):
    def test_the_request_body_asks_for_a_stream_with_usage_and_ignore_eos(self):
        with FakeServer(paced(tokens=2)) as server:
            loadgen(server, "--requests", 3, "--max-tokens", 7, "--ignore-eos", "--prefix-tokens", 20)
            probes = [b for b in server.bodies if b["max_tokens"] == 1]
            bodies = [b for b in server.bodies if b["max_tokens"] != 1]
        # Two probes first, to size prompts in tokens; this server's usage is constant, so it cannot.
        self.assertEqual(len(probes), 2)
        body = bodies[0]
        self.assertEqual(body["model"], "fake-model")          # the first id of /v1/models
        self.assertTrue(body["stream"])
        self.assertEqual(body["stream_options"], {"include_usage": True})
        self.assertEqual((body["max_tokens"], body["ignore_eos"]), (7, True))
        users = [b["messages"][-1]["content"] for b in bodies]
        systems = [b["messages"][0]["content"] for b in bodies]
        self.assertEqual(len(set(users)), 3)                    # distinct prompts
        self.assertEqual(len(set(systems)), 1)                  # one shared prefix, on purpose
        self.assertEqual(len(systems[0].split()), 20)

    def test_each_run_sends_prompts_no_earlier_run_sent(self):
        with FakeServer(paced(tokens=2)) as server:
            loadgen(server, "--requests", 2)
            loadgen(server, "--requests", 2)
            users = [b["messages"][-1]["content"] for b in server.bodies if b["max_tokens"] != 1]   # not the probes
        self.assertEqual(len(set(users)), 4)

    def test_the_api_key_is_sent_but_never_printed(self):
        key = "sk-secret-1234567890"
        with FakeServer(scripted("{}", status=401)) as server:
            code, out, err = run_cli("loadgen", "--url", server.url, "--requests", "1", "--json", "--detailed",
                                     env={"OPENAI_API_KEY": key})
            code2, out2, err2 = run_cli("loadgen", "--url", server.url, "--requests", "1", "--api-key", key)
            headers = server.headers
        self.assertEqual(headers[0]["Authorization"], f"Bearer {key}")
        for text in (out, err, out2, err2):
            self.assertNotIn(key, text)

    def test_prompts_file_is_used_in_turn_and_bad_lines_exit_2(self):
        with tempfile.TemporaryDirectory() as tmp:
            good = os.path.join(tmp, "p.jsonl")
            with open(good, "w") as f:
                f.write('{"prompt": "hello"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
            bad = os.path.join(tmp, "q.jsonl")
            with open(bad, "w") as f:
                f.write('{"prompt": "hello"}\n{"text": 3}\n')
            with FakeServer(paced(tokens=2)) as server:
                code, r, _ = loadgen(server, "--requests", 3, "--prompts", good)
                contents = [b["messages"][-1]["content"] for b in server.bodies]
            code2, out2, err2 = run_cli("loadgen", "--url", "http://127.0.0.1:9", "--prompts", bad)
        self.assertEqual(code, 0)
        self.assertEqual(sorted(contents), ["hello", "hello", "hi"])
        self.assertEqual(code2, 2)
        self.assertIn("line 2", err2)

    def test_duration_stops_sending_and_lets_requests_in_flight_finish(self):
        with FakeServer(paced(ttft=0.2, gap=0.05, tokens=3)) as server:
            code, r, _ = loadgen(server, "--concurrency", 2, "--duration", "0.5")
        self.assertEqual(code, 0)
        self.assertEqual(r["failed"], 0)
        self.assertTrue(2 <= r["completed"] <= 6, r["completed"])

    def test_rate_is_open_loop_and_capped_by_concurrency(self):
        with FakeServer(paced(ttft=0.3, gap=0.01, tokens=2)) as server:
            code, r, _ = loadgen(server, "--rate", 50, "--concurrency", 2, "--requests", 6, "--detailed")
        self.assertEqual(code, 0)
        starts = sorted(r["start_times"])
        # Two in flight at a time, each ~0.31 s: the 6 sends spread over about three rounds.
        self.assertGreater(starts[-1] - starts[0], 0.55)


class ManyMachines(unittest.TestCase):
    """loadgen --shard K/N --start-at T: N machines send one schedule between them; merge joins them."""

    def shards(self, server, count, *args):
        """The N shards run at once, each in its own process as on its own machine."""
        start = f"{time.time() + 4:.3f}"       # time for three interpreters to start and probe
        reports = {}
        def one(k):
            reports[k] = run_cli("loadgen", "--url", server.url, "--detailed", "--shard", f"{k}/{count}",
                                 "--start-at", start, *args, env={"OPENAI_API_KEY": ""})
        threads = [threading.Thread(target=one, args=(k,)) for k in range(1, count + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, (code, out, err) in reports.items():
            self.assertEqual(code, 0, err[-400:])
        return {k: json.loads(out) for k, (_, out, _) in reports.items()}, float(start)

    def write(self, name, report):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            json.dump(report, f)
        return path

    @staticmethod
    def offsets(report):
        at = report["config"]["started_perf"]
        return {i: t - at for i, t in zip(report["indices"], report["scheduled_times"])}

    def test_three_shards_send_exactly_the_one_machine_schedule_and_merge_into_one_run(self):
        load = ("--rate", 40, "--requests", 24, "--seed", 3, "--no-size-prompts", "--max-tokens", 3)
        with FakeServer(paced(ttft=0.01, gap=0.005, tokens=3)) as server:
            code, whole, _ = loadgen(server, "--detailed", *load)
            self.assertEqual(code, 0)
            shards, start = self.shards(server, 3, *load)
            bodies = server.bodies[24:]
        one = self.offsets(whole)
        self.assertEqual(sorted(one), list(range(24)))
        seen = {}
        for k, report in shards.items():
            mine = self.offsets(report)
            self.assertEqual(sorted(mine), [i for i in range(24) if i % 3 == k - 1])   # every third, from the k-th
            self.assertFalse(set(mine) & set(seen))
            seen.update(mine)
            self.assertGreaterEqual(report["config"]["started_unix"], start)
        self.assertEqual(sorted(seen), list(range(24)))
        for i in range(24):       # each at the time the one machine drew for it
            self.assertAlmostEqual(seen[i], one[i], places=6)
        prompts = [b["messages"][-1]["content"] for b in bodies]
        self.assertEqual(len(prompts), 24)
        self.assertEqual(len(set(prompts)), 24)        # no request sent twice
        paths = []
        for k, report in shards.items():
            path = os.path.join(self.tmp, f"shard{k}.json")
            with open(path, "w") as f:
                json.dump(report, f)
            paths.append(path)
        code, out, err = call_cli("merge", *paths, "--json")
        merged = json.loads(out)
        self.assertEqual(code, 0, err)
        self.assertEqual(merged["completed"], 24)
        machines = merged["config"]["machines"]
        self.assertEqual((machines["present"], machines["missing"], machines["requests"]), ([1, 2, 3], [], 24))
        self.assertLess(machines["start_spread_ms"], 1000)
        self.assertIsNotNone(machines["clocks_apart_at_most_s"])     # http.server sends a Date header

    def two_shards(self):
        """Two shards of one small run, and the paths of their reports."""
        with FakeServer(paced(ttft=0.01, gap=0.005, tokens=2)) as server:
            shards, _ = self.shards(server, 2, "--rate", 40, "--requests", 8, "--no-size-prompts", "--max-tokens", 2)
        return shards, self.write("a.json", shards[1]), self.write("b.json", shards[2])

    def test_merge_refuses_a_shard_twice_or_of_another_run_and_says_which_is_missing(self):
        shards, first, second = self.two_shards()
        write = self.write
        code, _, err = call_cli("merge", first, first)
        self.assertEqual(code, 2)
        twice = write("c.json", {**shards[2], "config": {**shards[2]["config"], "shard": [1, 2]}})
        code, _, err = call_cli("merge", first, twice)
        self.assertEqual(code, 2)
        self.assertIn("both shard 1/2", err)
        other = write("d.json", {**shards[2], "config": {**shards[2]["config"], "schedule": "0" * 16}})
        code, _, err = call_cli("merge", first, other)
        self.assertEqual(code, 2)
        self.assertIn("another run", err)
        code, out, err = call_cli("merge", second, "--json")
        self.assertEqual(code, 0, err)
        self.assertIn("shard 1/2 is missing", err)
        self.assertEqual(json.loads(out)["config"]["machines"]["missing"], [1])
        lost = write("e.json", {k: v for k, v in shards[1].items() if k != "indices"})
        code, _, err = call_cli("merge", lost, second)
        self.assertEqual(code, 2)
        self.assertIn("indices", err)

    def test_reports_with_a_clock_offset_are_read_back_by_explain_and_calibrate(self):
        with FakeServer(paced(ttft=0.01, gap=0.005, tokens=3)) as server:
            code, r, err = loadgen(server, "--rate", 20, "--requests", 20, "--no-size-prompts")
        self.assertEqual(code, 0, err)
        self.assertIsNotNone(r["client"]["server_clock"]["offset_s"])
        path = os.path.join(self.tmp, "r.json")
        with open(path, "w") as f:
            json.dump({**r, "client": {**r["client"], "server_clock": {"offset_s": -0.5, "low_s": -1.2,
                                                                        "high_s": -0.1, "answers": 20}}}, f)
        code, _, err = call_cli("explain", path)
        self.assertEqual(code, 0, err)

    def test_sharded_conversations_warm_up_and_an_empty_share_merge(self):
        load = ("--rate", 20, "--requests", 9, "--turns", 3, "--no-size-prompts", "--max-tokens", 2, "--warmup", 2)
        with FakeServer(paced(ttft=0.01, gap=0.005, tokens=2)) as server:
            shards, _ = self.shards(server, 4, *load)     # three conversations over four machines: one has none
        paths = []
        for k, report in shards.items():
            paths.append(os.path.join(self.tmp, f"c{k}.json"))
            with open(paths[-1], "w") as f:
                json.dump(report, f)
        self.assertEqual([len(shards[k]["indices"]) for k in (1, 2, 3, 4)], [3, 3, 3, 0])
        code, out, err = call_cli("merge", *paths, "--json")
        self.assertEqual(code, 0, err)
        merged = json.loads(out)
        self.assertEqual(merged["completed"], 7)            # 9 sent, the first 2 were the warm-up
        self.assertEqual(merged["config"]["machines"]["missing"], [])
        self.assertEqual(merged["config"]["machines"]["requests"], 9)

    def test_merge_says_a_shard_stopped_early_and_refuses_what_no_loadgen_writes(self):
        shards, first, second = self.two_shards()
        write = self.write
        stopped = write("s.json", {**shards[2], "stopped": "interrupted by Ctrl-C after 2 requests ended"})
        code, _, err = call_cli("merge", first, stopped)
        self.assertEqual(code, 0, err)
        self.assertIn("shard 2/2 (", err)
        self.assertIn("stopped early: interrupted", err)
        cases = [({**shards[2], "client": "x"}, "client is not an object"),
                 ({**shards[2], "scheduled_times": [1e300] * len(shards[2]["indices"])}, "scheduled_times"),
                 ({**shards[2], "config": {**shards[2]["config"], "start_at": shards[2]["config"]["start_at"] - 30 * 86400}},
                  "from its start_at")]
        for i, (report, words) in enumerate(cases):
            code, _, err = call_cli("merge", first, write(f"bad{i}.json", report))
            self.assertEqual(code, 2, words)
            self.assertIn(words, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_a_date_is_gmt_even_without_its_zone_and_two_dates_are_none(self):
        self.assertEqual(main.http_date(["Mon, 01 Dec 2025 18:00:00 GMT"]), 1764612000.0)
        self.assertEqual(main.http_date(["Mon Dec  1 18:00:00 2025"]), 1764612000.0)      # asctime form
        self.assertIsNone(main.http_date(["Mon, 01 Dec 2025 18:00:00 GMT", "Mon, 01 Dec 2025 18:00:05 GMT"]))
        self.assertIsNone(main.http_date(["soon"]))
        self.assertIsNone(main.http_date(None))

    def test_a_start_already_passed_is_refused_saying_by_how_much(self):
        with FakeServer(paced(tokens=1)) as server:
            code, _, err = call_cli("loadgen", "--url", server.url, "--rate", 5, "--start-at", f"{time.time() - 30:.0f}")
            self.assertEqual(code, 2)
            self.assertRegex(err, r"passed it (29|30|31)\.\d s ago")
            self.assertEqual(server.bodies, [])

    def test_a_shard_needs_an_open_loop_a_start_and_a_k_within_n(self):
        soon = f"{time.time() + 60:.0f}"
        for args, words in ((("--shard", "1/2", "--rate", 5), "--start-at"),
                            (("--shard", "1/2", "--concurrency", 4, "--start-at", soon), "open-loop"),
                            (("--shard", "3/2", "--rate", 5, "--start-at", soon), "K/N"),
                            (("--start-at", f"{time.time() + 30 * 86400:.0f}", "--rate", 5), "days away")):
            code, _, err = call_cli("loadgen", "--url", "http://127.0.0.1:9", *args)
            self.assertEqual(code, 2, args)
            self.assertIn(words, err, args)
            self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_the_start_waits_for_the_instant_and_the_clock_is_bounded_by_the_servers(self):
        with FakeServer(paced(ttft=0.01, gap=0.005, tokens=2)) as server:
            start = round(time.time() + 1.5, 3)
            code, r, err = loadgen(server, "--rate", 20, "--requests", 10, "--no-size-prompts", "--start-at",
                                   f"{start:.3f}")
        self.assertEqual(code, 0, err)
        self.assertGreaterEqual(r["config"]["started_unix"], start)
        self.assertLess(r["config"]["start_lag_ms"], 500)
        clock = r["client"]["server_clock"]
        # The server shares this machine's clock: the bound must hold 0.
        self.assertLessEqual(clock["low_s"], 0)
        self.assertGreaterEqual(clock["high_s"], 0)
        self.assertLess(clock["high_s"] - clock["low_s"], 1 + main.DATE_SLACK_S + 0.3)

    def test_a_rate_profile_is_sent_at_the_times_simulate_draws(self):
        path = os.path.join(self.tmp, "profile.csv")
        with open(path, "w") as f:
            f.write("time_s,rate\n0,20\n0.5,60\n")
        with FakeServer(paced(ttft=0.01, gap=0.005, tokens=2)) as server:
            code, r, err = loadgen(server, "--rate-profile", path, "--no-size-prompts", "--detailed", "--seed", 5)
        self.assertEqual(code, 0, err)
        drawn = main.profile_sends(main.read_rate_profile(path), 1.0, 5, 1.0, 0)
        self.assertEqual(len(r["indices"]), len(drawn))
        self.assertTrue(all(abs(a - b) < 1e-6 for a, b in zip(sorted(self.offsets(r).values()), drawn)))
        self.assertIn(f"rate profile {path}", r["config"]["title"])

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, True)


class Reasoning(unittest.TestCase):
    """A reasoning model streams its thinking first: ttft ends at the first thinking event, ttfa
    at the first answer (content) event, with each server's field name for the thinking."""

    @staticmethod
    def stream(field, thinking=3, answer=2, gap=0.06):
        pieces = [data(chunk({"role": "assistant", "content": None}))]
        for _ in range(thinking):
            pieces += [gap, data(chunk({field: " hmm"}))]
        for _ in range(answer):
            pieces += [gap, data(chunk({"content": " yes"}))]
        return scripted(*pieces, data(chunk(finish="stop")), data(usage(12, thinking + answer)), "data: [DONE]\n\n")

    def test_the_first_answer_token_comes_after_the_thinking_in_each_servers_field(self):
        for field in ("reasoning", "reasoning_content"):      # vLLM from 0.11; SGLang, llama.cpp, older vLLM
            with self.subTest(field=field), FakeServer(self.stream(field)) as server:
                code, r, err = loadgen(server, "--requests", 2, own_process=True)
                self.assertEqual(code, 0, err)
                self.assertTrue(50 <= r["median_ttft_ms"] < 150, r["median_ttft_ms"])     # the first thinking event
                self.assertTrue(220 <= r["median_ttfa_ms"] < 400, r["median_ttfa_ms"])    # the fourth event
                self.assertEqual(r["client"]["reasoning"]["requests_with_reasoning"], 2)
                self.assertEqual(r["total_output_tokens"], 10)           # usage counts thinking and answer

    def test_merge_keeps_the_time_to_first_answer(self):
        with FakeServer(self.stream("reasoning")) as server:
            code, out, err = call_cli("loadgen", "--url", server.url, "--requests", 2, "--detailed",
                                      "--no-size-prompts", env={"OPENAI_API_KEY": ""})
        self.assertEqual(code, 0, err)
        measured = json.loads(out)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "r.json")
            with open(path, "w") as f:
                f.write(out)
            code, merged, err = call_cli("merge", path, "--json")
        merged = json.loads(merged)
        self.assertAlmostEqual(merged["median_ttfa_ms"], measured["median_ttfa_ms"], places=6)
        self.assertGreater(merged["median_ttfa_ms"], merged["median_ttft_ms"])

    def test_thinking_inside_content_is_said_and_not_split(self):
        pieces = [data(chunk({"content": "<think>"})), data(chunk({"content": " hmm </think>"})),
                  data(chunk({"content": " yes"})), data(chunk(finish="stop")), data(usage(12, 3)), "data: [DONE]\n\n"]
        with FakeServer(scripted(*pieces)) as server:
            code, r, out = loadgen(server, "--requests", 1)
            code, text, _ = call_cli("loadgen", "--url", server.url, "--requests", 1, env={"OPENAI_API_KEY": ""})
        self.assertNotIn("median_ttfa_ms", r)
        self.assertIn("--reasoning-parser", r["client"]["reasoning"]["note"])
        self.assertIn("reasoning   the server streams its thinking inside content", text)

    def test_a_closing_tag_alone_or_a_tag_split_over_events_is_noticed(self):
        for pieces in ([" hmm", " </think>", " yes"], [" <th", "ink> hmm", " yes"]):
            events = [data(chunk({"content": p})) for p in pieces]
            with FakeServer(scripted(*events, data(chunk(finish="stop")), data(usage(12, 3)), "data: [DONE]\n\n")) as server:
                code, r, _ = loadgen(server, "--requests", 1)
            self.assertIn("--reasoning-parser", r["client"]["reasoning"]["note"], pieces)

    def test_a_reasoning_delta_that_is_not_text_fails_the_request(self):
        for value in (5, ["x"], {"t": "x"}, True):
            events = [data(chunk({"reasoning": value})), data(chunk({"content": " yes"}))]
            with FakeServer(scripted(*events, data(chunk(finish="stop")), data(usage(12, 2)), "data: [DONE]\n\n")) as server:
                code, r, _ = loadgen(server, "--requests", 1)
            self.assertEqual((code, r["failed"]), (1, 1), value)
            self.assertIn("bad stream", r["errors_by_kind"])

    def test_a_plain_model_reports_no_reasoning(self):
        with FakeServer(paced(tokens=3)) as server:
            code, r, _ = loadgen(server, "--requests", 1)
        self.assertIsNone(r["client"]["reasoning"])
        self.assertNotIn("median_ttfa_ms", r)


if __name__ == "__main__":
    unittest.main()
