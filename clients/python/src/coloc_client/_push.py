"""Pushing a workload's throughput to coloc's observer (``POST /observer/throughput`` on the
server's metrics endpoint, with ``push`` in ``observer.sources``): the standard library only."""

import json
import os
import time
import urllib.error
import urllib.request

PUSH_PATH = "/observer/throughput"


class PushError(Exception):
    """The server refused a push: ``status`` is the HTTP status, ``reason`` its text."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"push refused ({status}): {reason}")
        self.status = status
        self.reason = reason


def push_throughput(metrics_address: str, pod_uid: str, throughput: float, *, timeout: float = 5.0) -> None:
    """Sends one value: ``throughput`` (the workload's own unit per second, over its last
    steps) of the pod ``pod_uid`` to the server whose metrics endpoint is ``metrics_address``
    (``host:port``). Raises ``PushError`` when the server refuses it (nothing is kept then)."""
    body = json.dumps({"pod_uid": pod_uid, "throughput": throughput}).encode()
    request = urllib.request.Request(
        f"http://{metrics_address}{PUSH_PATH}", data=body, method="POST",
        headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read()
    except urllib.error.HTTPError as error:
        raise PushError(error.code, error.read().decode(errors="replace").strip()) from None


class ThroughputPusher:
    """Counts a loop's work and pushes its throughput every ``every`` steps.

    ``pod_uid`` defaults to the ``POD_UID`` environment variable (the Downward API's
    ``metadata.uid``). A push that fails is reported to ``on_error`` (default: ignored), so
    that the training loop never stops for the observer's sake."""

    def __init__(self, metrics_address: str, pod_uid: str | None = None, every: int = 50,
                 on_error=None, clock=time.monotonic):
        self.address = metrics_address
        self.pod_uid = pod_uid or os.environ["POD_UID"]
        self.every = every
        self.on_error = on_error
        self._clock = clock
        self._steps = 0
        self._work = 0.0
        self._since = clock()

    def step(self, work: float = 1.0) -> float | None:
        """Records one step that did ``work`` units (samples, tokens); every ``every`` steps
        pushes the units per second since the last push and returns that figure."""
        self._steps += 1
        self._work += work
        if self._steps < self.every:
            return None
        now = self._clock()
        throughput = self._work / max(now - self._since, 1e-9)
        self._steps, self._work, self._since = 0, 0.0, now
        try:
            push_throughput(self.address, self.pod_uid, throughput)
        except (PushError, OSError) as error:
            if self.on_error is not None:
                self.on_error(error)
        return throughput
