"""Two processes: a sender offers a NumPy array and a torch tensor; a receiver views them in
place (no copy) and answers in place into an array of its own.
Run: PYTHONPATH=build/lib/python /usr/bin/python3 doc/examples/python_pair.py"""
import multiprocessing as mp

import numpy as np
import tfab


def sender(port_queue):
    with tfab.Context("shm") as ctx:  # "ofi:tcp" between hosts
        port_queue.put(ctx.listen("127.0.0.1", 0))
        peer = ctx.accept(timeout=10)
        weights = np.arange(12, dtype=np.float32).reshape(3, 4)
        done = ctx.send("weights", 1, weights)  # kept alive, never copied
        done.result(timeout=10)  # the receiver has it
        answer = np.empty(3, dtype=np.float32)
        ctx.recv(peer, "row_sums", 1, out=answer, timeout=10)  # in place
        print("sender got", answer)


def receiver(port_queue):
    with tfab.Context("shm") as ctx:
        peer = ctx.connect("127.0.0.1", port_queue.get(timeout=10), timeout=10)
        t = ctx.recv(peer, "weights", 1, timeout=10)
        w = np.from_dlpack(t)  # a view of the library's registered memory
        print("receiver got", w.shape, w.dtype, "over", peer.path)
        ctx.send("row_sums", 1, w.sum(axis=1)).result(timeout=10)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    q = mp.Queue()
    procs = [mp.Process(target=sender, args=(q,)), mp.Process(target=receiver, args=(q,))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
