"""An in-process OpenAI-compatible server for loadgen's tests, scripted per test.
Only 127.0.0.1; each test starts its own on a free port."""
import json
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
        if self.path == "/v1/models":
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
    def __init__(self, stream=None, metrics=None, chunked=False):
        self.stream = stream or paced()
        self.metrics = metrics
        self.bodies, self.headers, self.scrapes, self.log = [], [], [], []
        self.lock = threading.Lock()
        handler = type("H", (Handler,), {"protocol_version": "HTTP/1.1" if chunked else "HTTP/1.0"})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
