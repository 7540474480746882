"""tfab as a torch.distributed backend (doc/torch.md).

``import tfab.torch`` registers the backend ``"tfab"``: after it,
``torch.distributed.init_process_group("tfab")`` runs torch's collectives and point-to-point
calls on a tfab world, with every init method torch has (env://, tcp://, file://, a store)
and under torchrun or ``torch.multiprocessing.spawn``. The ranks meet through the store torch
hands the backend: no port of tfab's own to configure. ``DistributedDataParallel`` runs on it
unchanged; :mod:`tfab.torch.hooks`'s comm hooks compress its gradients' traffic.

Every process imports this module before it makes the group: under ``mp.spawn`` the children
run the main module's top level, so import it there, not under ``if __name__ ==
"__main__"``.
"""

import atexit as _atexit
import builtins as _builtins
import datetime as _datetime
import os as _os
import threading as _threading
import time as _time
import weakref as _weakref
from collections import deque as _deque

import torch
import torch.distributed as dist

import tfab as _tfab
from tfab import errors as _errors

__all__ = ["ProcessGroupTfab", "stats", "hooks", "BACKEND"]

BACKEND = "tfab"

# Completed works that no one waited stay referenced this long (a count): a C++ caller
# (DDP's reducer) may wait on a Work after it completed, and reaches the Python override only
# while the Python object lives. Beyond it the oldest are dropped.
_KEEP_DONE = 4096
# A work in flight that no Python thread waits on gets the driver thread after this long.
_IDLE_S = 0.002
# How often the driver looks for such works while none is in flight.
_LOOK_S = 0.01

# torch's reduce ops (by RedOpType name) and tfab's.
_OPS = {"SUM": "sum", "AVG": "avg", "MIN": "min", "MAX": "max", "PRODUCT": "prod"}

_P2P_KEY = "tfab.torch/p/%d"

# What a peer's status says of its rank.
_WHY = {
    "TFAB_ERR_PEER_FAILED": "died, left or was cut off (TFAB_ERR_PEER_FAILED)",
    "TFAB_ERR_TIMEOUT": "was silent past TFAB_OP_TIMEOUT_MS: stopped, or unreachable "
                        "(TFAB_ERR_TIMEOUT)",
}


_op_names = {}  # op -> tfab's name: torch's enums are slow to read (pybind)


def _op_name(op, call):
    try:
        return _op_names[op]
    except (KeyError, TypeError):  # TypeError: an op that cannot be hashed
        pass
    name = getattr(getattr(op, "op", op), "name", None) or str(op)
    opn = _OPS.get(name)
    if opn is None:
        raise RuntimeError("tfab: %s: reduce op %s is not supported (SUM, AVG, MIN, MAX and "
                           "PRODUCT are)" % (call, name))
    try:
        _op_names[op] = opn
    except TypeError:
        pass
    return opn


def _one(tensors, call):
    if len(tensors) != 1:
        raise RuntimeError("tfab: %s takes one tensor per call, not %d" % (call, len(tensors)))
    return tensors[0]


def _local_host(store):
    """The address the other ranks reach this one at: TFAB_WORLD_HOST, else this host's
    address toward the store's host (a TCPStore's, under the group's PrefixStore) or
    MASTER_ADDR, else None (the library's default)."""
    host = _os.environ.get("TFAB_WORLD_HOST")
    if host:
        return host
    while store is not None and not hasattr(store, "host"):
        store = getattr(store, "underlying_store", None)
    toward = getattr(store, "host", None) or _os.environ.get("MASTER_ADDR")
    return _tfab._route_to(toward) if toward else None


class _Stats:
    def __init__(self):
        self.copies = 0
        self.bytes_copied = 0


def _contiguous(t, stats):
    """t, or a contiguous copy of it (counted)."""
    if t.is_contiguous():
        return t
    stats.copies += 1
    stats.bytes_copied += t.numel() * t.element_size()
    return t.contiguous()


def _copy_back(dst, src, stats):
    if dst is not src:
        stats.copies += 1
        stats.bytes_copied += src.numel() * src.element_size()
        dst.copy_(src.view(dst.shape) if src.numel() == dst.numel() else src)


def _flat(t):
    return t.reshape(-1)


class _Work(dist.Work):
    """A call's Work: ``wait()`` returns True or raises RuntimeError (naming the rank that
    died when one did), ``get_future()`` gives a torch future of the output tensors, failing
    in C++ too. It ends when every tfab future it holds is done and its finish (copies back
    into non-contiguous outputs) ran.

    Cheap on purpose: a small all_reduce's time on ranks that share cores is mostly the
    Python each rank runs per call. So no callbacks on the tfab futures unless the torch
    future was taken (then whoever completes them ends the work); no lock but for its end,
    which the waiting thread and the driver may reach together."""

    def __init__(self, group, call, futs, outputs, finish=None, source_rank=-1):
        super().__init__()
        self._group = group
        self._call = call
        self._futs = futs
        self._outputs = outputs
        self._finish = finish
        self._source = source_rank
        self._lock = _threading.Lock()
        self._ended = False
        self._raw = None  # the error, named (the rank that failed) when first asked for
        self._error = None
        self._torch_fut = None
        self._bg = False  # its future was taken: the driver drives it
        self._t0 = _time.monotonic()
        group._keep(self)
        if not futs:
            self._end()

    def _try_end(self):
        """End the work if every future is done; True once it has ended (False while
        another thread is ending it)."""
        if not self._ended:
            for f in self._futs:
                if not f.done():
                    return False
            self._end()
        return self._ended

    def _one_done(self, _f):
        self._try_end()

    def _end(self):
        """Every future is done: finish (copies back) or find the error, then complete the
        torch future if one was asked for. Runs once, on whichever thread comes first; a
        second one returns at once (its caller waits for _ended)."""
        if not self._lock.acquire(False):
            return
        if self._ended:
            self._lock.release()
            return
        error = None
        for f in self._futs:
            e = f.exception()
            if e is not None:
                error = e
                break
        if error is None and self._finish is not None:
            try:
                self._finish()
            except Exception as e:  # pragma: no cover (a copy back that failed)
                error = e
        self._raw = error
        self._ended = True
        tf = self._torch_fut
        self._lock.release()
        if tf is not None:
            self._complete(tf)
        self._group._done(self)

    def _failure(self, drive):
        """The RuntimeError of a work that failed (None if it did not), naming the rank
        that failed; drive: progress may be driven meanwhile (not from a callback)."""
        if self._raw is not None and self._error is None:
            self._error = self._group._runtime_error(self._call, self._raw, drive)
        return self._error

    def _complete(self, tf):
        tf.set_result((self._failure(False), self._outputs))

    # dist.Work

    def wait(self, timeout=None):
        g = self._group
        g._waited(self)  # before it ends: an ended work not waited is kept a while
        if not self._ended:
            secs = g._wait_seconds(timeout)
            start = _time.monotonic()
            g._waiting.add(self)  # the driver leaves the polling to this thread
            try:
                # Each future's wait drives progress in C, the GIL released, yielding the
                # core on idle polls (ranks may outnumber the cores).
                for f in self._futs:
                    if not f.done():
                        left = None if secs is None else max(
                            0.0, secs - (_time.monotonic() - start))
                        f.exception(left)  # waits; the error, if any, is read below
            except _builtins.TimeoutError:  # the wait's own (a failure is returned, not raised)
                g._timed_out(self._call, secs)
            finally:
                g._waiting.discard(self)
            while not self._try_end():  # another thread is ending it
                if secs is not None and _time.monotonic() - start > secs:
                    g._timed_out(self._call, secs)
                _time.sleep(0)
            _settle(g._progress)
        if self._raw is not None and self._failure(True) is not None:
            raise self._error
        return True

    def get_future(self):
        raw = torch.futures.Future()
        with self._lock:
            self._torch_fut = raw
            ended = self._ended
        if ended:
            self._complete(raw)
        else:
            for f in self._futs:  # whoever completes the last one ends the work
                f.add_done_callback(self._one_done)
            self._group._background(self)
        self._group._waited(self)  # C++ holds the future, not this object
        return raw.then(_unwrap)

    def is_completed(self):
        return self._try_end()

    def is_success(self):
        return self._try_end() and self._raw is None

    def exception(self):
        return self._failure(False) if self._try_end() else None

    def result(self):
        return list(self._outputs)

    def source_rank(self):
        return self._source

    def _source_rank(self):
        return self._source

    def synchronize(self):
        pass


def _settle(progress):
    """Progress calls until one completes nothing: the TAKEN of a receive completed in a
    call waits for the next one (the application's reply goes first), and its sender's send
    ends only on it. Without these calls a rank that moves on to other work (gloo, its
    model) would hold it."""
    for _ in range(64):
        if progress() <= 0:
            return


def _drive(ref):
    """The group's driver thread: it drives the context's progress (waiting on a work's
    tfab futures, which drives it with the GIL released, the context having no progress
    thread) for the works no Python thread is waiting on: at once for one whose future was
    taken (DDP's reducer waits on it in C++), and for the oldest in flight once it has waited
    _IDLE_S with no Python waiter (an isend never waited, a work its caller keeps for later).
    While a Python thread waits, that thread drives, and the driver sleeps: two threads
    polling would share the cores with the ranks. It ends with the group."""
    while True:
        g = ref()
        if g is None or g._closed:
            return
        cond, work = g._driver_cond, None
        with cond:
            inflight = g._inflight
            while inflight and inflight[0]._ended:
                inflight.popleft()
            for w in inflight:
                if w._bg and not w._ended:
                    work = w
                    break
            if work is None and inflight and not g._waiting and (
                    _time.monotonic() - inflight[0]._t0 > _IDLE_S):
                work = inflight[0]
            if work is None:
                del g
                # Not woken for each new work (a wake costs every call the GIL's hand-over):
                # it looks again after a while, as long as the group lives.
                cond.wait(_IDLE_S if inflight else _LOOK_S)
                continue
        del g
        try:
            for f in work._futs:
                f.exception()  # drives progress until done; fails at the latest on abort
            while not work._try_end():
                _os.sched_yield()  # another thread is ending it
            _settle(work._group._progress)
        except (_tfab.Error, ValueError):
            pass  # the group ended meanwhile (ValueError: its context is closed)
        del work


def _unwrap(fut):
    error, outputs = fut.value()
    if error is not None:
        raise error
    return outputs


class ProcessGroupTfab(dist.ProcessGroup):
    """A torch.distributed process group on a tfab world (doc/torch.md). Made by
    ``init_process_group("tfab")`` or ``new_group(backend="tfab")``; not by hand."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._timeout = timeout.total_seconds() if timeout is not None else None
        self._stats = _Stats()
        self._works = {}  # id -> work: not yet waited, or their future not yet taken
        self._done_works = _deque()  # completed, never waited: kept a while (_KEEP_DONE)
        self._p2p = {}  # (peer rank, tag, "s"/"r") -> next step
        # No progress thread: a wait drives progress itself, and the group's driver (below)
        # while anything is in flight; an idle thread's pauses would add to every round.
        self._ctx = _tfab.Context(progress_thread=False)
        self._progress = self._ctx._c.progress
        self._inflight = _deque()  # works not yet ended, oldest first: what the driver waits
        self._driver_cond = _threading.Condition()
        self._driver = None
        self._waiting = set()  # works a Python thread waits on (it drives progress)
        try:
            allgather = _tfab._StoreAllgather(store, rank, size, "tfab/")
            self._world = _tfab.World(self._ctx, rank=rank, size=size, host=_local_host(store),
                                      timeout=self._timeout, allgather=allgather)
        except BaseException:
            self._ctx.close()
            raise
        self._closed = False
        _live.add(self)
        self._finalizer = _weakref.finalize(self, _close, self._world, self._ctx)

    # Life and bookkeeping

    def getBackendName(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def name(self):
        return BACKEND

    def _keep(self, work):
        # Plain dict and deque operations, each atomic under the GIL: no lock per call.
        self._works[id(work)] = work
        self._inflight.append(work)
        if self._driver is None:
            with self._driver_cond:
                if self._driver is None:
                    self._driver = _threading.Thread(target=_drive,
                                                     args=(_weakref.ref(self),),
                                                     name="tfab-torch-driver", daemon=True)
                    self._driver.start()

    def _background(self, work):
        """work's future was taken: the driver drives it from now on."""
        with self._driver_cond:
            work._bg = True
            self._driver_cond.notify()

    def _waited(self, work):
        self._works.pop(id(work), None)

    def _done(self, work):
        """A work ended: one never waited is kept a while (_KEEP_DONE) for a late wait."""
        if id(work) in self._works:
            done = self._done_works
            done.append(work)
            while len(done) > _KEEP_DONE:
                old = done.popleft()
                if self._works.get(id(old)) is old:
                    del self._works[id(old)]

    def _wait_seconds(self, timeout):
        if isinstance(timeout, _datetime.timedelta):
            timeout = timeout.total_seconds()
        if timeout is None or timeout <= 0 or timeout >= 1e9:
            return self._timeout
        return float(timeout)

    def _timed_out(self, call, secs):
        """A wait past the group's timeout: the context is aborted (tfab cannot cancel one
        collective), so every later call fails too, as gloo's group after a timeout."""
        self._ctx.abort(-110)  # ETIMEDOUT
        raise RuntimeError("tfab: %s timed out after %.1f s (the process group's timeout); "
                           "the group is aborted" % (call, secs))

    def _dead_rank(self, drive):
        """(rank, status) of the peer whose failure failed the collective, or None. Peers
        in the order this rank saw them fail (World.failed), and of those the first that did
        not leave: a rank that gave up on the same collective and left may fail before our
        own verdict on the rank that died, whatever their numbers. A failure passed on by a
        neighbour may come before that verdict too, so this allows one liveness period for
        it, driving progress (drive: not from a callback) so that the verdict comes; past
        it, the first peer seen failed, though it left."""
        end = _time.monotonic() + 0.2
        progress = self._ctx._c.progress
        while True:
            if drive:
                try:
                    progress()
                except _tfab.Error:
                    drive = False
            try:
                failed = self._failed()
            except Exception:  # the world was left
                return None
            for r, st, left in failed:
                if not left:
                    return r, st
            if _time.monotonic() > end:
                return failed[0][:2] if failed else None
            _time.sleep(0.001 if drive else 0.01)

    def _failed(self):
        """[(rank, status, left)] of the failed peers, in the order seen; where the world
        does not know it (a context's second world), in rank order."""
        w, me = self._world, self.rank()
        order = w.failed
        if order is None:
            order = [r for r in range(self.size()) if r != me]
        got = []
        for r in order:
            peer = w.peer(r)
            st = peer.status
            if st:
                got.append((r, st, peer.left))
        return got

    def _runtime_error(self, call, error, drive=False):
        dead = self._dead_rank(drive) if isinstance(error, _tfab.Error) else None
        if dead is not None:
            r, st = dead
            name = self._world.name(r)
            who = "rank %d" % r if name == "rank %d" % r else "rank %d (%s)" % (r, name)
            why = _WHY.get(_errors.status_name(st), _errors.status_name(st))
            msg = "tfab: %s failed: %s %s; here: %s" % (call, who, why, error)
        else:
            msg = "tfab: %s failed: %s" % (call, error)
        exc = RuntimeError(msg)
        exc.__cause__ = error
        return exc

    def _check(self, call):
        if self._closed or not self._world.joined:
            raise RuntimeError("tfab: %s: the process group was destroyed" % call)

    def _start(self, call, post):
        """post() -> (futures, outputs, finish): a Work, or the call's refusal as the
        RuntimeError torch users expect."""
        self._check(call)
        try:
            futs, outputs, finish = post()
        except RuntimeError:
            raise
        except (_tfab.Error, ValueError, TypeError) as e:
            msg = str(e)
            msg = msg[6:] if msg.startswith("tfab: ") else msg
            raise RuntimeError("tfab: %s: %s" % (call, msg)) from e
        return _Work(self, call, futs, outputs, finish)

    # Collectives

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = opts if isinstance(opts, dist.ReduceOp) else getattr(opts, "reduceOp",
                                                                dist.ReduceOp.SUM)
        return self._allreduce("allreduce", tensors, op)

    def _allreduce(self, call, tensors, op, compress=None, key=None):
        t = _one(tensors, call)
        opn = _op_name(op, call)

        def post():
            c = _contiguous(t, self._stats)
            fut = self._world.allreduce(c, op=opn, compress=compress, key=key)
            return [fut], [t], (None if c is t else lambda: _copy_back(t, c, self._stats))
        return self._start(call, post)

    def allreduce_coalesced(self, tensors, opts=None):
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        opn = _op_name(op, "allreduce_coalesced")

        def post():
            cs = [_contiguous(t, self._stats) for t in tensors]
            futs = [self._world.allreduce(c, op=opn) for c in cs]

            def finish():
                for t, c in zip(tensors, cs):
                    _copy_back(t, c, self._stats)
            return futs, list(tensors), finish
        return self._start("allreduce_coalesced", post)

    def broadcast(self, tensors, opts=None):
        t = _one(tensors, "broadcast")
        root = getattr(opts, "rootRank", 0)

        def post():
            c = _contiguous(t, self._stats)
            fut = self._world.broadcast(c, root)
            return [fut], [t], (lambda: _copy_back(t, c, self._stats))
        return self._start("broadcast", post)

    def _allgather_base(self, output, input, opts=None):
        def post():
            c = _contiguous(input, self._stats)
            o = _contiguous(output, self._stats)
            fut = self._world.allgather(c, out=_flat(o))
            return [fut], [output], (lambda: _copy_back(output, o, self._stats))
        return self._start("_allgather_base", post)

    def allgather(self, output_lists, inputs, opts=None):
        t = _one(inputs, "allgather")
        outs = _one(output_lists, "allgather")
        if len(outs) != self.size():
            raise RuntimeError("tfab: allgather: %d output tensors for %d ranks"
                               % (len(outs), self.size()))

        def post():
            c = _contiguous(t, self._stats)
            scratch = torch.empty((self.size(),) + tuple(c.shape), dtype=c.dtype)
            fut = self._world.allgather(c, out=scratch)

            def finish():
                for o, s in zip(outs, scratch):
                    _copy_back(o, s, self._stats)
            return [fut], [outs], finish
        return self._start("allgather", post)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        if len(output_lists) != len(inputs):
            raise RuntimeError("tfab: allgather_coalesced: %d output lists for %d inputs"
                               % (len(output_lists), len(inputs)))
        works = [self.allgather([o], [i]) for o, i in zip(output_lists, inputs)]
        futs = [f for w in works for f in w._futs]
        for w in works:
            self._waited(w)

        def post():
            def finish():
                for w in works:
                    while not w._ended:
                        _time.sleep(0)
            return futs, output_lists, finish
        return self._start("allgather_coalesced", post)

    def reduce(self, tensors, opts=None):
        t = _one(tensors, "reduce")
        root = getattr(opts, "rootRank", 0)
        opn = _op_name(getattr(opts, "reduceOp", dist.ReduceOp.SUM), "reduce")

        def post():
            c = _contiguous(t, self._stats)
            fut = self._world.reduce(c, op=opn, root=root)
            finish = (lambda: _copy_back(t, c, self._stats)) if self.rank() == root else None
            return [fut], [t], finish
        return self._start("reduce", post)

    def gather(self, output_lists, inputs, opts=None):
        t = _one(inputs, "gather")
        root = getattr(opts, "rootRank", 0)
        outs = output_lists[0] if output_lists else []
        if self.rank() == root and len(outs) != self.size():
            raise RuntimeError("tfab: gather: %d output tensors for %d ranks"
                               % (len(outs), self.size()))

        def post():
            c = _contiguous(t, self._stats)
            scratch = None
            if self.rank() == root:
                scratch = torch.empty((self.size(),) + tuple(c.shape), dtype=c.dtype)
            fut = self._world.gather(c, out=scratch, root=root)

            def finish():
                if scratch is not None:
                    for o, s in zip(outs, scratch):
                        _copy_back(o, s, self._stats)
            return [fut], output_lists, finish
        return self._start("gather", post)

    def scatter(self, outputs, input_lists, opts=None):
        t = _one(outputs, "scatter")
        root = getattr(opts, "rootRank", 0)
        ins = input_lists[0] if input_lists else []
        if self.rank() == root and len(ins) != self.size():
            raise RuntimeError("tfab: scatter: %d input tensors for %d ranks"
                               % (len(ins), self.size()))

        def post():
            packed = None
            if self.rank() == root:
                packed = torch.stack([i.reshape(t.shape) for i in ins])
                self._stats.copies += 1
                self._stats.bytes_copied += packed.numel() * packed.element_size()
            c = _contiguous(t, self._stats)
            fut = self._world.scatter(packed, out=c, root=root)
            return [fut], [t], (lambda: _copy_back(t, c, self._stats))
        return self._start("scatter", post)

    def _reduce_scatter_base(self, output, input, opts=None):
        opn = _op_name(getattr(opts, "reduceOp", dist.ReduceOp.SUM), "_reduce_scatter_base")

        def post():
            c = _contiguous(input, self._stats)
            o = _contiguous(output, self._stats)
            fut = self._world.reduce_scatter(_flat(c), out=_flat(o), op=opn)
            return [fut], [output], (lambda: _copy_back(output, o, self._stats))
        return self._start("_reduce_scatter_base", post)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        t = _one(outputs, "reduce_scatter")
        ins = _one(input_lists, "reduce_scatter")
        opn = _op_name(getattr(opts, "reduceOp", dist.ReduceOp.SUM), "reduce_scatter")
        if len(ins) != self.size():
            raise RuntimeError("tfab: reduce_scatter: %d input tensors for %d ranks"
                               % (len(ins), self.size()))

        def post():
            packed = torch.cat([_flat(i) for i in ins])
            self._stats.copies += 1
            self._stats.bytes_copied += packed.numel() * packed.element_size()
            c = _contiguous(t, self._stats)
            fut = self._world.reduce_scatter(packed, out=_flat(c), op=opn)
            return [fut], [t], (lambda: _copy_back(t, c, self._stats))
        return self._start("reduce_scatter", post)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()

        def counts(t, splits, what):
            if not splits:
                if t.shape[0] % n if t.dim() else True:
                    raise ValueError("%s's first dimension (%r) is not divisible by the "
                                     "group's size %d" % (what, tuple(t.shape), n))
                return [t.numel() // n] * n
            if len(splits) != n:
                raise ValueError("%d %s split sizes for %d ranks" % (len(splits), what, n))
            row = t.numel() // t.shape[0] if t.shape[0] else 0
            return [int(s) * row for s in splits]

        def post():
            sc = counts(input, input_split_sizes, "input")
            rc = counts(output, output_split_sizes, "output")
            c = _contiguous(input, self._stats)
            o = _contiguous(output, self._stats)
            fut = self._world.alltoall(_flat(c), _flat(o), send_counts=sc, recv_counts=rc)
            return [fut], [output], (lambda: _copy_back(output, o, self._stats))
        return self._start("alltoall_base", post)

    def alltoall(self, output_list, input_list, opts=None):
        n = self.size()
        if len(output_list) != n or len(input_list) != n:
            raise RuntimeError("tfab: alltoall: %d outputs and %d inputs for %d ranks"
                               % (len(output_list), len(input_list), n))

        def post():
            packed = torch.cat([_flat(i) for i in input_list])
            out = torch.empty(sum(o.numel() for o in output_list), dtype=packed.dtype)
            self._stats.copies += 2
            self._stats.bytes_copied += (packed.numel() + out.numel()) * packed.element_size()
            fut = self._world.alltoall(packed, out, send_counts=[i.numel() for i in input_list],
                                       recv_counts=[o.numel() for o in output_list])

            def finish():
                at = 0
                for o in output_list:
                    o.copy_(out[at:at + o.numel()].view(o.shape))
                    at += o.numel()
            return [fut], output_list, finish
        return self._start("alltoall", post)

    def barrier(self, opts=None):
        return self._start("barrier", lambda: ([self._world.barrier()], [], None))

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        self.barrier(opts).wait()

    # Point to point: a tag is a key, the step counts the messages on (peer, tag, direction)

    def _step(self, peer, tag, way):
        k = (peer, tag, way)
        step = self._p2p.get(k, 0)
        self._p2p[k] = step + 1
        return step

    def _peer(self, rank, call):
        if not 0 <= rank < self.size() or rank == self.rank():
            raise RuntimeError("tfab: %s: no peer rank %d (this is rank %d of %d)"
                               % (call, rank, self.rank(), self.size()))
        return self._world.peer(rank)

    def send(self, tensors, dst, tag=0):
        t = _one(tensors, "send")
        peer = self._peer(dst, "send")

        def post():
            c = _contiguous(t, self._stats)
            step = self._step(dst, tag, "s")
            fut = self._ctx.send(_P2P_KEY % tag, step, _tfab._torch_bool(c), peer=peer)
            return [fut], [t], None
        return self._start("send to rank %d" % dst, post)

    def recv(self, tensors, src, tag=0):
        t = _one(tensors, "recv")
        peer = self._peer(src, "recv")

        def post():
            c = _contiguous(t, self._stats)
            step = self._step(src, tag, "r")
            fut = self._ctx.recv_async(peer, _P2P_KEY % tag, step, out=_tfab._torch_bool(c))
            return [fut], [t], (lambda: _copy_back(t, c, self._stats))
        work = self._start("recv from rank %d" % src, post)
        work._source = src
        return work

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("tfab: recv from any source is not supported: name the source rank")

    def _start_coalescing(self):
        pass  # each operation already starts at once

    def _end_coalescing(self, works):
        pass

    # tfab's own

    def _destroy(self):
        if not self._closed:
            self._closed = True
            _live.discard(self)
            self._works.clear()  # they refer to the group: no cycle left behind
            self._done_works.clear()
            self._finalizer()  # what is in flight fails: the driver's wait ends
            with self._driver_cond:
                self._inflight.clear()
                self._driver_cond.notify_all()
            d = self._driver
            if d is not None and d is not _threading.current_thread():
                d.join(10.0)

    def shutdown(self):
        """The group's end (torch 2's destroy_process_group calls it): what is in flight
        fails, the world is left, the context closed."""
        self._destroy()

    _shutdown = shutdown


def _close(world, ctx):
    """The group's end: abort what is in flight (nothing waits on it any more), leave the
    world, close the context. Nothing is left: no thread, listener or segment."""
    try:
        if world.joined:
            try:
                world.leave(timeout=1.0)
            except _tfab.Error:
                ctx.abort()
                world.leave(timeout=5.0)
    except Exception:  # pragma: no cover (the context was closed under it)
        pass
    ctx.close()


_live = _weakref.WeakSet()


@_atexit.register
def _close_all():
    for g in list(_live):
        g._destroy()


def stats(group=None):
    """What the group copied (non-contiguous tensors, list arguments packed): a dict with
    copies and bytes_copied, and the context's own counters under "context"."""
    g = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(g, ProcessGroupTfab):
        raise TypeError("tfab.torch.stats: %r is not a tfab process group" % (g,))
    return {"copies": g._stats.copies, "bytes_copied": g._stats.bytes_copied,
            "context": g._ctx.stats()}


_torch_destroy = dist.destroy_process_group


def destroy_process_group(group=None):
    """torch's destroy_process_group, then the end of every tfab group it let go: torch 1.13
    only drops its references to a group, and a tfab group holds threads, a listener and
    segments until it ends (doc/torch.md, "Faults, timeouts, the end")."""
    _torch_destroy(group)
    kept = set(dist.distributed_c10d._pg_map)
    for g in list(_live):
        if g not in kept:
            g._destroy()


def _create(store, rank, size, timeout):
    return ProcessGroupTfab(store, rank, size, timeout)


def _register():
    if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
        dist.Backend.register_backend(BACKEND, _create)


_register()
if getattr(dist.destroy_process_group, "__module__", "") != __name__:
    dist.destroy_process_group = destroy_process_group
    dist.distributed_c10d.destroy_process_group = destroy_process_group

from . import hooks  # noqa: E402 (needs the group class above)
