"""Hostile OpenAI-compatible servers: fake_server.py's pattern, extended with what a hostile
test needs. GET pages can be callables of the request count (the first scrape at once, the
final one dripped) or a Drip (headers at once, then one byte every N seconds); /v1/models can
answer what the test chooses (an id echoing the Authorization header, ESC sequences, a lone
surrogate); paced() can send raw timings JSON (1e400) and usage counts that contradict the
stream; a stop event ends endless and dripping handlers when the test closes the server.
Everything binds to 127.0.0.1 only; each test starts its own server on a free port."""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fake_server import chunk, data, usage


def raw_data(text, eol="\n"):
    """An event whose JSON is given as text (to send what json.dumps would not write: 1e400)."""
    return f"data: {text}{eol}{eol}"


def paced(ttft=0.02, gap=0.005, tokens=5, prompt=12, finish="length", timings=None, usage_extra=None,
          prompt_of=None, completion_tokens=None, timings_raw=None):
    """A well-formed stream: role chunk, `tokens` content events, finish_reason, usage, [DONE].
    prompt_of(body) -> the prompt token count to report (default: `prompt`);
    completion_tokens: the usage count to report (default: `tokens`);
    timings: llama.cpp's timings object, sent with the usage; timings_raw: the same as raw JSON text."""
    def stream(handler, body):
        handler.start_stream()
        handler.event(chunk({"role": "assistant", "content": None}))
        for i in range(tokens):
            time.sleep(ttft if i == 0 else gap)
            handler.event(chunk({"content": " tok"}))
        with handler.server.fake.lock:
            handler.server.fake.log.append(body)
        handler.event(chunk(finish=finish))
        count = prompt_of(body) if prompt_of else prompt
        event = usage(count, tokens if completion_tokens is None else completion_tokens, **(usage_extra or {}))
        if timings_raw is not None:
            text = json.dumps(event)[:-1] + ', "timings": ' + timings_raw + "}"
            handler.raw(raw_data(text))
        else:
            if timings is not None:
                event["timings"] = timings
            handler.event(event)
        handler.raw("data: [DONE]\n\n")
    return stream


def scripted(*pieces, status=200):
    """Send exactly these pieces (strings as raw text, numbers as sleeps, callables as
    generators of pieces that run until the server stops)."""
    def stream(handler, body):
        if status != 200:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()
        else:
            handler.start_stream()
        for piece in pieces:
            if isinstance(piece, (int, float)):
                if handler.server.fake.stopping.wait(piece):
                    return
            elif callable(piece):
                for more in piece(handler.server.fake.stopping):
                    handler.raw(more)
            else:
                handler.raw(piece)
    return stream


def reply_with(status, body, content_type="application/json"):
    def stream(handler, request_body):
        handler.reply(status, body, content_type)
    return stream


class Drip:
    """A GET answer whose headers come at once and whose body comes one byte every `every` s."""
    def __init__(self, body, every=2.0, content_type="text/plain; version=0.0.4"):
        self.body = body.encode() if isinstance(body, str) else body
        self.every, self.content_type = every, content_type


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

    def raw(self, text):
        self.wfile.write(text.encode("utf-8", errors="surrogatepass") if isinstance(text, str) else text)
        self.wfile.flush()

    def event(self, event, eol="\n"):
        self.raw(data(event, eol))

    def reply(self, status, body, content_type="application/json"):
        payload = body.encode("utf-8", errors="surrogatepass") if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def drip(self, answer: Drip):
        self.send_response(200)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.flush()
        for i in range(len(answer.body)):
            self.wfile.write(answer.body[i:i + 1])
            self.wfile.flush()
            if self.server.fake.stopping.wait(answer.every):
                return

    def do_GET(self):
        fake = self.server.fake
        with fake.lock:
            count = fake.gets.setdefault(self.path, 0)
            fake.gets[self.path] = count + 1
            fake.get_headers.append((self.path, dict(self.headers)))
        answer = fake.pages.get(self.path)
        if answer is None and self.path == "/v1/models":
            answer = (200, fake.models(self) if callable(fake.models) else fake.models, "application/json")
        if callable(answer):
            answer = answer(count)
        try:
            if answer is None:
                self.reply(404, json.dumps({"error": {"message": "not found"}}))
            elif isinstance(answer, Drip):
                self.drip(answer)
            else:
                status, body, content_type = answer
                self.reply(status, body if isinstance(body, (str, bytes)) else json.dumps(body), content_type)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self):
        fake = self.server.fake
        try:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        except ValueError:          # the client was killed mid-request
            return
        with fake.lock:
            fake.bodies.append(body)
            fake.headers.append(dict(self.headers))
        try:
            fake.stream(self, body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


class FakeServer:
    """pages: GET path -> (status, body, content type), a Drip, or a callable of the number of
    earlier GETs of that path returning either. models: the /v1/models body (JSON-able, text, or a
    callable of the handler)."""

    def __init__(self, stream=None, pages=None, models=None):
        self.stream = stream or paced()
        self.pages = pages or {}
        self.models = models if models is not None else {"object": "list", "data": [{"id": "fake-model"}]}
        self.bodies, self.headers, self.log, self.get_headers = [], [], [], []
        self.gets = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port():
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
