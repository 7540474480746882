"""A DLPack capsule made by hand (ctypes), for devices this machine may not have."""
import ctypes


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

KDLCPU, KDLCUDA = 1, 2


class FakeDeviceTensor:
    """float32[n] claiming to live on device_type (CUDA by default): memory is host memory."""

    def __init__(self, n=16, device_type=KDLCUDA):
        self.buf = (ctypes.c_float * n)()
        self.shape = (ctypes.c_int64 * 1)(n)
        self.device_type = device_type
        self.deleted = 0
        self._deleter = DELETER(self._delete)
        self._managed = []

    def _delete(self, ptr):
        self.deleted += 1

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, stream=None):
        m = DLManagedTensor()
        m.dl_tensor.data = ctypes.addressof(self.buf)
        m.dl_tensor.device = DLDevice(self.device_type, 0)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = DLDataType(2, 32, 1)
        m.dl_tensor.shape = self.shape
        m.dl_tensor.strides = None
        m.dl_tensor.byte_offset = 0
        m.deleter = self._deleter
        self._managed.append(m)
        return _capsule_new(ctypes.addressof(m), b"dltensor", None)
