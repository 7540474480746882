"""DDP comm hooks that compress gradients' traffic with tfab (doc/torch.md, "DDP on the group").

Register one on a DDP model whose process group is tfab's::

    model.register_comm_hook(None, tfab.torch.hooks.fp16)

``state`` is the process group (None: the default one). Each bucket is averaged over the
ranks with ``allreduce(op="avg")``, its float32 values travelling as float16, bfloat16 or
int8 with a scale per 4096 values (doc/world.md, "Compression"). What rounding lost is kept
per bucket (the key ``ddp.<index>``) and added to that bucket's next allreduce, so the error
does not accumulate over steps. The gradients stay float32; a bucket of another dtype goes
uncompressed.
"""

import torch
import torch.distributed as dist

__all__ = ["fp16", "bf16", "int8"]


def _group(state):
    from . import ProcessGroupTfab
    g = state if state is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(g, ProcessGroupTfab):
        raise RuntimeError("tfab.torch.hooks: the hook's state must be a tfab process group "
                           "(or None with tfab the default one), not %r" % (g,))
    return g


def _hook(compress):
    def hook(state, bucket):
        g = _group(state)
        buf = bucket.buffer()
        comp = compress if buf.dtype == torch.float32 else None
        key = "ddp.%d" % bucket.index() if comp is not None else None
        work = g._allreduce("allreduce", [buf], dist.ReduceOp.AVG, compress=comp, key=key)
        return work.get_future().then(lambda f: f.value()[0])
    hook.__name__ = hook.__qualname__ = compress
    hook.__doc__ = "Average a DDP bucket over the ranks, its traffic as %s." % compress
    return hook


fp16 = _hook("fp16")
bf16 = _hook("bf16")
int8 = _hook("int8")
