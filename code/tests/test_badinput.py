"""A careless user at the command line: every bad input is one line on stderr with the right exit
code (2 bad input; 1 does not fit, unreachable, failed, or cannot write), never a traceback; JSON
output never holds NaN or Infinity; a file written into a missing directory or a full disk is one
line with nothing half-written; Ctrl-C and SIGTERM end a run with 130/143 and keep what finished."""
import json
import os
import resource
import signal
import stat
import subprocess
import tempfile
import threading
import time
import unittest
from unittest import mock

from helpers import FIXTURES, ROOT, call_cli, main, main_command

PROGRESS = ("simulate:", "sweep:", "loadgen:", "search:")
REPORT = os.path.join(FIXTURES, "llamacpp-c8.json")     # a loadgen --json report from llama.cpp
CASE_SECONDS = 60                                      # an in-process case that takes longer hangs


def error_lines(err: str) -> list:
    """stderr without progress lines: what the user is told went wrong."""
    return [line for line in err.splitlines() if line.strip() and not line.startswith(PROGRESS)]


class CaseTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise CaseTimeout()


def call_guarded(argv: list):
    """call_cli, but an exception escaping main() (a traceback for the user) or a hang becomes a
    result the test can report instead of killing the run: (code, stdout, stderr)."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        return call_cli(*argv)
    except SystemExit as e:
        return (e.code if isinstance(e.code, int) else 1), "", f"SystemExit({e.code!r}) escaped main()\n"
    except CaseTimeout:
        return None, "", f"no answer within {CASE_SECONDS} s\n"
    except BaseException as e:   # noqa: BLE001 - exactly what a user would see as a traceback
        return "Traceback", "", f"Traceback (escaped main()): {type(e).__name__}: {e}\n"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_subprocess(argv, stdout=subprocess.PIPE, preexec_fn=None, timeout=120):
    proc = subprocess.run([*main_command(), *map(str, argv)],
                          stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                          timeout=timeout, preexec_fn=preexec_fn)
    return proc.returncode, proc.stdout or "", proc.stderr


def no_nan(text: str):
    """JSON as the promise has it: NaN, Infinity and -Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} in JSON output")
    return json.loads(text, parse_constant=refuse)


# ---------------------------------------------------------------------------------------------
# Files a careless user hands the program. {d} in a case is the directory they are written to.
# ---------------------------------------------------------------------------------------------

HW = {"name": "h", "memory_gib": 79.6, "bandwidth_gbs": 3350, "tflops": 989, "mbu": 0.75, "mfu": 0.5,
      "step_overhead_ms": 1.0, "reserve_gib": 2.0, "seq_overhead_ms": 0.0}
MODEL = {"name": "m", "params": 8.03e9, "layers": 32, "kv_heads": 8, "head_dim": 128,
         "weight_dtype_bytes": 2.0, "kv_dtype_bytes": 2}
TRACE_LINE = '{"arrival": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
SHAPE = ["--model", "smollm2-135m-q8_0", "--hardware", "cpu-4vcpu", "--kv-tokens", "4096", "--max-num-seqs", "4",
         "--output-tokens", "64", "--requests", "8", "--prompt-tokens", "40"]


def write_files(d: str) -> None:
    def raw(name, data: bytes):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)

    def text(name, data: str):
        raw(name, data.encode("utf-8"))

    def obj(name, value):
        text(name, json.dumps(value))

    # Traces
    raw("binary.jsonl", b"\x00\x01\x02\xff\xfe\x00binary\x00\n")
    raw("latin1.jsonl", '{"arrival": 0, "prompt_tokens": 10, "output_tokens": 5, "prefix": "caf\xe9"}\n'
        .encode("latin-1"))
    raw("utf16.jsonl", TRACE_LINE.encode("utf-16"))                       # with its BOM
    raw("utf8bom.jsonl", b"\xef\xbb\xbf" + (TRACE_LINE + '{"arrival": 0.5, "prompt_tokens": 20, '
                                                          '"output_tokens": 5}\n').encode())
    text("bigint.jsonl", '{"arrival": 0, "prompt_tokens": %s, "output_tokens": 5}\n' % ("9" * 5000))
    text("deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")
    text("arrival1e300.jsonl", '{"arrival": 1e300, "prompt_tokens": 10, "output_tokens": 5}\n')
    os.mkdir(os.path.join(d, "adir"))

    # Hardware and model preset files
    obj("hw_mbu7.json", dict(HW, mbu=7))
    obj("hw_mbu75.json", dict(HW, mbu=75))
    obj("hw_mfu_tiny.json", dict(HW, mfu=1e-300))
    obj("hw_mbu_tiny.json", dict(HW, mbu=1e-300))
    obj("hw_bw_huge.json", dict(HW, bandwidth_gbs=1e308))
    obj("hw_bw_tiny.json", dict(HW, bandwidth_gbs=1e-300))
    obj("hw_string.json", dict(HW, tflops="989"))
    obj("hw_null.json", dict(HW, mbu=None))
    obj("hw_unknown.json", dict(HW, colour="red"))
    obj("hw_missing.json", {k: v for k, v in HW.items() if k != "bandwidth_gbs"})
    obj("hw_array.json", [HW])
    text("hw_nan.json", json.dumps(HW).replace("3350", "NaN"))
    text("hw_bom.json", "\ufeff" + json.dumps(HW))
    obj("model_params8.json", dict(MODEL, params=8))
    obj("model_string.json", dict(MODEL, layers="32"))
    obj("model_unknown.json", dict(MODEL, vocab=128000))
    obj("model_missing.json", {k: v for k, v in MODEL.items() if k != "kv_heads"})
    obj("model_array.json", [MODEL])

    # Hand-edited reports for explain and calibrate
    with open(REPORT) as f:
        report = json.load(f)
    obj("r_server_int.json", dict(report, server=5))
    obj("r_tokens_str.json", dict(report, total_input_tokens="x"))
    obj("r_completed_str.json", dict(report, completed="many"))
    obj("r_timings_int.json", dict(report, timings={"prompt_ms": 5}))
    obj("r_ttft_str.json", dict(report, median_ttft_ms="slow", median_queue_ms="x"))
    obj("r_ttft_negative.json", dict(report, median_ttft_ms=-5.0))
    obj("r_sweep_str.json", [report, dict(report, output_throughput="x")])
    text("r_bom.json", "\ufeff" + json.dumps(report))
    text("scrape_huge.txt", "llamacpp:requests_processing 4\nllamacpp:requests_deferred 1e308\n"
                            "llamacpp:n_busy_slots_per_decode 1e308\n")

    # Calibration: two good reports from the simulator, then hand-edited copies of them.
    for clients in (1, 4):
        code, out, err = call_cli("simulate", *SHAPE, "--concurrency", clients, "--json")
        assert code == 0, err
        text(f"c{clients}.json", out)
    with open(os.path.join(d, "c1.json")) as f:
        c1 = json.load(f)
    with open(os.path.join(d, "c4.json")) as f:
        c4 = json.load(f)
    obj("c1_tpot_nan.json", dict(c1, median_tpot_ms=float("nan")))
    obj("c1_tpot_negative.json", dict(c1, median_tpot_ms=-5.0))
    obj("c1_tpot_1e308.json", dict(c1, median_tpot_ms=1e308))
    obj("c1_tpot_1e-300.json", dict(c1, median_tpot_ms=1e-300, median_ttft_ms=1e-300))
    obj("c1_tpot_str.json", dict(c1, median_tpot_ms="7"))
    obj("c1_tokens_1e308.json", dict(c1, total_input_tokens=1e308))
    obj("c1_clients_str.json", dict(c1, config=dict(c1["config"], max_concurrency="1")))
    obj("c4_tpot_zero.json", dict(c4, median_tpot_ms=0.0))
    obj("sim_config_list.json", dict(c1, config=[1]))          # a simulate report edited by hand
    obj("sim_engine_str.json", dict(c1, engine="x"))


# ---------------------------------------------------------------------------------------------
# The table: (argv, exit code, words the one stderr line must mention). {d}: the files above.
# ---------------------------------------------------------------------------------------------

D = "{d}"
CASES = [
    # An engine on a device it cannot run on
    (["capacity", "--engine", "trtllm", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0"], 2,
     ["TensorRT-LLM runs on NVIDIA GPUs", "cpu-4vcpu", "--engine llamacpp"]),
    (["simulate", "--engine", "trtllm", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0"], 2, ["--engine trtllm"]),
    # Absurd numbers on the command line
    (["simulate", "--rate", "1e-300"], 2, ["--rate"]),
    (["simulate", "--rate", "1e300"], 2, ["--rate"]),
    (["simulate", "--rate", "nan"], 2, ["--rate"]),
    (["simulate", "--rate", "inf"], 2, ["--rate"]),
    (["simulate", "--rate", "-inf"], 2, ["--rate"]),
    (["simulate", "--concurrency", "0"], 2, ["--concurrency"]),
    (["simulate", "--requests", "1000000000"], 2, ["--requests"]),
    (["simulate", "--prompt-tokens", "200000000"], 2, ["--prompt-tokens"]),
    (["simulate", "--output-tokens", "5-"], 2, ["--output-tokens"]),
    (["simulate", "--block-size", "0"], 2, ["--block-size"]),
    (["capacity", "--block-size", "0"], 2, ["--block-size"]),
    (["capacity", "--prefix-caching", "--kv-offloading-size", "1000000"], 2, ["--kv-offloading-size", "32768"]),
    (["capacity", "--gpu-memory-utilization", "0"], 2, ["--gpu-memory-utilization"]),
    (["capacity", "--gpu-memory-utilization", "1.5"], 2, ["--gpu-memory-utilization"]),
    (["capacity", "--gpu-memory-utilization", "-1"], 2, ["--gpu-memory-utilization"]),
    (["simulate", "--gpu-memory-utilization", "nan"], 2, ["--gpu-memory-utilization"]),
    (["capacity", "--kv-tokens", "-5"], 2, ["--kv-tokens"]),
    (["simulate", "--kv-tokens", "-5"], 2, ["--kv-tokens"]),
    (["capacity", "--num-gpu-blocks", "0"], 2, ["--num-gpu-blocks"]),
    (["capacity", "--max-model-len", "0"], 2, ["--max-model-len"]),
    (["simulate", "--max-model-len", "0"], 2, ["--max-model-len"]),
    (["simulate", "--max-num-seqs", "0"], 2, ["--max-num-seqs"]),
    (["simulate", "--max-num-batched-tokens", "0"], 2, ["--max-num-batched-tokens"]),
    (["simulate", "--kv-link-gbs", "1e-300"], 2, ["--kv-link-gbs"]),
    (["simulate", "--kv-link-gbs", "nan"], 2, ["--kv-link-gbs"]),
    (["simulate", "--prefix-tokens", "200000000"], 2, ["--prefix-tokens"]),
    (["simulate", "--num-prefixes", "4"], 2, ["--num-prefixes", "--prefix-tokens"]),
    (["sweep", "--num-prefixes", "4"], 2, ["--num-prefixes", "--prefix-tokens"]),
    (["sweep", "--concurrency", "1,,8"], 2, ["--concurrency"]),
    (["sweep", "--concurrency", ""], 2, ["--concurrency"]),
    (["sweep", "--rate", "1,x"], 2, ["--rate", "x"]),
    (["sweep", "--rate", "1,nan"], 2, ["--rate"]),
    (["sweep", "--rate", "1,1e300"], 2, ["--rate"]),
    (["sweep", "--jobs", "0"], 2, ["--jobs"]),
    (["loadgen", "--timeout", "1e10"], 2, ["--timeout"]),
    (["loadgen", "--timeout", "nan"], 2, ["--timeout"]),
    (["loadgen", "--rate", "1e-300"], 2, ["--rate"]),
    (["loadgen", "--concurrency", "0"], 2, ["--concurrency"]),
    (["loadgen", "--max-tokens", "0"], 2, ["--max-tokens"]),
    (["loadgen", "--duration", "0"], 2, ["--duration"]),
    (["loadgen", "--scrape-interval", "0"], 2, ["--scrape-interval"]),
    (["loadgen", "--url", "not-a-url"], 2, ["--url", "not-a-url"]),
    (["loadgen", "--url", "http://[::1"], 2, ["--url"]),
    (["loadgen", "--url", "ftp://127.0.0.1:21"], 2, ["--url"]),
    (["loadgen", "--url", "http://127.0.0.1:99999"], 2, ["--url"]),
    (["loadgen", "--url", "http://127.0.0.1:0"], 2, ["--url"]),
    # An API key pasted with its newline is bad input, not a server that is not OpenAI-compatible.
    (["loadgen", "--url", "http://127.0.0.1:1", "--api-key", "sk-abc\n", "--requests", "2"], 2, ["--api-key"]),
    # Unknown subcommands and flags
    (["explode"], 2, ["explode"]),
    ([], 2, []),
    (["simulate", "--frobnicate"], 2, ["--frobnicate"]),

    # Trace files
    (["simulate", "--trace", f"{D}/binary.jsonl"], 2, [f"{D}/binary.jsonl", "binary"]),
    (["simulate", "--trace", f"{D}/latin1.jsonl"], 2, [f"{D}/latin1.jsonl", "UTF-8"]),
    (["simulate", "--trace", f"{D}/utf16.jsonl"], 2, [f"{D}/utf16.jsonl", "UTF-8"]),
    (["simulate", "--trace", f"{D}/bigint.jsonl"], 2, [f"{D}/bigint.jsonl", "line 1"]),
    (["simulate", "--trace", f"{D}/deep.jsonl"], 2, [f"{D}/deep.jsonl", "line 1", "nested"]),
    (["sweep", "--trace", f"{D}/deep.jsonl"], 2, [f"{D}/deep.jsonl", "nested"]),
    (["simulate", "--trace", f"{D}/arrival1e300.jsonl"], 2, [f"{D}/arrival1e300.jsonl", "arrival"]),
    (["simulate", "--trace", f"{D}/missing.jsonl"], 2, [f"{D}/missing.jsonl"]),
    (["simulate", "--trace", f"{D}/adir"], 2, [f"{D}/adir"]),
    (["loadgen", "--prompts", f"{D}/binary.jsonl"], 2, [f"{D}/binary.jsonl", "binary"]),
    (["loadgen", "--prompts", f"{D}/deep.jsonl"], 2, [f"{D}/deep.jsonl", "nested"]),
    (["loadgen", "--prompts", f"{D}/adir"], 2, [f"{D}/adir"]),

    # JSON presets
    (["capacity", "--hardware", f"{D}/hw_mbu7.json"], 2, ["hw_mbu7.json", "mbu", "must be from 0.01 to 1"]),
    (["capacity", "--hardware", f"{D}/hw_mbu75.json"], 2, ["hw_mbu75.json", "mbu", "0.75"]),
    (["simulate", "--hardware", f"{D}/hw_mbu75.json"], 2, ["hw_mbu75.json", "mbu"]),
    (["capacity", "--hardware", f"{D}/hw_mfu_tiny.json"], 2, ["hw_mfu_tiny.json", "mfu"]),
    (["simulate", "--hardware", f"{D}/hw_mfu_tiny.json", "--requests", "5"], 2, ["hw_mfu_tiny.json", "mfu"]),
    (["capacity", "--hardware", f"{D}/hw_mbu_tiny.json"], 2, ["hw_mbu_tiny.json", "mbu"]),
    (["capacity", "--hardware", f"{D}/hw_bw_huge.json"], 2, ["hw_bw_huge.json", "bandwidth_gbs"]),
    (["capacity", "--hardware", f"{D}/hw_bw_tiny.json"], 2, ["hw_bw_tiny.json", "bandwidth_gbs"]),
    (["capacity", "--hardware", f"{D}/hw_string.json"], 2, ["hw_string.json", "tflops"]),
    (["capacity", "--hardware", f"{D}/hw_null.json"], 2, ["hw_null.json", "mbu"]),
    (["capacity", "--hardware", f"{D}/hw_nan.json"], 2, ["hw_nan.json", "bandwidth_gbs"]),
    (["capacity", "--hardware", f"{D}/hw_unknown.json"], 2, ["hw_unknown.json", "colour"]),
    (["capacity", "--hardware", f"{D}/hw_missing.json"], 2, ["hw_missing.json", "bandwidth_gbs"]),
    (["capacity", "--hardware", f"{D}/hw_array.json"], 2, ["hw_array.json", "object"]),
    (["capacity", "--hardware", f"{D}/binary.jsonl"], 2, ["binary.jsonl", "binary"]),
    (["capacity", "--hardware", f"{D}/deep.jsonl"], 2, ["deep.jsonl", "nested"]),
    (["capacity", "--hardware", f"{D}/adir"], 2, [f"{D}/adir"]),
    (["capacity", "--model", f"{D}/model_params8.json"], 2, ["model_params8.json", "params"]),
    (["capacity", "--model", f"{D}/model_string.json"], 2, ["model_string.json", "layers"]),
    (["capacity", "--model", f"{D}/model_unknown.json"], 2, ["model_unknown.json", "vocab"]),
    (["capacity", "--model", f"{D}/model_missing.json"], 2, ["model_missing.json", "kv_heads"]),
    (["capacity", "--model", f"{D}/model_array.json"], 2, ["model_array.json", "object"]),
    (["capacity", "--model", f"{D}/bigint.jsonl"], 2, ["bigint.jsonl"]),
    (["loadgen", "--simulate", f"{D}/hw_mbu75.json", "llama-3.1-8b"], 2, ["hw_mbu75.json", "mbu"]),

    # explain
    (["explain", f"{D}/binary.jsonl"], 2, ["binary.jsonl", "binary"]),
    (["explain", f"{D}/deep.jsonl"], 2, ["deep.jsonl", "nested"]),
    (["explain", f"{D}/utf16.jsonl"], 2, ["utf16.jsonl", "UTF-8"]),
    (["explain", f"{D}/bigint.jsonl"], 2, ["bigint.jsonl"]),
    (["explain", f"{D}/adir"], 2, [f"{D}/adir"]),
    (["explain", f"{D}/missing.json"], 2, [f"{D}/missing.json"]),
    (["explain", "--server-flags", "--parallel -5 --ctx-size 0", REPORT], 2, ["--server-flags", "--parallel"]),
    (["explain", "--server-flags", '--parallel 4 --ctx-size "4096', REPORT], 2, ["--server-flags"]),
    (["explain", "--server-flags", "--ctx-size 99999999999999999999", REPORT], 2, ["--server-flags", "--ctx-size"]),
    (["explain", "--server-flags", "--max-num-seqs 1e300", REPORT], 2, ["--server-flags", "--max-num-seqs"]),
    # A report edited by hand: a wrong type or an impossible value is bad input, not a traceback.
    (["explain", f"{D}/r_server_int.json"], 2, ["r_server_int.json", "server"]),
    (["explain", f"{D}/r_tokens_str.json"], 2, ["r_tokens_str.json", "total_input_tokens"]),
    (["explain", f"{D}/r_completed_str.json"], 2, ["r_completed_str.json", "completed"]),
    (["explain", f"{D}/r_timings_int.json"], 2, ["r_timings_int.json", "timings"]),
    (["explain", f"{D}/sim_config_list.json"], 2, ["sim_config_list.json", "config"]),
    (["explain", f"{D}/sim_engine_str.json"], 2, ["sim_engine_str.json", "engine"]),
    (["explain", f"{D}/r_ttft_str.json"], 2, ["r_ttft_str.json", "median_ttft_ms"]),
    (["explain", f"{D}/r_ttft_negative.json"], 2, ["r_ttft_negative.json", "median_ttft_ms"]),
    (["explain", f"{D}/r_sweep_str.json"], 2, ["r_sweep_str.json", "output_throughput"]),

    # calibrate
    (["calibrate", f"{D}/c1.json", f"{D}/c4.json", "--out", "/nonexistent/dir/x.json"], 2,
     ["--out", "/nonexistent/dir"]),
    (["calibrate", f"{D}/c1.json", f"{D}/c4.json", "--out", f"{D}/adir"], 2, ["--out", f"{D}/adir"]),
    (["calibrate", os.path.join(FIXTURES, "cpu-calibrated.json")], 2, ["cpu-calibrated.json", "report"]),
    (["calibrate", f"{D}/binary.jsonl"], 2, ["binary.jsonl", "binary"]),
    (["calibrate", f"{D}/deep.jsonl"], 2, ["deep.jsonl", "nested"]),
    (["calibrate", f"{D}/c1_tpot_nan.json", f"{D}/c4.json"], 2, ["c1_tpot_nan.json", "median_tpot_ms"]),
    (["calibrate", f"{D}/c1_tpot_negative.json", f"{D}/c4.json"], 2, ["c1_tpot_negative.json", "median_tpot_ms"]),
    (["calibrate", f"{D}/c1_tpot_1e308.json", f"{D}/c4.json"], 2, ["c1_tpot_1e308.json", "median_tpot_ms"]),
    (["calibrate", f"{D}/c1_tpot_1e-300.json", f"{D}/c4.json"], 2, ["c1_tpot_1e-300.json", "median_tpot_ms"]),
    (["calibrate", f"{D}/c1_tpot_str.json", f"{D}/c4.json"], 2, ["c1_tpot_str.json", "median_tpot_ms"]),
    (["calibrate", f"{D}/c1_tokens_1e308.json", f"{D}/c4.json"], 2, ["c1_tokens_1e308.json", "total_input_tokens"]),
    (["calibrate", f"{D}/c1_clients_str.json", f"{D}/c4.json"], 2, ["c1_clients_str.json", "max_concurrency"]),
    (["calibrate", f"{D}/c1.json", f"{D}/c4_tpot_zero.json"], 2, ["c4_tpot_zero.json", "median_tpot_ms"]),
    (["calibrate", f"{D}/r_server_int.json", "--model", "smollm2-135m-q8_0"], 2, ["r_server_int.json", "server"]),
    (["calibrate", f"{D}/r_tokens_str.json", "--model", "smollm2-135m-q8_0"], 2,
     ["r_tokens_str.json", "total_input_tokens"]),

    # Exit 1: does not fit, unreachable, requests failed. Still one line.
    (["capacity", "--model", "llama-3.1-70b", "--hardware", "l4-24gb"], 1, ["llama-3.1-70b", "l4-24gb"]),
    (["simulate", "--kv-tokens", "1000000000000"], 1, ["--kv-tokens"]),
    (["loadgen", "--url", "http://127.0.0.1:1", "--requests", "2"], 1, ["127.0.0.1:1"]),
    (["simulate", "--kv-tokens", "16", "--requests", "3", "--json"], 1, ["failed"]),
    (["simulate", "--max-model-len", "1", "--requests", "3"], 1, ["failed"]),
]


class Table(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        write_files(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def expand(self, items):
        return [item.replace(D, self.dir) for item in items]

    def test_every_case_is_one_line_with_the_right_exit_code(self):
        for argv, expected, mentions in CASES:
            argv, mentions = self.expand(argv), self.expand(mentions)
            with self.subTest(argv=argv):
                code, out, err = call_guarded(argv)
                lines = error_lines(err)
                self.assertNotIn("Traceback", err)
                self.assertEqual(code, expected, err)
                self.assertEqual(len(lines), 1, f"expected one line on stderr, got: {err!r}")
                if expected == 2:
                    self.assertEqual(out, "", "bad input printed output")
                for word in mentions:
                    self.assertIn(word.lower(), lines[0].lower(), f"the line does not name {word!r}")

    def assert_clean_json(self, *argvs):
        """Each command succeeds and prints JSON without NaN or Infinity."""
        for argv in argvs:
            argv = self.expand(argv)
            with self.subTest(argv=argv):
                code, out, err = call_guarded(argv)
                self.assertEqual(code, 0, err)
                self.assertNotIn("Traceback", err)
                no_nan(out)

    def test_a_utf8_bom_is_fine(self):
        self.assert_clean_json(["simulate", "--trace", f"{D}/utf8bom.jsonl", "--json"],
                               ["capacity", "--hardware", f"{D}/hw_bom.json", "--json"],
                               ["explain", "--json", f"{D}/r_bom.json"])

    def test_json_output_never_holds_nan_or_infinity(self):
        self.assert_clean_json(["simulate", "--output-tokens", "1", "--requests", "5", "--json"],
                               ["simulate", "--requests", "1", "--detailed"],
                               ["simulate", "--rate", "1e-6", "--requests", "3", "--json"],
                               ["simulate", "--rate", "1e6", "--requests", "3", "--json"],
                               ["sweep", "--rate", "1e-6,1e6", "--requests", "3", "--jobs", "1", "--json"],
                               ["capacity", "--json", "--kv-tokens", "16"],
                               ["presets", "--json"],
                               ["explain", "--json", f"{D}/scrape_huge.txt"],
                               ["explain", "--json", REPORT],
                               ["calibrate", f"{D}/c1.json", f"{D}/c4.json"])

    def test_calibrate_checks_out_before_the_fit(self):
        def fit(*args, **kwargs):
            raise AssertionError("calibrate fitted before checking --out")
        with mock.patch.object(main, "calibrate", fit), mock.patch.object(main, "nelder_mead", fit):
            code, out, err = call_guarded(self.expand(["calibrate", f"{D}/c1.json", f"{D}/c4.json",
                                                       "--out", "/nonexistent/dir/x.json"]))
        self.assertEqual(code, 2, err)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertIn("--out", err)
        self.assertFalse(os.path.exists("/nonexistent/dir"))


class FullDisk(unittest.TestCase):
    """Output to /dev/full: the user is told in one line, exit 1, no traceback."""
    COMMANDS = (["presets", "--json"], ["presets"], ["presets", "h100-sxm-80gb"],
                ["capacity"], ["capacity", "--json"], ["capacity", "--help"],
                ["simulate", "--requests", "20"], ["simulate", "--requests", "20", "--json"],
                ["sweep", "--requests", "20", "--concurrency", "1,4", "--jobs", "1"],
                ["sweep", "--requests", "20", "--concurrency", "1,4", "--jobs", "1", "--json"],
                ["sweep", "--requests", "20", "--concurrency", "1,4", "--jobs", "1", "--csv"],
                ["explain", "--table"], ["explain", REPORT], ["explain", "--json", REPORT])

    @unittest.skipUnless(os.path.exists("/dev/full"), "no /dev/full")
    def test_stdout_to_dev_full_is_one_line_exit_1(self):
        for argv in self.COMMANDS:
            with self.subTest(argv=argv), open("/dev/full", "w") as full:
                code, _, err = run_subprocess(argv, stdout=full)
                self.assertNotIn("Traceback", err)
                self.assertEqual(code, 1, err)
                lines = error_lines(err)
                self.assertEqual(len(lines), 1, err)
                self.assertIn("write", lines[0].lower())

    def test_calibrate_out_on_a_full_disk_leaves_nothing(self):
        """A disk that fills up mid-write (a file-size limit makes writes fail like a full disk)."""
        with tempfile.TemporaryDirectory() as tmp:
            for clients in (1, 4):
                code, out, err = call_cli("simulate", *SHAPE, "--concurrency", clients, "--json")
                self.assertEqual(code, 0, err)
                with open(os.path.join(tmp, f"c{clients}.json"), "w") as f:
                    f.write(out)
            target = os.path.join(tmp, "out", "fitted.json")
            os.mkdir(os.path.dirname(target))

            def small_disk():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
            code, out, err = run_subprocess(["calibrate", os.path.join(tmp, "c1.json"), os.path.join(tmp, "c4.json"),
                                             "--out", target], preexec_fn=small_disk)
            self.assertNotIn("Traceback", err)
            self.assertEqual(code, 1, err)
            self.assertEqual(len(error_lines(err)), 1, err)
            self.assertIn(target, err)
            self.assertEqual(os.listdir(os.path.dirname(target)), [], "a half-written file was left")

    @unittest.skipUnless(os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode), "no /dev/full")
    def test_calibrate_out_dev_full_reports_the_full_disk_and_keeps_the_device(self):
        """calibrate --out /dev/full. The device is guarded: a rename onto it is recorded, not done
        (as root, writing FILE.partial in /dev and renaming it over /dev/full would replace it)."""
        attempts = []
        real_replace, real_rename = os.replace, os.rename

        def guarded(real):
            def move(src, dst, *args, **kwargs):
                if os.path.abspath(str(dst)).startswith("/dev/"):
                    attempts.append((src, dst))
                    raise OSError(28, "No space left on device")
                return real(src, dst, *args, **kwargs)
            return move
        created = not os.path.exists("/dev/full.partial")
        with tempfile.TemporaryDirectory() as tmp:
            for clients in (1, 4):
                code, out, err = call_cli("simulate", *SHAPE, "--concurrency", clients, "--json")
                self.assertEqual(code, 0, err)
                with open(os.path.join(tmp, f"c{clients}.json"), "w") as f:
                    f.write(out)
            try:
                with mock.patch("os.replace", guarded(real_replace)), mock.patch("os.rename", guarded(real_rename)):
                    code, out, err = call_guarded(["calibrate", os.path.join(tmp, "c1.json"),
                                                   os.path.join(tmp, "c4.json"), "--out", "/dev/full"])
            finally:
                if created and os.path.isfile("/dev/full.partial"):
                    os.remove("/dev/full.partial")
        self.assertTrue(stat.S_ISCHR(os.stat("/dev/full").st_mode), "/dev/full was replaced")
        self.assertEqual(attempts, [], "calibrate tried to rename a file over /dev/full")
        self.assertNotIn("Traceback", err)
        self.assertEqual(code, 1, err)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertIn("/dev/full", err)


class Interrupts(unittest.TestCase):
    """Ctrl-C (130) and SIGTERM (143) mid-run: one line, no traceback; sweep --json keeps what finished."""
    SIMULATE = ["simulate", "--requests", "500000", "--concurrency", "256"]
    SWEEP = ["sweep", "--requests", "20000", "--concurrency", "1,8,32,128,256", "--jobs", "1"]

    def interrupt(self, argv, signum, after=1.0, when=None, group=False):
        """Start argv, send signum `after` seconds in (or once a stderr line contains `when`: a
        progress line says the run is under way however long the start took on a busy machine;
        a signal before main() runs is test_hostile_limits' case); to its whole process group with
        `group`, as a terminal's Ctrl-C and `timeout` send it."""
        proc = subprocess.Popen([*main_command(), *argv], cwd=ROOT, start_new_session=group,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err, seen = [], [], threading.Event()

        def read_err():
            for line in proc.stderr:
                err.append(line)
                if when and when in line:
                    seen.set()
        readers = [threading.Thread(target=lambda: out.append(proc.stdout.read())), threading.Thread(target=read_err)]
        for t in readers:
            t.start()
        try:
            if when:
                self.assertTrue(seen.wait(90), f"never saw {when!r}: {''.join(err)}")
            else:
                time.sleep(after)
            self.assertIsNone(proc.poll(), f"the run ended before the signal: {''.join(err)}")
            if group:
                os.killpg(proc.pid, signum)
            else:
                proc.send_signal(signum)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for t in readers:
                t.join(10)
            proc.stdout.close()
            proc.stderr.close()
        return code, "".join(out), "".join(err)

    def check(self, code, err, signum):
        self.assertNotIn("Traceback", err)
        self.assertEqual(code, 130 if signum == signal.SIGINT else 143, err)
        self.assertEqual(len(error_lines(err)), 1, err)

    def test_simulate(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            for extra in ([], ["--json"]):
                with self.subTest(signal=signum.name, extra=extra):
                    code, out, err = self.interrupt(self.SIMULATE + extra, signum, when="simulate:")
                    self.check(code, err, signum)
                    if extra and out.strip():
                        no_nan(out)            # nothing half-written: all of a report or none

    def test_sweep_json_before_any_point_is_an_empty_list(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=signum.name):
                code, out, err = self.interrupt(self.SWEEP + ["--json"], signum, when="sweep:")
                self.check(code, err, signum)
                self.assertEqual(no_nan(out), [])

    def test_sweep_json_keeps_the_finished_points(self):
        # 64 clients finish 20,000 requests in about a second; one client takes several more.
        sweep = ["sweep", "--requests", "20000", "--concurrency", "64,1", "--jobs", "1", "--json"]
        for signum in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=signum.name):
                code, out, err = self.interrupt(sweep, signum, when="concurrency 1:")
                self.check(code, err, signum)
                points = no_nan(out)
                self.assertIsInstance(points, list)
                self.assertEqual(len(points), 1)
                self.assertEqual(points[0]["config"]["sweep_value"], 64)
                for point in points:
                    self.assertEqual(point["completed"] + point["failed"], 20000)

    def test_search_keeps_the_probes_of_the_deployment_it_was_in(self):
        # One deployment, probes of 25,001 requests: a signal after the first ends leaves it mid-search.
        search = ["search", "--slo", "ttft_p95:1000", "--steady-requests", "20000"]
        for signum, extra in ((signal.SIGINT, ["--json"]), (signal.SIGTERM, [])):
            with self.subTest(signal=signum.name):
                code, out, err = self.interrupt(search + extra, signum, when="search: rate")
                self.check(code, err, signum)
                self.assertIn("output holds the", err)
                if extra:
                    deployment = no_nan(out)["deployments"][0]
                    self.assertTrue(deployment["interrupted"])
                    self.assertIsNone(deployment["highest_load"])
                    self.assertGreaterEqual(len(deployment["probes"]), 1)
                    self.assertTrue(all("rerun" in p for p in deployment["probes"]))
                else:
                    self.assertIn("interrupted before an answer; its ", out)
                    self.assertIn("25,001", out)       # a probe's row

    def test_a_parallel_search_keeps_the_probes_of_each_deployment_its_workers_were_in(self):
        # Two deployments in two worker processes, each some 25,001-request probes into its search:
        # both come back marked interrupted. Ctrl-C reaches the workers too (they leave it to the
        # parent, which asks them to stop); SIGTERM sent to the group stops them itself.
        search = ["search", "--slo", "ttft_p95:1000", "--steady-requests", "20000", "--hardware",
                  "h100-sxm-80gb,l4-24gb", "--jobs", "2", "--json"]
        for signum in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=signum.name):
                code, out, err = self.interrupt(search, signum, after=6.0, group=True)
                self.check(code, err, signum)
                report = no_nan(out)
                self.assertEqual(report["tried"], "0 of 2")
                deployments = report["deployments"]
                self.assertEqual([d["settings"]["hardware"] for d in deployments], ["h100-sxm-80gb", "l4-24gb"])
                for deployment in deployments:
                    self.assertTrue(deployment["interrupted"])
                    self.assertIsNone(deployment["highest_load"])
                    self.assertTrue(all("rerun" in p for p in deployment["probes"]))
                probes = sum(len(d["probes"]) for d in deployments)
                self.assertIn(f"of the 2 interrupted" if probes else "so the output holds none", err)

    def test_sweep_text_and_parallel_jobs(self):
        parallel = ["sweep", "--requests", "200000", "--concurrency", "1,8,32,128,256", "--jobs", "2", "--json"]
        for argv in (self.SWEEP, parallel):
            for signum in (signal.SIGINT, signal.SIGTERM):
                with self.subTest(argv=argv, signal=signum.name):
                    # Parallel points print nothing until one ends: three seconds in, they are running
                    # (200,000 requests a point: the whole sweep takes about 25 s, where 20,000 took 2.7 s
                    # on an idle machine and ended before the signal; one second in, a loaded CI machine
                    # was still starting main.py, and a signal then leaves no JSON, as
                    # test_hostile_limits expects).
                    code, out, err = self.interrupt(argv, signum, after=3.0,
                                                    when="sweep:" if argv is self.SWEEP else None)
                    self.check(code, err, signum)
                    if "--json" in argv:
                        self.assertIsInstance(no_nan(out), list)


if __name__ == "__main__":
    unittest.main()
