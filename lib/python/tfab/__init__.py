"""tfab: zero-copy tensor rendezvous between processes (Python binding of libtfab).

A receiver asks for a tensor by key and step; the sender's fabric writes it straight from the
sender's tensor into the receiver's memory. Tensors are anything with ``__dlpack__`` (NumPy
arrays, torch tensors); received ones are :class:`Tensor` objects that NumPy and torch view
without a copy. A :class:`World` of ranks runs collectives (allreduce, broadcast, allgather,
reduce_scatter, barrier) on the caller's tensors in place. See doc/python.md for ownership,
threads and errors.
"""

import atexit as _atexit
import errno as _errno
import concurrent.futures as _cf
import threading as _threading
import time as _time
import weakref as _weakref

from . import errors
from .errors import (AbortedError, ConfigError, Error, NoFabricError, OutMismatchError,
                     PeerFailedError, ProtocolError, TimeoutError, status_name)
from . import _tfab
from ._tfab import Peer, Tensor


def _take_signals_back():
    """Debian's libfabric links libinfinipath (PSM), whose constructor, run as _tfab loads,
    replaces the handlers of SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT with one
    that ends the process with exit status 1: Ctrl-C would raise no KeyboardInterrupt and
    run no clean-up, a crash would dump no core. Python's own handlers (what its signal
    module holds) go back, from the main thread (the only one that may set them)."""
    import signal
    if _threading.current_thread() is not _threading.main_thread():
        return
    for name in ("SIGINT", "SIGTERM", "SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT"):
        sig = getattr(signal, name, None)
        handler = signal.getsignal(sig) if sig is not None else None
        if handler is not None:
            try:
                signal.signal(sig, handler)
            except (OSError, ValueError, RuntimeError):  # pragma: no cover
                pass
    import faulthandler
    if faulthandler.is_enabled():
        faulthandler.enable()  # its handlers were replaced too


_take_signals_back()


# The library's log lines in Python's logging (doc/python.md, "Logs"): the C sink queues them
# (bounded; it never takes the GIL) while the "tfab" logger, or one above it, has a handler,
# and a daemon thread hands them to the logger; without a handler the sink writes them to
# stderr itself, as the library does, so that nothing is lost for those who never configure
# logging.
import logging as _logging  # noqa: E402
import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

_log = _logging.getLogger("tfab")
# The library's levels (tfab/log.h: 1 error .. 5 trace) as logging's; trace is DEBUG too.
_LOG_LEVELS = {1: _logging.ERROR, 2: _logging.WARNING, 3: _logging.INFO, 4: _logging.DEBUG,
               5: _logging.DEBUG}
_LOG_NAMES = {1: "error", 2: "warn", 3: "info", 4: "debug", 5: "trace"}
_log_pump = None
_log_pump_lock = _threading.Lock()


def _library_level(level):
    """The library's level (0 none .. 4 debug) that logs what a logger at level takes."""
    for lib, py in ((4, _logging.DEBUG), (3, _logging.INFO), (2, _logging.WARNING),
                    (1, _logging.ERROR)):
        if level <= py:
            return lib
    return 0


def _log_pump_main():
    warned = False
    while True:
        got = _tfab._log_take(None)
        if got is None:
            return
        lines, dropped = got
        handled = _log.hasHandlers()
        for level, subsys, msg in lines:
            if handled:
                _log.log(_LOG_LEVELS.get(level, _logging.DEBUG), msg,
                         extra={"subsystem": subsys})
            else:  # the handlers went: as the library writes its lines
                _sys.stderr.write("tfab %s [%s]: %s\n" % (_LOG_NAMES.get(level, "?"), subsys,
                                                          msg))
        if not handled:
            _tfab._log_bridge(False)
        if dropped and not warned:
            warned = True
            _log.warning("%d of the library's log lines were dropped: their queue to logging "
                         "was full (handlers slower than the library logs); later drops are "
                         "not reported", dropped, extra={"subsystem": "python"})


def _log_route():
    """The library's lines to logging where the "tfab" logger (or one above it) has a
    handler, else to stderr; checked at import and as each context is made."""
    global _log_pump
    on = _log.hasHandlers()
    if on and _log_pump is None:
        with _log_pump_lock:
            if _log_pump is None:
                _log_pump = _threading.Thread(target=_log_pump_main, name="tfab-log",
                                              daemon=True)
                _log_pump.start()
    _tfab._log_bridge(on)


@_atexit.register  # before _close_all's: it runs after it, and takes the lines of the closes
def _log_end():
    """Lines from now on to stderr; the queued ones to logging, waited for a little (a
    handler that blocks holds the exit up no longer)."""
    _tfab._log_stop()
    if _log_pump is not None:
        _log_pump.join(2.0)


if "TFAB_LOG_LEVEL" not in _os.environ:
    _tfab._log_level(_library_level(_log.getEffectiveLevel()))
_log_route()

__all__ = [
    "Context", "World", "Peer", "Tensor", "Future", "Error", "TimeoutError", "PeerFailedError",
    "ProtocolError", "AbortedError", "ConfigError", "NoFabricError", "OutMismatchError",
    "status_name", "settings", "version", "MAX_KEY_LEN", "__version__",
]

# The C library's version, as a Python package gives its own: tfab.__version__ == tfab.version().
__version__ = _tfab.version()

MAX_KEY_LEN = _tfab.MAX_KEY_LEN
_EPROTOTYPE = __import__("errno").EPROTOTYPE
_ETIMEDOUT = __import__("errno").ETIMEDOUT

# A blocking call from the main thread (the one that runs Python's signal handlers) waits in
# the library at most this long (seconds) before they run: Ctrl-C raises KeyboardInterrupt.
_SLICE = 0.1
_MAIN_THREAD = _threading.main_thread().ident
_get_ident = _threading.get_ident
# A receive whose tensor may take longer than a slice to land waits on a thread of its own
# from the start: a slice that ends while the content is being written cancels it, and the
# sender writes it again (bytes, from out= or from what the key's tensor had).
_BIG = 16 << 20


def version() -> str:
    """The C library's version."""
    return _tfab.version()


def settings():
    """Every TFAB_* setting: a list of (name, default, help)."""
    return _tfab.settings()


def _setting_name(name: str) -> str:
    name = name.upper()
    return name if name.startswith("TFAB_") else "TFAB_" + name


def _setting_value(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


_RUNNING, _FINISHED = _cf._base.RUNNING, _cf._base.FINISHED
_DONE = (_cf._base.CANCELLED, _cf._base.CANCELLED_AND_NOTIFIED, _FINISHED)
try:
    from numpy import ndarray as _ndarray
except ImportError:  # pragma: no cover
    _ndarray = None


class Future(_tfab.FutureBase, _cf.Future):
    """A ``concurrent.futures.Future`` for a send or a receive. Without a progress thread,
    ``result()`` and ``exception()`` drive the context's progress while they wait. From
    asyncio: ``await asyncio.wrap_future(f)`` (with ``progress_thread=True``, or a task that
    calls ``ctx.progress()``). It cannot be cancelled: use ``step_cleanup`` or ``abort``."""

    # A fetch's future is made, completed and read once, mostly by one thread: FutureBase
    # (lib/python/future.c) does those in C, on its fields (_state, _result, _exception, _ctx,
    # _cond, _waiter_list, _callbacks, _yield_idle: a collective's wait yields the core while
    # idle, its ranks may outnumber the cores), and concurrent.futures.Future's per-future
    # condition and lists are made only when a thread waits, installs a waiter or a callback
    # (the properties below). Completion writes the state first and then notifies whatever
    # found the condition: under the GIL, a waiter that made it before the write is notified,
    # one that made it after sees the state (python-api tests the threads and asyncio).

    @property
    def _condition(self):
        cond = self._cond
        return cond if cond is not None else self._setdefault(0, _threading.Condition())

    @property
    def _waiters(self):
        w = self._waiter_list
        return w if w is not None else self._setdefault(1, [])

    @property
    def _done_callbacks(self):
        cbs = self._callbacks
        return cbs if cbs is not None else self._setdefault(2, [])

    def _finish(self, exception):
        if self._state in _DONE:
            raise _cf.InvalidStateError("tfab: %r is already done" % (self,))
        self._state = _FINISHED
        cond = self._cond
        if cond is not None:
            with cond:
                for waiter in self._waiters:
                    if exception is None:
                        waiter.add_result(self)
                    else:
                        waiter.add_exception(self)
                cond.notify_all()
        if self._callbacks:
            self._invoke_callbacks()

    def set_result(self, result):
        self._result = result
        self._finish(None)

    def set_exception(self, exception):
        self._exception = exception
        self._finish(exception)

    def _fail(self, status, what):
        """A send's or receive's failure (status negative), from the library's callback."""
        self.set_exception(errors._from_status(status, what))

    def _coll_callback(self, what, result):
        """A collective's completion: the future gets result (its tensor) or the failure."""
        self._yield_idle = True

        def done(status):
            if status:
                self.set_exception(errors._from_status(status, what))
            else:
                self.set_result(result)
        return done



def _string_items(items, what):
    """The elements of a string tensor, each bytes (bytearray and NumPy's bytes_ too)."""
    out = []
    for i, x in enumerate(items):
        if not isinstance(x, (bytes, bytearray)):
            raise TypeError("tfab: %s is sent as a string tensor, whose elements are bytes: "
                            "element %d is %s (encode str to bytes; numbers need a numeric "
                            "dtype, such as int64 or float32)" % (what, i, type(x).__name__))
        out.append(bytes(x))
    return out


def _strings_of(tensor):
    """(shape, flat list of bytes) when tensor is a string tensor, else None."""
    if isinstance(tensor, (bytes, bytearray)):
        return (), [bytes(tensor)]
    if isinstance(tensor, (list, tuple)):
        try:
            import numpy
        except ImportError:
            return (len(tensor),), _string_items(tensor, "a list")
        arr = numpy.array(tensor, dtype=object)
        return arr.shape, _string_items(arr.reshape(-1), "a list")
    dtype = getattr(tensor, "dtype", None)
    kind = getattr(dtype, "kind", None)
    if kind in ("O", "S") and hasattr(tensor, "reshape"):
        return tuple(tensor.shape), _string_items(tensor.reshape(-1),
                                                  "an array of dtype %s" % (dtype,))
    if kind in ("U", "V", "M", "m") and hasattr(tensor, "reshape"):
        raise TypeError("tfab: dtype %s cannot be sent%s" % (
            dtype, ": encode the strings to bytes (dtype S, or object holding bytes)"
            if kind == "U" else " (DLPack has no such type)"))
    return None


def _strings_array(shape, items):
    try:
        import numpy
    except ImportError:
        return items
    arr = numpy.empty(len(items), dtype=object)
    arr[:] = items
    return arr.reshape(shape)


def _out_view(out, view):
    """What an any_shape receive into out returns: a view of out with the tensor's shape."""
    if type(out).__module__.split(".")[0] == "torch":
        import torch
        return torch.from_dlpack(view)
    import numpy
    return numpy.asarray(view)


def _wait_done(fut, seconds):
    """Wait for a concurrent.futures.Future at most seconds (None: no limit) in slices, the
    signal handlers running between them (a signal that another thread took wakes no wait).
    Whether it is done."""
    deadline = None if seconds is None else _time.monotonic() + seconds
    while True:
        left = _SLICE if deadline is None else min(_SLICE, deadline - _time.monotonic())
        if _cf.wait((fut,), max(left, 0.0)).done:
            return True
        if deadline is not None and _time.monotonic() >= deadline:
            return False


def _nbytes(out):
    n = getattr(out, "nbytes", None)
    if n is None and hasattr(out, "element_size"):  # torch 1.13 has no nbytes
        return out.element_size() * out.nelement()
    return n if isinstance(n, int) else 0


def _adopted(value, given, out, any_shape):
    """What a receive into out returns when it takes the value of an earlier receive that
    Ctrl-C interrupted (given: its (out, any_shape))."""
    old_out = given[0] if given else None
    if out is None or value is None or out is old_out:
        return value
    if old_out is not None and given[1] and value is not old_out:
        src = value  # a view of the old out with the tensor's shape
    else:
        src = old_out if old_out is not None else value
    if _strings_of_kind(src):
        raise Error(-_EPROTOTYPE, "recv into out=: the sender sent strings")
    try:
        _tfab.copy_into(out if not any_shape else _like(out, src), src)
    except ValueError as e:
        raise OutMismatchError(-22, "recv into out=: %s (an earlier receive of this key and "
                               "step, interrupted, took the tensor)" % (e,)) from None
    return _out_view(out, _like(out, src)) if any_shape else out


def _strings_of_kind(a):
    return getattr(getattr(a, "dtype", None), "kind", None) == "O"


def _like(out, src):
    """out's first bytes with src's shape (any_shape): a view."""
    import numpy
    if type(out).__module__.split(".")[0] == "torch":
        import torch
        flat = out.reshape(-1)
        shape = tuple(src.shape)
        n = int(numpy.prod(shape)) if shape else 1
        if n > flat.numel():
            raise OutMismatchError(-90, "recv into out=: the tensor does not fit out=")
        return flat[:n].reshape(shape)
    flat = numpy.asarray(out).reshape(-1)
    shape = tuple(src.shape)
    n = int(numpy.prod(shape)) if shape else 1
    if n > flat.size:
        raise OutMismatchError(-90, "recv into out=: the tensor does not fit out=")
    return flat[:n].reshape(shape)


class Context:
    """A tfab context: one per process is typical.

    ``provider`` is TFAB_PROVIDER ("shm", "ofi:tcp", "auto", ...); every other keyword is a
    TFAB_* setting by its name without the prefix, in any case (``progress_thread=True``,
    ``op_timeout_ms=5000``); they win over the environment, which is not changed. Use it as a
    context manager, or call ``close()``. Thread-safe: any thread may call any method.
    """

    def __init__(self, provider=None, **settings):
        pairs = []
        if provider is not None:
            pairs.append(("TFAB_PROVIDER", str(provider)))
        for name, value in settings.items():
            pairs.append((_setting_name(name), _setting_value(value)))
        _log_route()  # logging configured since the import takes the lines from now on
        self._c = _tfab.Context(pairs)
        self._settings = dict(pairs)  # what the world's meeting reads before the library
        self._string_keys = set()  # (peer, key) that recv() found sent as strings
        # Calls that Ctrl-C interrupted, going on in the background until they end: what
        # names them ("recv", peer, key, step), ("accept",), ("connect", host, port),
        # ("join",) -> (a concurrent.futures.Future of their value, what they were given).
        self._interrupted = {}
        self._big_keys = set()  # (peer, key) whose tensors were large: no first slice
        _live.add(self)

    # Life

    def close(self) -> None:
        """Abort what is pending (futures fail with AbortedError) and close every peer. The
        library's memory behind received tensors still alive stays valid until they go.
        An accept that Ctrl-C interrupted ends with the abort; a connect() or a join is waited
        for (its timeout at most)."""
        self._c.close()  # an accept that Ctrl-C interrupted ends with the abort

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self) -> bool:
        return self._c.closed

    @property
    def progress_thread(self) -> bool:
        """Whether a progress thread drives this context (the TFAB_PROGRESS_THREAD setting)."""
        return self._c.progress_thread

    @property
    def paths(self):
        """The paths this context opened, in order of preference ('shm', 'ofi:tcp')."""
        return self._c.paths()

    @property
    def fabric(self):
        """(backend, fabric, domain) of the first path."""
        return self._c.fabric

    # Peers

    def listen(self, host=None, port: int = 0) -> int:
        """Listen for peers on host:port (None: any; 0: any port); returns the port."""
        return self._c.listen(host, port)

    def accept(self, timeout: float = 10.0) -> Peer:
        """Accept one peer that called connect(), within timeout seconds. Ctrl-C raises
        KeyboardInterrupt at once; the accept goes on, and the next accept() takes it."""
        return self._background(("accept",), self._c.accept, _seconds(timeout))

    def connect(self, host: str, port: int, timeout: float = 10.0) -> Peer:
        """Connect to a listening context at host:port, within timeout seconds. Ctrl-C raises
        KeyboardInterrupt at once; the connect goes on, and the next connect() to the same
        address takes it."""
        s = _seconds(timeout)
        return self._background(("connect", host, port),
                                lambda t: self._c.connect(host, port, t), s)

    def _join(self, args, ms, allgather):
        """The C world of a join with args (rank, size, name, host), ms its bound (-1: the
        setting's). On the main thread the join runs on a thread of its own, so that Ctrl-C
        interrupts the wait: it goes on, and the next join here takes it (its world left
        first if it was given other arguments); through allgather= it runs here, and Ctrl-C
        reaches the callable."""
        ident = ("join",)
        if ident in self._interrupted:
            fut = self._interrupted[ident][0]
            _wait_done(fut, None)  # its own bound ends it
            fut, given = self._interrupted.pop(ident)
            if fut.exception() is None:
                if given == args and allgather is None:
                    return fut.result()
                fut.result().leave()
        if allgather is not None:
            return _tfab.World(self._c, *args, ms, allgather)
        return self._background(ident, lambda _: _tfab.World(self._c, *args, ms, None), None,
                                args)

    # Blocking calls and Ctrl-C

    def _adopt(self, ident, seconds):
        """The value of the call named ident that Ctrl-C interrupted, waited for at most
        seconds (None: no limit): (value, what it was given, seconds left), or None when
        there is none or it failed (the caller starts anew, with the seconds left)."""
        fut, given = self._interrupted.pop(ident)
        start = _time.monotonic()
        try:
            done = _wait_done(fut, seconds)
        except BaseException:
            self._interrupted[ident] = (fut, given)  # interrupted again: still there
            raise
        left = None if seconds is None else max(0.0, seconds - (_time.monotonic() - start))
        if not done:
            self._interrupted[ident] = (fut, given)
            raise TimeoutError(-_ETIMEDOUT, "%s: an earlier call that Ctrl-C interrupted is "
                               "still waiting: Connection timed out" % ident[0])
        if fut.exception() is not None:
            return None, left
        return (fut.result(), given), left

    def _background(self, ident, call, seconds, given=None, first=False):
        """call(seconds) (None: no limit), a blocking library call, so that Ctrl-C interrupts
        it: on the main thread it waits in the library at most a slice (first: one slice
        here, then the rest), the rest on a thread of its own while this one runs the signal
        handlers. What Ctrl-C interrupts goes on until it ends, and the next call named ident
        takes its value (given: what it was given, for the caller to judge)."""
        if ident in self._interrupted and ident[0] in ("accept", "connect"):
            got, seconds = self._adopt(ident, seconds)
            if got is not None:
                return got[0]
        if _get_ident() != _MAIN_THREAD:
            return call(seconds)  # signals run on the main thread only
        start = _time.monotonic()
        if first:
            try:
                return call(_SLICE if seconds is None else min(seconds, _SLICE))
            except Error as e:
                if e.status != -_ETIMEDOUT or (seconds is not None and seconds <= _SLICE):
                    raise
            if seconds is not None:
                seconds = max(0.0, seconds - (_time.monotonic() - start))
        fut = _cf.Future()

        def main():
            try:
                fut.set_result(call(seconds))
            except BaseException as e:  # noqa: B902 (handed to the waiter)
                fut.set_exception(e)

        _threading.Thread(target=main, name="tfab-" + ident[0], daemon=True).start()
        try:
            _wait_done(fut, None)  # call's own timeout bounds it
        except BaseException:
            self._interrupted[ident] = (fut, given)
            raise
        return fut.result()

    def peer(self) -> Peer:
        """A peer to connect through blobs moved by other means: send ``peer.blob()`` to the
        other side and pass what it sends back to ``peer.connect(blob)``."""
        return self._c.peer_create()

    # Progress

    def progress(self) -> int:
        """Drive progress once (the GIL released); returns the events handled."""
        return self._c.progress()

    def flush(self, timeout=None) -> None:
        """Wait until every send posted so far has ended (raises TimeoutError). The wait
        returns every 100 ms to run the signal handlers: Ctrl-C raises KeyboardInterrupt."""
        self._c.flush(timeout)

    # Sends

    def send(self, key, step: int, tensor, is_dead: bool = False, peer: Peer = None) -> Future:
        """Offer ``tensor`` under (key, step). It is never copied and kept alive until the
        returned future completes: None when a receiver has it whole, or an exception.
        ``tensor``: anything with ``__dlpack__`` (contiguous, CPU or CUDA), or a string
        tensor (bytes, a list or an object/bytes array of bytes). ``peer``: only that peer's
        receives take it. ``is_dead`` with ``tensor=None`` sends a dead tensor."""
        fut = Future(self)
        if type(tensor) is _ndarray and tensor.dtype.kind not in "OSUVMm":
            # a NumPy array of numbers: no string tensor, no torch bool to bridge
            self._c.send(key, step, tensor, is_dead, peer, fut)
            return fut
        cb = fut
        if tensor is None:
            if not is_dead:
                raise TypeError("tfab: send() needs a tensor unless is_dead")
            tensor = _empty()
        tensor = _torch_bool(tensor)
        strings = _strings_of(tensor)
        if strings is not None:
            self._c.send_strings(key, step, strings[0], strings[1], is_dead, peer, cb)
        else:
            self._c.send(key, step, tensor, is_dead, peer, cb)
        return fut

    # Receives

    def recv(self, peer: Peer, key, step: int, out=None, timeout=None,
             any_shape: bool = False):
        """Receive (key, step) from peer, waiting at most ``timeout`` seconds (None: no
        limit) with the GIL released. Returns a :class:`Tensor` in the library's memory
        (``numpy.from_dlpack``, ``torch.from_dlpack`` or ``.numpy()`` view it), or with
        ``out=`` (a contiguous, writable array of the sender's dtype and shape) ``out``
        itself, filled in place; ``any_shape=True`` takes any shape that fits and returns a
        view of out. A string tensor comes as an object array of bytes; a dead tensor as
        None. Ctrl-C raises KeyboardInterrupt within 100 ms (doc/python.md says what becomes
        of the receive)."""
        seconds = None if timeout is None else _seconds(timeout)
        if self._interrupted:
            ident = ("recv", peer._id, key, step)
            if ident in self._interrupted:
                got, seconds = self._adopt(ident, seconds)
                if got is not None:
                    return self._adopted(ident, got, out, any_shape)
        if _get_ident() != _MAIN_THREAD:
            return self._recv(peer, key, step, out, seconds, any_shape)
        if out is not None:
            big = _nbytes(out) >= _BIG
        else:
            big = self._big_keys and (peer._id, key) in self._big_keys
        if not big:
            # One slice here, the common case: no thread to start.
            start = _time.monotonic()
            try:
                return self._recv(peer, key, step, out,
                                  seconds if seconds is not None and seconds <= _SLICE
                                  else _SLICE, any_shape)
            except TimeoutError as e:
                if e.status != -_ETIMEDOUT or (seconds is not None and seconds <= _SLICE):
                    raise
            if seconds is not None:
                seconds = max(0.0, seconds - (_time.monotonic() - start))
        got = self._background(("recv", peer._id, key, step),
                               lambda t: self._recv(peer, key, step, out, t, any_shape),
                               seconds, (out, any_shape))
        if out is None and not big and getattr(got, "nbytes", 0) >= _BIG:
            if len(self._big_keys) >= 4096:
                self._big_keys.clear()
            self._big_keys.add((peer._id, key))
        return got

    def _recv(self, peer, key, step, out, seconds, any_shape):
        if out is None and (peer, key) in self._string_keys:
            try:
                return self._recv_strings(peer, key, step, seconds)
            except Error as e:
                if abs(e.status) != _EPROTOTYPE:
                    raise
                self._string_keys.discard((peer, key))  # a tensor this time
        try:
            tensor, dead = self._c.recv(peer, key, step, out, any_shape, seconds)
        except Error as e:
            if abs(e.status) != _EPROTOTYPE or out is not None:
                raise
            # A key sent as strings: received as strings from now on, without the try.
            if len(self._string_keys) >= 4096:
                self._string_keys.clear()  # a bound: forgetting costs one try again
            self._string_keys.add((peer, key))
            return self._recv_strings(peer, key, step, seconds)
        if dead:
            return None
        if out is not None:
            return _out_view(out, tensor) if any_shape else out
        return tensor

    def recv_async(self, peer: Peer, key, step: int, out=None, any_shape: bool = False) -> Future:
        """recv() without waiting: a Future of what recv() returns."""
        if self._interrupted and ("recv", peer._id, key, step) in self._interrupted:
            return self._adopt_async(("recv", peer._id, key, step), out, any_shape,
                                     lambda: self.recv_async(peer, key, step, out, any_shape))
        fut = Future(self)
        cb = _recv_callback(fut, out, any_shape, _what("recv", key, step)) if any_shape else fut
        self._c.recv_async(peer, key, step, out, any_shape, cb)
        return fut

    def _adopted(self, ident, got, out, any_shape):
        """_adopted() of got (value, given); what an out= that does not fit leaves stays
        for a receive that fits."""
        try:
            return _adopted(got[0], got[1], out, any_shape)
        except Error:
            kept = _cf.Future()
            kept.set_result(got[0])
            self._interrupted[ident] = (kept, got[1])
            raise

    def _adopt_async(self, ident, out, any_shape, anew):
        """A Future of the value of the receive named ident that Ctrl-C interrupted (its
        failure: of anew(), a receive posted then)."""
        inner, given = self._interrupted.pop(ident)
        fut = Future(self)

        def done(inner):
            try:
                if inner.exception() is None:
                    fut.set_result(self._adopted(ident, (inner.result(), given), out,
                                                 any_shape))
                    return
                again = anew()
            except BaseException as e:  # noqa: B902 (the future's)
                fut.set_exception(e)
                return
            again.add_done_callback(lambda f: fut.set_exception(f.exception())
                                    if f.exception() is not None else fut.set_result(f.result()))
        inner.add_done_callback(done)
        return fut

    def recv_strings(self, peer: Peer, key, step: int, timeout=None):
        """Receive a string tensor: an object array of bytes (None when dead). Ctrl-C raises
        KeyboardInterrupt within 100 ms, as for recv()."""
        seconds = _seconds(timeout)
        ident = ("recv", peer._id, key, step)
        if self._interrupted and ident in self._interrupted:
            got, seconds = self._adopt(ident, seconds)
            if got is not None:
                return got[0]
        return self._background(ident, lambda t: self._recv_strings(peer, key, step, t),
                                seconds, (None, False), first=True)

    def _recv_strings(self, peer, key, step, seconds):
        (shape, items), dead = self._c.recv_strings(peer, key, step, seconds)
        if dead or shape is None:
            return None
        return _strings_array(shape, items)

    def recv_strings_async(self, peer: Peer, key, step: int) -> Future:
        """recv_strings() without waiting: a Future."""
        if self._interrupted and ("recv", peer._id, key, step) in self._interrupted:
            return self._adopt_async(("recv", peer._id, key, step), None, False,
                                     lambda: self.recv_strings_async(peer, key, step))
        fut = Future(self)
        what = _what("recv_strings", key, step)

        def done(status, res, dead):
            if status:
                fut.set_exception(errors._from_status(status, what))
            elif dead or res[0] is None:
                fut.set_result(None)
            else:
                fut.set_result(_strings_array(res[0], res[1]))
        self._c.recv_strings_async(peer, key, step, done)
        return fut

    def recv_ahead(self, peer: Peer, key, depth: int) -> None:
        """No-request mode for key from peer: keep requests standing ``depth`` steps ahead."""
        self._c.recv_ahead(peer, key, depth)

    # Steps, failures, statistics

    def step_cleanup(self, step: int) -> None:
        """Fail every pending send and receive of step with AbortedError, and forget them."""
        self._c.step_cleanup(step)
        for ident in [i for i in self._interrupted if i[0] == "recv" and i[3] == step]:
            del self._interrupted[ident]  # what they received is forgotten too

    def abort(self, status: int = 0) -> None:
        """Fail everything pending, and every later send and receive, with status
        (AbortedError by default)."""
        self._c.abort(status)
        for ident in [i for i in self._interrupted if i[0] == "recv"]:
            del self._interrupted[ident]

    def stats(self) -> dict:
        """The context's counters (bytes_sent, bytes_received, bytes_copied, ...)."""
        return self._c.stats()

    def __repr__(self):
        state = "closed" if self.closed else ",".join(self.paths)
        return "tfab.Context(%s)" % state


_OPS = {"sum": 0, "avg": 1, "min": 2, "max": 3, "prod": 4}
_ALGOS = {None: 0, "auto": 0, "direct": 1, "ring": 2, "doubling": 3}
_COMPRESS = {None: 0, "none": 0, "fp16": 1, "bf16": 2, "int8": 3}


def _choice(table, value, what):
    try:
        return table[value.lower() if isinstance(value, str) else value]
    except (KeyError, TypeError):
        names = ", ".join(repr(k) for k in table)
        raise ValueError("tfab: %s is one of %s, not %r" % (what, names, value)) from None


def _seconds(timeout):
    """A timeout argument: None, or a number of seconds >= 0 (as a float)."""
    if timeout is None:
        return None
    try:
        s = float(timeout)
    except (TypeError, ValueError):
        s = None
    if s is None or isinstance(timeout, (str, bytes, complex)):
        raise TypeError("tfab: timeout must be a number >= 0 (seconds) or None, got %r"
                        % (timeout,))
    if not s >= 0:  # NaN too
        raise ValueError("tfab: timeout must be a number >= 0 (seconds) or None, got %r"
                         % (timeout,))
    return s


def _timeout_ms(timeout):
    s = _seconds(timeout)
    if s is None:
        return -1
    return int(min(s * 1000.0 + 0.5, 2 ** 30))


def _is_torch(tensor):
    return type(tensor).__module__.split(".")[0] == "torch"


def _empty_like(tensor, shape):
    """A new tensor of tensor's kind (torch or NumPy) and dtype, of the given shape."""
    if _is_torch(tensor):
        import torch
        return torch.empty(shape, dtype=tensor.dtype)
    import numpy
    return numpy.empty(shape, dtype=numpy.asarray(tensor).dtype)


# The world's settings and the launchers' names for them, first found wins, as
# lib/util/config.c reads them (doc/settings.md, "Launchers").
_RANK_VARS = ("TFAB_RANK", "RANK", "OMPI_COMM_WORLD_RANK")
_SIZE_VARS = ("TFAB_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")
_ADDR_VARS = ("TFAB_MASTER_ADDR", "MASTER_ADDR")


def _world_setting(ctx, names):
    """The value of a world's setting: given to the context, else the first of names that
    the environment has; None when none."""
    import os
    if names[0] in ctx._settings:
        return ctx._settings[names[0]]
    for name in names:
        if name in os.environ:
            return os.environ[name]
    return None


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


class _TorchStoreMeeting:
    """A world's meeting through torch's store at MASTER_ADDR:MASTER_PORT, where torchrun (or
    init_process_group) has it: the port is torch's, so the world takes no port of its own.
    Who hosts the store follows torch's own rule (rendezvous.py, _create_c10d_store): where
    torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE=True: its static rendezvous) every
    rank is a client; else (torchrun --standalone or another c10d rendezvous, whose agent
    only picks MASTER_PORT; or a launch without torchrun) rank 0 hosts it, multi-tenant as
    init_process_group does, so that the two share it whichever comes first in the process,
    until the join has ended. Each rank set()s its record at tfab/world/<gen>/<rank> and get()s
    every rank's; gen, from store.add, is new for each world made on the store."""

    def __init__(self, ctx, rank, size, timeout_s):
        import datetime
        import os
        try:
            import torch.distributed as dist
        except ImportError as e:
            raise ConfigError("tfab: MASTER_PORT is set (torch's store's port, never the "
                              "world's), and torch, whose store the world would meet "
                              "through, does not import (%s): set TFAB_MASTER_PORT" % e) from None
        self.addr = _world_setting(ctx, _ADDR_VARS)
        port = _int_or_none(os.environ["MASTER_PORT"])
        if not self.addr or port is None or not 0 < port < 65536:
            raise ConfigError("tfab: MASTER_PORT=%r and MASTER_ADDR=%r: no store to meet "
                              "through; set both, or TFAB_MASTER_PORT (and TFAB_MASTER_ADDR) "
                              "for a rendezvous of the world's own"
                              % (os.environ["MASTER_PORT"], self.addr))
        self.rank, self.size = rank, size
        self.hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        self.store = dist.TCPStore(self.addr, port, size, self.hosts,
                                   datetime.timedelta(seconds=timeout_s),
                                   wait_for_workers=False, multi_tenant=True)

    def allgather(self, mine):
        return _StoreAllgather(self.store, self.rank, self.size, "tfab/world/")(mine)

    def host(self):
        """The address the other ranks reach this one at (_route_to)."""
        return _route_to(self.addr)


class _StoreAllgather:
    """An allgather over a torch.distributed store, for a world's meeting: each rank set()s
    its bytes at <prefix><gen>/<call>/<rank> and get()s every rank's (get blocks, within the
    store's timeout); the last rank to have read them all takes them away. gen, from
    store.add, is new for each world made on the store (one that persists, file://, keeps
    the last one's counters); call counts the allgathers of this one."""

    def __init__(self, store, rank, size, prefix):
        self.store, self.rank, self.size, self.prefix = store, rank, size, prefix
        self.gen = (store.add(prefix + "joins", 1) - 1) // size
        self.calls = 0

    def __call__(self, mine):
        store, size = self.store, self.size
        prefix = "%s%d/%d/" % (self.prefix, self.gen, self.calls)
        self.calls += 1
        store.set(prefix + str(self.rank), bytes(mine))
        every = [bytes(store.get(prefix + str(r))) for r in range(size)]
        if store.add(prefix + "read", 1) == size:
            for r in range(size):
                store.delete_key(prefix + str(r))
            store.delete_key(prefix + "read")
        return every


def _route_to(addr):
    """The address of this host's interface toward addr (a UDP socket's connect() sends
    nothing), or None: what the other ranks of a world reach this one at. Debian's host name
    resolves to 127.0.1.1, of no use to another host."""
    import socket
    try:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return s.getsockname()[0]
    except (OSError, TypeError):
        return None


def _torch_store_meeting(ctx, rank, size, ms, allgather):
    """The meeting through torch's store where the environment is torch's (MASTER_PORT set,
    no TFAB_MASTER_PORT, no allgather given, a world of more than one rank), else None."""
    import os
    if (allgather is not None or "MASTER_PORT" not in os.environ or
            _world_setting(ctx, ("TFAB_MASTER_PORT",)) is not None):
        return None
    rank = _int_or_none(_world_setting(ctx, _RANK_VARS)) if rank is None else rank
    size = _int_or_none(_world_setting(ctx, _SIZE_VARS)) if size is None else size
    if rank is None or size is None or size < 2 or not 0 <= rank < size:
        return None  # the library says what is missing (or a world of one needs no meeting)
    if ms < 0:
        ms = _int_or_none(_world_setting(ctx, ("TFAB_WORLD_TIMEOUT_MS",))) or 60000
    return _TorchStoreMeeting(ctx, rank, size, ms / 1000.0)


class World:
    """A world of ranks: this process and the others of the job, each pair connected by a
    peer on its best path, for collectives (doc/world.md).

    ``World(ctx)`` joins from the environment: ``TFAB_RANK``, ``TFAB_WORLD_SIZE``,
    ``TFAB_MASTER_ADDR`` and ``TFAB_MASTER_PORT`` (rank 0 listens there for the others), or
    the launchers' names (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``OMPI_COMM_WORLD_*``;
    doc/settings.md). Under torchrun (``MASTER_PORT`` set, ``TFAB_MASTER_PORT`` not) the
    ranks meet through torch's store at ``MASTER_ADDR:MASTER_PORT`` instead, binding no port
    (rank 0 hosts the store unless torchrun's agent does: ``TORCHELASTIC_USE_AGENT_STORE``). ``rank`` and ``size`` given win over the environment; ``name`` is this
    rank's name (``"/job:worker/task:3"``), ``host`` the address the others reach it at,
    ``timeout`` the join's bound in seconds (None: ``TFAB_WORLD_TIMEOUT_MS``).
    ``allgather``: the ranks meet through the job's own launcher instead of rank 0, a callable
    ``(mine: bytes) -> list of bytes`` that returns every rank's bytes in rank order
    (``comm.allgather`` of mpi4py is one; with torch.distributed,
    ``dist.all_gather_object(out, mine)``). ``ctx`` None: the world makes a context of its
    own, closed when it is left. A context has one world. The join waits with the GIL
    released, and so does every wait below.

    Collectives return a :class:`Future` at once; every rank must start the same
    collectives in the same order, with tensors of the same dtype and size (the order
    numbers them). Tensors are NumPy arrays, torch tensors, or anything with ``__dlpack__``:
    contiguous, on the CPU or a CUDA GPU (through pinned host proxies: the input copied at the
    call, the result copied back before the future completes; work on streams other than the
    default one is the caller's to synchronize first). The library reads and writes CPU
    tensors in place (no copy), and keeps every tensor alive until the future completes: do
    not touch them before. The future's result is
    the tensor that holds the result. A failure (a rank that died, stopped or failed) is the
    future's exception, a :class:`tfab.Error`. A world is a context manager: leaving waits
    for what is in flight.
    """

    def __init__(self, ctx=None, rank=None, size=None, name=None, host=None, timeout=None,
                 allgather=None):
        ms = _timeout_ms(timeout)
        args = (-1 if rank is None else int(rank), -1 if size is None else int(size), name,
                host)
        own = ctx is None
        if own:
            ctx = Context()
        try:
            meeting = _torch_store_meeting(ctx, rank, size, ms, allgather)
            if meeting is not None:
                if host is None and _world_setting(ctx, ("TFAB_WORLD_HOST",)) is None:
                    host = meeting.host()
                args = (meeting.rank, meeting.size, name, host)
                allgather = meeting.allgather
            self._w = ctx._join(args, ms, allgather)
        except BaseException:
            if own:
                left = ctx._interrupted.pop(("join",), None)
                if left is not None:  # Ctrl-C: the join goes on, and the context with it
                    left[0].add_done_callback(lambda f: ctx.close())
                else:
                    ctx.close()
            raise
        self._ctx = ctx
        self._own_ctx = own
        self._rank, self._size = self._w.rank, self._w.size

    # Who is who

    @property
    def rank(self) -> int:
        """This process's rank, 0 to size - 1."""
        return self._rank

    @property
    def size(self) -> int:
        """The number of ranks."""
        return self._size

    @property
    def context(self) -> "Context":
        """The context the world runs on."""
        return self._ctx

    @property
    def joined(self) -> bool:
        """False once the world was left (or its context closed)."""
        return self._w.joined

    def name(self, rank: int = None) -> str:
        """The name rank gave (this rank's by default): TFAB_WORLD_NAME, else "rank N"."""
        return self._w.name(self._rank if rank is None else rank)

    def peer(self, rank: int):
        """The :class:`Peer` that connects this rank to rank (None for this rank): for
        send/recv beside the collectives. The world owns it: it closes when the world is
        left."""
        return self._w.peer(rank)

    @property
    def failed(self):
        """The ranks whose peers have failed, in the order this rank learned it (the first
        failure seen first; ``peer(r).left`` tells a rank that left from one that died), or
        None for a context's second world, whose failures the engine reports to the first."""
        return self._w.failed

    # Life

    def wait(self, timeout=None) -> None:
        """Wait (driving progress, the GIL released) until every collective started before
        has completed; TimeoutError after timeout seconds (None: no bound)."""
        self._w.wait(timeout)

    def leave(self, timeout=None) -> None:
        """Wait for the collectives in flight (at most timeout seconds: TimeoutError, and
        the world stays), then leave: the world's peers close. A world made without a
        context closes its own. Not from a future's callback."""
        self._w.leave(timeout)
        if self._own_ctx:
            self._ctx.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()

    def __repr__(self):
        if not self.joined:
            return "tfab.World(left)"
        return "tfab.World(rank=%d, size=%d)" % (self.rank, self.size)

    # Collectives

    def allreduce(self, tensor, out=None, op: str = "sum", compress=None, key=None,
                  algo=None) -> Future:
        """Reduce tensor over every rank: ``out`` (tensor itself, in place, by default) gets
        rank 0's op rank 1's op ... (doc/world.md says in which order). ``op``: "sum",
        "avg" (the sum divided by size; integers toward zero), "min", "max", "prod". dtypes:
        float16, bfloat16 (torch), float32, float64, and integers: int8 to int64, uint8 to
        uint64 (sums and products wrap, as torch's do). ``compress`` ("fp16", "bf16",
        "int8"; float32 only) shrinks what travels, ``key`` names the tensor for compression's
        error feedback; ``algo`` ("direct", "ring", "doubling"; None: by size). Returns a
        Future of out."""
        opn = _choice(_OPS, op, "op")
        algon = _choice(_ALGOS, algo, "algo")
        compn = _choice(_COMPRESS, compress, "compress")
        if out is tensor:
            out = None
        fut = Future(self._ctx)
        cb = fut._coll_callback("allreduce", tensor if out is None else out)
        self._w.allreduce(tensor, out, opn, algon, compn, key, cb)
        return fut

    def broadcast(self, tensor, root: int = 0) -> Future:
        """Rank root's tensor into every rank's tensor (same dtype and size everywhere; any
        dtype). Returns a Future of tensor."""
        fut = Future(self._ctx)
        self._w.broadcast(_torch_bool(tensor), root, fut._coll_callback("broadcast", tensor))
        return fut

    def allgather(self, tensor, out=None) -> Future:
        """Every rank's tensor, in rank order, into out: size times tensor's elements, of its
        dtype (None: a new array or torch tensor of shape (size,) + tensor.shape). Returns a
        Future of out."""
        if out is None:
            out = _empty_like(tensor, (self._size,) + tuple(tensor.shape))
        fut = Future(self._ctx)
        self._w.allgather(_torch_bool(tensor), _torch_bool(out),
                          fut._coll_callback("allgather", out))
        return fut

    def reduce_scatter(self, tensor, out=None, op: str = "sum") -> Future:
        """Part ``rank`` of the reduction of every rank's tensor into out: tensor holds size
        parts of out's elements (None: a new one, tensor's first dimension divided by size).
        ``op`` as allreduce's. Returns a Future of out."""
        opn = _choice(_OPS, op, "op")
        if out is None:
            shape = tuple(tensor.shape)
            if not shape or shape[0] % self._size:
                raise ValueError("tfab: reduce_scatter without out= needs a first dimension "
                                 "that the world's size (%d) divides, not shape %r"
                                 % (self._size, shape))
            out = _empty_like(tensor, (shape[0] // self._size,) + shape[1:])
        fut = Future(self._ctx)
        self._w.reduce_scatter(tensor, out, opn, fut._coll_callback("reduce_scatter", out))
        return fut

    def reduce(self, tensor, out=None, op: str = "sum", root: int = 0) -> Future:
        """The reduction of every rank's tensor, folded in rank order (the bits of a direct
        allreduce), into out on rank root (tensor itself, in place, by default); ``op`` and
        dtypes as allreduce's. out is the root's only: ignored elsewhere. Returns a Future of
        out (None on the other ranks)."""
        opn = _choice(_OPS, op, "op")
        if out is tensor:
            out = None
        result = None
        if self._rank == root:
            result = tensor if out is None else out
        fut = Future(self._ctx)
        self._w.reduce(tensor, out, opn, root, fut._coll_callback("reduce", result))
        return fut

    def gather(self, tensor, out=None, root: int = 0) -> Future:
        """Every rank's tensor, in rank order, into out on rank root: size times tensor's
        elements, of its dtype (None: a new array or torch tensor of shape (size,) +
        tensor.shape); any dtype. out is the root's only: ignored elsewhere. Returns a Future
        of out (None on the other ranks)."""
        if self._rank != root:
            out = None
        elif out is None:
            out = _empty_like(tensor, (self._size,) + tuple(tensor.shape))
        fut = Future(self._ctx)
        self._w.gather(_torch_bool(tensor), _torch_bool(out), root,
                       fut._coll_callback("gather", out))
        return fut

    def scatter(self, tensor, out, root: int = 0) -> Future:
        """Part ``rank`` of rank root's tensor into out on every rank: root's tensor holds size
        parts of out's elements, in rank order (any dtype); tensor is the root's only (None
        elsewhere is fine). Returns a Future of out."""
        if self._rank != root:
            tensor = None
        fut = Future(self._ctx)
        self._w.scatter(_torch_bool(tensor), _torch_bool(out), root,
                        fut._coll_callback("scatter", out))
        return fut

    def alltoall(self, tensor, out, send_counts=None, recv_counts=None) -> Future:
        """All to all (torch's all_to_all_single): tensor holds this rank's pieces for ranks 0
        to size - 1 in rank order, send_counts[k] elements for rank k; out gets rank k's piece
        for this rank, recv_counts[k] elements, in rank order (counts in elements, None: equal
        pieces); any dtype, the same on every rank. Rank i's send_counts[j] must be rank j's
        recv_counts[i]: where not, both fail (tfab.Error, EINVAL) and nothing of theirs
        lands. tensor and out do not overlap. Returns a Future of out."""
        def counts(c):
            return None if c is None else [int(x) for x in c]
        fut = Future(self._ctx)
        self._w.alltoallv(_torch_bool(tensor), _torch_bool(out), counts(send_counts),
                          counts(recv_counts), fut._coll_callback("alltoall", out))
        return fut

    def barrier(self) -> Future:
        """A Future that completes once every rank has called barrier()."""
        fut = Future(self._ctx)
        self._w.barrier(fut._coll_callback("barrier", None))
        return fut


# Contexts still open at exit are closed while the interpreter can still run their callbacks.
_live = _weakref.WeakSet()


@_atexit.register
def _close_all():
    for ctx in list(_live):
        try:
            ctx.close()
        except Exception:  # pragma: no cover
            pass


def _torch_bool(tensor):
    """torch 1.13 exports no bool through DLPack: a CPU one goes as its NumPy view (no copy)."""
    if type(tensor).__module__.split(".")[0] != "torch":
        return tensor
    import torch
    if tensor.dtype is torch.bool and tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor.numpy()
    return tensor


def _empty():
    try:
        import numpy
        return numpy.empty(0, dtype=numpy.float32)
    except ImportError:  # pragma: no cover
        return bytearray()


def _what(call, key, step):
    """An operation in an exception's words: "recv of 'k' step 3"."""
    if isinstance(key, (bytes, bytearray)):
        key = bytes(key).decode("utf-8", "replace")
    return "%s of '%.64s' step %d" % (call, key, step)


def _recv_callback(fut, out, any_shape, what="recv"):
    mismatch = "recv into out=: its dtype or shape (or size) does not match the tensor sent"

    def done(status, tensor, dead):
        if status:
            if out is not None and abs(status) in (_errno.EINVAL, _errno.EMSGSIZE):
                what_ = mismatch
            else:
                what_ = what
            fut.set_exception(errors._from_status(status, what_))
        elif dead:
            fut.set_result(None)
        elif out is not None:
            try:
                fut.set_result(_out_view(out, tensor) if any_shape else out)
            except Exception as e:  # pragma: no cover
                fut.set_exception(e)
        else:
            fut.set_result(tensor)
    return done
