"""Hangs, unbounded memory and signals, second pass (issue 20): every run ends within a bound,
stays within a memory budget, and keeps what it measured when it is stopped -- by a hostile
stream, a dripped GET, a killed worker, or Ctrl-C and SIGTERM at any moment. Each run is main.py
in its own process group with an address-space cap (so a run that eats memory fails its test
instead of the machine) and a wall-clock bound (so a hang fails its test instead of the suite);
peak memory is the child's own peak RSS (wait4)."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from helpers import ROOT
from bounded import alive, children, cmdline, cpu_ticks, finish, jsonl, kill_group, run, start
from fake_server import chunk, data
from hostile_server import Drip, FakeServer, closed_port, paced, scripted

METRICS = ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
           "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:generation_tokens_total 10\n")


def mooncake_row(i, tokens=3000):
    ids = ", ".join(str(i * 10 + k) for k in range(-(-tokens // 512)))
    return '{"timestamp": %d, "input_length": %d, "output_length": 100, "hash_ids": [%s]}\n' % (i * 10, tokens, ids)


class EndlessEvents(unittest.TestCase):
    """# issue 20 finding 4: data: lines with no blank line grow one event without bound, and each
    line resets --timeout."""

    def test_endless_data_lines_without_a_blank_line_stay_under_100_mb_and_fail_the_request(self):
        # issue 20 finding 4 (and the Done-when target: loadgen against endless data < 100 MB)
        line = "data: " + "a" * (512 * 1024) + "\n"

        def endless(stopping):
            while not stopping.is_set():
                yield line
        with FakeServer(scripted(data(chunk({"content": "a"})), endless)) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--timeout", 5, "--json",
                    timeout=40, as_bytes=2 * 2**30)
        self.assertLess(r.peak_mb, 100, f"peak RSS {r.peak_mb:.0f} MB; stderr: {r.err[-300:]}")
        self.assertLess(r.took, 15, f"took {r.took:.1f} s with --timeout 5")
        report = r.json()
        self.assertEqual(r.code, 1, r.err)
        self.assertEqual(report["failed"], 1)
        self.assertTrue(set(report["errors_by_kind"]) <= {"bad stream", "timeout"}, report["first_error_by_kind"])

    def test_a_partial_event_is_not_progress_for_the_timeout(self):
        # issue 20 finding 4: "a partial event is not progress" -- small data: lines every 0.5 s,
        # never a blank line, must fail at --timeout 2, not run forever
        def trickle(stopping):
            while not stopping.wait(0.5):
                yield "data: x\n"
        with FakeServer(scripted(data(chunk({"content": "a"})), trickle)) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 1, "--timeout", 2, "--json",
                    timeout=30)
        report = r.json()
        self.assertEqual(r.code, 1, r.err)
        self.assertEqual(list(report["errors_by_kind"]), ["timeout"], report["first_error_by_kind"])
        self.assertLess(r.took, 8, f"took {r.took:.1f} s with --timeout 2")


class DrippedGets(unittest.TestCase):
    """# issue 20 finding 5: GET /metrics, /v1/models and /props have no whole-response deadline."""
    BOUND = 15           # --timeout 3, one byte every 2 s: each GET must be cut within a few seconds

    def test_v1_models_dripped_one_byte_every_2_s_fails_within_the_timeout(self):
        # issue 20 finding 5: /v1/models
        body = json.dumps({"object": "list", "data": [{"id": "fake-model"}]})
        with FakeServer(paced(), pages={"/v1/models": Drip(body, 2.0, "application/json")}) as server:
            r = run("loadgen", "--url", server.url, "--requests", 2, "--timeout", 3, timeout=60)
        self.assertLess(r.took, self.BOUND, f"took {r.took:.1f} s")
        self.assertEqual(r.code, 1, r.err)
        self.assertEqual(len(r.lines()), 1, r.err)
        self.assertNotIn("Traceback", r.err)

    def test_metrics_dripped_from_the_first_scrape_does_not_stall_the_run(self):
        # issue 20 finding 5: /metrics before the run
        with FakeServer(paced(), pages={"/metrics": Drip(METRICS, 2.0)}) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 2, "--timeout", 3, "--json",
                    timeout=60)
        self.assertLess(r.took, self.BOUND, f"took {r.took:.1f} s")
        self.assertEqual(r.code, 0, r.err)
        report = r.json()
        self.assertEqual(report["completed"], 2)
        self.assertIn("metrics", json.dumps(report["server"]), "the unreadable /metrics is not reported")

    def test_props_dripped_does_not_stall_simulate(self):
        # issue 20 finding 5: /props, read for --simulate after the run
        props = json.dumps({"total_slots": 4, "default_generation_settings": {"n_ctx": 4096}})
        with FakeServer(paced(), pages={"/props": Drip(props, 2.0, "application/json")}) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 2, "--timeout", 3, "--json",
                    "--simulate", "cpu-4vcpu", "smollm2-135m-q8_0", timeout=60)
        self.assertLess(r.took, self.BOUND, f"took {r.took:.1f} s")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(r.json()["completed"], 2)

    @staticmethod
    def last_scrape_drips(count):
        """The first /metrics answer at once, every later one dripped (the final scrape)."""
        return (200, METRICS, "text/plain; version=0.0.4") if count == 0 else Drip(METRICS, 2.0)

    def test_a_dripped_final_scrape_does_not_hold_the_finished_report(self):
        # issue 20 finding 5: the final scrape is optional; the report is printed before it
        with FakeServer(paced(), pages={"/metrics": self.last_scrape_drips}) as server:
            r = run("loadgen", "--url", server.url, "--model", "m", "--requests", 3, "--timeout", 3,
                    "--scrape-interval", 3600, "--json", timeout=60)
        self.assertLess(r.took, self.BOUND, f"took {r.took:.1f} s")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(r.json()["completed"], 3)

    def test_sigterm_during_a_dripped_final_scrape_still_prints_the_report(self):
        # issue 20 finding 5: "then SIGTERM exits 143 with nothing printed"
        with FakeServer(paced(), pages={"/metrics": self.last_scrape_drips}) as server:
            t0 = time.monotonic()
            proc, out_f, err_f = start(["loadgen", "--url", server.url, "--model", "m", "--requests", 3,
                                        "--timeout", 30, "--scrape-interval", 3600, "--json"])
            try:
                end = time.monotonic() + 20
                while server.gets.get("/metrics", 0) < 2 and time.monotonic() < end and proc.poll() is None:
                    time.sleep(0.02)           # until the final scrape has started dripping
                time.sleep(0.5)
                os.kill(proc.pid, signal.SIGTERM)
                r = finish(proc, out_f, err_f, t0, 30)
            finally:
                kill_group(proc)
        self.assertEqual(r.code, 143, r.err)
        self.assertNotIn("Traceback", r.err)
        self.assertTrue(r.out.strip(), "SIGTERM during the final scrape printed no report")
        self.assertEqual(r.json()["completed"], 3)


class SignalWhileWorkersStart(unittest.TestCase):
    """A signal to the whole group a moment after the first worker forks (the terminal's Ctrl-C,
    timeout's SIGTERM): before, half such runs left a worker behind, hung, swallowed the Ctrl-C or
    printed a worker's traceback. Now: one line, its exit code, nothing left running."""
    SEARCH = ["search", "--slo", "ttft_p95:1000", "--hardware", "h100-sxm-80gb,l4-24gb", "--steady-requests", "2000",
              "--jobs", "2", "--json"]

    def test_a_signal_as_the_workers_fork(self):
        for signum, delay in [(signum, delay) for signum in (signal.SIGINT, signal.SIGTERM)
                              for delay in (0.0, 0.002, 0.005, 0.01)]:
            with self.subTest(signal=signum.name, delay=delay):
                t0 = time.monotonic()
                proc, out_f, err_f = start(self.SEARCH)
                try:
                    forked = f"/proc/{proc.pid}/task/{proc.pid}/children"
                    while alive(proc) and not read_text(forked).split() and time.monotonic() - t0 < 60:
                        pass
                    time.sleep(delay)
                    os.killpg(proc.pid, signum)
                    while alive(proc) and time.monotonic() - t0 < 40:
                        time.sleep(0.02)
                    time.sleep(0.5)
                    left = [pid for pid in group_members(proc.pid) if pid != proc.pid]
                    r = finish(proc, out_f, err_f, t0, 40, "a signal as the workers fork")
                finally:
                    kill_group(proc)
                self.assertEqual(left, [], f"workers outlived the run: {r.err}")
                self.assertNotIn("Traceback", r.err)
                self.assertEqual(r.code, 130 if signum == signal.SIGINT else 143, r.err)
                self.assertEqual(len(r.lines()), 1, r.err)


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def group_members(group):
    """Live (not zombie) processes of a process group, from /proc."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


class DeadWorkers(unittest.TestCase):
    """# issue 20 finding 7: a --jobs worker killed (by the OOM killer) leaves the pool waiting
    forever; Ctrl-C then reports 0 points. Point order 1,96: the slow point (1 client) first, so
    the fast point's result waits behind it; the worker running the slow one is SIGKILLed. (At
    24,000 requests and 64 clients the engine grew fast enough that the slow point ended about
    a second after the fast one, and an idle machine never showed one worker idle for a second.)"""
    SWEEP = ["sweep", "--requests", "60000", "--concurrency", "1,96", "--jobs", "2"]

    def start_until_one_worker_is_idle(self, args):
        """Start the sweep; wait until one worker has gone idle (concurrency 96 done, ~3 s) while
        the other still runs concurrency 1 (~6 s); the busy worker's pid. Idle means no CPU at all
        over a second, busy a few ticks: on a machine other tests load, a running worker may get
        a small share of a core, but never none for a second."""
        t0 = time.monotonic()
        proc, out_f, err_f = start([*self.SWEEP, *args])
        me = cmdline(proc.pid)
        end = time.monotonic() + 60
        busy = []
        while time.monotonic() < end and alive(proc):
            workers = [pid for pid in children(proc.pid) if cmdline(pid) == me]
            before = {pid: cpu_ticks(pid) for pid in workers}
            time.sleep(1)
            used = {pid: cpu_ticks(pid) - before[pid] for pid in workers}
            busy = [pid for pid in workers if used[pid] >= 5]
            idle = [pid for pid in workers if used[pid] <= 1]
            if len(workers) == 2 and len(busy) == 1 and len(idle) == 1 and time.monotonic() - t0 > 2:
                break
        else:
            kill_group(proc)
            self.fail(f"never saw one worker idle and one busy (workers busy: {busy})")
        return proc, out_f, err_f, t0, busy[0]

    def test_a_killed_worker_ends_the_sweep_with_the_finished_points(self):
        # issue 20 finding 7: the OOM killer takes the worker running concurrency 1
        proc, out_f, err_f, t0, busy = self.start_until_one_worker_is_idle(("--json",))
        os.kill(busy, signal.SIGKILL)
        try:
            r = finish(proc, out_f, err_f, t0, 40, "sweep after a worker was killed")
        finally:
            kill_group(proc)
        self.assertNotIn("Traceback", r.err)
        self.assertEqual(r.code, 1, r.err)
        self.assertEqual(len(r.lines()), 1, r.err)
        self.assertRegex(r.lines()[0], r"(?i)worker process died.*concurrency 1")
        points = r.json()
        self.assertEqual([p["config"]["sweep_value"] for p in points], [96], "the finished point was not kept")

    def test_ctrl_c_after_a_worker_died_keeps_the_finished_points(self):
        # issue 20 finding 7: "SIGINT then reports 0 points"
        proc, out_f, err_f, t0, busy = self.start_until_one_worker_is_idle(("--json",))
        os.kill(busy, signal.SIGKILL)
        try:
            time.sleep(0.2)
            if alive(proc):
                os.kill(proc.pid, signal.SIGINT)
            r = finish(proc, out_f, err_f, t0, 40)
        finally:
            kill_group(proc)
        self.assertNotIn("Traceback", r.err)
        points = r.json()
        self.assertIn(96, [p["config"]["sweep_value"] for p in points], "the finished point was lost")

    def test_ctrl_c_keeps_a_point_that_finished_behind_a_running_one(self):
        # issue 20 finding 7: concurrency 96 finished while concurrency 1 (before it in order)
        # still runs; Ctrl-C keeps it, in the JSON list and as a row of the table
        for mode in (("--json",), ()):
            with self.subTest(mode=mode):
                proc, out_f, err_f, t0, _ = self.start_until_one_worker_is_idle(mode)
                os.kill(proc.pid, signal.SIGINT)
                try:
                    r = finish(proc, out_f, err_f, t0, 45)
                finally:
                    kill_group(proc)
                self.assertNotIn("Traceback", r.err)
                self.assertEqual(r.code, 130, r.seen())
                self.assertEqual(len(r.lines()), 1, r.err)
                if mode:
                    self.assertEqual([p["config"]["sweep_value"] for p in r.json()], [96])
                else:
                    rows = [line.split()[0] for line in r.out.splitlines()[2:]]
                    self.assertEqual(rows, ["96"], r.out)


class WholeInputs(unittest.TestCase):
    """# issue 20 finding 9 (the inputs): a trace read whole, hash ids without a cap, a sweep
    grid without a cap. (Search's grid and probes are left to issue 17's rewrite of search.)"""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.big = os.path.join(cls.tmp.name, "mooncake-150mb.jsonl")
        with open(cls.big, "w") as f:
            size, i = 0, 0
            while size < 150 * 2**20:               # a 150 MiB Mooncake trace, 3,000-token prompts
                row = mooncake_row(i)
                f.write(row)
                size += len(row)
                i += 1

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_simulate_the_first_1000_requests_of_a_150_mb_trace_under_200_mb(self):
        # issue 20 finding 9, and the Done-when target (simulate on a 150 MB trace, --requests 1000, < 200 MB)
        r = run("simulate", "--trace", self.big, "--requests", 1000, "--json", as_bytes=2**30, timeout=120)
        self.assertNotIn("Traceback", r.err[-3000:], r.err[-600:])
        self.assertEqual(r.code, 0, r.err[-600:])
        self.assertLess(r.peak_mb, 200, f"peak RSS {r.peak_mb:.0f} MB for a {os.path.getsize(self.big) >> 20} MiB trace")
        self.assertEqual(r.json()["completed"], 1000)

    def test_a_bailian_row_with_3_million_hash_ids_is_refused_in_little_memory(self):
        # issue 20 finding 9: one Bailian row with 3.1M hash ids uses 0.9 GB; cap ids per row
        n = 3_100_000
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bailian.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 16 * n,
                                    "output_length": 10, "type": "text", "turn": 1, "hash_ids": list(range(n))}) + "\n")
            r = run("simulate", "--trace", path, "--requests", 1, as_bytes=2**30, timeout=60)
        self.assertNotIn("Traceback", r.err[-3000:])
        self.assertLess(r.peak_mb, 200, f"peak RSS {r.peak_mb:.0f} MB for one row")
        self.assertEqual(r.code, 2, r.err[-300:])
        self.assertEqual(len(r.lines()), 1, r.err)
        self.assertIn("hash_ids", r.lines()[0])

    def test_a_sweep_of_20000_points_is_refused_before_it_runs(self):
        # issue 20 finding 9: sweep has no cap on points (20,000 points: 650 MB)
        values = ",".join(str(i) for i in range(1, 20_001))
        r = run("sweep", "--concurrency", values, "--requests", 8, "--jobs", 1, "--json", timeout=30)
        self.assertEqual(r.code, 2, f"exit {r.code}: {r.err[-300:]}")
        self.assertEqual(len(r.lines()), 1, r.err)
        self.assertRegex(r.lines()[0], r"20,?000")
        self.assertEqual(r.out, "")


class Signals(unittest.TestCase):
    """# issue 20 finding 13: a double Ctrl-C (or `timeout`, which signals the process and then
    its group) loses the loadgen report or prints a traceback; Ctrl-C while main.py is still
    starting (compiling and importing) prints a traceback."""

    def double_signal(self, signum, gap=0.005, group=False, busy=True):
        """loadgen --json; the signal twice, `gap` s apart. busy: a fast server and 8 clients, the
        signals ~4 s in (a few thousand requests done, so building the report takes a moment);
        else a slow server, the signals after the third request."""
        stream = paced(ttft=0.0, gap=0.0, tokens=2) if busy else paced(ttft=0.1, gap=0.05, tokens=6)
        with FakeServer(stream) as server:
            t0 = time.monotonic()
            proc, out_f, err_f = start(["loadgen", "--url", server.url, "--requests", 200000 if busy else 200,
                                        "--concurrency", 8 if busy else 2, "--max-tokens", 6, "--json"])
            try:
                if busy:
                    time.sleep(2.5)
                else:
                    end = time.monotonic() + 15
                    while len(server.log) < 3 and time.monotonic() < end:
                        time.sleep(0.01)
                    time.sleep(0.15)
                os.kill(proc.pid, signum)
                time.sleep(gap)
                if group:
                    os.killpg(proc.pid, signum)       # what timeout(1) does after signalling the child
                else:
                    os.kill(proc.pid, signum)
                return finish(proc, out_f, err_f, t0, 30)
            finally:
                kill_group(proc)

    def test_double_ctrl_c_within_a_few_ms_keeps_the_loadgen_report(self):
        # issue 20 finding 13: "loses the whole loadgen report (3 of 3 runs)"
        for gap in (0.002, 0.02):
            with self.subTest(gap=gap):
                r = self.double_signal(signal.SIGINT, gap)
                self.assertTrue(r.out.strip(), f"no report after a double Ctrl-C: {r.seen()}")
                self.assertGreaterEqual(r.json()["completed"], 100)
                self.assertNotIn("Traceback", r.err)
                self.assertEqual(r.code, 130, r.seen())
                self.assertEqual(len(r.lines()), 1, r.err)

    def test_sigterm_then_sigterm_to_the_group_keeps_the_loadgen_report(self):
        # issue 20 finding 13: `timeout` re-signals the group
        for gap in (0.002, 0.02):
            with self.subTest(gap=gap):
                r = self.double_signal(signal.SIGTERM, gap, group=True)
                self.assertTrue(r.out.strip(), f"no report after SIGTERM twice: {r.seen()}")
                self.assertGreaterEqual(r.json()["completed"], 100)
                self.assertNotIn("Traceback", r.err)
                self.assertEqual(r.code, 143, r.seen())

    def test_a_second_signal_after_the_report_is_neither_a_traceback_nor_a_death_by_signal(self):
        # issue 20 finding 13: "or prints a traceback from threading._shutdown"; a second signal
        # that lands after the report is written must still end with the documented code
        for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            for gap in (0.0, 0.005, 0.05):
                with self.subTest(signal=signum.name, gap=gap):
                    r = self.double_signal(signum, gap, busy=False)
                    self.assertTrue(r.out.strip(), r.seen())
                    self.assertNotIn("Traceback", r.err, r.seen())
                    self.assertEqual(r.code, code, r.seen())

    def test_ctrl_c_while_main_py_loads_is_one_line_without_a_traceback(self):
        # issue 20 finding 13: Ctrl-C while main.py's imports and definitions run printed a
        # traceback and died by the signal. The interpreter compiles main.py before running any
        # of it, and no code in main.py can guard that (Python then prints a bare KeyboardInterrupt,
        # exit 1); so this starts the run as the interpreter does, compiled first, and sends the
        # Ctrl-C at each delay after main.py's first line starts.
        for delay in (0.005, 0.02, 0.05, 0.1, 0.2, 0.4):
            with self.subTest(delay=delay):
                t0 = time.monotonic()
                proc, out_f, err_f = start(["simulate", "--requests", 200000],
                                           prefix=[sys.executable, "-c", COMPILED_THEN_CTRL_C, str(delay)])
                try:
                    r = finish(proc, out_f, err_f, t0, 30)
                finally:
                    kill_group(proc)
                where = f"Ctrl-C {delay:g} s after main.py started"
                self.assertNotIn("Traceback", r.err, f"{where}: {r.seen()}")
                self.assertEqual(r.code, 130, f"{where}: {r.seen()}")
                self.assertEqual(len(r.lines()), 1, f"{where}: {r.seen()}")


# main.py run as `python3 main.py ARGS` runs it, but compiled first, then a Ctrl-C DELAY seconds
# after its first line starts (argv after -c: DELAY, main.py, its arguments). The clock starts
# when main.py's code is entered, not when the timer is: on a loaded machine the timer's 5 ms could
# pass before this harness reached main.py, and the Ctrl-C land in the harness.
COMPILED_THEN_CTRL_C = """
import os, signal, sys, threading, time
delay, path = float(sys.argv[1]), sys.argv[2]
sys.argv = sys.argv[2:]
with open(path) as f:
    code = compile(f.read(), path, "exec")
inside = threading.Event()
def ctrl_c():
    inside.wait()
    time.sleep(delay)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=ctrl_c, daemon=True).start()
def entered(frame, event, arg):
    if frame.f_code.co_filename == path:
        sys.setprofile(None)
        inside.set()
sys.setprofile(entered)
exec(code, {"__name__": "__main__", "__file__": path})
"""


class OutputIntoAFullPipe(unittest.TestCase):
    """helper-37 finding 1: `sweep --json | less`, and Ctrl-C while the finished sweep waits for
    the pipe to take its output: with PYTHONUNBUFFERED (set in many containers) the kernel takes
    64 KiB, the rest was dropped, and stderr said the output was written."""

    def test_a_signal_while_the_output_waits_on_a_full_pipe_loses_nothing(self):
        from helpers import main_command
        for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            with self.subTest(signal=signum), tempfile.TemporaryFile() as err_f:
                read_end, write_end = os.pipe()
                proc = subprocess.Popen([*main_command(), "sweep", "--jobs", "1", "--requests", "300",
                                         "--concurrency", "1,8,32,64,128,256", "--max-num-seqs", "16,32,64,128,256",
                                         "--json"], stdout=write_end, stderr=err_f, cwd=ROOT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
                os.close(write_end)
                try:
                    deadline = time.monotonic() + 60
                    while not wchan(proc.pid).endswith("pipe_write") and proc.poll() is None:
                        self.assertLess(time.monotonic(), deadline, "the sweep never filled the pipe")
                        time.sleep(0.05)
                    proc.send_signal(signum)
                    time.sleep(0.3)
                    with os.fdopen(read_end, "rb") as pipe:
                        out = pipe.read().decode()
                    proc.wait(30)
                    err_f.seek(0)
                    err = err_f.read().decode()
                finally:
                    kill_group(proc)
                self.assertEqual(proc.returncode, code, err)
                self.assertNotIn("Traceback", err)
                self.assertEqual(len(json.loads(out)), 30, "the finished points are not all there")
                self.assertGreater(len(out), 65536, "not a test of a full pipe")


def wchan(pid):
    """What the process is waiting in, in the kernel (anon_pipe_write: a write to a full pipe)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read()
    except OSError:
        return ""


class LongRuns(unittest.TestCase):
    """Issue 20 finding 8: memory does not grow with simulated seconds, and the one-year rule
    holds after conversations stretch the run."""

    def trace(self, tmp, days):
        return jsonl(os.path.join(tmp, "far.jsonl"), [{"arrival": 0, "prompt_tokens": 100, "output_tokens": 10},
                                                     {"arrival": days * 86400, "prompt_tokens": 100, "output_tokens": 10}])

    def test_two_requests_300_days_apart_simulate_in_little_memory(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = run("simulate", "--trace", self.trace(tmp, 300), "--json", as_bytes=2**30)
        self.assertEqual(r.code, 0, r.err)
        self.assertLess(r.peak_mb, 200, f"peak RSS {r.peak_mb:.0f} MB for 2 requests")

    def test_a_timeline_of_300_days_is_refused_in_one_line_not_built(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = run("simulate", "--trace", self.trace(tmp, 300), "--timeline", os.path.join(tmp, "t.csv"),
                    as_bytes=2**30, timeout=60)
        self.assertEqual(r.code, 2, r.err)
        self.assertEqual(len(r.lines()), 1, r.err)
        self.assertIn("one row per simulated second", r.err)
        self.assertLess(r.peak_mb, 200)

    def test_conversations_past_a_year_are_refused(self):
        for extra in ((), ("--rate", "1")):
            with self.subTest(extra=extra):
                r = run("simulate", "--requests", 1000, "--turns", 1000, "--think-time", 86400, "--prompt-tokens", 1,
                        "--output-tokens", 1, *extra, as_bytes=2**30)
                self.assertEqual(r.code, 2, r.err[-300:])
                self.assertEqual(len(r.lines()), 1, r.err)
                self.assertIn("up to a year", r.err)

    def test_a_search_grid_past_the_cap_is_refused_before_it_runs(self):
        """Issue 20 finding 9: a 23,040-deployment grid once took 1.9 GB."""
        seqs = ",".join(str(i) for i in range(8, 32))
        budget = ",".join(str(2048 + 64 * i) for i in range(20))
        util = ",".join(f"{0.5 + 0.01 * i:.2f}" for i in range(48))
        r = run("search", "--slo", "ttft_p95:500", "--rate", 1, "--requests", 8, "--max-num-seqs", seqs,
                "--max-num-batched-tokens", budget, "--gpu-memory-utilization", util, "--jobs", 1, "--json", timeout=30)
        self.assertEqual(r.code, 2, r.err[-300:])
        self.assertEqual(len(r.lines()), 1, r.err)
        self.assertIn("23,040 deployments", r.err)


class SearchConfirm(unittest.TestCase):
    """Issue 20 finding 11: confirm's inputs are checked before the search, and a confirm that
    fails leaves the search's answer in the output."""
    SEARCH = ("search", "--slo", "ttft_p95:100000", "--rate", "1", "--requests", "10", "--prompt-tokens", "20",
              "--output-tokens", "5", "--jobs", "1", "--confirm-requests", "2")

    def test_an_unreachable_confirm_server_keeps_the_search(self):
        url = f"http://127.0.0.1:{closed_port()}"
        for fmt in ("--json", "--csv"):
            with self.subTest(fmt=fmt):
                r = run(*self.SEARCH, "--confirm", url, fmt, timeout=60)
                self.assertTrue(r.out.strip(), r.err)
                if fmt == "--json":
                    report = json.loads(r.out)
                    self.assertTrue(report["deployments"])
                    self.assertIn("cannot connect", report["confirm"]["problem"])
                else:
                    self.assertIn("meets", r.out)
                self.assertEqual(r.code, 1, r.err)
                self.assertEqual(len(r.lines()), 1, r.err)

    def test_a_server_that_is_no_llm_server_keeps_the_search(self):
        with FakeServer(scripted(), pages={"/v1/models": (404, '{"detail": "Not Found"}', "application/json")}) as server:
            r = run(*self.SEARCH, "--confirm", server.url, "--timeout", 2, "--json", timeout=90)
        self.assertTrue(json.loads(r.out)["deployments"], r.err)
        self.assertEqual(r.code, 1, r.err)

    def test_a_bad_key_is_refused_before_the_search_naming_what_search_takes(self):
        long_search = ("search", "--slo", "ttft_p95:500", "--requests", "5000", "--prompt-tokens", "100",
                       "--output-tokens", "20", "--jobs", "1")
        cases = {"a key with a line break": ("http://127.0.0.1:9", {"OPENAI_API_KEY": "sk-abc\ndef"}),
                 "a URL password and a key": ("http://bob:pw@127.0.0.1:9", {"OPENAI_API_KEY": "sk-abcdef"})}
        for name, (url, env) in cases.items():
            with self.subTest(name):
                r = run(*long_search, "--confirm", url, env=env, timeout=60)
                self.assertEqual(r.code, 2, r.err)
                self.assertEqual(r.out, "")
                self.assertEqual(len(r.lines()), 1, r.err)
                self.assertNotRegex(r.lines()[0], r"--api-key|--url\b")
                self.assertRegex(r.lines()[0], r"--confirm|OPENAI_API_KEY")


if __name__ == "__main__":
    unittest.main()
