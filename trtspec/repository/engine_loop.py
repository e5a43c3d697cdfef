"""The served torch models' scheduler: one thread runs the batch engine; requests join between steps.

Triton hands execute() requests as they arrive; the model turns each into a `Sequence`, submits it
here and returns at once, and this thread answers through the request's response sender (which the
python backend allows from any thread, decoupled or not). A request that arrives while others run
joins the running batch at the next step instead of waiting for them to finish: TensorRT-LLM's
in-flight batching on the torch runner. A bug in a step fails the requests in flight, never the loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from trtspec.speculative.batch import BatchEngine, Sequence

# done(sequence, error): error is None, or a one-line message for the client
Done = Callable[[Sequence, str | None], None]
CANCEL_POLL_S = 0.05  # how often running requests are asked whether their client went away


class EngineLoop:
    def __init__(
        self,
        engine: BatchEngine,
        on_step: Callable[[BatchEngine], None] | None = None,
        log_error: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.on_step = on_step
        self.log_error = log_error or (lambda message: None)
        self.inbox: queue.SimpleQueue[tuple[Sequence, Done, Callable[[], bool] | None]] = queue.SimpleQueue()
        self.done: dict[int, Done] = {}
        self.cancel_checks: dict[int, Callable[[], bool]] = {}
        self.wake = threading.Event()
        self.stopping = False
        self.polled = 0.0
        self.thread = threading.Thread(target=self._run, name="trtspec-engine", daemon=True)
        self.thread.start()

    def submit(self, seq: Sequence, done: Done, is_cancelled: Callable[[], bool] | None = None) -> None:
        """Queue a sequence; `done` is called from the loop's thread when it finishes or is refused."""
        self.inbox.put((seq, done, is_cancelled))
        self.wake.set()

    def close(self, timeout: float = 10.0) -> None:
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout)

    def _take_inbox(self) -> None:
        while True:
            try:
                seq, done, is_cancelled = self.inbox.get_nowait()
            except queue.Empty:
                return
            try:
                self.engine.add(seq)
            except ValueError as exc:  # could never fit a slot: refused, the others unaffected
                done(seq, str(exc))
                continue
            self.done[id(seq)] = done
            if is_cancelled is not None:
                self.cancel_checks[id(seq)] = is_cancelled

    def _poll_cancelled(self) -> None:
        now = time.monotonic()
        if now - self.polled < CANCEL_POLL_S:
            return
        self.polled = now
        for seq in [*self.engine.rows, *self.engine.waiting]:
            if seq is not None and not seq.cancelled:
                check = self.cancel_checks.get(id(seq))
                if check is not None and _safe(check):
                    seq.cancelled = True

    def _run(self) -> None:
        while not self.stopping:
            if not self.engine.has_work() and self.inbox.empty():
                self.wake.wait(1.0)
                self.wake.clear()
                continue
            self._take_inbox()
            self._poll_cancelled()
            try:
                finished = self.engine.step()
            except Exception:  # a bug, not a request's fault: fail what is in flight, keep serving
                import traceback

                self.log_error(traceback.format_exc())
                for seq in self.engine.reset():
                    self._finish(seq, "internal error in trtspec's batch engine (see the server log)")
                continue
            if self.on_step is not None:  # before answering: a client that reads the metrics next sees this step
                self.on_step(self.engine)
            for seq in finished:
                self._finish(seq, None)

    def _finish(self, seq: Sequence, error: str | None) -> None:
        self.cancel_checks.pop(id(seq), None)
        done = self.done.pop(id(seq), None)
        if done is not None:
            try:
                done(seq, error)
            except Exception:  # answering failed (the client went away): nothing left to tell it
                import traceback

                self.log_error(traceback.format_exc())


def _safe(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:
        return True  # a request whose state cannot be read is treated as gone
