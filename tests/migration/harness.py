"""Run a migration pipeline and record what it yields; shared by the test and the recorder."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any

from tests.migration.encoding import encode


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(folder: str) -> Iterator[str]:
    """Serve ``folder`` over HTTP on 127.0.0.1; yield the base URL."""
    handler = functools.partial(_QuietHandler, directory=folder)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def run(module: ModuleType, root: str, base_url: str) -> dict[str, Any]:
    """Build the pipeline's outputs and read each to the end; JSON-ready."""
    outputs = module.build(root, base_url)
    recorded: dict[str, Any] = {}
    for name, pipe in outputs.items():
        if isinstance(pipe, list):
            recorded[name] = [[encode(item, root) for item in part] for part in pipe]
        else:
            recorded[name] = [encode(item, root) for item in pipe]
    return recorded


def canonical(outputs: dict[str, Any], order: str) -> dict[str, Any]:
    """With ``order="any"`` every output list is compared as a multiset."""
    if order != "any":
        return outputs
    return {
        name: sorted(json.dumps(item, sort_keys=True) for item in items)
        for name, items in outputs.items()
    }
