"""How the storage chaining methods map torchdata 0.9's arguments onto pipeloom's blocks."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeloom.datapipes import FSSpecFileOpener, HttpReader, IterableWrapper


class Echo(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = f"{self.path} {self.headers.get('X-Token', '-')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def base_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def test_read_from_http_takes_timeout_and_headers(base_url):
    urls = IterableWrapper([f"{base_url}/a", f"{base_url}/b"])
    dp = urls.read_from_http(timeout=5, headers={"X-Token": "t"})
    assert isinstance(dp, HttpReader) and dp.timeout == 5
    assert [(url[-2:], stream.read()) for url, stream in dp] == [("/a", b"/a t"), ("/b", b"/b t")]
    default = urls.read_from_http()  # HttpReader's defaults: a stall fails after 30 s
    assert (default.timeout, default.retries, default.deadline) == (30.0, 3, 600.0)
    tuned = urls.read_from_http(timeout=None, retries=0, backoff=0.1, deadline=5)
    assert (tuned.timeout, tuned.retries, tuned.backoff, tuned.deadline) == (None, 0, 0.1, 5)


def test_read_from_http_refuses_what_it_cannot_honour():
    urls = IterableWrapper([])
    with pytest.raises(ValueError, match=r"skip_on_error=True\) is not supported.*filter"):
        urls.read_from_http(skip_on_error=True)
    with pytest.raises(TypeError, match=r"takes timeout=, headers=, .* only.*\['auth'\]"):
        urls.read_from_http(auth=("user", "pass"))


def test_open_files_by_fsspec_passes_open_kwargs_and_storage_options():
    import fsspec

    fsspec.filesystem("memory").pipe({"/ofb/a.txt": "é".encode("latin-1")})
    urls = IterableWrapper(["memory://ofb/a.txt"])
    dp = urls.open_files_by_fsspec(mode="r", kwargs_for_open={"encoding": "latin-1"})
    assert isinstance(dp, FSSpecFileOpener) and dp.encoding == "latin-1"
    assert [stream.read() for _, stream in dp] == ["é"]
    binary = urls.open_files_by_fsspec(mode="rb", kwargs_for_open={"block_size": 2})
    assert [stream.read() for _, stream in binary] == ["é".encode("latin-1")]
    fsspec.filesystem("memory").rm("/ofb", recursive=True)


def test_torchdata_names_answered_differently_say_how_to_port():
    urls = IterableWrapper([])
    with pytest.raises(
        NotImplementedError, match=r"reads HTTP\(S\) URLs with \.read_from_http\(timeout="
    ):
        urls.read_from_remote(timeout=3)
    with pytest.raises(NotImplementedError, match=r"use \.sharding_filter\(\) at the same place"):
        urls.sharding_round_robin_dispatch()
