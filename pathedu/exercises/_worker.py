"""The processes that run a submission's code for ``python -m pathedu.course grade``, and the format that carries
values between them and the grader.

The grader (:mod:`pathedu.course`) never runs a student's code itself.  It starts one fork server
(:func:`zygote`), a fresh interpreter that imports torch and pathedu and then only forks: no submission's code
ever runs in it, it takes requests from the grader alone (on an anonymous socket), and on Linux it and every
process it forks are non-dumpable (a process of the same user can neither trace them nor open their memory or
file descriptors under ``/proc``).  For each exercise the grader asks it for a worker: a fork that closes every
file descriptor but its own channel to the grader, starts its own session, silences its standard streams and
moves into the exercise's temporary working directory (:func:`serve`).  The grader sends the worker two kinds of
request:

* ``load``: run the notebook's statements that the answer needs (the grader chose them by reading the source) in
  a fresh namespace, then evaluate the check call's arguments.  A function comes back as a handle, any other
  value as data.
* ``call``: call a handle on the arguments the grader sends, with grading mode's tripwires armed (calls to
  pathedu's own forms are recorded, :func:`pathedu.exercises._grader._armed`), and send back what it returned
  or what it raised, and the pathedu functions it called.

Every verdict is decided in the grader's process, on inputs it drew and references it computed; this process only
answers "what does your function return for these inputs".  What it sends back is read by :func:`decode`, which
builds plain values (numbers, strings, tuples, lists, dicts, plain tensors and numpy arrays of numeric dtypes)
and nothing else: no unpickling, no object of the student's classes, no code runs in the grader.

Messages are frames: 8 bytes of length (big-endian), then the payload.  A payload is 4 bytes of header length, a
JSON header, then the raw bytes of the tensors and arrays the header refers to.
"""
from __future__ import annotations

import ast
import builtins
import json
import math
import numbers
import os
import re
import select
import socket
import struct
import sys
import time
import traceback

import numpy as np
import torch

#: The largest message either side accepts (bytes).
MAX_MESSAGE = 256 * 2 ** 20
_DEPTH = 40
_TEXT = 2000  # longest error message or type name kept
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)}
_NP_DTYPES = ("float16", "float32", "float64", "complex64", "complex128", "int8", "int16", "int32", "int64",
              "uint8", "uint16", "uint32", "uint64", "bool")


class FormatError(ValueError):
    """A message that is not in the format (or too large): the other side is not to be trusted."""


class Opaque:
    """A value of a type the format does not carry, rebuilt as an empty object whose type has the same name (so
    that a check can say "expected a torch.Tensor, got MyThing")."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def _opaque(name) -> Opaque:
    name = re.sub(r"\W", "_", str(name))[:80] or "object"
    if name[0].isdigit():
        name = "_" + name
    return type(name, (Opaque,), {})()


# ---------------------------------------------------------------------------
# Values <-> bytes
# ---------------------------------------------------------------------------

def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = torch.Tensor.as_subclass(t, torch.Tensor).detach().to("cpu").contiguous()
    if t.is_sparse or t.is_quantized or t.dtype not in _DTYPES.values():
        raise TypeError(f"a tensor of layout {t.layout} and dtype {t.dtype}")
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _encode_node(value, blobs: list, depth: int):
    if depth > _DEPTH:
        return {"t": "opaque", "type": type(value).__name__}
    if value is None or isinstance(value, (bool, str)):
        return value if not isinstance(value, str) else {"t": "str", "v": value}
    if isinstance(value, torch.Tensor):
        try:
            data = _tensor_bytes(value)
            blobs.append(data)
            return {"t": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                    "i": len(blobs) - 1}
        except Exception:
            return {"t": "opaque", "type": type(value).__name__}
    if isinstance(value, np.ndarray) and value.dtype.name in _NP_DTYPES:
        blobs.append(np.ascontiguousarray(value).tobytes())
        return {"t": "ndarray", "dtype": value.dtype.name, "shape": list(value.shape), "i": len(blobs) - 1}
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return {"t": "int", "v": str(int(value))}
    if isinstance(value, numbers.Real):
        return {"t": "float", "v": float(value).hex()}
    if isinstance(value, numbers.Complex):
        z = complex(value)
        return {"t": "complex", "v": [z.real.hex(), z.imag.hex()]}
    if isinstance(value, (tuple, list)):  # torch.Size and named tuples travel as tuples
        kind = "list" if isinstance(value, list) else "tuple"
        return {"t": kind, "v": [_encode_node(x, blobs, depth + 1) for x in value]}
    if isinstance(value, dict):
        return {"t": "dict", "k": [_encode_node(k, blobs, depth + 1) for k in value],
                "v": [_encode_node(v, blobs, depth + 1) for v in value.values()]}
    return {"t": "opaque", "type": type(value).__name__}


def encode(value) -> bytes:
    """``value`` as a payload (see the module docstring); a type the format does not carry becomes
    :class:`Opaque` on the other side."""
    blobs: list = []
    root = _encode_node(value, blobs, 0)
    header = json.dumps({"root": root, "sizes": [len(b) for b in blobs]}, separators=(",", ":"),
                        allow_nan=False).encode()
    return b"".join([struct.pack(">I", len(header)), header, *blobs])


def _decode_node(node, blobs: list, depth: int):
    if depth > _DEPTH + 1:
        raise FormatError("nested too deeply")
    if node is None or isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise FormatError(f"unexpected {type(node).__name__}")
    kind = node.get("t")
    if kind == "str":
        return _str(node.get("v"))
    if kind == "int":
        text = _str(node.get("v"))
        if not re.fullmatch(r"-?\d{1,4000}", text):
            raise FormatError("not an integer")
        return int(text)
    if kind == "float":
        return float.fromhex(_str(node.get("v")))
    if kind == "complex":
        re_, im = node.get("v") or ("", "")
        return complex(float.fromhex(_str(re_)), float.fromhex(_str(im)))
    if kind in ("tuple", "list"):
        items = [_decode_node(x, blobs, depth + 1) for x in _list(node.get("v"))]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        keys = [_decode_node(x, blobs, depth + 1) for x in _list(node.get("k"))]
        values = [_decode_node(x, blobs, depth + 1) for x in _list(node.get("v"))]
        if len(keys) != len(values) or not all(k is None or isinstance(k, (bool, int, float, complex, str))
                                               for k in keys):
            raise FormatError("bad dict")
        return dict(zip(keys, values))
    if kind == "opaque":
        return _opaque(_str(node.get("type"))[:_TEXT])
    if kind in ("tensor", "ndarray"):
        shape = _list(node.get("shape"))
        if len(shape) > 32 or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n for n in shape):
            raise FormatError("bad shape")
        i = node.get("i")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(blobs):
            raise FormatError("bad blob index")
        data = blobs[i]
        if kind == "tensor":
            dtype = _DTYPES.get(node.get("dtype"))
            if dtype is None:
                raise FormatError("bad dtype")
            count = math.prod(shape)
            if count * torch.empty((), dtype=dtype).element_size() != len(data):
                raise FormatError("tensor size does not match its bytes")
            if count == 0:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)
        name = node.get("dtype")
        if name not in _NP_DTYPES:
            raise FormatError("bad dtype")
        dtype = np.dtype(name)
        if math.prod(shape) * dtype.itemsize != len(data):
            raise FormatError("array size does not match its bytes")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    raise FormatError(f"unknown kind {kind!r}")


def _str(x) -> str:
    if not isinstance(x, str):
        raise FormatError("expected a string")
    return x


def _list(x) -> list:
    if not isinstance(x, list):
        raise FormatError("expected a list")
    return x


def decode(data: bytes):
    """The value in payload ``data``; :class:`FormatError` for anything else.  Builds only plain values."""
    try:
        (n,) = struct.unpack(">I", data[:4])
        header = json.loads(data[4:4 + n].decode())
        sizes = _list(header.get("sizes"))
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes):
            raise FormatError("bad sizes")
        blobs, at = [], 4 + n
        for s in sizes:
            blobs.append(data[at:at + s])
            at += s
        if at != len(data) or any(len(b) != s for b, s in zip(blobs, sizes)):
            raise FormatError("payload length does not match its header")
        return _decode_node(header.get("root"), blobs, 0)
    except FormatError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, struct.error, OverflowError, RecursionError) as exc:
        raise FormatError(f"{type(exc).__name__}: {exc}") from None


# ---------------------------------------------------------------------------
# Frames on a file descriptor
# ---------------------------------------------------------------------------

class OutOfTime(Exception):
    """A frame did not arrive (or could not be sent) before its deadline."""


def _remaining(deadline):
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise OutOfTime()
    return left


def write_frame(fd: int, payload: bytes, deadline: float | None = None) -> None:
    """Send ``payload`` as one frame; :class:`OutOfTime` when the reader does not take it before ``deadline``
    (a ``time.monotonic()`` value; ``None``: wait)."""
    data = memoryview(struct.pack(">Q", len(payload)) + payload)
    while data:
        if deadline is not None:
            _, ready, _ = select.select([], [fd], [], _remaining(deadline))
            if not ready:
                continue
        data = data[os.write(fd, data[:1 << 20]):]


def read_frame(fd: int, deadline: float | None = None, limit: int = MAX_MESSAGE) -> bytes:
    """One frame's payload; ``EOFError`` when the other side closed, :class:`OutOfTime` after ``deadline``,
    :class:`FormatError` for a frame longer than ``limit``."""
    def read(n):
        chunks, got = [], 0
        while got < n:
            if deadline is not None:
                ready, _, _ = select.select([fd], [], [], _remaining(deadline))
                if not ready:
                    continue
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError("the other side closed the connection")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    (n,) = struct.unpack(">Q", read(8))
    if n > limit:
        raise FormatError(f"a message of {n} bytes (the limit is {limit})")
    return read(n)


# ---------------------------------------------------------------------------
# The process that runs a submission's code
# ---------------------------------------------------------------------------

def _text(obj) -> str:
    try:
        text = str(obj)
    except BaseException:  # noqa: BLE001 - a student's __str__ may raise anything
        text = "?"
    return text if len(text) <= _TEXT else text[:_TEXT - 3] + "..."


def _error(exc: BaseException) -> dict:
    """What the grader needs to phrase an exception like :func:`pathedu.exercises.call_student` does."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return {"type": _text(type(exc).__name__), "message": _text(exc), "line": last.lineno if last else 0,
            "where": _text(last.filename) if last else "", "stub": isinstance(exc, NotImplementedError)}


def _quiet() -> None:
    """Send the standard streams to /dev/null: nothing a submission prints reaches the grader's terminal."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def _enter(workdir: str) -> None:
    os.makedirs(workdir, exist_ok=True)  # an earlier exercise's code may have removed it
    os.chdir(workdir)
    tmp = os.path.join(workdir, "tmp")
    os.makedirs(tmp, exist_ok=True)
    for key in [k for k in os.environ if k.startswith("PATHEDU_")]:
        del os.environ[key]
    os.environ.update(HOME=workdir, TMPDIR=tmp, MPLBACKEND="Agg")
    import tempfile

    tempfile.tempdir = tmp


class _Session:
    def __init__(self):
        self.answers: list = []  # handle -> the object
        self.allow: tuple = ()

    def load(self, msg) -> dict:
        from ._grader import answer_is_pathedu

        self.allow = tuple(msg.get("allow", ()))
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        first = None
        for piece in msg["pieces"]:
            filename = f"<cell {piece['cell']}>"
            tree = ast.parse(piece["source"], filename=filename)
            for i in piece["statements"]:
                code = compile(ast.Module(body=[tree.body[i]], type_ignores=[]), filename, "exec")
                try:
                    exec(code, namespace)  # noqa: S102 - the submission's own code, in its own process
                except BaseException as exc:  # noqa: BLE001 - report it, go on as "Run all" with errors would
                    first = first or _error(exc)
        try:
            args, kwargs = eval(compile(msg["answer"], "<the check call>", "eval"), namespace)  # noqa: S307
        except BaseException as exc:  # noqa: BLE001
            return {"ok": False, "error": _error(exc), "first": first}
        described = []
        for value in [*args, *kwargs.values()]:
            if callable(value):
                self.answers.append(value)
                described.append({"handle": len(self.answers) - 1,
                                  "name": _text(getattr(value, "__name__", type(value).__name__))[:80]})
            else:
                described.append({"value": value})
        try:
            own = answer_is_pathedu([*args, *kwargs.values()], self.allow)
        except Exception:  # noqa: BLE001
            own = []
        return {"ok": True, "answers": described, "n_args": len(args), "names": list(kwargs), "own": own,
                "first": first}

    def call(self, msg) -> dict:
        from ._grader import _armed

        fn = self.answers[msg["handle"]]
        args, kwargs = msg["args"], msg["kwargs"]
        with _armed(self.answers, self.allow, sys._getframe()) as state:
            try:
                value = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - SystemExit included: it is the answer's doing
                return {"ok": False, "error": _error(exc), "calls": sorted(state.calls)}
        return {"ok": True, "value": value, "calls": sorted(state.calls)}


def serve(fd: int, workdir: str) -> None:
    """The worker's main loop: answer ``load`` and ``call`` requests on file descriptor ``fd`` until the grader
    closes it.  Runs in its own session (so that the grader can end it with everything it started), silent, in
    ``workdir`` with ``HOME`` and ``TMPDIR`` inside it and no ``PATHEDU_*`` variable set."""
    os.setsid()
    _quiet()
    _enter(workdir)
    torch.set_num_threads(1)  # the exercises are small; one thread per worker, none waiting for another
    session = _Session()
    while True:
        try:
            msg = decode(read_frame(fd))
        except (EOFError, OSError, FormatError):
            return
        try:
            reply = session.load(msg) if msg.get("op") == "load" else session.call(msg)
            payload = encode(reply)
        except BaseException as exc:  # noqa: BLE001 - the reply could not be made or encoded
            payload = encode({"ok": False, "error": _error(exc), "calls": [], "internal": True})
        write_frame(fd, payload)


# ---------------------------------------------------------------------------
# The fork server
# ---------------------------------------------------------------------------

def _prctl(option: int, value: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def nondumpable() -> None:
    """On Linux, make this process (and the processes it forks) non-dumpable: another process of the same user
    can then neither ptrace it nor read its memory or file descriptors under ``/proc``.  Elsewhere nothing."""
    _prctl(4, 0)  # PR_SET_DUMPABLE


def _die_with_parent() -> None:
    """On Linux, end this process when its parent ends (the grader, for the fork server; the fork server, for a
    worker): a grader killed in the middle leaves no worker looping on."""
    _prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def _end(pid: int) -> None:
    """End worker ``pid`` and its process group (whatever its code started)."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, 9)
        except OSError:
            pass


def _fork_worker(control: socket.socket, workdir: str) -> int:
    """Fork a worker for ``workdir``, send the grader its pid and its channel (a socket's file descriptor);
    return the pid."""
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the worker
        code = 0
        try:
            fd = theirs.detach()
            mine.detach(), control.detach()  # closed below, by number
            if fd != 3:
                os.dup2(fd, 3, inheritable=False)
                fd = 3
            os.closerange(4, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096)
            _die_with_parent()
            serve(fd, workdir)
        except BaseException:  # noqa: BLE001 - nothing to report to: the grader sees the channel close
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    try:
        socket.send_fds(control, [struct.pack(">q", pid)], [mine.fileno()])
    finally:
        mine.close()
    return pid


def zygote(control_fd: int) -> None:
    """The fork server's main loop (see the module docstring): preload, then answer the grader's requests on the
    socket ``control_fd`` until it closes: ``fork`` (a worker for a working directory) and ``reap`` (a worker's
    exit code, after the grader ended it).  When the grader is gone (the socket closed, however it ended), every
    worker not yet reaped is ended with its process group."""
    nondumpable()
    os.environ.setdefault("MPLBACKEND", "Agg")
    import pathedu  # noqa: F401 - the device policy, before any kernel is defined

    from ._grader import watched_functions

    watched_functions()  # imports every watched module: a worker starts with them
    control = socket.socket(fileno=control_fd)
    fd = control.fileno()
    workers: set = set()
    try:
        while True:
            try:
                msg = decode(read_frame(fd))
            except (EOFError, OSError, FormatError):
                return
            if msg.get("op") == "fork":
                workers.add(_fork_worker(control, str(msg["workdir"])))
            elif msg.get("op") == "reap":
                pid = int(msg["pid"])
                workers.discard(pid)
                try:
                    _, status = os.waitpid(pid, 0)
                    code = os.waitstatus_to_exitcode(status)
                except ChildProcessError:
                    code = None
                write_frame(fd, encode({"code": code}))
    finally:
        for pid in workers:
            _end(pid)
