"""HttpReader against a local server: streaming tar shards, retries, clear errors."""

from __future__ import annotations

import copy
import io
import socket
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeloom.datapipes import HttpReader, IterableWrapper, TarArchiveLoader, reset_pipeline
from pipeloom.testing import check_resume_from_every_step, collect, collect_async


def tar_bytes(members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


SHARDS = {
    f"/shard-{i}.tar": [(f"{j:02d}.bin", bytes([i, j]) * 100) for j in range(3)] for i in range(3)
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        server = self.server
        server.hits.append(self.path)
        server.hit.set()
        failures = server.fail_first.get(self.path, 0)
        if failures:
            server.fail_first[self.path] = failures - 1
            self.send_error(server.fail_status)
            return
        body = server.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.files = {path: tar_bytes(members) for path, members in SHARDS.items()}
    httpd.files["/truncated.tar"] = httpd.files["/shard-0.tar"][:700]
    httpd.hits, httpd.hit, httpd.fail_first, httpd.fail_status = [], threading.Event(), {}, 500
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    httpd.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(10)


def urls(server, names=SHARDS):
    return [server.base + name for name in names]


def expected(server):
    return [(f"{server.base}{p}/{n}", d) for p, members in SHARDS.items() for n, d in members]


def test_streams_tar_shards_over_http(server):
    pipe = TarArchiveLoader(HttpReader(IterableWrapper(urls(server))))
    assert collect(pipe) == expected(server)
    assert collect_async(pipe) == expected(server)


def test_a_server_error_is_retried(server):
    server.fail_first["/shard-1.tar"] = 1
    pipe = TarArchiveLoader(HttpReader(IterableWrapper(urls(server)), retries=2, backoff=0.01))
    assert collect(pipe) == expected(server)
    assert server.hits.count("/shard-1.tar") == 2


def test_persistent_server_error_names_url_status_and_attempts(server):
    server.fail_first["/shard-0.tar"] = 10
    reader = HttpReader(IterableWrapper(urls(server)), retries=2, backoff=0.01)
    with pytest.raises(
        OSError,
        match=r"GET http://127.0.0.1:\d+/shard-0.tar failed with HTTP status 500 .* "
        r"after 3 attempts",
    ):
        list(reader)


def test_not_found_fails_at_once_naming_url_and_status(server):
    reader = HttpReader(IterableWrapper([server.base + "/missing.tar"]), retries=3, backoff=0.01)
    with pytest.raises(
        OSError, match=r"GET http://127.0.0.1:\d+/missing.tar failed with HTTP status 404"
    ):
        list(reader)
    assert server.hits == ["/missing.tar"]


def test_refused_connection_names_url_and_cause_after_retries():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x.tar"
    reader = HttpReader(IterableWrapper([url]), retries=2, backoff=0.01, timeout=5)
    with pytest.raises(
        ConnectionError, match=rf"GET {url} failed after 3 attempt\(s\): .*[Rr]efused"
    ):
        list(reader)


def test_close_interrupts_the_backoff_wait(server):
    server.fail_first["/shard-0.tar"] = 10
    reader = HttpReader(IterableWrapper(urls(server)[:1]), retries=1, backoff=600)
    errors = []

    def consume():
        try:
            list(reader)
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=consume)
    thread.start()
    assert server.hit.wait(10)
    reader.close()
    thread.join(10)
    assert not thread.is_alive() and "closed while retrying" in str(errors[0])


def test_truncated_download_raises_naming_the_url(server):
    pipe = TarArchiveLoader(HttpReader(IterableWrapper([server.base + "/truncated.tar"])))
    with pytest.raises(tarfile.ReadError, match=r"truncated.tar' is corrupted or truncated"):
        list(pipe)


def test_resumes_mid_shard_by_requesting_it_again(server):
    check_resume_from_every_step(
        lambda: TarArchiveLoader(HttpReader(IterableWrapper(urls(server))))
    )


def test_sharded_copies_request_disjoint_urls(server):
    pipe = TarArchiveLoader(HttpReader(IterableWrapper(urls(server))))
    outputs = []
    for index in range(2):
        replica = copy.deepcopy(pipe)
        replica.source.sharding_settings(2, index)
        server.hits.clear()
        outputs.extend(collect(replica))
        assert server.hits == list(SHARDS)[index::2]
    assert sorted(outputs) == sorted(expected(server))


def test_responses_are_closed_on_reset(server):
    reader = HttpReader(IterableWrapper(urls(server)))
    it = iter(reader)
    responses = [next(it)[1] for _ in range(2)]
    reset_pipeline(reader)
    assert all(response.closed for response in responses)


def test_bad_arguments_are_rejected():
    source = IterableWrapper([])
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0 or None, got 0"):
        HttpReader(source, timeout=0)
    with pytest.raises(ValueError, match="retries must be an int >= 0, got -1; use 0 for no retry"):
        HttpReader(source, retries=-1)
    with pytest.raises(ValueError, match="backoff must be a number of seconds >= 0"):
        HttpReader(source, backoff=-1)
    with pytest.raises(TypeError, match="headers must be a dict of str to str"):
        HttpReader(source, headers={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="expects http:// or https:// URLs, got 'ftp://x'"):
        list(HttpReader(IterableWrapper(["ftp://x"])))
    assert (
        repr(HttpReader(source)) == "HttpReader(timeout=30.0, retries=3, backoff=0.5, headers=None)"
    )
