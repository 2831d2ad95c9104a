"""loadgen against hostile servers, second pass (issue 20): a secret is never printed or stored, a
server's strings reach the terminal, the JSON and the SVG without a secret or a control character
in them, and every number a server sends is validated where it is read; a stream, a GET and a
final scrape end within their bounds, and a pasted URL is understood. Each test runs main.py in
its own process group, as a user does (bounded.py), against a server of its own on 127.0.0.1."""
import base64
import gzip
import http.server
import json
import os
import re
import tempfile
import threading
import unittest
import xml.etree.ElementTree as ET

from bounded import CONTROL, run, strings
from fake_server import chunk, data, usage
from hostile_server import FakeServer, closed_port, paced, reply_with, scripted

PASSWORD = "s3cretPASS"
USER_PASS = f"alice:{PASSWORD}"
BASIC = base64.b64encode(USER_PASS.encode()).decode()
SK_KEY = "sk-live-Zq8sV1xK7mW2pR4tY6uI"           # an OpenAI-shaped key
OTHER_KEY = "tok_live_9f8e7d6c5b4a3210ZYXW"       # not sk-shaped: only knowing it can redact it
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"       # set the window title, clear the screen, red
SEARCH = ("search", "--slo", "ttft_p95:100000", "--rate", "1", "--requests", "10", "--prompt-tokens", "20",
          "--output-tokens", "5", "--jobs", "1")


WORDS = re.compile(r"\S+")


def last_user_words(body):
    """What a server's tokenizer would count, in words: the last user message."""
    return len(WORDS.findall(body["messages"][-1]["content"]))


def svg_ok(test, path):
    """The file is well-formed XML (an SVG a browser will draw)."""
    try:
        ET.parse(path)
    except ET.ParseError as e:
        test.fail(f"{path} is not well-formed XML: {e}")


class SchemelessUrls(unittest.TestCase):
    """# issue 20 finding 1: a --url without a scheme carries user:password past redaction."""

    def assert_hidden(self, *texts):
        for text in texts:
            self.assertNotIn(PASSWORD, text)
            self.assertNotIn(BASIC, text)

    def test_password_in_a_schemeless_url_never_printed_in_text_json_or_svg(self):
        # issue 20 finding 1
        with tempfile.TemporaryDirectory() as tmp, FakeServer(paced(tokens=3)) as server:
            url = f"{USER_PASS}@127.0.0.1:{server.port}"
            svg = os.path.join(tmp, "run.svg")
            for mode in ((), ("--json",), ("--detailed",)):
                with self.subTest(mode=mode):
                    r = run("loadgen", "--url", url, "--requests", 1, "--plot", svg, *mode)
                    self.assertEqual(r.code, 0, r.err)
                    self.assert_hidden(r.out, r.err)
                    with open(svg, encoding="utf-8") as f:
                        self.assert_hidden(f.read())
                    if mode:
                        self.assertIn("***@127.0.0.1", r.json()["config"]["url"])
            # the credentials were sent, as Basic auth
            self.assertEqual(server.get_headers[0][1].get("Authorization"), f"Basic {BASIC}")

    def test_password_in_a_schemeless_url_not_in_the_connection_error(self):
        # issue 20 finding 1
        r = run("loadgen", "--url", f"{USER_PASS}@127.0.0.1:{closed_port()}", "--requests", 1)
        self.assertEqual(r.code, 1, r.err)
        self.assertEqual(len(r.lines()), 1, r.err)
        self.assert_hidden(r.out, r.err)

    def test_search_confirm_with_a_schemeless_url_never_prints_the_password(self):
        # issue 20 finding 1 (search --confirm)
        with FakeServer(paced(tokens=5)) as server:
            url = f"{USER_PASS}@127.0.0.1:{server.port}"
            for mode in ((), ("--json",)):
                with self.subTest(mode=mode):
                    r = run(*SEARCH, "--confirm", url, "--confirm-requests", 2, *mode, timeout=60)
                    self.assertNotIn("Traceback", r.err)
                    self.assertEqual(r.code, 0, r.err)
                    self.assert_hidden(r.out, r.err)

    def test_search_confirm_unreachable_schemeless_url_error_hides_the_password(self):
        # issue 20 finding 1 (search --confirm, the connection error)
        r = run(*SEARCH, "--confirm", f"{USER_PASS}@127.0.0.1:{closed_port()}", "--confirm-requests", 2, timeout=60)
        self.assertNotIn("Traceback", r.err)
        self.assert_hidden(r.out, r.err)


def echo_auth_models(handler):
    return {"object": "list", "data": [{"id": f"model-for {handler.headers.get('Authorization')}"}]}


def echo_auth_finish(handler, body):
    handler.start_stream()
    handler.event(chunk({"content": "hi"}))
    handler.event(chunk(finish=f"stop ({handler.headers.get('Authorization')})"))
    handler.event(usage(5, 1))
    handler.raw("data: [DONE]\n\n")


class ServerStrings(unittest.TestCase):
    """# issue 20 finding 2: server-provided strings (model ids, finish reasons, error bodies) are
    shown and stored unredacted and with raw control characters."""

    def outputs(self, server, key, tmp, extra=()):
        """(mode, Run, svg text) for the text, --json and --detailed reports of one run each."""
        found = []
        for mode in ((), ("--json",), ("--detailed",)):
            svg = os.path.join(tmp, f"run{len(found)}.svg")
            r = run("loadgen", "--url", server.url, "--requests", 1, *(("--api-key", key) if key else ()), "--plot",
                    svg, *mode, *extra)
            self.assertNotIn("Traceback", r.err)
            text = ""
            if os.path.exists(svg):
                with open(svg, encoding="utf-8", errors="replace") as f:
                    text = f.read()
            found.append((mode, r, text, svg))
        return found

    def test_a_model_id_echoing_the_bearer_token_is_redacted_everywhere(self):
        # issue 20 finding 2: /v1/models id echoes the Authorization header
        for key in (SK_KEY, OTHER_KEY):
            with tempfile.TemporaryDirectory() as tmp, FakeServer(paced(tokens=3), models=echo_auth_models) as server:
                for mode, r, svg, _ in self.outputs(server, key, tmp):
                    with self.subTest(key=key[:6], mode=mode):
                        self.assertEqual(r.code, 0, r.err)
                        for where, text in (("stdout", r.out), ("stderr", r.err), ("svg", svg)):
                            self.assertNotIn(key, text, f"the key is in {where}")
                            self.assertNotIn(key[:12], text, f"part of the key is in {where}")

    def test_a_finish_reason_echoing_the_bearer_token_is_redacted_everywhere(self):
        # issue 20 finding 2: finish_reason echoes the Authorization header
        for key in (SK_KEY, OTHER_KEY):
            with tempfile.TemporaryDirectory() as tmp, FakeServer(echo_auth_finish) as server:
                for mode, r, svg, _ in self.outputs(server, key, tmp, extra=("--model", "m")):
                    with self.subTest(key=key[:6], mode=mode):
                        self.assertEqual(r.code, 0, r.err)
                        for where, text in (("stdout", r.out), ("stderr", r.err), ("svg", svg)):
                            self.assertNotIn(key, text, f"the key is in {where}")
                            self.assertNotIn(key[:12], text, f"part of the key is in {where}")

    def test_escape_sequences_in_an_error_body_never_reach_the_terminal_or_the_json(self):
        # issue 20 finding 2: raw ESC sequences (window title, screen clear) from an error body
        # raw bytes, as a proxy's plain-text error page sends them (json.dumps would escape them)
        body = '{"error": {"message": "overloaded ' + ESCAPES + ' try later"}}'
        cases = {"http 500 body": reply_with(500, body, "text/plain"),
                 "error event in the stream": scripted(data({"error": {"message": "boom " + ESCAPES}})),
                 "llama.cpp error: field": scripted("error: boom " + ESCAPES + "\n\n")}
        for name, stream in cases.items():
            with FakeServer(stream) as server:
                for mode in ((), ("--json",), ("--detailed",)):
                    with self.subTest(case=name, mode=mode):
                        r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, *mode)
                        self.assertNotIn("Traceback", r.err)
                        self.assertEqual(r.code, 1, r.err)
                        self.assertIsNone(CONTROL.search(r.out), f"control characters on stdout: {r.out[:400]!r}")
                        self.assertIsNone(CONTROL.search(r.err), f"control characters on stderr: {r.err!r}")
                        if mode:
                            stored = [s for s in strings(r.json()) if CONTROL.search(s)]
                            self.assertEqual(stored, [], "control characters stored in the JSON report")

    def test_a_refusal_echoing_pieces_of_the_key_shows_neither_piece(self):
        # A server that refuses a key often names it by its first and last characters.
        for key in (SK_KEY, OTHER_KEY):
            body = json.dumps({"error": {"message": f"Incorrect API key provided: {key[:11]}****{key[-9:]}"}})
            with FakeServer(reply_with(401, body, "application/json")) as server:
                for mode in ((), ("--json",), ("--detailed",)):
                    with self.subTest(key=key[:6], mode=mode):
                        r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--api-key", key,
                                *mode)
                        self.assertEqual(r.code, 1, r.err)
                        self.assertIn("Incorrect API key provided: ***", r.out + r.err)
                        for where, text in (("stdout", r.out), ("stderr", r.err)):
                            self.assertNotIn(key[:11], text, f"the key's start is in {where}")
                            self.assertNotIn(key[-9:], text, f"the key's end is in {where}")

    def test_a_user_name_hidden_does_not_cut_the_password_into_pieces_shown(self):
        # helper-59: hidden one secret after another, "admin:adminXYZ1234" read "***:***XYZ1234"
        from helpers import main
        http = main.Http("http://admin:adminXYZ1234@127.0.0.1:9/v1", 5, None)
        self.assertEqual(http.redact("bad credentials admin:adminXYZ1234"), "bad credentials ***:***")
        self.assertEqual(main.hide_pieces("key sk-abcdefgh12 and abcdefgh?", ["abcdefgh12345", "zz"]),
                         "key sk-*** and ***?")

    def test_escape_sequences_in_a_model_id_never_reach_the_terminal_json_or_svg(self):
        # issue 20 finding 2: a model id with ESC sequences; the SVG must stay well-formed XML
        models = {"object": "list", "data": [{"id": "evil" + ESCAPES + "model"}]}
        with tempfile.TemporaryDirectory() as tmp, FakeServer(paced(tokens=3), models=models) as server:
            for mode, r, _, svg_path in self.outputs(server, "", tmp):
                with self.subTest(mode=mode):
                    self.assertEqual(r.code, 0, r.err)
                    self.assertIsNone(CONTROL.search(r.out), f"control characters on stdout: {r.out[:300]!r}")
                    self.assertIsNone(CONTROL.search(r.err), f"control characters on stderr: {r.err!r}")
                    if mode:
                        stored = [s for s in strings(r.json()) if CONTROL.search(s)]
                        self.assertEqual(stored, [], "control characters stored in the JSON report")
                    svg_ok(self, svg_path)

    def test_a_control_character_in_a_model_id_leaves_the_svg_well_formed_xml(self):
        # issue 20 finding 2: "control characters also make SVGs invalid XML today"
        models = {"object": "list", "data": [{"id": "model\x1b]0;x\x07\x01end"}]}
        with tempfile.TemporaryDirectory() as tmp, FakeServer(paced(tokens=3), models=models) as server:
            svg = os.path.join(tmp, "run.svg")
            r = run("loadgen", "--url", server.url, "--requests", 1, "--json", "--plot", svg)
            self.assertEqual(r.code, 0, r.err)
            svg_ok(self, svg)


class PastedUrls(unittest.TestCase):
    """# issue 20 finding 22: a new user's --url."""

    def test_a_url_ending_in_v1_requests_v1_models(self):
        # issue 20 finding 22: --url http://host:port/v1 (accept a trailing /v1)
        with FakeServer(paced()) as server:
            for suffix in ("/v1", "/v1/"):
                with self.subTest(suffix=suffix):
                    r = run("loadgen", "--url", server.url + suffix, "--requests", 1)
                    self.assertEqual(r.code, 0, r.seen())
            paths = {path for path, _ in server.get_headers}
        self.assertNotIn("/v1/v1/models", paths)

    def test_a_pasted_chat_completions_endpoint_is_accepted_or_explained(self):
        # issue 20 finding 22, the same mistake one step further: the endpoint pasted as --url
        with FakeServer(paced()) as server:
            r = run("loadgen", "--url", server.url + "/v1/chat/completions", "--requests", 1)
        self.assertNotIn("Traceback", r.err)
        if r.code != 0:
            self.assertEqual(len(r.lines()), 1, r.err)
            self.assertRegex(r.lines()[0], r"(?i)base address|drop .*/v1/chat/completions|without /v1/chat")

    def test_port_99999_says_the_port_is_out_of_range(self):
        # issue 20 finding 22: port 99999 gets a hint about percent-encoding passwords
        for argv in (("loadgen", "--url", "http://127.0.0.1:99999", "--requests", 1),
                     ("search", "--slo", "ttft_p95:500", "--rate", 1, "--requests", 5, "--confirm",
                      "http://127.0.0.1:99999")):
            with self.subTest(command=argv[0]):
                r = run(*argv)
                self.assertEqual(r.code, 2, r.seen())
                self.assertEqual(len(r.lines()), 1, r.err)
                self.assertRegex(r.lines()[0], r"(?i)port")
                self.assertRegex(r.lines()[0], r"(?i)range|65,?535")
                self.assertNotIn("percent", r.lines()[0])



class ServerNumbers(unittest.TestCase):
    """# issue 20 finding 10: a bad number or string from the server, read after the run, crashes
    loadgen and discards every measurement. Each must be reported, never fatal to the report."""

    def assert_report_kept(self, r, completed=2, code=0):
        self.assertNotIn("Traceback", r.err, r.seen())
        self.assertEqual(r.code, code, r.seen())
        self.assertTrue(r.out.strip(), f"the report was lost: {r.seen()}")

    def test_timings_prompt_ms_a_string_keeps_the_report(self):
        # issue 20 finding 10: timings.prompt_ms a string
        timings = {"prompt_n": 12, "prompt_ms": "fast", "predicted_n": 5, "predicted_ms": 50.0,
                   "predicted_per_token_ms": 10.0, "cache_n": 0}
        with FakeServer(paced(timings=timings)) as server:
            for mode in ((), ("--json",)):
                with self.subTest(mode=mode):
                    r = run("loadgen", "--url", server.url, "--requests", 2, *mode)
                    self.assert_report_kept(r)
                    if mode:
                        self.assertEqual(r.json()["completed"], 2)

    def test_timings_prompt_n_1e400_keeps_the_report(self):
        # issue 20 finding 10: prompt_n 1e400 (json reads it as infinity)
        raw = '{"prompt_n": 1e400, "prompt_ms": 5.0, "predicted_n": 5, "predicted_ms": 50.0, "cache_n": 0}'
        with FakeServer(paced(timings_raw=raw)) as server:
            for mode in ((), ("--json",)):
                with self.subTest(mode=mode):
                    r = run("loadgen", "--url", server.url, "--requests", 2, *mode)
                    self.assert_report_kept(r)

    def test_a_lone_surrogate_in_an_error_message_keeps_the_report(self):
        # issue 20 finding 10: an error message containing a lone surrogate (\ud800)
        with FakeServer(scripted(data({"error": {"message": "broken \ud800 here"}}))) as server:
            for mode in ((), ("--json",), ("--detailed",)):
                with self.subTest(mode=mode):
                    r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 2, *mode)
                    self.assert_report_kept(r, code=1)
                    self.assertIn("server error in stream", r.out)

    def test_a_lone_surrogate_in_the_model_id_keeps_the_report_and_the_svg(self):
        # issue 20 finding 10: a model id containing a lone surrogate
        models = {"object": "list", "data": [{"id": "model-\ud800"}]}
        with tempfile.TemporaryDirectory() as tmp, FakeServer(paced(), models=models) as server:
            svg = os.path.join(tmp, "run.svg")
            for mode in ((), ("--json",)):
                with self.subTest(mode=mode):
                    r = run("loadgen", "--url", server.url, "--requests", 2, "--plot", svg, *mode)
                    self.assert_report_kept(r)
                    ET.parse(svg)

    def test_metrics_of_1e308_are_reported_as_bad_not_inf_nan_or_a_crash(self):
        # issue 20 finding 10: /metrics series of 1e308 ("peak running inf", "generated tokens nan",
        # then --plot OverflowError)
        page = ('vllm:num_requests_running{engine="0"} 1e308\nvllm:num_requests_running{engine="1"} 1e308\n'
                'vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n'
                'vllm:generation_tokens_total{engine="0"} 1e308\nvllm:generation_tokens_total{engine="1"} 1e308\n')
        with tempfile.TemporaryDirectory() as tmp, \
                FakeServer(paced(), pages={"/metrics": (200, page, "text/plain; version=0.0.4")}) as server:
            svg = os.path.join(tmp, "run.svg")
            r = run("loadgen", "--url", server.url, "--requests", 2, "--plot", svg)
            self.assert_report_kept(r)
            self.assertIsNone(re.search(r"(?i)\b(inf|nan)\b", r.out), f"inf or nan printed:\n{r.out}")
            ET.parse(svg)


class ServerTextInNotes(unittest.TestCase):
    """What servesim says about a server's bad figures quotes the server: that text is redacted
    and escaped like every other server string (found in the review of findings 2 and 10)."""

    def test_a_timings_value_echoing_the_key_is_redacted_where_it_is_listed_as_left_out(self):
        timings = {"prompt_n": 12, "prompt_ms": f"Bearer {OTHER_KEY}", "predicted_n": 5, "cache_n": 0}
        with FakeServer(paced(timings=timings)) as server:
            for mode in ((), ("--json",)):
                with self.subTest(mode=mode):
                    r = run("loadgen", "--url", server.url, "--requests", 1, "--api-key", OTHER_KEY, *mode)
                    self.assertEqual(r.code, 0, r.seen())
                    self.assertIn("timings.prompt_ms", r.out)
                    self.assertNotIn(OTHER_KEY[:12], r.out + r.err)

    def test_metric_names_with_escapes_or_the_key_are_shown_escaped_and_redacted(self):
        page = (f"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nevil{ESCAPES}name 1e308\n"
                f"key_{OTHER_KEY} inf\n")
        with FakeServer(paced(), pages={"/metrics": (200, page, "text/plain; version=0.0.4")}) as server:
            for mode in ((), ("--json",)):
                with self.subTest(mode=mode):
                    r = run("loadgen", "--url", server.url, "--requests", 1, "--api-key", OTHER_KEY, *mode)
                    self.assertEqual(r.code, 0, r.seen())
                    self.assertIn("left out", r.out)
                    self.assertIsNone(CONTROL.search(r.out), r.out)
                    self.assertNotIn(OTHER_KEY[:12], r.out + r.err)
                    if mode:
                        self.assertEqual([x for x in strings(r.json()) if CONTROL.search(x)], [])


class Contradictions(unittest.TestCase):
    """# issue 20 finding 20: usage counts that contradict the stream are believed; a /metrics page
    over 1 MiB is truncated silently and the server called "unknown"."""

    def test_usage_of_1e8_tokens_for_2_events_is_flagged(self):
        # issue 20 finding 20: 10^8 completion tokens for 2 events with max_tokens 64
        with FakeServer(paced(tokens=2, completion_tokens=10**8)) as server:
            r = run("loadgen", "--url", server.url, "--requests", 2, "--max-tokens", 64, "--json")
            text = run("loadgen", "--url", server.url, "--requests", 2, "--max-tokens", 64)
        self.assertNotIn("Traceback", r.err)
        report = r.json()
        warning = re.compile(r"(?i)usage.*(contradict|exceed|more than|max.?tokens|implausible|disagree|events)")
        flagged = [s for s in strings(report) if warning.search(s)] + [l for l in r.err.splitlines()
                                                                        if warning.search(l)]
        self.assertTrue(flagged or report["total_output_tokens"] <= 2 * 64,
                        f"{report['total_output_tokens']:,} output tokens, {report['output_throughput']:,.0f} tok/s, "
                        f"believed without a warning")
        shown = [l for l in text.out.splitlines() + text.err.splitlines()
                 if warning.search(l) and not l.startswith("definitions")]
        throughput = next(l for l in text.out.splitlines() if l.startswith("throughput"))
        tok_s = float(throughput.split()[1].replace(",", ""))
        self.assertTrue(shown or tok_s < 1e6, f"the text report shows no warning beside: {throughput}")

    def test_a_5000_digit_usage_count_is_a_bad_count_not_a_failed_request(self):
        # helper-53: valid JSON past Python's 4,300-digit integers read as "an event is not JSON"
        huge = "9" * 5000
        stream = scripted(data(chunk({"content": " tok"})), data(chunk({"content": " tok"})), data(chunk(finish="stop")),
                          'data: {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 12, '
                          '"completion_tokens": ' + huge + ', "total_tokens": 12}}\n\n', "data: [DONE]\n\n")
        with FakeServer(stream) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--json")
        self.assertEqual(r.code, 0, r.err)
        report = r.json()
        self.assertEqual((report["completed"], report["total_output_tokens"]), (1, 2))     # its events, counted

    def test_a_server_listing_no_model_says_so_and_a_gzip_trace_says_how_to_read_it(self):
        # helper-38: "(IndexError: list index out of range)"; "is a binary file, not text"
        with FakeServer(paced(), models={"object": "list", "data": []}) as server:
            r = run("loadgen", "--url", server.url, "--requests", 2)
        self.assertEqual(r.code, 1, r.seen())
        self.assertIn("lists no model", r.err)
        self.assertNotIn("IndexError", r.err)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.jsonl.gz")
            with gzip.open(path, "wt") as f:
                f.write('{"arrival": 0, "prompt_tokens": 5, "output_tokens": 5}\n')
            r = run("simulate", "--trace", path)
        self.assertEqual(r.code, 2, r.seen())
        self.assertIn("is gzip-compressed; pass it through zcat", r.err)

    def test_a_metrics_page_over_1_mib_is_read_or_flagged_not_called_unknown(self):
        # issue 20 finding 20: a /metrics page over 1 MiB is silently truncated
        filler = "".join(f'python_gc_objects_collected_total{{generation="{i}"}} {i}\n' for i in range(30000))
        self.assertGreater(len(filler), 1 << 20)
        page = filler + "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:generation_tokens_total 10\n"
        with FakeServer(paced(), pages={"/metrics": (200, page, "text/plain; version=0.0.4")}) as server:
            r = run("loadgen", "--url", server.url, "--requests", 2, "--json")
        self.assertEqual(r.code, 0, r.seen())
        server_part = r.json()["server"]
        self.assertTrue(server_part.get("server") == "vllm" or
                        re.search(r"(?i)MiB|truncat|too (large|big)|longer", json.dumps(server_part)),
                        f"the page was cut silently: {server_part}")


class DefaultPrompt(unittest.TestCase):
    """# issue 20 finding 23: loadgen's default prompt is 40 words, not 40 tokens as --help says."""

    def test_the_default_prompt_is_about_40_tokens_on_a_5_tokens_a_word_tokenizer(self):
        # issue 20 finding 23: the server counts 5 tokens a word plus a 10-token template
        with FakeServer(paced(tokens=3, prompt_of=lambda body: 5 * last_user_words(body) + 10)) as server:
            r = run("loadgen", "--url", server.url, "--requests", 3, "--json")
        self.assertEqual(r.code, 0, r.seen())
        report = r.json()
        mean = report["total_input_tokens"] / report["completed"]
        self.assertTrue(28 <= mean <= 52, f"the default prompt is {mean:.0f} tokens, not about 40")


if __name__ == "__main__":
    unittest.main()


class StreamWords(unittest.TestCase):
    """helper-53: an SSE `event: error` was recorded as `truncated`, its message lost; a finish_reason
    that is an object was counted as a completion and stored as a Python repr; an empty --api-key
    sent `Bearer ` with no key."""

    def test_an_error_event_is_the_servers_failure_with_its_message(self):
        stream = scripted("event: error\ndata: " + json.dumps({"message": "overloaded, retry"}) + "\n\n")
        with FakeServer(stream) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--json")
        self.assertEqual(r.code, 1, r.err)
        report = r.json()
        self.assertEqual(list(report["first_error_by_kind"].values()), ["server error in stream: overloaded, retry"])

    def test_a_finish_reason_that_is_not_text_fails_the_request(self):
        for reason in ({"x": [1, 2]}, [], 0, False):       # (helper-56: the empty ones read as "truncated")
            stream = scripted(data(chunk({"content": " tok"})), data(chunk(finish=reason)), "data: [DONE]\n\n")
            with self.subTest(reason=reason), FakeServer(stream) as server:
                r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--json")
                self.assertEqual(r.code, 1, r.err)
                (error,) = r.json()["first_error_by_kind"].values()
                self.assertTrue(error.startswith("bad stream: a finish_reason is not a string"), error)
                self.assertEqual(r.json()["completed"], 0)

    def test_what_a_failed_request_streamed_is_kept_apart(self):
        # helper-53: three tokens streamed, then the stream ended: the report kept none of them
        stream = scripted(*[data(chunk({"content": " tok"})) for _ in range(3)])
        with FakeServer(stream) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--detailed")
            text = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1)
        self.assertEqual(r.code, 1, r.err)
        report = r.json()
        self.assertEqual((report["completed"], report["total_output_tokens"]), (0, 0))    # as vllm bench serve
        self.assertEqual(report["failed_streamed_tokens"], 3)
        self.assertEqual(report["failed_streamed"][0]["tokens"], 3)
        self.assertGreater(report["failed_streamed"][0]["ttft"], 0)
        self.assertIn("3 tokens streamed before their requests failed", text.out)

    def test_a_stream_cut_inside_an_event_is_truncated_not_bad_json(self):
        # helper-53: a connection closed halfway through an event's JSON read as "bad stream: not JSON"
        stream = scripted(data(chunk({"content": " tok"})), 'data: {"object": "chat.completion.chunk", "choi')
        with FakeServer(stream) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--json")
        self.assertEqual(r.code, 1, r.err)
        (error,) = r.json()["first_error_by_kind"].values()
        self.assertTrue(error.startswith("truncated: the stream ended inside an event"), error)

    def test_a_get_redirected_says_where_it_pointed(self):
        # helper-53: "HTTP 302:" and nothing after it for /v1/models
        class Moved(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(302)
                self.send_header("Location", "http://user:pw@elsewhere.example:8000/v1/models")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Moved)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            r = run("loadgen", "--url", f"http://127.0.0.1:{server.server_address[1]}", "--requests", 1)
        finally:
            server.shutdown()
        self.assertEqual(r.code, 1, r.err)
        self.assertIn("redirected to http://***@elsewhere.example:8000/v1/models; pass that as --url", r.err)
        self.assertNotIn("pw", r.err)

    def test_an_empty_key_or_model_is_refused(self):
        for flag in ("--api-key", "--model"):
            for value in ("", "  "):
                with self.subTest(flag=flag, value=value):
                    r = run("loadgen", "--url", "http://127.0.0.1:9", flag, value, "--requests", 1)
                    self.assertEqual(r.code, 2, r.err)
                    self.assertIn(f"argument {flag}: is empty", r.err)
