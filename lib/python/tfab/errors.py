"""tfab's exceptions: tfab.Error, with the status name, and one subclass per kind of failure."""

import builtins
import errno as _errno

# The library's own codes (tfab/status.h), by value.
_TFAB_CODES = {
    256: "TFAB_ERR_NO_FABRIC",
    257: "TFAB_ERR_PEER_FAILED",
    258: "TFAB_ERR_PROTOCOL",
    259: "TFAB_ERR_ABORTED",
    260: "TFAB_ERR_REMOTE",
    261: "TFAB_ERR_FABRIC",
    262: "TFAB_ERR_REMOTE_ACCESS",
    263: "TFAB_ERR_CONFIG",
    264: "TFAB_ERR_VERSION",
    265: "TFAB_ERR_AUTH",
    266: "TFAB_ERR_TIMEOUT",
}


def status_name(status: int) -> str:
    """The name of a status: 'TFAB_ERR_TIMEOUT', 'ETIMEDOUT', ... ('OK' for 0)."""
    code = abs(status)
    if code == 0:
        return "OK"
    if code in _TFAB_CODES:
        return _TFAB_CODES[code]
    if code == _errno.EOPNOTSUPP:
        return "EOPNOTSUPP"  # the library's name for it (Python's is ENOTSUP)
    return _errno.errorcode.get(code, "E%d" % code)


class Error(Exception):
    """A tfab call failed. ``status`` is the library's (negative) status, ``name`` its name
    ('TFAB_ERR_PEER_FAILED', 'EINVAL'), ``message`` the text."""

    def __init__(self, status: int, message: str = ""):
        Exception.__init__(self, status, message)
        self.status = -abs(status)
        self.name = status_name(status)
        self.message = message

    def __str__(self) -> str:
        return "%s: %s" % (self.name, self.message)

    def __reduce__(self):
        return (type(self), (self.status, self.message))


class TimeoutError(Error, builtins.TimeoutError):
    """A wait ran out (ETIMEDOUT), or a peer was silent past TFAB_OP_TIMEOUT_MS."""

    __init__ = Error.__init__
    __str__ = Error.__str__


class PeerFailedError(Error, builtins.ConnectionError):
    """The peer left, died or was cut off (TFAB_ERR_PEER_FAILED)."""

    __init__ = Error.__init__
    __str__ = Error.__str__


class ProtocolError(Error):
    """A peer sent what the protocol refuses (TFAB_ERR_PROTOCOL, TFAB_ERR_VERSION)."""


class AbortedError(Error):
    """The operation was aborted: abort(), step_cleanup(), or the context closed."""


class ConfigError(Error, builtins.ValueError):
    """A setting is unknown or has a bad value (TFAB_ERR_CONFIG)."""


class NoFabricError(Error):
    """No usable fabric for the provider asked for (TFAB_ERR_NO_FABRIC)."""


class OutMismatchError(Error, builtins.ValueError):
    """``out=`` does not fit the tensor sent: its dtype, shape or size differs."""


_BY_CODE = {
    _errno.ETIMEDOUT: TimeoutError,
    266: TimeoutError,
    257: PeerFailedError,
    258: ProtocolError,
    264: ProtocolError,
    259: AbortedError,
    263: ConfigError,
    256: NoFabricError,
}


_DL_KINDS = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex"}


def _dtype_name(code: int, bits: int, lanes: int) -> str:
    """A DLPack dtype as users write it: 'float32', 'bfloat16', 'bool'."""
    if code == 6 and bits == 8 and lanes == 1:
        return "bool"
    if code in _DL_KINDS and lanes == 1:
        return "%s%d" % (_DL_KINDS[code], bits)
    return "dlpack(%d,%d,%d)" % (code, bits, lanes)


def _dtype_words(text: str) -> str:
    """The library's message with its DLPack dtype triples "(2,32,1)" named ("float32")."""
    if "dtype" not in text:
        return text
    import re
    return re.sub(r"\((\d+),(\d+),(\d+)\)",
                  lambda m: _dtype_name(*(int(g) for g in m.groups())), text)


def _from_status(status: int, what: str = "", logged: str = "") -> Error:
    """The exception for a failed call: the C module raises what this returns."""
    from . import _tfab

    code = abs(status)
    cls = _BY_CODE.get(code, Error)
    if what.startswith("recv into out=") and code in (_errno.EINVAL, _errno.EMSGSIZE):
        cls = OutMismatchError
    text = _tfab.strerror(status)
    if what:
        text = "%s: %s" % (what, text)
    if logged:
        text = "%s (%s)" % (text, _dtype_words(logged))
    return cls(status, text)
