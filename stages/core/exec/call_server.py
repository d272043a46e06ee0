"""The program that serves calls to a model's function from inside a sandbox (stdlib only).

Both code graders run the model's code in a process of its own that only answers calls: the code
env's test harness (``stages/envs/_code_harness.py``) and the benchmark graders' candidates sandbox
(``_bench_grader.py``). :func:`program` writes that process's program. It reads its stdin, writes
its stdout, discards everything the model's module prints, and speaks length-prefixed pickles: it
sends ``("load", message)`` when the module fails to load, else ``("ready", None)``, then for each
pickled argument tuple ``("ok", result)`` or ``("err", message)``. The graders unpickle the replies
as plain data only (no class or function can be named in them).
"""
from __future__ import annotations

# How the server words errors: the code env shows these messages to the model (load and call
# errors alike: type and text, cut to 160 characters).
ENV_ERRORS = """def _call_error(e):
    return (type(e).__name__ + (": " + str(e) if str(e) else ""))[:160]
_load_error = _call_error"""
# The benchmark graders only count verdicts: a load error names the exception type alone.
BENCH_ERRORS = """def _load_error(e):
    return type(e).__name__
def _call_error(e):
    return type(e).__name__ + ": " + str(e)[:200]"""

_SERVER = """import os, pickle, struct, sys
_w = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
sys.stdout = open(os.devnull, "w")
def _send(obj):
    try:
        data = pickle.dumps(obj, protocol=4)
    except BaseException as e:
        data = pickle.dumps(("err", "result cannot be sent back: " + type(e).__name__), protocol=4)
    data = struct.pack("<Q", len(data)) + data
    while data:
        data = data[os.write(_w, data):]
def _read(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            os._exit(0)
        buf += chunk
    return buf
%s
_ns = {"__name__": "candidate"}
try:
    exec(compile(%r, "<candidate>", "exec"), _ns)
    _fn = _ns[%r]
    assert callable(_fn), "not a function"
except BaseException as e:
    _send(("load", _load_error(e)))
    os._exit(0)
_send(("ready", None))
while True:
    _args = pickle.loads(_read(struct.unpack("<Q", _read(8))[0]))
    try:
        _send(("ok", _fn(*_args)))
    except BaseException as e:
        _send(("err", _call_error(e)))
"""


def program(code: str, entry_point: str, errors: str) -> str:
    """The server program for one model module.

    Args:
        code: the model's complete module (untrusted; embedded as a string literal, run with ``exec``).
        entry_point: the name of the function to serve.
        errors: :data:`ENV_ERRORS` or :data:`BENCH_ERRORS` (how load and call errors are worded).

    Returns:
        Python source to run as a script with the call channel as stdin and stdout.
    """
    return _SERVER % (errors, code, entry_point)
