"""Test harness executed inside the sandbox by :mod:`stages.core.envs.code` (never imported).

The caller prepends ``SPEC_JSON = "<json>"`` and runs the result with
:func:`stages.core.sandbox.run_python`. Modes (``SPEC["mode"]``):

* ``expected``: time the reference solution on the inputs; report ``{keep, times}``: indices of the
  inputs it handles (those where it raises are dropped) and its seconds on each.
* ``asserts``: load the candidate, run the test-module setup and each statement of ``check``;
  statements flagged as tests count towards ``passed``.
* ``inputs``: load the candidate, run the reference then the candidate on each kept input, the
  candidate under a per-input timer (evalplus' rule: max(1 s, 4x the reference time)), and compare
  as evalplus does; stop at the first input that exceeds its limit.

Every report is one JSON line prefixed with ``SPEC["nonce"]`` on stdout.
"""
import copy, io, json, signal, sys, time
SPEC = json.loads(SPEC_JSON)  # noqa: F821  (SPEC_JSON is prepended by the caller)
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
    raise SystemExit(0)
def _quiet(f, *a):
    sys.stdout = _Null()
    try:
        return f(*a)
    finally:
        sys.stdout = _out
def _exec(src, ns, name):
    exec(compile(src, name, "exec"), ns)
def _why(e):
    return (type(e).__name__ + (": " + str(e) if str(e) else ""))[:160]
def _load(src, name):
    ns = {"__name__": name}
    _quiet(_exec, src, ns, "<" + name + ">")
    if not callable(ns.get(EP)):
        raise NameError("no function %r defined" % EP)
    return ns
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
    raise SystemExit(0)
try:
    cand = _load(SPEC["candidate"], "candidate")
except BaseException as e:
    _report(0, SPEC["total"], "candidate does not load: " + _why(e))
fn, passed, fails = cand[EP], 0, []
if SPEC["mode"] == "asserts":
    ns = dict(cand, candidate=fn)
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
