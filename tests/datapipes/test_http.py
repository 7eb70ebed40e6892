"""HttpReader against a misbehaving local server: whole files once, or an error naming the URL."""

from __future__ import annotations

import copy
import random
import socket
import tarfile
import threading

import pytest

from pipeloom.datapipes import HttpReader, IterableWrapper, TarArchiveLoader, reset_pipeline
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.hostile_http import HostileServer, Route
from tests.datapipes.test_tar import tar_bytes

pytestmark = pytest.mark.timeout(60)


SHARDS = {
    f"/shard-{i}.tar": [(f"{j:02d}.bin", bytes([i, j]) * 100) for j in range(3)] for i in range(3)
}
BODY = random.Random(0).randbytes(10_000)
FAST = {"backoff": 0.01, "timeout": 5}


@pytest.fixture
def server():
    with HostileServer() as httpd:
        for path, members in SHARDS.items():
            httpd.routes[path] = Route(tar_bytes(members))
        httpd.routes["/truncated.tar"] = Route(tar_bytes(SHARDS["/shard-0.tar"])[:700])
        yield httpd


def urls(server, names=SHARDS):
    return [server.url(name) for name in names]


def expected(server):
    return [(f"{server.url(p)}/{n}", d) for p, members in SHARDS.items() for n, d in members]


def read_all(server, path, **options):
    """The bytes HttpReader delivers for ``path``, read in odd-sized pieces."""
    reader = HttpReader(IterableWrapper([server.url(path)]), **options)
    _, stream = next(iter(reader))  # the reader closes it at the end of the epoch
    parts = []
    with stream:
        while piece := stream.read(777):
            parts.append(piece)
    return b"".join(parts)


# -- the ordinary path ---------------------------------------------------------------------------


def test_streams_tar_shards_over_http(server):
    pipe = TarArchiveLoader(HttpReader(IterableWrapper(urls(server))))
    assert collect(pipe) == expected(server)
    assert collect_async(pipe) == expected(server)


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
        assert [hit.path for hit in server.hits] == list(SHARDS)[index::2]
    assert sorted(outputs) == sorted(expected(server))


def test_responses_are_closed_on_reset(server):
    reader = HttpReader(IterableWrapper(urls(server)))
    it = iter(reader)
    responses = [next(it)[1] for _ in range(2)]
    reset_pipeline(reader)
    assert all(response.closed for response in responses)


def test_a_truncated_tar_served_whole_is_a_corrupted_shard(server):
    pipe = TarArchiveLoader(HttpReader(IterableWrapper([server.url("/truncated.tar")])))
    with pytest.raises(tarfile.ReadError, match=r"truncated.tar' is corrupted or truncated"):
        list(pipe)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_whole_body_is_delivered_exactly_with_or_without_content_length(server, chunked):
    server.routes["/f.bin"] = Route(BODY, chunked=chunked)
    assert read_all(server, "/f.bin") == BODY


# -- statuses ------------------------------------------------------------------------------------


@pytest.mark.parametrize("statuses", [[500], [429, 503], [503, 502, 504]])
def test_server_errors_and_429_are_retried_then_succeed(server, statuses):
    server.routes["/f.bin"] = Route(BODY, statuses=statuses)
    assert read_all(server, "/f.bin", retries=3, **FAST) == BODY
    assert len(server.requests("/f.bin")) == len(statuses) + 1


def test_persistent_server_error_names_url_status_and_attempts(server):
    server.routes["/f.bin"] = Route(BODY, statuses=[500] * 10)
    with pytest.raises(
        OSError,
        match=r"GET http://127.0.0.1:\d+/f.bin failed with HTTP status 500 .* after 3 attempt",
    ):
        read_all(server, "/f.bin", retries=2, **FAST)


def test_a_retry_after_past_the_deadline_fails_at_once_naming_the_url(server):
    server.routes["/f.bin"] = Route(BODY, statuses=[503] * 5, retry_after="3600")
    with pytest.raises(TimeoutError, match=r"GET http://127.0.0.1:\d+/f.bin: .*wait 3600.0 s"):
        read_all(server, "/f.bin", deadline=5, **FAST)
    assert len(server.requests("/f.bin")) == 1


def test_an_error_status_while_resuming_names_the_url_status_and_offset(server):
    server.routes["/f.bin"] = Route(BODY, cut=[0.4])
    reader = HttpReader(IterableWrapper([server.url("/f.bin")]), **FAST)
    _, stream = next(iter(reader))
    stream.read(100)  # the first response is open; now the file goes away
    server.routes["/f.bin"] = Route(statuses=[404] * 5)
    with pytest.raises(
        OSError, match=r"f.bin failed with HTTP status 404 .* at byte 4000 of 10000"
    ):
        stream.read()


def test_not_found_fails_at_once_naming_url_and_status(server):
    with pytest.raises(
        OSError, match=r"GET http://127.0.0.1:\d+/missing.tar failed with HTTP status 404"
    ):
        read_all(server, "/missing.tar", retries=3, **FAST)
    assert len(server.requests("/missing.tar")) == 1


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
    server.routes["/f.bin"] = Route(BODY, statuses=[503] * 10)
    reader = HttpReader(
        IterableWrapper([server.url("/f.bin")]), retries=1, backoff=600, deadline=None
    )
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


# -- bodies cut short, stalls, trickles ----------------------------------------------------------


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
@pytest.mark.parametrize("validators", [True, False], ids=["etag", "no-etag"])
def test_a_body_cut_short_once_is_resumed_exactly(server, ranges, validators):
    server.routes["/f.bin"] = Route(BODY, cut=[0.4, None], ranges=ranges, validators=validators)
    assert read_all(server, "/f.bin", **FAST) == BODY
    first, second = server.requests("/f.bin")
    assert first.range is None
    if ranges and validators:  # only the rest, and only if it is the same file
        assert second.range == "bytes=4000-" and second.if_range == '"v0"'
    else:  # the whole file again, the first 4000 bytes dropped
        assert second.range is None


def test_a_body_always_cut_short_raises_naming_url_and_offsets(server):
    server.routes["/f.bin"] = Route(BODY, cut=[0.4], ranges=False)
    with pytest.raises(
        ConnectionError,
        match=r"GET http://127.0.0.1:\d+/f.bin: .*ended .*byte 4000.*after 3 attempt\(s\)",
    ):
        read_all(server, "/f.bin", retries=2, **FAST)
    assert len(server.requests("/f.bin")) == 3


def test_lines_of_a_file_cut_short_are_never_delivered_as_complete(server):
    text = "".join(f"row {i},{i * i}\n" for i in range(1000)).encode()
    server.routes["/rows.csv"] = Route(text, cut=[0.4], ranges=False)
    pipe = HttpReader(IterableWrapper([server.url("/rows.csv")]), retries=1, **FAST).readlines()
    got = []
    with pytest.raises(ConnectionError, match=r"rows.csv: the body ended at byte \d+ of 14427"):
        for item in pipe:
            got.append(item[1])
    assert got == [f"row {i},{i * i}".encode() for i in range(len(got))] and len(got) < 1000


def test_a_range_request_resumes_after_each_cut_with_progress(server):
    server.routes["/f.bin"] = Route(BODY, cut=[0.5, 0.5, 0.5, None])
    assert read_all(server, "/f.bin", retries=1, **FAST) == BODY  # progress resets the count
    assert [hit.range for hit in server.requests("/f.bin")] == [
        None,
        "bytes=5000-",
        "bytes=7500-",
        "bytes=8750-",
    ]


def test_a_stall_once_is_retried_and_resumed(server):
    server.routes["/f.bin"] = Route(BODY, stall=[0.4, None])
    assert read_all(server, "/f.bin", retries=1, timeout=1.0, backoff=0.01) == BODY
    assert [hit.range for hit in server.requests("/f.bin")] == [None, "bytes=4000-"]


def test_a_stall_raises_a_timeout_naming_the_url_after_the_retries(server):
    server.routes["/f.bin"] = Route(BODY, stall=[0.4, 0.0])
    with pytest.raises(
        TimeoutError,
        match=r"GET http://127.0.0.1:\d+/f.bin: no data for 1.0 s at byte 4000 of 10000, "
        r"after 2 attempt\(s\)",
    ):
        read_all(server, "/f.bin", retries=1, timeout=1.0, backoff=0.01)


def test_a_trickling_server_is_stopped_by_the_deadline(server):
    server.routes["/f.bin"] = Route(BODY[:100], trickle=0.3)
    with pytest.raises(
        TimeoutError,
        match=r"GET http://127.0.0.1:\d+/f.bin: gave up at byte \d+ of 100: .*"
        r"past deadline=1.0 s",
    ):
        read_all(server, "/f.bin", timeout=5, deadline=1.0)
    assert len(server.requests("/f.bin")) == 1


# -- the file changes, the protocol breaks -------------------------------------------------------


@pytest.mark.parametrize(
    "ranges,validators,why",
    [
        (True, True, "ETag"),  # If-Range sees a new version: the server sends it whole
        (False, True, "ETag"),
        (False, False, "CRC-32"),  # nothing to compare but the bytes themselves
    ],
)
def test_a_file_that_changes_between_requests_is_never_spliced(server, ranges, validators, why):
    other = random.Random(1).randbytes(len(BODY))
    server.routes["/f.bin"] = Route(
        cut=[0.4, None], versions=[BODY, other], ranges=ranges, validators=validators
    )
    with pytest.raises(OSError, match=rf"f.bin: the file changed on the server .*{why}"):
        read_all(server, "/f.bin", **FAST)


def test_the_same_file_without_validators_is_resumed_by_its_checksum(server):
    server.routes["/f.bin"] = Route(cut=[0.4, None], versions=[BODY, BODY], validators=False)
    assert read_all(server, "/f.bin", **FAST) == BODY


@pytest.mark.parametrize(
    "route",
    [Route(BODY, chunked=True, garbage_chunk=True), Route(BODY, chunked=True, cut=[0.7])],
    ids=["garbage-chunk-size", "cut-before-last-chunk"],
)
def test_broken_chunked_encoding_raises_naming_the_url(server, route):
    route.ranges = False
    server.routes["/f.bin"] = route
    with pytest.raises(ConnectionError, match=r"GET http://127.0.0.1:\d+/f.bin .*after 2 attempt"):
        read_all(server, "/f.bin", retries=1, **FAST)


# -- tar shards over a failing network -----------------------------------------------------------


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_a_tar_shard_cut_mid_member_delivers_every_member_once(server, ranges):
    members = [(f"{j:02d}.bin", random.Random(j).randbytes(3000)) for j in range(6)]
    server.routes["/big.tar"] = Route(tar_bytes(members), cut=[0.5, None], ranges=ranges)
    pipe = TarArchiveLoader(
        HttpReader(IterableWrapper([server.url("/big.tar")]), **FAST), on_error="skip"
    )
    assert collect(pipe) == [(f"{server.url('/big.tar')}/{n}", d) for n, d in members]


def test_a_network_failure_is_raised_even_with_on_error_skip(server):
    members = [(f"{j:02d}.bin", random.Random(j).randbytes(3000)) for j in range(6)]
    server.routes["/big.tar"] = Route(tar_bytes(members), stall=[0.5, 0.0])
    reader = HttpReader(
        IterableWrapper([server.url("/big.tar"), server.url("/shard-0.tar")]),
        retries=1,
        timeout=1.0,
        backoff=0.01,
    )
    got = []
    with pytest.raises(TimeoutError, match=r"big.tar: no data for 1.0 s"):
        for path, data in TarArchiveLoader(reader, on_error="skip"):
            got.append((path.member, data))
    assert got == members[: len(got)] and 0 < len(got) < len(members)


# -- arguments -----------------------------------------------------------------------------------


def test_bad_arguments_are_rejected():
    source = IterableWrapper([])
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0 or None, got 0"):
        HttpReader(source, timeout=0)
    with pytest.raises(ValueError, match="retries must be an int >= 0, got -1; use 0 for no retry"):
        HttpReader(source, retries=-1)
    with pytest.raises(ValueError, match="backoff must be a number of seconds >= 0, got -1"):
        HttpReader(source, backoff=-1)
    with pytest.raises(ValueError, match=r"deadline must be a number of seconds > 0 or None"):
        HttpReader(source, deadline=float("nan"))
    with pytest.raises(TypeError, match="headers must be a dict of str to str"):
        HttpReader(source, headers={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="expects http:// or https:// URLs, got 'ftp://x'"):
        list(HttpReader(IterableWrapper(["ftp://x"])))
    assert repr(HttpReader(source, deadline=None)) == (
        "HttpReader(timeout=30.0, retries=3, backoff=0.5, deadline=None, headers=None)"
    )
