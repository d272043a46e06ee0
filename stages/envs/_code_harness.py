"""Test harness executed inside the sandbox by :mod:`stages.envs.code` (never imported).

It runs as the grader, with the audit hook off; its spec arrives as JSON on stdin (never in a file
the candidate could read). Modes (``SPEC["mode"]``):

* ``expected``: time the reference solution on the inputs; report ``{keep, times}``: indices of the
  inputs it handles (those where it raises are dropped) and its seconds on each.
* ``asserts``: run the task prompt (its helpers) and the test-module setup here, with the entry
  point and ``candidate`` bound to the candidate process; run each statement of ``check``;
  statements flagged as tests count towards ``passed``.
* ``inputs``: run the reference here and the candidate in its process on each kept input, the
  candidate under a per-input timer (evalplus' rule: max(1 s, 4x the reference time)), and compare
  as evalplus does; stop at the first input that exceeds its limit.

The candidate runs in a separate process (forked before the spec is read, then running the
sandbox prelude with the audit hook, then ``SPEC["server"]``, written by
:func:`stages.core.exec.call_server.program`) that holds only two pipes: calls go to it pickled, and its results come back through an unpickler that builds
plain data only (no class or function can be named). This grader makes itself non-dumpable, so the
candidate cannot read or write its memory or file descriptors (``/proc/<pid>/mem``, ``/fd``, ptrace),
and ignores the signals it can ignore; the comparisons and the report (one JSON line prefixed with
``SPEC["nonce"]`` on the grader's stdout, which the candidate does not hold) stay out of its reach.
"""
import copy, ctypes, io, json, os, pickle, signal, struct, sys, time
ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0 (inherited by the fork below)
# The candidate's process: forked before the spec is read (so its memory never holds the spec), with
# the call pipes as fds 0 and 1; it gets the sandbox prelude and the server program through fd 0 and
# runs them (audit hook on, no new interpreter to start).
_CALL_R, _TO_CAND = os.pipe()
_FROM_CAND, _REPLY_W = os.pipe()
_CAND_PID = os.fork()
if _CAND_PID == 0:
    os.dup2(_CALL_R, 0)
    os.dup2(_REPLY_W, 1)
    os.closerange(3, 65536)
    def _take(n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(0, n - len(buf))
            if not chunk:
                os._exit(0)
            buf += chunk
        return buf
    _prelude, _server = json.loads(_take(struct.unpack("<Q", _take(8))[0]))
    _prog = os.path.join(os.getcwd(), "candidate.py")
    with open(_prog, "w", encoding="utf-8") as _fh:
        _fh.write(_server)
    sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
    sys.argv = ["-c", os.getcwd(), _prog, "hook"]
    try:
        exec(compile(_prelude, "<prelude>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    finally:
        os._exit(0)
os.close(_CALL_R)
os.close(_REPLY_W)
SPEC = json.load(sys.stdin)
for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE,
             signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGXFSZ):
    signal.signal(_sig, signal.SIG_IGN)
EP, _out = SPEC["entry_point"], sys.stdout
class _Null(io.TextIOBase):
    def write(self, s):
        return len(s)
def _emit(text):
    _out.write("\n" + SPEC["nonce"] + text + "\n")
    _out.flush()
def _report(passed, total, error="", failures=(), timed_out=False):
    _emit(json.dumps({"passed": passed, "total": total, "error": error, "failures": list(failures),
                      "timed_out": timed_out}))
    _out.flush()
    os._exit(0)
def _quiet(f, *a):
    sys.stdout = _Null()
    try:
        return f(*a)
    finally:
        sys.stdout = _out
def _exec(src, ns, name):
    exec(compile(src, name, "exec"), ns)
class _Raised(Exception):
    """The candidate raised (its message is the candidate's exception type and text)."""
def _why(e):
    if isinstance(e, _Raised):
        return str(e)[:160]
    return (type(e).__name__ + (": " + str(e) if str(e) else ""))[:160]
def _load(src, name):
    ns = {"__name__": name}
    _quiet(_exec, src, ns, "<" + name + ">")
    if not callable(ns.get(EP)):
        raise NameError("no function %r defined" % EP)
    return ns
_SAFE = {("builtins", n) for n in ("complex", "set", "frozenset", "bytearray", "int", "float", "str", "list",
                                   "tuple", "dict", "bool", "bytes", "slice", "range")}
_SAFE |= {("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "Counter"),
          ("collections", "deque"), ("decimal", "Decimal"), ("fractions", "Fraction"), ("numpy", "dtype"),
          ("numpy", "ndarray"), ("numpy.core.multiarray", "scalar"), ("numpy.core.multiarray", "_reconstruct"),
          ("numpy._core.multiarray", "scalar"), ("numpy._core.multiarray", "_reconstruct")}
class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError("result holds %s.%s, not plain data" % (module, name))
class _Gone(Exception):
    pass
class _Candidate:
    """The candidate's entry point, called in its own process (forked at the start)."""
    def __init__(self):
        self._req, self._rep = _TO_CAND, _FROM_CAND
        self._send(json.dumps([SPEC["prelude"], SPEC["server"]]).encode())
        kind, value = self._recv()
        if kind != "ready":
            raise NameError(value if kind == "load" else "candidate did not load")
    def _send(self, data):
        data = struct.pack("<Q", len(data)) + data
        try:
            while data:
                data = data[os.write(self._req, data):]
        except OSError:
            raise _Gone("the candidate process ended") from None
    def _recv(self):
        head = self._read(8)
        return _DataOnly(io.BytesIO(self._read(struct.unpack("<Q", head)[0]))).load()
    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(self._rep, min(n - len(buf), 1 << 20))
            if not chunk:
                raise _Gone("the candidate process ended")
            buf += chunk
        return buf
    def __call__(self, *args):
        self._send(pickle.dumps(args, protocol=4))
        reply = self._recv()
        if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] in ("ok", "err")):
            raise _Gone("the candidate process sent no result")
        if reply[0] == "err":
            raise _Raised(str(reply[1]))
        return reply[1]
oracle = {}
if SPEC["mode"] != "asserts":
    exec(SPEC["oracle"], oracle)
    inputs = SPEC["inputs"]
    if SPEC["deserialize"]:
        exec(SPEC["deserialize"], oracle)
        inputs = oracle["mbpp_deserialize_inputs"](SPEC["task_id"], inputs)
    mbpp, atol0 = SPEC["dataset"] == "mbpp-plus", SPEC["atol"]
    ref = _load(SPEC["reference"], "reference")[EP]
    not_none = mbpp and EP in oracle["MBPP_OUTPUT_NOT_NONE_TASKS"]
if SPEC["mode"] == "expected":
    keep, times = [], []
    for i, inp in enumerate(inputs):
        t0 = time.perf_counter()
        try:
            _quiet(ref, *copy.deepcopy(inp))
        except BaseException:
            continue
        times.append(time.perf_counter() - t0)
        keep.append(i)
    _emit(json.dumps({"keep": keep, "times": times}))
    _out.flush()
    os._exit(0)
try:
    fn = _Candidate()
except BaseException as e:
    _report(0, SPEC["total"], "candidate does not load: " + _why(e))
passed, fails = 0, []
if SPEC["mode"] == "asserts":
    ns = {"__name__": "test"}
    try:
        _quiet(_exec, SPEC["prompt"], ns, "<prompt>")
    except BaseException:
        pass
    ns.update({EP: fn, "candidate": fn})
    for src in SPEC["setup"]:
        try:
            _quiet(_exec, src, ns, "<test>")
        except BaseException:
            pass
    for src, is_test in SPEC["units"]:
        try:
            _quiet(_exec, src, ns, "<test>")
            passed += is_test
        except BaseException as e:
            if is_test and len(fails) < 3:
                fails.append(src.strip().splitlines()[0][:160] + "  ->  " + _why(e))
    _report(passed, SPEC["total"], "", fails)
def _floats(x):
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(i, float) for i in x)
def _flat(x):
    return [v for i in x for v in _flat(i)] if isinstance(x, (list, tuple)) else [x]
def _close(out, exp, atol):
    if type(out) != type(exp) or (isinstance(exp, (list, tuple)) and len(out) != len(exp)):
        return False
    a, b = _flat(out), _flat(exp)
    return len(a) == len(b) and all(abs(x - y) <= atol + 1e-7 * abs(y) for x, y in zip(a, b))
def _match(out, exp, inp):
    if EP == "find_zero" and not mbpp:
        return abs(oracle["_poly"](*inp, out)) <= atol0
    exact = out == exp
    if mbpp:
        if EP == "are_equivalent":
            exact = True
        elif EP == "sum_div":
            exact = exact or out == 0
        elif EP == "surface_Area":
            exact = exact or abs(out - oracle["_surface_Area"](*inp)) <= atol0
        elif EP == "digit_distance_nums":
            exact = exact or out == oracle["_digit_distance_nums"](*inp)
        elif EP in oracle["MBPP_OUTPUT_SET_EQ_TASKS"]:
            exact = set(out) == set(exp)
        elif EP in oracle["MBPP_OUTPUT_NOT_NONE_TASKS"]:
            exact = out == exp if isinstance(out, bool) else exp == (out is not None)
    atol = 1e-6 if atol0 == 0 and _floats(exp) else atol0
    if not exact and atol != 0:
        return _close(out, exp, atol)
    return bool(exact)
class _Slow(BaseException):
    pass
def _alarm(*_):
    raise _Slow()
signal.signal(signal.SIGALRM, _alarm)
total = 0
for i, t in zip(SPEC["keep"], SPEC["times"]):
    inp, limit = inputs[i], max(1.0, 4.0 * t)  # evalplus' per-input limit (min 1 s, 4x reference)
    try:
        exp = _quiet(ref, *copy.deepcopy(inp))
    except BaseException:
        continue
    if not_none:
        exp = exp is not None
    total += 1
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        out = _quiet(fn, *copy.deepcopy(inp))
        signal.setitimer(signal.ITIMER_REAL, 0)
        ok, err = _match(out, exp, inp), "wrong output"
    except _Slow:
        fails.append("input %s  ->  exceeded its %.1f s limit" % (repr(inp)[:120], limit))
        _report(passed, len(SPEC["keep"]), "", fails[-3:], True)
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        ok, err = False, _why(e)
    passed += bool(ok)
    if not ok and len(fails) < 3:
        fails.append("input " + repr(inp)[:120] + "  ->  " + err)
_report(passed, total, "", fails)
