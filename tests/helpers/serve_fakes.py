"""Stand-ins for Triton's response senders, for the serving loop without a server."""

import time


class FakeResponder:
    def __init__(self, cancel_after: int | None = None):
        self.sent, self.errors, self.final = [], [], False
        self.cancel_after = cancel_after

    def send(self, outputs, final):
        self.sent.append(outputs)
        self.final = final

    def error(self, message):
        self.errors.append(message)
        self.final = True

    def cancelled(self):
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after


def wait_final(responders, timeout=120):
    deadline = time.monotonic() + timeout
    while not all(r.final for r in responders):
        assert time.monotonic() < deadline, "responses did not finish"
        time.sleep(0.01)
