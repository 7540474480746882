"""The library's log lines in Python's logging (doc/python.md, "Logs"): records of the "tfab"
logger at the mapped level with the subsystem in extra, stderr as before where no handler is
configured, the library's level from the logger's unless TFAB_LOG_LEVEL says, and an
interpreter that ends while a library thread logs, with lines still queued: no hang, no
crash. Each child process is bounded."""
import logging
import os
import subprocess
import sys
import textwrap
import time

import tfab
import tfabtest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testprocs import free_port  # noqa: E402


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def wait_for(self, text, bound_s=10.0):
        end = time.monotonic() + bound_s
        while time.monotonic() < end:
            for r in self.records:
                if text in r.getMessage():
                    return r
            time.sleep(0.02)
        raise AssertionError("no record with %r in %s" % (text, [r.getMessage() for r in
                                                               self.records]))


def test_connect_refused_is_a_record(capfd):
    records = Records()
    logger = logging.getLogger("tfab")
    logger.addHandler(records)
    try:
        with tfabtest.context() as ctx:
            port = free_port()
            try:
                ctx.connect("127.0.0.1", port, 0.5)
            except tfab.Error:
                pass
            else:
                raise AssertionError("a connect to a closed port succeeded")
            rec = records.wait_for("127.0.0.1:%d refused" % port)
    finally:
        logger.removeHandler(records)
    assert rec.name == "tfab" and rec.levelno == logging.ERROR, (rec.name, rec.levelname)
    assert rec.subsystem == "bootstrap", rec.__dict__
    assert "nothing listens there" in rec.getMessage()
    # Logging has it: stderr does not (the library's own sink would have written it there).
    assert "refused" not in capfd.readouterr().err


def child(code, env=None, timeout=60):
    full = dict(os.environ)
    full.pop("TFAB_LOG_LEVEL", None)
    full.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


CONNECT = """
    import tfab
    ctx = tfab.Context("%s")
    try:
        ctx.connect("127.0.0.1", %d, 0.5)
    except tfab.Error:
        print("refused", flush=True)
"""


def test_no_handler_writes_stderr_as_before():
    port = free_port()
    rc, out, err = child(CONNECT % (tfabtest.PROVIDER, port))
    assert rc == 0 and out == "refused\n", (out, err)
    assert "tfab error [bootstrap]: connection to 127.0.0.1:%d refused" % port in err, err


def test_level_follows_the_logger_unless_tfab_log_level():
    code = """
        import logging, sys
        logging.basicConfig(level=logging.%s, stream=sys.stdout,
                            format="%%(name)s %%(levelname)s %%(subsystem)s: %%(message)s")
        import tfab
        print("LEVEL", tfab._tfab._log_level())
        with tfab.Context("%s"):
            pass
    """
    rc, out, err = child(code % ("DEBUG", tfabtest.PROVIDER))
    assert rc == 0 and "LEVEL 4" in out, (out, err)
    assert "tfab INFO engine: context path 0:" in out, out  # an info line, at DEBUG
    assert "tfab" not in err, err  # logging has them all
    rc, out, err = child(code % ("DEBUG", tfabtest.PROVIDER), env={"TFAB_LOG_LEVEL": "warn"})
    assert rc == 0 and "LEVEL 2" in out and "context path" not in out + err, (out, err)
    rc, out, err = child(code % ("ERROR", tfabtest.PROVIDER))
    assert rc == 0 and "LEVEL 1" in out, (out, err)


def test_exit_while_a_library_thread_logs():
    # Trace lines from the progress threads of a pair that sends in a loop, to a handler
    # slower than they come (the queue fills and drops): the main thread exits meanwhile,
    # leaving the contexts to the atexit close. The process ends within its bound, whole.
    code = """
        import logging, sys, threading, time
        import numpy as np

        class Slow(logging.StreamHandler):
            def emit(self, record):
                time.sleep(0.001)
                super().emit(record)

        logging.getLogger().addHandler(Slow(sys.stderr))
        logging.getLogger().setLevel(logging.DEBUG)
        import tfab
        a = tfab.Context("%s", progress_thread=True)
        b = tfab.Context("%s", progress_thread=True)
        port = a.listen("127.0.0.1", 0)
        accepted = []
        t = threading.Thread(target=lambda: accepted.append(a.accept(10)))
        t.start()
        peer_b = b.connect("127.0.0.1", port, 10)
        t.join(15)
        x = np.ones(1000, np.float32)

        def send():
            step = 0
            while True:
                a.send("k", step, x)
                b.recv(peer_b, "k", step, timeout=10)
                step += 1

        threading.Thread(target=send, daemon=True).start()
        time.sleep(1.0)
        print("exiting", flush=True)
    """ % (tfabtest.PROVIDER, tfabtest.PROVIDER)
    t0 = time.monotonic()
    rc, out, err = child(code, env={"TFAB_LOG_LEVEL": "trace"}, timeout=60)
    took = time.monotonic() - t0
    assert rc == 0 and "exiting" in out, (rc, out, err[-3000:])
    assert "Fatal Python error" not in err and "Segmentation" not in err, err[-3000:]
    assert "peer " in err, err[-3000:]  # trace lines reached the handler
    assert "log lines were dropped" in err, err[-3000:]
    assert took < 30, took
