"""An in-process OpenAI-compatible server for loadgen's tests, scripted per test.
Only 127.0.0.1; each test starts its own on a free port."""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chunk(delta=None, finish=None, **extra):
    event = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    event.update(extra)
    return event


def usage(prompt, completion, **extra):
    return {"object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}, **extra}


def paced(ttft=0.05, gap=0.01, tokens=5, prompt=12, field="content", per_event=1, timings=None, eol="\n"):
    """A stream like llama.cpp's: role chunk, content after `ttft`, one event every `gap`,
    finish_reason, usage (with timings if given), [DONE]."""
    def stream(handler, body):
        received = time.perf_counter()
        handler.start_stream()
        handler.event(chunk({"role": "assistant", "content": None}), eol)
        events = tokens // per_event
        written = []
        for i in range(events):
            time.sleep(ttft if i == 0 else gap)
            handler.event(chunk({field: " tok" * per_event}), eol)
            written.append(time.perf_counter())
        with handler.server.fake.lock:   # what the server really did, to check the client against
            handler.server.fake.log.append({"prompt": body["messages"][-1]["content"],
                                            "received": received, "written": written})
        handler.event(chunk(finish="length"), eol)
        extra = {"timings": timings} if timings else {}
        handler.event(usage(prompt, tokens, **extra), eol)
        handler.raw(f"data: [DONE]{eol}{eol}")
    return stream


def scripted(*pieces, status=200, headers=True):
    """Send exactly these pieces (strings as raw SSE text, numbers as sleeps)."""
    def stream(handler, body):
        if status != 200:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()
        elif headers:
            handler.start_stream()
        for piece in pieces:
            if isinstance(piece, (int, float)):
                time.sleep(piece)
            else:
                handler.raw(piece)
    return stream


def data(event, eol="\n"):
    return f"data: {json.dumps(event)}{eol}{eol}"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if self.protocol_version == "HTTP/1.1":
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def raw(self, text):
        payload = text.encode()
        if self.protocol_version == "HTTP/1.1":
            payload = f"{len(payload):x}\r\n".encode() + payload + b"\r\n"
        self.wfile.write(payload)
        self.wfile.flush()

    def event(self, event, eol="\n"):
        self.raw(data(event, eol))

    def reply(self, status, body, content_type="application/json"):
        payload = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        fake = self.server.fake
        if self.path in fake.pages:
            status, body, content_type = fake.pages[self.path]
            self.reply(status, body if isinstance(body, str) else json.dumps(body), content_type)
        elif self.path == "/v1/models":
            self.reply(200, json.dumps({"object": "list", "data": [{"id": "fake-model"}]}))
        elif self.path == "/metrics" and fake.metrics is not None:
            with fake.lock:
                text = fake.metrics(len(fake.scrapes)) if callable(fake.metrics) else fake.metrics
                fake.scrapes.append(time.perf_counter())
            self.reply(200, text, "text/plain; version=0.0.4")
        else:
            self.reply(404, json.dumps({"error": {"message": "not found"}}))

    def do_POST(self):
        fake = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with fake.lock:
            fake.bodies.append(body)
            fake.headers.append(dict(self.headers))
        try:
            fake.stream(self, body)
            if self.protocol_version == "HTTP/1.1":
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


class FakeServer:
    def __init__(self, stream=None, metrics=None, chunked=False, pages=None):
        self.stream = stream or paced()
        self.metrics = metrics
        self.pages = pages or {}      # GET path -> (status, body str or JSON-able, content type)
        self.bodies, self.headers, self.scrapes, self.log = [], [], [], []
        self.lock = threading.Lock()
        handler = type("H", (Handler,), {"protocol_version": "HTTP/1.1" if chunked else "HTTP/1.0"})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.first_contact = None
        serve = self.httpd.process_request

        def process_request(request, address):
            self.first_contact = self.first_contact or time.monotonic()
            serve(request, address)
        self.httpd.process_request = process_request

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------------------------------------
# Below: servers that misbehave below the level http.server lets a test script (resets, header
# floods, byte drips, a protocol other than the one asked for), and a server in its own process
# that a test can kill.
# ---------------------------------------------------------------------------------------------

def read_request(conn, timeout=5.0):
    """(method, path, headers, body) of one HTTP request read from a raw socket, or None."""
    conn.settimeout(timeout)
    received = b""
    while b"\r\n\r\n" not in received:
        piece = conn.recv(65536)
        if not piece:
            return None
        received += piece
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path = lines[0].split(" ")[:2]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    while len(body) < length:
        piece = conn.recv(65536)
        if not piece:
            break
        body += piece
    return method, path, headers, body


def sse_head(status="200 OK", content_type="text/event-stream", extra=()):
    """An HTTP/1.0-style response head (the body runs until the connection closes)."""
    lines = [f"HTTP/1.0 {status}", f"Content-Type: {content_type}", *extra, "", ""]
    return "\r\n".join(lines).encode()


def good_stream(tokens=3, prompt=5):
    """A whole, well-formed chat completion stream as bytes."""
    text = data(chunk({"role": "assistant", "content": None}))
    text += "".join(data(chunk({"content": " tok"})) for _ in range(tokens))
    text += data(chunk(finish="length")) + data(usage(prompt, tokens)) + "data: [DONE]\n\n"
    return text.encode()


def reset(conn):
    """Close with a TCP RST instead of a FIN, as a crashing or killed-by-proxy server does."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class RawServer:
    """A TCP server on 127.0.0.1 that hands every POST (after reading it) to
    on_post(conn, method, path, headers, body) with the raw socket. GETs go to on_get the same way,
    or get a 404 JSON answer. With raw=True nothing is read first: on_connect(conn) gets the socket
    as accepted (for a client speaking TLS to a plain server). Requests seen are in .requests.

    Both servers here note .first_contact, when the first connection was accepted: how long a
    client took to give up is timed from it, not from its process's start, which a loaded machine
    stretches by seconds."""

    def __init__(self, on_post=None, on_get=None, on_connect=None):
        self.on_post, self.on_get, self.on_connect = on_post, on_get, on_connect
        self.requests = []
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopping = threading.Event()
        self.conns = []
        self.first_contact = None

    def __enter__(self):
        threading.Thread(target=self.accept_loop, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.sock.close()
        for conn in list(self.conns):
            try:
                conn.close()
            except OSError:
                pass

    def accept_loop(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.first_contact = self.first_contact or time.monotonic()
            self.conns.append(conn)
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn):
        try:
            if self.on_connect:
                self.on_connect(conn)
                return
            request = read_request(conn)
            if request is None:
                return
            with self.lock:
                self.requests.append(request)
            method = request[0]
            if method == "POST" and self.on_post:
                self.on_post(conn, *request)
            elif method == "GET" and self.on_get:
                self.on_get(conn, *request)
            else:
                body = b'{"error": {"message": "not found"}}'
                conn.sendall(b"HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass


class ServerProcess:
    """FakeServer(paced(...)) in a process of its own, to be killed mid-run like a real server.
    It prints its URL, then one line 'done' per request whose stream it finished."""

    def __init__(self, ttft=0.05, gap=0.02, tokens=5):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", str(ttft), str(gap), str(tokens)],
                                     stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        self.done = 0

    def wait_done(self, count, timeout=10.0):
        """Block until the server has finished `count` streams (reads its stdout)."""
        end = time.monotonic() + timeout
        while self.done < count and time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.strip() == "done":
                self.done += 1
        return self.done >= count

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        self.proc.stdout.close()


def serve_forever_paced(ttft, gap, tokens):
    stream = paced(ttft=ttft, gap=gap, tokens=tokens)

    def counted(handler, body):
        stream(handler, body)
        sys.stdout.write("done\n")
        sys.stdout.flush()
    with FakeServer(counted) as server:
        sys.stdout.write(server.url + "\n")
        sys.stdout.flush()
        while True:
            time.sleep(3600)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve_forever_paced(float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
