"""The served torch models' scheduler: one thread runs the batch engine; requests join between steps.

Triton hands execute() requests as they arrive; the model turns each into a `Sequence`, submits it
here and returns at once. A request that arrives while others run joins the running batch at the
next step instead of waiting for them to finish: TensorRT-LLM's in-flight batching on the torch
runner. Everything that talks to Triton (streamed chunks, final responses through the request's
response sender, which the python backend allows from any thread, metrics, asking whether a client
went away) is an IPC round trip, so it runs on a second thread, in order, while the engine thread
steps: with 16 rows a step would otherwise wait on dozens of them. A bug in a step fails the
requests in flight, never the loop.

The engine is built (weights loaded, step costs calibrated) on the engine thread itself, and the
model's own thread never runs torch work: once a second thread has run OpenMP work, every step on
the engine thread ran about 30% slower on CPU (measured at batch 1-16 with 2 intra-op threads), a
cost a single-threaded in-process run never pays.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trtspec.speculative.batch import BatchEngine, Sequence

# done(sequence, error): error is None, or a one-line message for the client
Done = Callable[[Sequence, str | None], None]
CANCEL_POLL_S = 0.5  # how often running requests are asked whether their client went away
REPORT_EVERY_S = 0.25  # how often the batch gauges follow the running batch (and always when it empties)
INTERNAL_ERROR = "internal error in trtspec's batch engine (see the server log)"


@dataclass(frozen=True)
class BatchSnapshot:
    """The running batch as the metrics show it, taken on the engine thread between steps."""

    running: int
    waiting: int
    k: int  # drafts per row in the latest step
    kv_used: int  # target positions held by running requests
    kv_capacity: int

    @staticmethod
    def of(engine: BatchEngine) -> BatchSnapshot:
        used = sum(int(engine.state.lengths[s.slot]) for s in engine.rows if s is not None)
        return BatchSnapshot(
            engine.running, len(engine.waiting), engine.last_k, used, len(engine.rows) * engine.capacity
        )


class EngineLoop:
    def __init__(
        self,
        build: Callable[[], BatchEngine],
        on_step: Callable[[BatchSnapshot], None] | None = None,
        log_error: Callable[[str], None] | None = None,
    ) -> None:
        """Start the threads and build the engine on the engine thread; returns once it is built, or
        raises what building it raised (a model's initialize() then fails with the reason)."""
        self.engine: BatchEngine
        self.on_step = on_step
        self.log_error = log_error or (lambda message: None)
        self.inbox: queue.SimpleQueue[tuple[Sequence, Done, Callable[[], bool] | None]] = queue.SimpleQueue()
        self.done: dict[int, Done] = {}
        self.cancel_checks: dict[int, Callable[[], bool]] = {}
        self.wake = threading.Event()
        self.stopping = False
        self.polled = self.reported = 0.0
        self.outbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.responder = threading.Thread(target=self._respond, name="trtspec-responder", daemon=True)
        self.responder.start()
        built: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

        def build_then_run() -> None:
            try:
                self.engine = build()
            except BaseException as exc:  # handed to the constructing thread, which raises it
                built.put(exc)
                return
            built.put(None)
            self._run()

        self.thread = threading.Thread(target=build_then_run, name="trtspec-engine", daemon=True)
        self.thread.start()
        error = built.get()
        if error is not None:
            self.outbox.put(None)
            raise error

    def defer(self, action: Callable[[], None]) -> None:
        """Run `action` (a send to Triton) on the responder thread, after every action deferred before it."""
        self.outbox.put(action)

    def _respond(self) -> None:
        while True:
            action = self.outbox.get()
            if action is None:
                return
            try:
                action()
            except Exception:  # answering failed (the client went away): nothing left to tell it
                import traceback

                self.log_error(traceback.format_exc())

    def submit(self, seq: Sequence, done: Done, is_cancelled: Callable[[], bool] | None = None) -> None:
        """Queue a sequence; `done` is called from the loop's thread when it finishes or is refused."""
        self.inbox.put((seq, done, is_cancelled))
        self.wake.set()

    def close(self, timeout: float = 10.0) -> None:
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout)
        self.outbox.put(None)
        self.responder.join(timeout)

    def _take_inbox(self) -> None:
        while True:
            try:
                seq, done, is_cancelled = self.inbox.get_nowait()
            except queue.Empty:
                return
            try:
                self.engine.add(seq)
            except ValueError as exc:  # could never fit a slot: refused, the others unaffected
                self.defer(lambda seq=seq, done=done, message=str(exc): done(seq, message))
                continue
            self.done[id(seq)] = done
            if is_cancelled is not None:
                self.cancel_checks[id(seq)] = is_cancelled

    def _poll_cancelled(self) -> None:
        """Ask (on the responder thread) whether running requests' clients went away; the next step drops them."""
        now = time.monotonic()
        if now - self.polled < CANCEL_POLL_S or not self.cancel_checks:
            return
        self.polled = now
        watched = [(seq, self.cancel_checks.get(id(seq))) for seq in [*self.engine.rows, *self.engine.waiting] if seq]

        def poll() -> None:
            for seq, check in watched:
                if check is not None and not seq.cancelled and _safe(check):
                    seq.cancelled = True

        self.defer(poll)

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
                    self._finish(seq, INTERNAL_ERROR)
                continue
            self._report()  # before answering: a client that reads the metrics next sees this step
            for seq in finished:
                self._finish(seq, None)

    def _report(self) -> None:
        now = time.monotonic()
        if self.on_step is None or (now - self.reported < REPORT_EVERY_S and self.engine.has_work()):
            return
        self.reported = now
        snapshot, report = BatchSnapshot.of(self.engine), self.on_step
        self.defer(lambda: report(snapshot))

    def _finish(self, seq: Sequence, error: str | None) -> None:
        self.cancel_checks.pop(id(seq), None)
        done = self.done.pop(id(seq), None)
        if done is not None:
            self.defer(lambda: self._answer(done, seq, error))

    def _answer(self, done: Done, seq: Sequence, error: str | None) -> None:
        """`done`, and if building the answer fails (a bug), the error answer instead: a client whose
        final response is never sent waits for ever."""
        try:
            done(seq, error)
        except Exception:
            if error is not None:
                raise  # even the error answer failed: the responder logs it
            import traceback

            self.log_error(traceback.format_exc())
            done(seq, INTERNAL_ERROR)


class Stream:
    """One request's streamed output, sent on the responder thread.

    What is pushed while a send of it is already queued joins that send: with 16 rows a step queues
    16 sends, and a responder that falls behind catches up with fewer, larger chunks instead of
    delaying every row's tokens (a new row's first one too) behind a growing queue. A chunk of
    several tokens is what speculation streams anyway.
    """

    def __init__(self, loop: EngineLoop, send: Callable[[list], None]) -> None:
        self.loop, self.send = loop, send
        self.items: list = []
        self.sent = 0
        self.queued = False

    def push(self, items: list) -> None:
        """On the engine thread."""
        self.items.extend(items)
        if not self.queued:  # the flush resets this before reading items: nothing pushed is left behind
            self.queued = True
            self.loop.defer(self.flush)

    def flush(self) -> None:
        """On the responder thread: everything pushed and not yet sent, as one send (`items[:sent]` is
        then all that was sent, for a sender that works on the whole output rather than the chunk)."""
        self.queued = False
        end = len(self.items)
        if end > self.sent:
            new, self.sent = self.items[self.sent : end], end
            self.send(new)


def _safe(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:
        return True  # a request whose state cannot be read is treated as gone
