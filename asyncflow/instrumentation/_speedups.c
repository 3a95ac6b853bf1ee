/* The compiled hot path of asyncflow: the coroutine wrapper and its per-call record.
 *
 * asyncflow/instrumentation/futures.py is the reference: InstrumentedCoroutine and CallRecord here
 * keep the same fields, the same figures and the same semantics, and futures.py chooses one or
 * the other at import (ASYNCFLOW_NO_EXTENSIONS=1 forces the Python one). What this module does
 * in C is the common path only: reading the clock, the counters and the histogram bucket of
 * every poll, the common end of a call (it returned), and driving the wrapped coroutine through
 * its am_send slot so that neither a task step nor an `await` makes a Python frame or a
 * StopIteration. Everything rare (the first poll, exceptions, throw, close, finalization,
 * cancellation bookkeeping) calls back into the Python helpers of futures.py, so that there is
 * one definition of what those record.
 *
 * Each thread has a "running" slot: the innermost call being polled on it now, each call
 * pointing at the one polled around it. The blocked-loop monitor reads it (running_calls()), as
 * it reads the pure-Python path's (futures._PollSlot).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000
#error "asyncflow's compiled hot path needs CPython 3.11 or newer"
#endif

/* Must match asyncflow/stats.py (checked by setup()). */
#define SUB_BITS 5
#define LINEAR (1 << (SUB_BITS + 1))
#define BUCKETS ((64 + 1) << SUB_BITS)

/* ---- state set by setup() ------------------------------------------------------------------ */

static PyObject *futures_dict;    /* asyncflow.instrumentation.futures' namespace (helpers, constants) */
static PyObject *clock_dict;      /* asyncflow.clock's namespace: now_ns may be replaced */
static PyObject *session_dict;    /* asyncflow.instrumentation._session's namespace: active */
static PyObject *perf_counter_ns; /* time.perf_counter_ns: then read CLOCK_MONOTONIC directly */
static PyObject *call_ids;        /* futures._call_ids, shared with the Python reference */
static PyObject *cancelled_error; /* asyncio.CancelledError */
static PyObject *READY, *RETURNED, *CLOSED, *NEVER_AWAITED, *SUSPENDED, *RAISED, *CANCELLED;
/* The poll probe (futures.set_poll_probe): the probe and its bound begin and end, or all NULL.
 * A poll checks probe_end only; see probed_poll. */
static PyObject *probe_obj, *probe_begin, *probe_end;
static PyObject *bucket_ints[BUCKETS];
static PyObject *get_running_loop; /* asyncio.events._get_running_loop */
static PyObject *current_tasks;    /* 3.11: asyncio.tasks._current_tasks (loop -> task); or NULL */
static PyObject *current_task;     /* asyncio.current_task */
static PyObject *loops_module, *loops_dict; /* asyncflow.instrumentation.loops (last_key, see) */
static PyTypeObject *deque_type; /* collections.deque: the session's buffer of finished calls */
static PyObject *deque_append;   /* deque.append, called unbound */
static PyObject *deque_popleft;  /* deque.popleft, likewise */

static PyObject *s_now_ns, *s_stats, *s_poll_hist, *s_live, *s_created, *s_first_call, *s_first_caller, *s_dropped, *s_send, *s_throw,
    *s_close, *s_first_poll, *s_finish_poll, *s_cancel_requested, *s_scheduled, *s_normalize_throw,
    *s_close_record, *s_session, *s_internal_error, *s_log_result, *s_returned, *s_polls_done,
    *s_busy_done, *s_idle_done, *s_max_poll_done, *s_active, *s_finished, *s_appended,
    *s_append, *s_slot_key, *s_get_running_loop, *s_loops, *s_last_key, *s_see,
    *s_current_tasks, *s_asyncio, *s_current_task, *s_get_name,
    *s_wrapper_name, *s_probe_failed, *s_new_poll_histogram, *s_id;

/* ---- small compatibility helpers ------------------------------------------------------------ */

/* The exception being raised, normalized, as a new reference (NULL: none), and cleared. */
static PyObject *
fetch_exc(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL) {
        return NULL;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_DECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

/* Raise ``exc`` again (steals the reference). */
static void
restore_exc(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    if (exc == NULL) {
        return;
    }
    PyObject *tb = PyException_GetTraceback(exc);
    PyObject *type = (PyObject *)Py_TYPE(exc);
    Py_INCREF(type);
    PyErr_Restore(type, exc, tb);
#endif
}

/* StopIteration(value), as a generator's return raises it; NULL on error. */
static PyObject *
new_stop(PyObject *value)
{
    return PyObject_CallOneArg(PyExc_StopIteration, value);
}

/* ---- the clock ------------------------------------------------------------------------------ */

/* ---- module globals read on the hot path ---------------------------------------------------
 *
 * clock.now_ns, _session.active, loops.last_key and futures.InstrumentedCoroutine may be
 * rebound at any time (set_clock, a profiler starting, a test's monkeypatch), so every poll or
 * call reads them again: through a one-entry cache per global, valid while the module's dict
 * keeps the version it had when the value was looked up (CPython gives a dict a new version
 * on every change). A hit costs one comparison where a lookup cost ~60 instructions. */

#if PY_VERSION_HEX < 0x030E0000
#define HAVE_DICT_VERSION 1
#else
#define HAVE_DICT_VERSION 0 /* 3.14 dropped ma_version_tag: every read is a lookup */
#endif

typedef struct {
    PyObject *dict;     /* the namespace the entry was read from (borrowed) */
    uint64_t version;   /* its version then */
    PyObject *value;    /* what it held (borrowed from the dict); NULL: missing */
} GlobalCache;

#if HAVE_DICT_VERSION
static inline uint64_t
dict_version(PyObject *dict)
{
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    return ((PyDictObject *)dict)->ma_version_tag;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
}
#endif

/* dict[key], borrowed; NULL with no exception set when missing, NULL with one on error. */
static inline PyObject *
global_get(GlobalCache *c, PyObject *dict, PyObject *key)
{
#if HAVE_DICT_VERSION
    uint64_t version = dict_version(dict);
    if (c->dict == dict && c->version == version) {
        return c->value;
    }
#endif
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value == NULL && PyErr_Occurred()) {
        return NULL;
    }
#if HAVE_DICT_VERSION
    c->dict = dict;
    c->version = version;
    c->value = value;
#endif
    return value;
}

static GlobalCache clock_cache, active_cache, last_key_cache, wrapper_cache;

/* clock.now_ns, as a new reference: looked up once per poll, for both of its readings. */
static inline PyObject *
clock_get(void)
{
    PyObject *fn = global_get(&clock_cache, clock_dict, s_now_ns);
    if (fn == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_AttributeError, "asyncflow.clock has no now_ns");
        }
        return NULL;
    }
    return Py_NewRef(fn);
}

/* Read ``clock``: the monotonic clock directly when it is time.perf_counter_ns (the same
 * CLOCK_MONOTONIC on Linux), else by calling it (clock.set_clock() installed a fake clock). */
static inline int
clock_read(PyObject *clock, long long *out)
{
    if (clock == perf_counter_ns) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *out = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        return 0;
    }
    PyObject *value = PyObject_CallNoArgs(clock);
    if (value == NULL) {
        return -1;
    }
    long long ns = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (ns == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = ns;
    return 0;
}

/* clock.now_ns() */
static int
now_ns(long long *out)
{
    PyObject *clock = clock_get();
    if (clock == NULL) {
        return -1;
    }
    int rc = clock_read(clock, out);
    Py_DECREF(clock);
    return rc;
}

/* ---- histograms (asyncflow/stats.py: bucket_of, and the sparse dict the hot path bumps) ---- */

static inline Py_ssize_t
bucket_of(long long ns)
{
    if (ns < LINEAR) {
        return ns < 0 ? 0 : (Py_ssize_t)ns;
    }
    int bits = 64 - __builtin_clzll((unsigned long long)ns);
    return ((Py_ssize_t)bits << SUB_BITS) | (Py_ssize_t)((ns >> (bits - SUB_BITS - 1)) &
                                                         ((1 << SUB_BITS) - 1));
}

/* ---- PollHistogram: a future's poll histogram, bumped in place without a Python object ----
 *
 * futures.FutureStats.poll_hist on the compiled path (stats.new_histogram's defaultdict on the
 * pure-Python one): the same buckets and counts, read by the cold path as a Mapping (bucket ->
 * count, only the filled buckets), so that stats.percentiles and stats.merge give the same
 * figures from either. A poll adds one to a C counter: no dict lookup, no int allocated. The
 * counters come in rows of 32 (one power of two), allocated when first filled, so a future's
 * histogram stays as small as the few powers of two its polls span. */

#define HIST_ROWS (BUCKETS >> SUB_BITS)
#define HIST_COLS (1 << SUB_BITS)

typedef struct {
    PyObject_HEAD
    Py_ssize_t filled;                /* buckets whose count is not 0 */
    unsigned long long *rows[HIST_ROWS]; /* NULL: a row of zeros */
} HistObject;

static PyTypeObject HistType;

/* h[bucket] += n (bucket in range); 0, or -1 with MemoryError set. */
static inline int
hist_add(HistObject *h, Py_ssize_t bucket, unsigned long long n)
{
    unsigned long long *row = h->rows[bucket >> SUB_BITS];
    if (row == NULL) {
        if (n == 0) {
            return 0;
        }
        row = PyMem_Calloc(HIST_COLS, sizeof(unsigned long long));
        if (row == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        h->rows[bucket >> SUB_BITS] = row;
    }
    unsigned long long *cell = &row[bucket & (HIST_COLS - 1)];
    if (*cell == 0 && n != 0) {
        h->filled++;
    }
    *cell += n;
    return 0;
}

static inline unsigned long long
hist_count(HistObject *h, Py_ssize_t bucket)
{
    unsigned long long *row = h->rows[bucket >> SUB_BITS];
    return row == NULL ? 0 : row[bucket & (HIST_COLS - 1)];
}

/* The bucket a key names: 0..BUCKETS-1, or -1 with KeyError (TypeError: not an int) set. */
static Py_ssize_t
hist_key(PyObject *key)
{
    if (!PyLong_Check(key)) {
        PyErr_Format(PyExc_TypeError, "a histogram bucket is an int, not %.100s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    int overflow;
    long long b = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (b == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow || b < 0 || b >= BUCKETS) {
        PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    return (Py_ssize_t)b;
}

static PyObject *
hist_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "PollHistogram() takes no arguments");
        return NULL;
    }
    HistObject *h = (HistObject *)type->tp_alloc(type, 0);
    if (h != NULL) {
        h->filled = 0;
        memset(h->rows, 0, sizeof(h->rows));
    }
    return (PyObject *)h;
}

static void
hist_dealloc(HistObject *h)
{
    for (int i = 0; i < HIST_ROWS; i++) {
        PyMem_Free(h->rows[i]);
    }
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static Py_ssize_t
hist_length(HistObject *h)
{
    return h->filled;
}

/* h[bucket]: its count, 0 for an empty bucket (as the defaultdict(int) of stats.py reads). */
static PyObject *
hist_subscript(HistObject *h, PyObject *key)
{
    Py_ssize_t b = hist_key(key);
    return b < 0 ? NULL : PyLong_FromUnsignedLongLong(hist_count(h, b));
}

static int
hist_ass_subscript(HistObject *h, PyObject *key, PyObject *value)
{
    Py_ssize_t b = hist_key(key);
    if (b < 0) {
        return -1;
    }
    unsigned long long old = hist_count(h, b);
    if (value == NULL) { /* del h[bucket] */
        if (old == 0) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        h->rows[b >> SUB_BITS][b & (HIST_COLS - 1)] = 0;
        h->filled--;
        return 0;
    }
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "a histogram count is an int, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    unsigned long long n = PyLong_AsUnsignedLongLong(value);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Format(PyExc_ValueError, "a histogram count is from 0 to 2**64-1, not %R",
                         value);
        }
        return -1;
    }
    if (old != 0) {
        h->rows[b >> SUB_BITS][b & (HIST_COLS - 1)] = 0;
        h->filled--;
    }
    return hist_add(h, b, n);
}

static int
hist_contains(HistObject *h, PyObject *key)
{
    if (!PyLong_Check(key)) {
        return 0;
    }
    int overflow;
    long long b = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (b == -1 && PyErr_Occurred()) {
        return -1;
    }
    return !overflow && b >= 0 && b < BUCKETS && hist_count(h, (Py_ssize_t)b) != 0;
}

enum { HIST_KEYS, HIST_VALUES, HIST_ITEMS };

/* The filled buckets in bucket order, as a list of keys, counts or (bucket, count) pairs: a
 * copy taken at once (no other thread can bump it meanwhile). */
static PyObject *
hist_list(HistObject *h, int what)
{
    PyObject *out = PyList_New(h->filled);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t i = 0;
    for (Py_ssize_t b = 0; b < BUCKETS && i < h->filled; b++) {
        unsigned long long n = hist_count(h, b);
        if (n == 0) {
            continue;
        }
        PyObject *item;
        if (what == HIST_KEYS) {
            item = Py_NewRef(bucket_ints[b]);
        }
        else {
            PyObject *count = PyLong_FromUnsignedLongLong(n);
            if (count == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            item = what == HIST_VALUES ? count : PyTuple_Pack(2, bucket_ints[b], count);
            if (what == HIST_ITEMS) {
                Py_DECREF(count);
            }
        }
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i++, item);
    }
    return out;
}

static PyObject *
hist_keys(HistObject *h, PyObject *Py_UNUSED(ignored))
{
    return hist_list(h, HIST_KEYS);
}

static PyObject *
hist_values(HistObject *h, PyObject *Py_UNUSED(ignored))
{
    return hist_list(h, HIST_VALUES);
}

static PyObject *
hist_items(HistObject *h, PyObject *Py_UNUSED(ignored))
{
    return hist_list(h, HIST_ITEMS);
}

static PyObject *
hist_iter(HistObject *h)
{
    PyObject *keys = hist_list(h, HIST_KEYS);
    if (keys == NULL) {
        return NULL;
    }
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

/* {bucket: count} of the filled buckets */
static PyObject *
hist_as_dict(HistObject *h)
{
    PyObject *d = PyDict_New();
    for (Py_ssize_t b = 0; d != NULL && b < BUCKETS; b++) {
        unsigned long long n = hist_count(h, b);
        if (n == 0) {
            continue;
        }
        PyObject *count = PyLong_FromUnsignedLongLong(n);
        if (count == NULL || PyDict_SetItem(d, bucket_ints[b], count) < 0) {
            Py_CLEAR(d);
        }
        Py_XDECREF(count);
    }
    return d;
}

static PyObject *
hist_get(HistObject *h, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get expected 1 or 2 arguments, got %zd", nargs);
        return NULL;
    }
    int has = hist_contains(h, args[0]);
    if (has < 0) {
        return NULL;
    }
    if (!has) {
        return Py_NewRef(nargs > 1 ? args[1] : Py_None);
    }
    return hist_subscript(h, args[0]);
}

/* Equal to a mapping with the same filled buckets and counts (a dict, another histogram). */
static PyObject *
hist_richcompare(HistObject *h, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || !(PyDict_Check(other) || Py_IS_TYPE(other, &HistType))) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *mine = hist_as_dict(h);
    PyObject *theirs = Py_IS_TYPE(other, &HistType) ? hist_as_dict((HistObject *)other)
                                                     : Py_NewRef(other);
    PyObject *res = mine && theirs ? PyObject_RichCompare(mine, theirs, op) : NULL;
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    return res;
}

static PyObject *
hist_repr(HistObject *h)
{
    PyObject *d = hist_as_dict(h);
    if (d == NULL) {
        return NULL;
    }
    PyObject *res = PyUnicode_FromFormat("PollHistogram(%R)", d);
    Py_DECREF(d);
    return res;
}

static PyObject *
hist_sizeof(HistObject *h, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t size = Py_TYPE(h)->tp_basicsize;
    for (int i = 0; i < HIST_ROWS; i++) {
        if (h->rows[i] != NULL) {
            size += HIST_COLS * (Py_ssize_t)sizeof(unsigned long long);
        }
    }
    return PyLong_FromSsize_t(size);
}

static PyMappingMethods hist_as_mapping = {
    .mp_length = (lenfunc)hist_length,
    .mp_subscript = (binaryfunc)hist_subscript,
    .mp_ass_subscript = (objobjargproc)hist_ass_subscript,
};

static PySequenceMethods hist_as_sequence = {
    .sq_contains = (objobjproc)hist_contains,
};

static PyMethodDef hist_methods[] = {
    {"keys", (PyCFunction)hist_keys, METH_NOARGS, "The filled buckets, in order (a list)."},
    {"values", (PyCFunction)hist_values, METH_NOARGS, "Their counts, in bucket order (a list)."},
    {"items", (PyCFunction)hist_items, METH_NOARGS,
     "(bucket, count) of the filled buckets, in bucket order (a list: a consistent copy)."},
    {"get", (PyCFunction)(void (*)(void))hist_get, METH_FASTCALL,
     "get(bucket, default=None): its count if filled, else default."},
    {"__sizeof__", (PyCFunction)hist_sizeof, METH_NOARGS, NULL},
    {NULL},
};

static PyTypeObject HistType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.PollHistogram",
    .tp_doc = "A future's poll histogram on the compiled path: bucket -> count (as "
              "asyncflow.stats' sparse histograms; only filled buckets are keys), bumped in C.",
    .tp_basicsize = sizeof(HistObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = hist_new,
    .tp_dealloc = (destructor)hist_dealloc,
    .tp_as_mapping = &hist_as_mapping,
    .tp_as_sequence = &hist_as_sequence,
    .tp_iter = (getiterfunc)hist_iter,
    .tp_richcompare = (richcmpfunc)hist_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_repr = (reprfunc)hist_repr,
    .tp_methods = hist_methods,
};

static int hist_bump_mapping(PyObject *hist, long long ns);

/* hist[bucket_of(ns)] += 1; inline where every poll calls it */
static inline int
hist_bump(PyObject *hist, long long ns)
{
    if (Py_IS_TYPE(hist, &HistType)) { /* the common case: no Python object made or looked up */
        return hist_add((HistObject *)hist, bucket_of(ns), 1);
    }
    return hist_bump_mapping(hist, ns);
}

/* hist[bucket_of(ns)] += 1 on a histogram that is a Python mapping */
static int
hist_bump_mapping(PyObject *hist, long long ns)
{
    PyObject *key = bucket_ints[bucket_of(ns)];
    PyObject *bumped;
    if (PyDict_Check(hist)) { /* a defaultdict(int) (stats.new_histogram) */
        PyObject *count = PyDict_GetItemWithError(hist, key); /* borrowed */
        if (count == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            bumped = PyLong_FromLong(1);
        }
        else {
            long long n = PyLong_CheckExact(count) ? PyLong_AsLongLong(count) : -1;
            if (n >= 0) {
                bumped = PyLong_FromLongLong(n + 1);
            }
            else {
                PyErr_Clear();
                Py_INCREF(count);
                bumped = PyNumber_Add(count, bucket_ints[1]);
                Py_DECREF(count);
            }
        }
        if (bumped == NULL) {
            return -1;
        }
        int rc = PyDict_SetItem(hist, key, bumped);
        Py_DECREF(bumped);
        return rc;
    }
    PyObject *count = PyObject_GetItem(hist, key);
    if (count == NULL) {
        return -1;
    }
    bumped = PyNumber_Add(count, bucket_ints[1]);
    Py_DECREF(count);
    if (bumped == NULL) {
        return -1;
    }
    int rc = PyObject_SetItem(hist, key, bumped);
    Py_DECREF(bumped);
    return rc;
}

/* ---- the slots of futures.py's records ------------------------------------------------------ */

/* A __slots__ attribute of one of futures.py's classes (FutureStats, FutureRecord) or of
 * _session.Session: read and written at its offset when the object is exactly of that class
 * (what a Python attribute access does, without the lookups), through the attribute protocol
 * otherwise. */
typedef struct {
    const char *cls;  /* the class's name in its module */
    const char *name; /* the attribute */
    int ns;           /* where the class is: NS_FUTURES, NS_SESSION or NS_STREAMS */
    PyObject *pyname;
    PyTypeObject *type;
    Py_ssize_t offset;
} Field;

enum {
    FS_CREATED,
    FS_RETURNED,
    FS_POLLS_DONE,
    FS_BUSY_DONE,
    FS_IDLE_DONE,
    FS_MAX_POLL_DONE,
    FS_LIVE,
    FS_POLL_HIST,
    FR_STATS,
    FR_LOG_RESULT,
    FR_TRACKED_BY,
    FF_WRAPPED,
    FF_RECORD,
    TF_ENABLED,
    TF_PREVIOUS,
    SE_FINISHED,
    SE_APPENDED,
    SE_KEEP_IN_PLACE,
    IT_STATS,
    IT_ARMING,
    SS_ITEMS,
    SS_ARM,
    N_FIELDS
};

enum { NS_FUTURES, NS_SESSION, NS_STREAMS };

static Field fields[N_FIELDS] = {
    [FS_CREATED] = {"FutureStats", "created", 0},
    [FS_RETURNED] = {"FutureStats", "returned", 0},
    [FS_POLLS_DONE] = {"FutureStats", "polls_done", 0},
    [FS_BUSY_DONE] = {"FutureStats", "busy_done", 0},
    [FS_IDLE_DONE] = {"FutureStats", "idle_done", 0},
    [FS_MAX_POLL_DONE] = {"FutureStats", "max_poll_done", 0},
    [FS_LIVE] = {"FutureStats", "live", 0},
    [FS_POLL_HIST] = {"FutureStats", "poll_hist", 0},
    [FR_STATS] = {"FutureRecord", "stats", 0},
    [FR_LOG_RESULT] = {"FutureRecord", "log_result", 0},
    [FR_TRACKED_BY] = {"FutureRecord", "tracked_by", 0},
    [FF_WRAPPED] = {"FutureFunction", "__wrapped__", 0},
    [FF_RECORD] = {"FutureFunction", "future_record", 0},
    [TF_ENABLED] = {"_TaskFactory", "enabled", 0},
    [TF_PREVIOUS] = {"_TaskFactory", "previous", 0},
    [SE_FINISHED] = {"Session", "finished", NS_SESSION},
    [SE_APPENDED] = {"Session", "appended", NS_SESSION},
    [SE_KEEP_IN_PLACE] = {"Session", "keep_in_place", NS_SESSION},
    [IT_STATS] = {"_Iteration", "stats", NS_STREAMS},
    [IT_ARMING] = {"_Iteration", "arming", NS_STREAMS},
    [SS_ITEMS] = {"StreamStats", "items", NS_STREAMS},
    [SS_ARM] = {"StreamStats", "arm", NS_STREAMS},
};

/* Find each field's class and offset (setup()); a field whose class or slot is not found is
 * reached through the attribute protocol. */
static int
fields_setup(int ns, PyObject *dict)
{
    for (int i = 0; i < N_FIELDS; i++) {
        Field *f = &fields[i];
        if (f->ns != ns) {
            continue;
        }
        if (f->pyname == NULL && (f->pyname = PyUnicode_InternFromString(f->name)) == NULL) {
            return -1;
        }
        Py_CLEAR(f->type);
        f->offset = 0;
        PyObject *cls = PyDict_GetItemString(dict, f->cls);
        if (cls == NULL || !PyType_Check(cls)) {
            continue;
        }
        PyObject *descr = PyDict_GetItemWithError(((PyTypeObject *)cls)->tp_dict, f->pyname);
        if (descr == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) {
                Py_INCREF(cls);
                f->type = (PyTypeObject *)cls;
                f->offset = member->offset;
            }
        }
    }
    return 0;
}

/* obj.<field>: a new reference, or NULL with an exception set. */
static inline PyObject *
field_get(PyObject *obj, int which)
{
    Field *f = &fields[which];
    if (f->offset && Py_IS_TYPE(obj, f->type)) {
        PyObject *v = *(PyObject **)((char *)obj + f->offset);
        if (v != NULL) {
            return Py_NewRef(v);
        }
    }
    return PyObject_GetAttr(obj, f->pyname);
}

/* obj.<field> = value */
static inline int
field_set(PyObject *obj, int which, PyObject *value)
{
    Field *f = &fields[which];
    if (f->offset && Py_IS_TYPE(obj, f->type)) {
        PyObject **slot = (PyObject **)((char *)obj + f->offset);
        PyObject *old = *slot;
        *slot = Py_NewRef(value);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(obj, f->pyname, value);
}

/* obj.<field> += delta */
static int
field_add(PyObject *obj, int which, long long delta)
{
    PyObject *value = field_get(obj, which);
    if (value == NULL) {
        return -1;
    }
    PyObject *sum = NULL;
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
        long long total;
        if (n == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        else if (!overflow && !__builtin_add_overflow(n, delta, &total)) {
            sum = PyLong_FromLongLong(total);
            Py_DECREF(value);
            value = NULL;
        }
    }
    if (value != NULL) { /* a big (or not an) int: as Python would add */
        PyObject *d = PyLong_FromLongLong(delta);
        sum = d == NULL ? NULL : PyNumber_Add(value, d);
        Py_XDECREF(d);
        Py_DECREF(value);
    }
    if (sum == NULL) {
        return -1;
    }
    int rc = field_set(obj, which, sum);
    Py_DECREF(sum);
    return rc;
}

/* ---- FutureStats: a future's figures, counted in C ------------------------------------------
 *
 * futures.FutureStatsPy is the reference: the same attributes, which the pure-Python path keeps
 * as Python ints in slots. Here the counters are C integers: a call's creation and its common
 * end add to them in place, where a Python int had to be read, made again and freed for each
 * (~1,300 instructions a call for the six of them). Python reads and writes them as ints (the
 * cold path, the Python helpers of the rare ends, futures._fold), so nothing else changes. */

typedef struct {
    PyObject_HEAD
    long long created, returned, raised, cancelled, closed, never_awaited;
    long long dropped; /* of closed: garbage-collected after a poll, never finished */
    long long cancel_requested, cancel_swallowed, cancel_raised, max_cancel_to_end;
    long long polls_done, busy_done, idle_done, max_poll_done;
    long long sched_total, max_sched; /* scheduled time (futures._scheduled), live included */
    long long first_call; /* when its session's first call was made (clock reading); 0: none */
    long long first_caller; /* the future polled when that call was made (its id); 0: none */
    PyObject *live;      /* unfinished calls, by call id: a dict */
    PyObject *poll_hist; /* bumped in place by every poll */
    PyObject *call_hist; /* bumped as each finished call is folded (futures.fold_call) */
    PyObject *recent;    /* the log of recent finished calls, made by the first one folded */
    PyObject *series;    /* owned by the collector */
    PyObject *sched_hist; /* bumped by each poll a task's wake-up led to */
    PyObject *error_types; /* exception type name -> calls that raised it (_raised.count_type) */
} StatsObject;

static PyTypeObject StatsType;

#define STATS_OBJECTS(X) \
    X(live) X(poll_hist) X(call_hist) X(recent) X(series) X(sched_hist) X(error_types)

static int
stats_traverse(StatsObject *self, visitproc visit, void *arg)
{
#define VISIT(name) Py_VISIT(self->name);
    STATS_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int
stats_clear(StatsObject *self)
{
#define CLEAR(name) Py_CLEAR(self->name);
    STATS_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void
stats_dealloc(StatsObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_TRASHCAN_BEGIN(self, stats_dealloc)
    stats_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
    Py_TRASHCAN_END
}

static PyObject *call_helper(PyObject *name, PyObject *const *args, Py_ssize_t nargs);

/* FutureStats(): zeros, an empty ``live``, and two of the histograms futures.py makes
 * (_new_poll_histogram(): a PollHistogram, bumped without a dict or an int, by every poll and by
 * every call as it is folded, where it finishes). */
static PyObject *
stats_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "FutureStats() takes no arguments");
        return NULL;
    }
    if (futures_dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asyncflow: FutureStats() before setup()");
        return NULL;
    }
    StatsObject *self = (StatsObject *)type->tp_alloc(type, 0); /* zeros */
    if (self == NULL) {
        return NULL;
    }
    self->recent = Py_NewRef(Py_None);
    self->series = Py_NewRef(Py_None);
    if ((self->live = PyDict_New()) == NULL || (self->error_types = PyDict_New()) == NULL ||
        (self->poll_hist = call_helper(s_new_poll_histogram, NULL, 0)) == NULL ||
        (self->call_hist = call_helper(s_new_poll_histogram, NULL, 0)) == NULL ||
        (self->sched_hist = call_helper(s_new_poll_histogram, NULL, 0)) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* The name of obj's type without its module: tp_name after its last dot. */
static const char *
short_name(PyObject *obj)
{
    const char *name = Py_TYPE(obj)->tp_name;
    const char *dot = strrchr(name, '.');
    return dot != NULL ? dot + 1 : name;
}

/* A C counter of an object (FutureStats, StreamCounter), read and set as an int (a getset rather
 * than a T_LONGLONG member: 3.11's member stores -1 before it refuses an int too large for it). */
static PyObject *
stats_int_get(PyObject *self, void *offset)
{
    return PyLong_FromLongLong(*(long long *)((char *)self + (Py_ssize_t)offset));
}

static int
stats_int_set(PyObject *self, PyObject *value, void *offset)
{
    if (value == NULL) {
        PyErr_Format(PyExc_TypeError, "a %s counter cannot be deleted", short_name(self));
        return -1;
    }
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "a %s counter is an int, not %.100s", short_name(self),
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    long long n = PyLong_AsLongLong(value);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    *(long long *)((char *)self + (Py_ssize_t)offset) = n;
    return 0;
}

#define STATS_INT(name, doc)                                                                   \
    {#name, (getter)stats_int_get, (setter)stats_int_set, doc,                                 \
     (void *)offsetof(StatsObject, name)},

static PyGetSetDef stats_getset[] = {
    STATS_INT(created, NULL)
    STATS_INT(returned, NULL)
    STATS_INT(raised, NULL)
    STATS_INT(cancelled, NULL)
    STATS_INT(closed, NULL)
    STATS_INT(never_awaited, NULL)
    STATS_INT(dropped, "of closed: garbage-collected after a poll, never finished")
    STATS_INT(cancel_requested, "calls that received at least one cancellation request")
    STATS_INT(cancel_swallowed, "... and returned normally while their task was cancelling")
    STATS_INT(cancel_raised, "... and raised something else (TimeoutError, say)")
    STATS_INT(max_cancel_to_end, "the longest time from a call's first request to its end")
    STATS_INT(polls_done, "sums over finished calls; live calls are added at snapshot time")
    STATS_INT(busy_done, NULL)
    STATS_INT(idle_done, NULL)
    STATS_INT(max_poll_done, NULL)
    STATS_INT(sched_total, "scheduled time: the sum of the waits from a wake-up to its poll")
    STATS_INT(max_sched, "... and the longest")
    STATS_INT(first_call, "when its first call was made (clock reading); 0: none yet")
    STATS_INT(first_caller, "the future whose call was polled when that call was made: 0, none")
    {NULL},
};

#define STATS_OBJ(name, doc) {#name, T_OBJECT_EX, offsetof(StatsObject, name), 0, doc},

static PyMemberDef stats_members[] = {
    STATS_OBJ(live, "unfinished calls, by call id")
    STATS_OBJ(poll_hist, "bumped in place by every poll")
    STATS_OBJ(call_hist, "bumped as each finished call is folded")
    STATS_OBJ(recent, "deque of recent finished calls, made by the first one folded")
    STATS_OBJ(series, "live calls over time (collector.LiveSeries), owned by it")
    STATS_OBJ(sched_hist, "bumped by each poll a task's wake-up led to")
    STATS_OBJ(error_types, "exception type name -> calls that raised it, over the run")
    {NULL},
};

#undef STATS_INT
#undef STATS_OBJ

static PyTypeObject StatsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.FutureStats",
    .tp_doc = "One session's aggregates for one future (the compiled twin of "
              "futures.FutureStats: its counters are C integers, read and set as ints).",
    .tp_basicsize = sizeof(StatsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = stats_new,
    .tp_dealloc = (destructor)stats_dealloc,
    .tp_traverse = (traverseproc)stats_traverse,
    .tp_clear = (inquiry)stats_clear,
    .tp_members = stats_members,
    .tp_getset = stats_getset,
};

/* stats.live or stats.poll_hist (FS_LIVE, FS_POLL_HIST), as a new reference */
static inline PyObject *
stats_field(PyObject *stats, int which)
{
    if (Py_IS_TYPE(stats, &StatsType)) {
        PyObject *v = which == FS_LIVE ? ((StatsObject *)stats)->live
                                       : ((StatsObject *)stats)->poll_hist;
        if (v != NULL) {
            return Py_NewRef(v);
        }
    }
    return field_get(stats, which);
}

/* ---- CallRecord ----------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    long long call_id;
    long long start; /* clock reading at the start of the poll in progress; 0 when not running */
    long long polls;
    long long busy;
    long long max;
    long long last;
    long long created;
    long long first;
    long long finished;
    long long cancel_at;
    long long parent_call; /* the creating task's outermost call, for a task's call; 0: none */
    long long woken;       /* when the task's wake-up was handed to its loop; 0: none pending */
    long long sched;       /* the call's scheduled time: the sum of those waits */
    long long last_end;    /* when its last poll ended (that suspended); 0: none yet */
    long long created_lasti; /* for a task's call: created_code's instruction offset */
    PyObject *future;
    PyObject *stats; /* its poll histogram is the record's ``hist`` (see record_hist) */
    /* set only when they happen (AttributeError until then, as in the Python record) */
    PyObject *state;
    PyObject *task;
    PyObject *outcome;
    PyObject *created_code; /* for a task's call: the code of the frame that made the task */
    /* The fields few calls ever set (RARE_FIELDS), apart: NULL until the first of them is set.
     * Every live task has a record, so each pointer here costs a live task 8 bytes (issue 28:
     * at most 400 B a tracked task more than a plain one). */
    PyObject **rare;
} RecordObject;

static PyTypeObject RecordType;

#define RECORD_OBJECTS(X) X(future) X(stats) X(state) X(task) X(outcome) X(created_code)

/* The record's rarely set fields, in ``rare``: a raised call's, a cancelled call's, a logged
 * result, the poll probe's own (never touched here). */
#define RARE_FIELDS(X)                                                                         \
    X(exc_type) X(exc_message) X(result) X(cancel_requests) X(cancel_to_end) X(cancel_outcome) \
    X(probe_data)
enum {
#define RARE_INDEX(name) RARE_##name,
    RARE_FIELDS(RARE_INDEX)
#undef RARE_INDEX
    N_RARE
};

static int
record_traverse(RecordObject *self, visitproc visit, void *arg)
{
#define VISIT(name) Py_VISIT(self->name);
    RECORD_OBJECTS(VISIT)
#undef VISIT
    if (self->rare != NULL) {
        for (int i = 0; i < N_RARE; i++) {
            Py_VISIT(self->rare[i]);
        }
    }
    return 0;
}

static int
record_clear(RecordObject *self)
{
#define CLEAR(name) Py_CLEAR(self->name);
    RECORD_OBJECTS(CLEAR)
#undef CLEAR
    PyObject **rare = self->rare;
    if (rare != NULL) {
        self->rare = NULL;
        for (int i = 0; i < N_RARE; i++) {
            Py_CLEAR(rare[i]);
        }
        PyMem_Free(rare);
    }
    return 0;
}

/* A rarely set field (``which``: its RARE_ index): AttributeError while unset, as a member. */
static PyObject *
record_rare_get(RecordObject *self, void *which)
{
    PyObject *value = self->rare != NULL ? self->rare[(Py_ssize_t)which] : NULL;
    if (value == NULL) {
        static const char *names[] = {
#define RARE_NAME(name) #name,
            RARE_FIELDS(RARE_NAME)
#undef RARE_NAME
        };
        PyErr_Format(PyExc_AttributeError, "%s", names[(Py_ssize_t)which]);
        return NULL;
    }
    return Py_NewRef(value);
}

static int
record_rare_set(RecordObject *self, PyObject *value, void *which)
{
    Py_ssize_t i = (Py_ssize_t)which;
    if (value == NULL) { /* del: as a member's, an AttributeError when unset */
        if (self->rare == NULL || self->rare[i] == NULL) {
            PyObject *unset = record_rare_get(self, which);
            Py_XDECREF(unset);
            return -1;
        }
        Py_CLEAR(self->rare[i]);
        return 0;
    }
    if (self->rare == NULL && (self->rare = PyMem_Calloc(N_RARE, sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_XSETREF(self->rare[i], Py_NewRef(value));
    return 0;
}

/* record.hist: its stats' poll histogram (as the Python record's, set with its stats), kept
 * nowhere else: a live task's record is 8 bytes smaller. */
static PyObject *
record_hist_get(RecordObject *self, void *Py_UNUSED(closure))
{
    if (self->stats == NULL) {
        PyErr_SetString(PyExc_AttributeError, "hist");
        return NULL;
    }
    return stats_field(self->stats, FS_POLL_HIST);
}

/* Setting it is allowed, as on the Python record (``call.hist = stats.poll_hist`` where a call
 * moves to another future), and must be its stats' own. */
static int
record_hist_set(RecordObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    PyObject *own = record_hist_get(self, NULL);
    if (own == NULL) {
        return -1;
    }
    Py_DECREF(own);
    if (value != own) {
        PyErr_SetString(PyExc_ValueError, "a call record's hist is its stats' poll_hist");
        return -1;
    }
    return 0;
}

static PyGetSetDef record_getset[] = {
    {"hist", (getter)record_hist_get, (setter)record_hist_set, "its stats' poll histogram", NULL},
#define RARE_GETSET(name)                                                                      \
    {#name, (getter)record_rare_get, (setter)record_rare_set, NULL, (void *)RARE_##name},
    RARE_FIELDS(RARE_GETSET)
#undef RARE_GETSET
    {NULL},
};

/* Records freed (when a future's log of recent calls lets them go) are kept for the next
 * calls, up to RECORD_FREE_MAX of them (0.9 MB): a record taken from them costs no allocation
 * and, above all, does not advance the cyclic GC's count of new objects. Every new record did,
 * and (while finished calls waited for the collector's drain, every 50 ms) lived on: a
 * decorated fan-out made the GC run about twice as often as uninstrumented and once in a while
 * fully, which cost more than all the rest of a call's recording. The list holds what a drain
 * of a busy program frees, when calls wait for it. A CallRecord has no finalizer, so its GC
 * header is as new once it is untracked. */
#ifndef Py_GIL_DISABLED
#define RECORD_FREE_MAX 4096
#else
#define RECORD_FREE_MAX 0 /* a free-threaded build: no list shared between threads */
#endif
static RecordObject *record_free[RECORD_FREE_MAX + 1];
static int record_free_count;

static void
record_dealloc(RecordObject *self)
{
    PyObject_GC_UnTrack(self);
    record_clear(self);
    if (Py_IS_TYPE(self, &RecordType) && record_free_count < RECORD_FREE_MAX) {
        record_free[record_free_count++] = self;
        return;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A new, untracked-then-tracked record with every object field NULL (record_setup fills it). */
static RecordObject *
record_alloc(void)
{
    if (record_free_count == 0) {
        return (RecordObject *)RecordType.tp_alloc(&RecordType, 0);
    }
    RecordObject *r = record_free[--record_free_count];
    PyObject_Init((PyObject *)r, &RecordType); /* (cleared by record_clear when it was freed) */
    PyObject_GC_Track(r);
    return r;
}

/* record.hist[bucket_of(ns)] += 1: its stats' poll histogram, read in place where the stats
 * are the compiled FutureStats (always, on this path). */
static int
record_hist_bump(RecordObject *r, long long ns)
{
    if (Py_IS_TYPE(r->stats, &StatsType) && ((StatsObject *)r->stats)->poll_hist != NULL) {
        return hist_bump(((StatsObject *)r->stats)->poll_hist, ns);
    }
    PyObject *hist = stats_field(r->stats, FS_POLL_HIST);
    if (hist == NULL) {
        return -1;
    }
    int rc = hist_bump(hist, ns);
    Py_DECREF(hist);
    return rc;
}

static long long polled_future_id(void);

/* What CallRecord.__init__(future, stats, now) does: a new call, registered live. */
static int
record_setup(RecordObject *self, PyObject *future, PyObject *stats, long long now)
{
    Py_INCREF(future);
    Py_XSETREF(self->future, future);
    Py_INCREF(stats);
    Py_XSETREF(self->stats, stats);
    PyObject *id = PyIter_Next(call_ids);
    if (id == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "asyncflow: call ids ran out");
        }
        return -1;
    }
    self->call_id = PyLong_AsLongLong(id);
    if (self->call_id == -1 && PyErr_Occurred()) {
        Py_DECREF(id);
        return -1;
    }
    self->start = self->polls = self->busy = self->max = self->last = 0;
    self->first = self->finished = self->cancel_at = self->parent_call = 0;
    self->woken = self->sched = self->last_end = self->created_lasti = 0;
    self->created = now;
    PyObject *live = stats_field(stats, FS_LIVE);
    int rc = live == NULL                ? -1
             : PyDict_CheckExact(live) ? PyDict_SetItem(live, id, (PyObject *)self)
                                       : PyObject_SetItem(live, id, (PyObject *)self);
    Py_XDECREF(live);
    Py_DECREF(id); /* (live holds it; unlive() makes it again from call_id) */
    if (rc < 0) {
        return -1;
    }
    if (Py_IS_TYPE(stats, &StatsType)) {
        StatsObject *st = (StatsObject *)stats;
        st->created += 1;
        if (!st->first_call) {
            st->first_call = now;
            st->first_caller = polled_future_id();
        }
        return 0;
    }
    if (field_add(stats, FS_CREATED, 1) < 0) { /* Python figures: as the reference counts */
        return -1;
    }
    PyObject *first = PyObject_GetAttr(stats, s_first_call);
    int none_yet = first == NULL ? -1 : PyObject_Not(first);
    Py_XDECREF(first);
    if (none_yet <= 0) {
        return none_yet;
    }
    PyObject *at = PyLong_FromLongLong(now);
    int set = at == NULL ? -1 : PyObject_SetAttr(stats, s_first_call, at);
    Py_XDECREF(at);
    if (set < 0) {
        return -1;
    }
    PyObject *caller = PyLong_FromLongLong(polled_future_id());
    set = caller == NULL ? -1 : PyObject_SetAttr(stats, s_first_caller, caller);
    Py_XDECREF(caller);
    return set;
}

static int
record_init(RecordObject *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"future", "stats", "now", NULL};
    PyObject *future, *stats;
    long long now;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOL:CallRecord", names, &future, &stats, &now)) {
        return -1;
    }
    return record_setup(self, future, stats, now);
}

static PyMemberDef record_members[] = {
    {"call_id", T_LONGLONG, offsetof(RecordObject, call_id), 0, NULL},
    {"start", T_LONGLONG, offsetof(RecordObject, start), 0,
     "clock reading at the start of the poll in progress; 0 when not running"},
    {"polls", T_LONGLONG, offsetof(RecordObject, polls), 0, NULL},
    {"busy", T_LONGLONG, offsetof(RecordObject, busy), 0, NULL},
    {"max", T_LONGLONG, offsetof(RecordObject, max), 0, NULL},
    {"last", T_LONGLONG, offsetof(RecordObject, last), 0, NULL},
    {"created", T_LONGLONG, offsetof(RecordObject, created), 0, NULL},
    {"first", T_LONGLONG, offsetof(RecordObject, first), 0, NULL},
    {"finished", T_LONGLONG, offsetof(RecordObject, finished), 0, NULL},
    {"cancel_at", T_LONGLONG, offsetof(RecordObject, cancel_at), 0, NULL},
    {"parent_call", T_LONGLONG, offsetof(RecordObject, parent_call), 0,
     "for a task's call: the id of the outermost call polled when the task was made (its "
     "creator's); 0 when none was"},
    {"woken", T_LONGLONG, offsetof(RecordObject, woken), 0,
     "for a task's own call: when the task's wake-up was handed to its loop; 0: none pending"},
    {"sched", T_LONGLONG, offsetof(RecordObject, sched), 0,
     "the call's scheduled time: the sum of its waits from a wake-up to the poll it led to"},
    {"created_code", T_OBJECT_EX, offsetof(RecordObject, created_code), 0,
     "for a task's call: the code of the frame that called create_task (asyncio's left out), "
     "set by the task factory; unset: unknown"},
    {"created_lasti", T_LONGLONG, offsetof(RecordObject, created_lasti), 0,
     "for a task's call: that frame's instruction offset (f_lasti) when it made the task"},
    {"future", T_OBJECT_EX, offsetof(RecordObject, future), 0, NULL},
    {"stats", T_OBJECT_EX, offsetof(RecordObject, stats), 0, NULL},
    {"state", T_OBJECT_EX, offsetof(RecordObject, state), 0, NULL},
    {"task", T_OBJECT_EX, offsetof(RecordObject, task), 0, NULL},
    {"outcome", T_OBJECT_EX, offsetof(RecordObject, outcome), 0, NULL},
    {NULL},
};

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.CallRecord",
    .tp_doc = "One call's figures (the compiled twin of futures.CallRecord). Holds no reference "
              "to the coroutine, its arguments or its result.",
    .tp_basicsize = sizeof(RecordObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)record_init,
    .tp_dealloc = (destructor)record_dealloc,
    .tp_traverse = (traverseproc)record_traverse,
    .tp_clear = (inquiry)record_clear,
    .tp_members = record_members,
    .tp_getset = record_getset,
};

/* ---- calling back into futures.py ----------------------------------------------------------- */

/* futures.<name>(args..., **kwargs): a new reference, or NULL with an exception set. */
static PyObject *
call_helper_kw(PyObject *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *fn = PyDict_GetItemWithError(futures_dict, name);
    if (fn == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_RuntimeError, "asyncflow: futures.%U is missing", name);
        }
        return NULL;
    }
    Py_INCREF(fn);
    PyObject *res = PyObject_Vectorcall(fn, args, (size_t)nargs, kwnames);
    Py_DECREF(fn);
    return res;
}

/* futures.<name>(args...) */
static PyObject *
call_helper(PyObject *name, PyObject *const *args, Py_ssize_t nargs)
{
    return call_helper_kw(name, args, nargs, NULL);
}

/* futures.<name>(r, t0): 0, or -1 with an exception set. */
static int
call_with_time(PyObject *name, RecordObject *r, long long t0)
{
    PyObject *t = PyLong_FromLongLong(t0);
    if (t == NULL) {
        return -1;
    }
    PyObject *args[2] = {(PyObject *)r, t};
    PyObject *res = call_helper(name, args, 2);
    Py_DECREF(t);
    if (res == NULL) {
        return -1;
    }
    Py_DECREF(res);
    return 0;
}

/* futures._finish_poll(r, t0, exc): the call ended with ``exc`` (StopIteration included). It
 * catches its own errors; one that escapes it (a BaseException) replaces ``exc``, as it would
 * in the Python wrapper's ``except`` block. Steals ``exc`` and returns what is to be raised. */
static PyObject *
finish_poll(RecordObject *r, long long t0, PyObject *exc)
{
    PyObject *t = PyLong_FromLongLong(t0);
    PyObject *res = NULL;
    if (t != NULL) {
        PyObject *args[3] = {(PyObject *)r, t, exc};
        res = call_helper(s_finish_poll, args, 3);
        Py_DECREF(t);
    }
    if (res != NULL) {
        Py_DECREF(res);
        return exc;
    }
    PyObject *err = fetch_exc();
    if (err == NULL) {
        return exc;
    }
    PyException_SetContext(err, exc);
    return err;
}

/* futures._session.internal_error(where, err), for an Exception ``err`` (stolen); anything else
 * is reported as unraisable. Leaves no exception set. */
static void
internal_error(const char *where, PyObject *err, PyObject *obj)
{
    if (err == NULL) {
        return;
    }
    if (!PyObject_TypeCheck(err, (PyTypeObject *)PyExc_Exception)) {
        restore_exc(err);
        PyErr_WriteUnraisable(obj);
        return;
    }
    PyObject *session = PyDict_GetItemWithError(futures_dict, s_session);
    if (session == NULL || session == Py_None) { /* at interpreter shutdown: nobody to tell */
        PyErr_Clear();
        Py_DECREF(err);
        return;
    }
    PyObject *fn = PyObject_GetAttr(session, s_internal_error);
    PyObject *text = PyUnicode_FromString(where);
    PyObject *res = NULL;
    if (fn != NULL && text != NULL) {
        PyObject *args[2] = {text, err};
        res = PyObject_Vectorcall(fn, args, 2, NULL);
    }
    Py_XDECREF(fn);
    Py_XDECREF(text);
    Py_DECREF(err);
    if (res == NULL) {
        PyErr_WriteUnraisable(obj);
    }
    Py_XDECREF(res);
}

/* An error while recording: asyncflow's own (an Exception) goes to internal_error() and 0 is
 * returned; anything else (KeyboardInterrupt or SystemExit raised while a repr() the program
 * asked for ran) is the program's: it is counted there already, set again, and -1 is returned
 * for the caller to raise it. */
static int
recording_failed(const char *where, PyObject *obj)
{
    PyObject *err = fetch_exc();
    if (err != NULL && !PyObject_TypeCheck(err, (PyTypeObject *)PyExc_Exception)) {
        restore_exc(err);
        return -1;
    }
    internal_error(where, err, obj);
    return 0;
}

/* ---- the common end of a call, in C: it returned (futures._finish_poll, then _retire) ------- */

/* Whether the returning call can be ended here: no result to log, no cancellation to account
 * for, not ended before. Anything else goes through futures._finish_poll. */
static int
plain_return(RecordObject *r)
{
    if (r->finished || r->cancel_at) {
        return 0;
    }
    PyObject *log = field_get(r->future, FR_LOG_RESULT);
    if (log == NULL) {
        PyErr_Clear();
        return 0;
    }
    int on = PyObject_IsTrue(log);
    Py_DECREF(log);
    if (on != 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The counters end_returned adds to, on a Python FutureStats (futures.FutureStatsPy). */
static int
retire_py(RecordObject *r, PyObject *st, long long now)
{
    if (field_add(st, FS_RETURNED, 1) < 0) {
        return -1;
    }
    /* _retire(r, now) */
    r->finished = now;
    if (field_add(st, FS_POLLS_DONE, r->polls) < 0 || field_add(st, FS_BUSY_DONE, r->busy) < 0) {
        return -1;
    }
    if (r->first && field_add(st, FS_IDLE_DONE, now - r->first - r->busy) < 0) {
        return -1;
    }
    PyObject *max = field_get(st, FS_MAX_POLL_DONE);
    if (max == NULL) {
        return -1;
    }
    long long max_done = PyLong_AsLongLong(max);
    Py_DECREF(max);
    if (max_done == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (r->max > max_done) {
        PyObject *m = PyLong_FromLongLong(r->max);
        int rc = m == NULL ? -1 : field_set(st, FS_MAX_POLL_DONE, m);
        Py_XDECREF(m);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

static int fold_one(PyObject *r, PyObject *keep, PyObject *live, PyObject *to_users);

/* What futures._finish_poll does for a StopIteration, and _retire, but for taking the call out
 * of ``live`` (end_returned). */
static int
end_returned_figures(RecordObject *r, long long t0, PyObject *clock)
{
    long long now;
    if (clock_read(clock, &now) < 0) {
        return -1;
    }
    long long dt = now - t0;
    r->start = 0;
    r->polls += 1;
    r->busy += dt;
    r->last = dt;
    if (dt > r->max) {
        r->max = dt;
    }
    if (record_hist_bump(r, dt) < 0) {
        return -1;
    }
    Py_INCREF(READY);
    Py_XSETREF(r->state, READY);
    Py_INCREF(RETURNED);
    Py_XSETREF(r->outcome, RETURNED);
    PyObject *st = r->stats;
    if (Py_IS_TYPE(st, &StatsType)) { /* counted in C: the common case */
        StatsObject *s = (StatsObject *)st;
        s->returned += 1;
        /* _retire(r, now) */
        r->finished = now;
        s->polls_done += r->polls;
        s->busy_done += r->busy;
        if (r->first) {
            s->idle_done += now - r->first - r->busy;
        }
        if (r->max > s->max_poll_done) {
            s->max_poll_done = r->max;
        }
    }
    else if (retire_py(r, st, now) < 0) { /* the Python FutureStats */
        return -1;
    }
    PyObject *session = global_get(&active_cache, session_dict, s_active); /* borrowed */
    if (session == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (session != NULL && session != Py_None) {
        Py_INCREF(session);
        PyObject *keep = field_get(session, SE_KEEP_IN_PLACE);
        if (keep == NULL) {
            Py_DECREF(session);
            return -1;
        }
        if (keep != Py_None) { /* folded here, as the collector would (fold_one) */
            int rc = fold_one((PyObject *)r, keep, Py_None, Py_None);
            Py_DECREF(keep);
            Py_DECREF(session);
            if (rc < 0) {
                return -1;
            }
            return 0;
        }
        Py_DECREF(keep);
        PyObject *finished = field_get(session, SE_FINISHED);
        PyObject *res = NULL;
        if (finished != NULL && deque_append != NULL && Py_IS_TYPE(finished, deque_type)) {
            PyObject *args[2] = {finished, (PyObject *)r}; /* deque.append(finished, r) */
            res = PyObject_Vectorcall(deque_append, args, 2, NULL);
        }
        else if (finished != NULL) {
            res = PyObject_CallMethodOneArg(finished, s_append, (PyObject *)r);
        }
        Py_XDECREF(finished);
        int rc = res == NULL ? -1 : field_add(session, SE_APPENDED, 1);
        Py_XDECREF(res);
        Py_DECREF(session);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

/* Take a finished call out of its future's ``live``: last, since once a gone future's ``live``
 * is empty the reaper may fold its figures. */
static int
unlive(RecordObject *r)
{
    PyObject *live = stats_field(r->stats, FS_LIVE);
    if (live == NULL) {
        return -1;
    }
    PyObject *id = PyLong_FromLongLong(r->call_id);
    int rc = -1;
    if (id != NULL) {
        rc = PyDict_Check(live) ? PyDict_DelItem(live, id) : PyObject_DelItem(live, id);
        if (rc < 0 && PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
            rc = 0;
        }
        Py_DECREF(id);
    }
    Py_DECREF(live);
    return rc;
}

static int
end_returned(RecordObject *r, long long t0, PyObject *clock)
{
    PyObject *pending = end_returned_figures(r, t0, clock) < 0 ? fetch_exc() : NULL;
    if (unlive(r) < 0) { /* a call that ended is never left live, whatever failed before */
        if (pending == NULL) {
            pending = fetch_exc();
        }
        else {
            PyErr_Clear();
        }
    }
    if (pending != NULL) {
        restore_exc(pending);
        return -1;
    }
    return 0;
}

/* ---- the running slot of each thread -------------------------------------------------------- */

typedef struct WrapperObject WrapperObject;

typedef struct {
    PyObject_HEAD
    WrapperObject *inner; /* the innermost call being polled on this thread; borrowed */
} SlotObject;

struct WrapperObject {
    PyObject_HEAD
    PyObject *coro;
    RecordObject *r;
    WrapperObject *outer;  /* while polled: the call polled around this one; borrowed */
    int polling;           /* in a poll now: a send or throw into it meanwhile is no poll */
    WrapperObject *child;  /* the tracked call its last poll suspended awaiting (see Handoff);
                              only compared, never followed */
    long long child_id;    /* ... and that call's id, which no other call shares */
};

/* Clock readings handed between the nested polls of one chain of tracked calls.
 *
 * When a task steps a call that awaits another tracked call, the outer poll resumes the inner
 * one with no code of its own between (the frame resumes at its ``await``), and when the inner
 * poll suspends, what it yields passes up through the outer one unchanged. Each poll still
 * reads the clock at its start and end, but only the outermost start and the innermost end
 * are needed: the others are the same moment, give or take the pass-through. So an outer poll
 * whose coroutine suspended awaiting a tracked call, and yields exactly what that call's poll
 * just yielded, ends at that poll's reading (``yielded``); and when it resumes, it lends its
 * start to that call (``resume_for``). A deep chain then reads the clock twice a step, not
 * twice a level (the clock's cost is the largest share of a poll's).
 *
 * "Suspended awaiting" is checked, not assumed: the outer coroutine's ``cr_await`` leads to
 * the inner wrapper through native coroutines and generators only (``awaits``). The same object
 * yielded is not enough: ``None`` is what every ``sleep(0)`` yields, and a call may run an
 * eager task, or drive a coroutine by hand, and go on with its own code before yielding an
 * object equal to the inner one's. Only with the real clock (a fake one is read as asked, on
 * every path), with no poll probe (whose begin() runs between the two polls and must stay
 * outside both), and only on ``send``; the call lent a start must be the first wrapper
 * entered, and the very call (its id) that suspended. Under the GIL no other thread runs
 * between the two polls; a free-threaded build keeps one per thread. */
typedef struct {
    WrapperObject *resume_for; /* the wrapper whose poll starts at resume_ns if entered next */
    long long resume_id;       /* ... the id of its call */
    long long resume_ns;
    PyObject *yielded;         /* what the last poll to suspend yielded (identity only) */
    WrapperObject *yielded_by; /* ... that poll's wrapper */
    long long yielded_ns;      /* ... and when it ended */
} Handoff;

#ifndef Py_GIL_DISABLED
static Handoff handoff;
#else
static _Thread_local Handoff handoff;
#endif

/* The getters of ``cr_await`` and ``gi_yieldfrom``, found in the types' getset tables at
 * setup (called directly: no attribute look-up on the poll's path); NULL: not found, looked up
 * by name. */
static getter cr_await_get, gi_yieldfrom_get;
static PyObject *s_cr_await, *s_gi_yieldfrom;

static getter
getset_getter(PyTypeObject *type, const char *name)
{
    for (PyGetSetDef *g = type->tp_getset; g != NULL && g->name != NULL; g++) {
        if (strcmp(g->name, name) == 0) {
            return g->get;
        }
    }
    return NULL;
}

/* What the suspended native coroutine or generator ``aw`` awaits (a new reference); NULL with
 * no exception set if it is neither, or awaits nothing. */
static PyObject *
awaited_by(PyObject *aw)
{
    PyObject *next;
    if (Py_IS_TYPE(aw, &PyCoro_Type)) {
        next = cr_await_get != NULL ? cr_await_get(aw, NULL) : PyObject_GetAttr(aw, s_cr_await);
    }
    else if (Py_IS_TYPE(aw, &PyGen_Type)) {
        next = gi_yieldfrom_get != NULL ? gi_yieldfrom_get(aw, NULL)
                                        : PyObject_GetAttr(aw, s_gi_yieldfrom);
    }
    else {
        return NULL;
    }
    if (next == NULL) {
        PyErr_Clear();
    }
    return next;
}

/* Whether the suspended ``coro`` awaits ``target``: its ``cr_await`` is ``target``, or leads to
 * it through native coroutines and generators (``gi_yieldfrom``). */
static int
awaits(PyObject *coro, WrapperObject *target)
{
    PyObject *aw = Py_NewRef(coro);
    for (int hops = 0; hops < 8 && aw != NULL; hops++) {
        PyObject *next = awaited_by(aw);
        Py_DECREF(aw);
        if (next == (PyObject *)target) {
            Py_DECREF(next);
            return 1;
        }
        aw = next;
    }
    Py_XDECREF(aw);
    return 0;
}

/* This thread's slot, cached; the thread state's dict owns it. */
static _Thread_local SlotObject *tls_slot;

static void
slot_dealloc(SlotObject *self)
{
    if (tls_slot == self) { /* the thread state is being cleared: its thread is ending */
        tls_slot = NULL;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject SlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.RunningSlot",
    .tp_basicsize = sizeof(SlotObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)slot_dealloc,
};

/* The id of the future whose call is polled on this thread now (the caller of a call made
 * now, or the maker of a task); 0: none, or not known. Read once a future, at its first call. */
static long long
polled_future_id(void)
{
    SlotObject *slot = tls_slot;
    if (slot == NULL || slot->inner == NULL || slot->inner->r == NULL) {
        return 0;
    }
    PyObject *id = PyObject_GetAttr(slot->inner->r->future, s_id);
    long long found = id != NULL && PyLong_Check(id) ? PyLong_AsLongLong(id) : 0;
    Py_XDECREF(id);
    if (PyErr_Occurred()) { /* (a future record of another shape: not known) */
        PyErr_Clear();
        return 0;
    }
    return found;
}

/* This thread's slot; NULL (no error set) if it cannot have one: the poll is then not visible
 * to the monitor, and nothing else changes. */
static SlotObject *
make_slot(void)
{
    PyObject *dict = PyThreadState_GetDict();
    if (dict == NULL) {
        return NULL;
    }
    PyObject *found = PyDict_GetItemWithError(dict, s_slot_key);
    if (found != NULL && Py_IS_TYPE(found, &SlotType)) {
        tls_slot = (SlotObject *)found;
        return tls_slot;
    }
    SlotObject *slot = PyObject_New(SlotObject, &SlotType);
    if (slot == NULL) {
        PyErr_Clear();
        return NULL;
    }
    slot->inner = NULL;
    if (PyDict_SetItem(dict, s_slot_key, (PyObject *)slot) < 0) {
        PyErr_Clear();
        Py_DECREF(slot);
        return NULL;
    }
    Py_DECREF(slot); /* the thread state's dict holds it */
    tls_slot = slot;
    return slot;
}

static inline SlotObject *
get_slot(void)
{
    SlotObject *slot = tls_slot;
    return slot != NULL ? slot : make_slot();
}

/* The most links running_calls() follows from a thread's innermost call out. */
#define WALK_LIMIT 1000000

/* ``self``'s poll begins: the slot names it, and it names the call polled around it. */
static inline void
slot_enter(SlotObject *slot, WrapperObject *self)
{
    if (slot != NULL) {
        self->outer = slot->inner;
        slot->inner = self;
    }
}

/* ``self``'s poll ended: the slot names the call polled around it again. Polls on a thread end
 * in the order opposite to their starts, but for greenlets that switch in the middle of one:
 * then ``self`` may be further out in the chain, and is unlinked there (never left in it, where
 * it would dangle once freed). */
static inline void
slot_leave(SlotObject *slot, WrapperObject *self)
{
    WrapperObject *outer = self->outer;
    self->outer = NULL;
    if (slot == NULL) {
        return;
    }
    if (slot->inner == self) {
        slot->inner = outer;
        return;
    }
    for (WrapperObject *w = slot->inner; w != NULL; w = w->outer) {
        if (w->outer == self) {
            w->outer = outer;
            return;
        }
    }
}

/* ---- InstrumentedCoroutine ------------------------------------------------------------------ */

static PyTypeObject WrapperType;

/* ---- the running loop and the current task's name, read at each call's first poll ----------
 *
 * 3.11's asyncio._get_running_loop() calls getpid() every time (a check against forks): a
 * system call, ~230 ns here, once per tracked call. It reads a holder asyncio keeps in the
 * thread state's dict; so does running_loop(), once a call of _get_running_loop() has shown that
 * the holder there has the layout expected (its loop is the loop returned, its pid ours). Our
 * pid is cached, and forgotten in a forked child. 3.12 reads the loop without a system call. */
#if PY_VERSION_HEX < 0x030C0000 && !defined(MS_WINDOWS)
#define FAST_RUNNING_LOOP 1
#include <pthread.h>
#include <unistd.h>

typedef struct { /* _asynciomodule.c's PyRunningLoopHolder (3.11) */
    PyObject_HEAD
    PyObject *rl_loop;
    pid_t rl_pid;
} LoopHolder;

static PyTypeObject *holder_type; /* asyncio's holder type, once learned; NULL: not (yet) */
static PyObject *s_holder_key;    /* the thread state dict's key for it */
static pid_t my_pid;              /* getpid(), cached; 0: not read since a fork */

static void
forked_child(void)
{
    my_pid = 0;
}

/* After _get_running_loop() returned ``loop`` (not None): learn the holder's type if the entry
 * of this thread's dict is laid out as expected. */
static void
learn_holder(PyObject *loop)
{
    PyObject *tsd = PyThreadState_GetDict();
    if (tsd == NULL || !PyCFunction_Check(get_running_loop)) {
        return;
    }
    PyObject *h = PyDict_GetItemWithError(tsd, s_holder_key);
    if (h == NULL) {
        PyErr_Clear();
        return;
    }
    if (Py_TYPE(h)->tp_basicsize == (Py_ssize_t)sizeof(LoopHolder) &&
        strcmp(Py_TYPE(h)->tp_name, "_RunningLoopHolder") == 0 &&
        ((LoopHolder *)h)->rl_loop == loop && ((LoopHolder *)h)->rl_pid == getpid()) {
        holder_type = Py_TYPE(h);
    }
}
#else
#define FAST_RUNNING_LOOP 0
#endif

/* asyncio.events._get_running_loop(): a new reference (None outside a loop), NULL on error. */
static PyObject *
running_loop(void)
{
#if FAST_RUNNING_LOOP
    if (holder_type != NULL) {
        PyObject *tsd = PyThreadState_GetDict();
        PyObject *h = tsd == NULL ? NULL : PyDict_GetItemWithError(tsd, s_holder_key);
        if (h == NULL) {
            return PyErr_Occurred() ? NULL : Py_NewRef(Py_None); /* never set on this thread */
        }
        if (Py_IS_TYPE(h, holder_type)) {
            if (my_pid == 0) {
                my_pid = getpid();
            }
            LoopHolder *lh = (LoopHolder *)h;
            return Py_NewRef(lh->rl_pid == my_pid ? lh->rl_loop : Py_None);
        }
    }
    PyObject *loop = PyObject_CallNoArgs(get_running_loop);
    if (holder_type == NULL && loop != NULL && loop != Py_None) {
        learn_holder(loop);
    }
    return loop;
#else
    return PyObject_CallNoArgs(get_running_loop);
#endif
}

static PyTypeObject *task_type; /* asyncio.Task, when its methods cannot be replaced */
static PyObject *task_get_name; /* asyncio.Task.get_name, then */

/* task.get_name(): a new reference, or NULL with an exception set. */
static inline PyObject *
task_name(PyObject *task)
{
    if (Py_IS_TYPE(task, task_type)) { /* no method lookup */
        return PyObject_Vectorcall(task_get_name, &task, 1, NULL);
    }
    return PyObject_CallMethodNoArgs(task, s_get_name);
}

/* futures._first_poll(r, t0), in C: the call's first poll notes its loop and its task. */
static int
first_poll(RecordObject *r, long long t0)
{
    r->first = t0;
    PyObject *loop = running_loop();
    if (loop == NULL) {
        return -1;
    }
    if (loop == Py_None) { /* driven by hand, outside any event loop */
        Py_DECREF(loop);
        return 0;
    }
    int rc = -1;
    PyObject *task = NULL;
    /* if id(loop) != loops.last_key: loops.see(loop) */
    PyObject *last = global_get(&last_key_cache, loops_dict, s_last_key); /* borrowed */
    if (last == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "asyncflow: loops.last_key is missing");
        }
        goto done;
    }
    void *last_loop = PyLong_AsVoidPtr(last);
    if (last_loop == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (last_loop != (void *)loop) {
        PyObject *seen = PyObject_CallMethodOneArg(loops_module, s_see, loop);
        if (seen == NULL) {
            goto done;
        }
        Py_DECREF(seen);
    }
    if (current_tasks != NULL) { /* 3.11: asyncio.tasks._current_tasks */
        task = PyDict_GetItemWithError(current_tasks, loop);
        if (task == NULL && PyErr_Occurred()) {
            goto done;
        }
        Py_XINCREF(task);
    }
    else if ((task = PyObject_CallOneArg(current_task, loop)) == NULL) {
        goto done;
    }
    if (task != NULL && task != Py_None) {
        PyObject *name = task_name(task);
        if (name == NULL) {
            goto done;
        }
        Py_XSETREF(r->task, name);
    }
    rc = 0;
done:
    Py_XDECREF(task);
    Py_DECREF(loop);
    return rc;
}

/* futures._scheduled(r, t0), in C: the poll starting at ``t0`` is the one the call's task was
 * woken for; the wait since counts as its scheduled time, on the call and on its future. */
static int
scheduled(RecordObject *r, long long t0)
{
    if (!Py_IS_TYPE(r->stats, &StatsType)) { /* Python figures: as the reference counts them */
        return call_with_time(s_scheduled, r, t0);
    }
    long long ns = t0 > r->woken ? t0 - r->woken : 0;
    r->woken = 0;
    r->sched += ns;
    StatsObject *st = (StatsObject *)r->stats;
    st->sched_total += ns;
    if (ns > st->max_sched) {
        st->max_sched = ns;
    }
    return hist_bump(st->sched_hist, ns);
}

/* Send ``arg`` into ``coro`` (*res: what it yielded or returned). */
static inline PySendResult
send_into(PyObject *coro, PyObject *arg, PyObject **res)
{
    if (Py_IS_TYPE(coro, &PyCoro_Type) || Py_IS_TYPE(coro, &PyGen_Type)) {
        return PyIter_Send(coro, arg, res);
    }
    /* as the Python wrapper does: its send() method, whatever its __next__ does */
    *res = PyObject_CallMethodOneArg(coro, s_send, arg);
    return *res != NULL ? PYGEN_NEXT : PYGEN_ERROR;
}

/* Throw into ``coro``: the legacy three-argument form normalized as a generator would. */
static PyObject *
throw_into(PyObject *coro, PyObject *typ, PyObject *val, PyObject *tb)
{
    if (val == Py_None && tb == Py_None) {
        return PyObject_CallMethodOneArg(coro, s_throw, typ);
    }
    PyObject *nargs3[3] = {typ, val, tb};
    PyObject *exc = call_helper(s_normalize_throw, nargs3, 3);
    PyObject *res = exc == NULL ? NULL : PyObject_CallMethodOneArg(coro, s_throw, exc);
    Py_XDECREF(exc);
    return res;
}

/* One poll: send ``arg`` into the wrapped coroutine and record it, as
 * futures.InstrumentedCoroutine.send does. Returns PYGEN_NEXT (*res: what it yielded),
 * PYGEN_RETURN (*res: what it returned) or PYGEN_ERROR (the exception is set; it may be the
 * StopIteration of a coroutine that is not a native one). If ``stop`` is not NULL and the call
 * returned, *stop is the StopIteration it would raise (or NULL, to be made by the caller). */
static PySendResult
poll_inner(WrapperObject *self, PyObject *arg, PyObject **res, PyObject **stop, long long *t0_out)
{
    RecordObject *r = self->r;
    long long t0, now;
    *res = NULL;
    if (stop != NULL) {
        *stop = NULL;
    }
    /* Both readings of one poll use the clock found at its start. */
    PyObject *clock = clock_get();
    if (clock == NULL) {
        return PYGEN_ERROR;
    }
    int real_clock = clock == perf_counter_ns && probe_end == NULL;
    if (real_clock && handoff.resume_for == self && handoff.resume_id == r->call_id) {
        t0 = handoff.resume_ns; /* resumed by the poll of the call awaiting it (Handoff) */
    }
    else if (clock_read(clock, &t0) < 0) {
        handoff.resume_for = NULL;
        Py_DECREF(clock);
        return PYGEN_ERROR;
    }
    handoff.resume_for = NULL; /* the first wrapper entered takes it, or nobody */
    *t0_out = t0;
    if (r->woken && scheduled(r, t0) < 0) { /* observing never breaks the program */
        internal_error("counting scheduled time", fetch_exc(), (PyObject *)self);
    }
    if (!r->first && first_poll(r, t0) < 0) {
        Py_DECREF(clock);
        return PYGEN_ERROR;
    }
    r->start = t0;
    SlotObject *slot = get_slot();
    Py_INCREF(self); /* named by the slot while it runs */
    slot_enter(slot, self);
    PyObject *coro = self->coro;
    handoff.resume_for = real_clock ? self->child : NULL;
    handoff.resume_id = self->child_id;
    handoff.resume_ns = t0;
    handoff.yielded = NULL;
    self->child = NULL;
    PySendResult status = send_into(coro, arg, res);
    handoff.resume_for = NULL;
    slot_leave(slot, self);
    if (status != PYGEN_NEXT) {
        handoff.yielded = NULL; /* nothing passes up: the outer poll goes on running */
    }
    else { /* it suspended: _end_poll */
        if (real_clock && handoff.yielded == *res && awaits(coro, handoff.yielded_by)) {
            now = handoff.yielded_ns; /* what the poll of the call it awaits just yielded */
            self->child = handoff.yielded_by;
            self->child_id = handoff.yielded_by->r->call_id; /* alive: it is awaited */
        }
        else if (clock_read(clock, &now) < 0) {
            handoff.yielded = NULL;
            Py_CLEAR(*res);
            status = PYGEN_ERROR;
            goto done;
        }
        handoff.yielded = real_clock ? *res : NULL; /* a fake clock's reading is lent to none */
        handoff.yielded_by = self;
        handoff.yielded_ns = now;
        long long dt = now - t0;
        r->last_end = now;
        r->start = 0;
        r->polls += 1;
        r->busy += dt;
        r->last = dt;
        if (dt > r->max) {
            r->max = dt;
        }
        if (record_hist_bump(r, dt) < 0) {
            Py_CLEAR(*res);
            status = PYGEN_ERROR;
        }
        goto done;
    }
    if (status == PYGEN_RETURN) {
        if (plain_return(r)) { /* the common end, in C (send() makes its StopIteration) */
            if (end_returned(r, t0, clock) < 0) {
                internal_error("recording a finished call", fetch_exc(), (PyObject *)self);
            }
            goto done;
        }
        PyObject *exc = new_stop(*res);
        if (exc == NULL) {
            Py_CLEAR(*res);
            status = PYGEN_ERROR;
            goto done;
        }
        exc = finish_poll(r, t0, exc);
        if (!PyErr_GivenExceptionMatches(exc, PyExc_StopIteration)) { /* a helper failed */
            Py_CLEAR(*res);
            restore_exc(exc);
            status = PYGEN_ERROR;
            goto done;
        }
        if (stop != NULL) {
            *stop = exc;
        }
        else {
            Py_DECREF(exc);
        }
        goto done;
    }
    restore_exc(finish_poll(r, t0, fetch_exc()));
done:
    Py_DECREF(self);
    Py_DECREF(clock);
    return status;
}

/* ---- the poll probe ------------------------------------------------------------------------- */

/* futures._probe_failed(probe, err): removes the probe (if still set) and counts the error.
 * Steals ``err``; leaves no exception set. */
static void
probe_failed(PyObject *probe, PyObject *err)
{
    if (err == NULL) {
        return;
    }
    PyObject *args[2] = {probe, err};
    PyObject *res = call_helper(s_probe_failed, args, 2);
    if (res == NULL) {
        PyErr_WriteUnraisable(probe);
    }
    Py_XDECREF(res);
    Py_DECREF(err);
}

/* The probe around one poll: taken at its start (so that a probe replaced meanwhile still gets
 * the end of what it began), called outside the timed part of the poll. */
typedef struct {
    PyObject *probe; /* NULL: no probe, or its begin failed */
    PyObject *end;
    PyObject *token;
    long long polls; /* r->polls before the poll */
    long long t0;
} ProbeCall;

static void
probe_enter(ProbeCall *pc, RecordObject *r)
{
    pc->probe = Py_NewRef(probe_obj);
    pc->end = Py_NewRef(probe_end);
    pc->polls = r->polls;
    pc->t0 = 0;
    pc->token = PyObject_CallOneArg(probe_begin, (PyObject *)r);
    if (pc->token == NULL) {
        probe_failed(pc->probe, fetch_exc());
        Py_CLEAR(pc->probe);
        Py_CLEAR(pc->end);
    }
}

/* Call end(record, token, t0_ns, dt_ns, outcome); the poll's own exception (if ``status`` is
 * PYGEN_ERROR) is set on entry and set again on exit. */
static void
probe_exit(ProbeCall *pc, RecordObject *r, PySendResult status)
{
    if (pc->probe == NULL) {
        return;
    }
    PyObject *pending = NULL, *outcome;
    if (status == PYGEN_NEXT) {
        outcome = SUSPENDED;
    }
    else if (status == PYGEN_RETURN) {
        outcome = RETURNED;
    }
    else {
        pending = fetch_exc();
        outcome = pending == NULL ? RAISED
                  : PyErr_GivenExceptionMatches(pending, PyExc_StopIteration) ? RETURNED
                  : PyErr_GivenExceptionMatches(pending, cancelled_error)     ? CANCELLED
                                                                               : RAISED;
    }
    long long dt;
    if (r->polls == pc->polls + 1) { /* the poll recorded its duration */
        dt = r->last;
    }
    else if (pc->t0 == 0 || now_ns(&dt) < 0) { /* the call had ended, or the clock failed */
        PyErr_Clear();
        dt = 0;
    }
    else {
        dt -= pc->t0;
    }
    PyObject *t0 = PyLong_FromLongLong(pc->t0);
    PyObject *d = PyLong_FromLongLong(dt);
    PyObject *res = NULL;
    if (t0 != NULL && d != NULL) {
        PyObject *args[5] = {(PyObject *)r, pc->token, t0, d, outcome};
        res = PyObject_Vectorcall(pc->end, args, 5, NULL);
    }
    Py_XDECREF(t0);
    Py_XDECREF(d);
    if (res == NULL) {
        probe_failed(pc->probe, fetch_exc());
    }
    Py_XDECREF(res);
    Py_CLEAR(pc->token);
    Py_CLEAR(pc->end);
    Py_CLEAR(pc->probe);
    if (pending != NULL) {
        restore_exc(pending);
    }
}

/* One poll (poll_inner), with the probe's begin before it and its end after it. */
/* ---- handing the GIL over to the profiler's thread ---------------------------------------------
 *
 * A program that computes on its loop and yields every fraction of a millisecond (a loaded
 * server: a poll, then select(0) with the GIL released for a microsecond, then the next poll)
 * takes the GIL back before another thread woken to take it can: CPython's GIL asks its holder to
 * let go only when no switch happened for a whole interval (5 ms), and each of those releases is
 * a switch. The profiler's thread then waited seconds for every step of its work: an endpoint
 * request went unanswered for 4 s and more.
 *
 * So its loop waits for events here (wait_events, in place of select.epoll.poll), and says on
 * waking, before it waits for the GIL, that it wants it. The main thread, at its next check for
 * pending calls (asked with Py_AddPendingCall, which needs no GIL), and a poll of a tracked call
 * on any other thread then hand the GIL over first: each lets go, and waits until the
 * profiler's thread is back waiting for events (its work done), for at most HAND_OVER_NS. When
 * that time runs out (the profiler's thread is computing a large document, or blocked on
 * something else), nothing is handed over for a while, twice as long each time for the same
 * wake (up to HAND_OVER_GAP_MAX_NS; its next wake ends it): the program never pays more than a
 * small share of its time. */
#if defined(__linux__)
#define HAND_OVER 1
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sys/epoll.h>

#define HAND_OVER_NS 2000000LL          /* the longest a poll waits for the profiler's thread */
#define HAND_OVER_GAP_NS 5000000LL      /* then no hand-over for this long, at first */
#define HAND_OVER_GAP_MAX_NS 100000000LL /* and never longer than this */

static int gil_wanted;                /* atomic: the waiting thread woke and wants the GIL */
static unsigned long wanting_thread;  /* which thread waits for events here (never hands over) */
static unsigned long wakes;           /* atomic: its wakes, each a new batch of work */
static long long hand_over_after;     /* atomic: no hand-over before this (monotonic ns) */
static long long hand_over_gap;       /* the gap after the next hand-over that runs out */
static unsigned long gap_wake;        /* the wake that gap was for */
static long long handed, handed_ns, handed_out; /* hand-overs, their time, those that ran out */
static pthread_mutex_t hand_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hand_cond;

static inline long long
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The profiler's thread is back waiting for events (or gone): nobody needs to hand over. */
static void
wanted_no_more(void)
{
    if (__atomic_load_n(&gil_wanted, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&hand_mutex);
        __atomic_store_n(&gil_wanted, 0, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&hand_cond);
        pthread_mutex_unlock(&hand_mutex);
    }
}

static void
hand_over_slow(void)
{
    if (PyThread_get_thread_ident() == wanting_thread) {
        return;
    }
    long long now = mono_ns();
    unsigned long wake = __atomic_load_n(&wakes, __ATOMIC_RELAXED);
    if (wake == gap_wake && now < __atomic_load_n(&hand_over_after, __ATOMIC_RELAXED)) {
        return; /* still the work that ran out a hand-over: its gap */
    }
    long long until = now + HAND_OVER_NS;
    struct timespec deadline = {(time_t)(until / 1000000000LL), (long)(until % 1000000000LL)};
    int done = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&hand_mutex);
    while (__atomic_load_n(&gil_wanted, __ATOMIC_ACQUIRE)) {
        if (pthread_cond_timedwait(&hand_cond, &hand_mutex, &deadline) == ETIMEDOUT) {
            done = !__atomic_load_n(&gil_wanted, __ATOMIC_ACQUIRE);
            break;
        }
    }
    pthread_mutex_unlock(&hand_mutex);
    Py_END_ALLOW_THREADS
    handed++;
    handed_ns += mono_ns() - now;
    handed_out += !done;
    if (!done) { /* still at that work: leave it the GIL's own turns for a while */
        long long gap = wake == gap_wake && hand_over_gap > 0 ? hand_over_gap * 2
                                                              : HAND_OVER_GAP_NS;
        gap = gap < HAND_OVER_GAP_MAX_NS ? gap : HAND_OVER_GAP_MAX_NS;
        gap_wake = wake;
        hand_over_gap = gap;
        __atomic_store_n(&hand_over_after, mono_ns() + gap, __ATOMIC_RELAXED);
    }
}

/* Called by each poll of a tracked call: one load when nobody wants the GIL. */
static inline void
hand_over(void)
{
    if (__atomic_load_n(&gil_wanted, __ATOMIC_RELAXED)) {
        hand_over_slow();
    }
}

/* The same, asked of the main thread at its next check for pending calls (a loop that runs no
 * tracked call, or none at this moment, hands over too). */
static int pending_posted; /* atomic: one pending call of ours at most in the interpreter's queue
                           * (32 places, shared with the program's extensions) */

static int
pending_hand_over(void *Py_UNUSED(arg))
{
    __atomic_store_n(&pending_posted, 0, __ATOMIC_RELAXED);
    hand_over();
    return 0;
}

static int
is_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

static int
hand_cond_init(void)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) {
        return -1;
    }
    int failed = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) != 0 ||
                 pthread_cond_init(&hand_cond, &attr) != 0;
    pthread_condattr_destroy(&attr);
    return failed ? -1 : 0;
}

static void
hand_over_forked(void)
{
    /* the child has no profiler's thread yet: nothing is wanted, the lock is free and nobody
     * waits on the condition (a thread of the parent's may have been inside either) */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    hand_mutex = fresh;
    (void)hand_cond_init();
    gil_wanted = 0;
    pending_posted = 0;
    hand_over_after = 0;
}

static int
hand_over_init(void)
{
    if (hand_cond_init() != 0 || pthread_atfork(NULL, NULL, hand_over_forked) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "asyncflow: cannot set up the GIL hand-over");
        return -1;
    }
    return 0;
}

/* The loop monitor's heartbeats in flight: posted to a loop, not run there yet. The monitor
 * adds one as it posts each (heartbeat_posted, from whichever thread posts it), and takes one
 * off as each runs on its loop or is given up (heartbeat_landed); heartbeats_in_flight(0) as it
 * starts. A look the monitor planned at a heartbeat still in flight is needed only if the
 * heartbeat has not run by then: wait_events' "then". */
static long in_flight;

static PyObject *
mod_heartbeat_posted(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    __atomic_add_fetch(&in_flight, 1, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *
mod_heartbeats_in_flight(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "heartbeats_in_flight(n=None)");
        return NULL;
    }
    long was = __atomic_load_n(&in_flight, __ATOMIC_ACQUIRE);
    if (nargs == 1 && args[0] != Py_None) {
        long n = PyLong_AsLong(args[0]);
        if (n == -1 && PyErr_Occurred()) {
            return NULL;
        }
        __atomic_store_n(&in_flight, n < 0 ? 0 : n, __ATOMIC_RELEASE);
    }
    return PyLong_FromLong(was);
}

static PyObject *
mod_heartbeat_landed(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    long n = __atomic_load_n(&in_flight, __ATOMIC_RELAXED);
    while (n > 0 && !__atomic_compare_exchange_n(&in_flight, &n, n - 1, 0, __ATOMIC_RELEASE,
                                                 __ATOMIC_RELAXED)) {
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(wait_events_doc,
             "wait_events(epfd, timeout, maxevents, then=None): select.epoll.poll() for the "
             "profiler's loop, which says on waking that this thread wants the GIL (see "
             "hand_over above). With then (seconds, more than timeout), a wait that times out "
             "while no heartbeat is in flight goes on until then: the look it was for has nothing "
             "to look at, and the thread does not wake.");

static PyObject *
mod_wait_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "wait_events(epfd, timeout, maxevents, then=None)");
        return NULL;
    }
    double then = -1.0;
    if (nargs == 4 && args[3] != Py_None) {
        then = PyFloat_AsDouble(args[3]);
        if (then == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
    }
    int epfd = (int)PyLong_AsLong(args[0]);
    int maxevents = (int)PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    double timeout = -1.0;
    if (args[1] != Py_None) {
        timeout = PyFloat_AsDouble(args[1]);
        if (timeout == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
    }
    int ms = timeout < 0 ? -1 : timeout * 1000.0 >= INT_MAX ? INT_MAX : (int)ceil(timeout * 1000.0);
    if (maxevents <= 0 || maxevents > 1024) {
        maxevents = maxevents <= 0 ? 1024 : maxevents > 1024 ? 1024 : maxevents;
    }
    struct epoll_event events[1024];
    wanting_thread = PyThread_get_thread_ident();
    int n, err;
    if (ms == 0) {
        /* A look with no wait, between two steps of the same batch of work (asyncio's loop
         * looks so whenever callbacks are ready: after every timer that wakes a task). Letting
         * the GIL go here ended the hand-over half-way, and the program handed it over again
         * for the rest: two round trips a wake instead of one. epoll_wait(0) does not block. */
        n = epoll_wait(epfd, events, maxevents, 0);
        err = errno;
        goto collect;
    }
    wanted_no_more(); /* its work is done: the polls elsewhere go on */
    if (then > 86400.0) {
        then = 86400.0; /* (a day: the profiler's own are tens of ms) */
    }
    long long then_at = then > timeout && ms > 0 ? mono_ns() + (long long)(then * 1e9) : 0;
    Py_BEGIN_ALLOW_THREADS
    n = epoll_wait(epfd, events, maxevents, ms);
    err = errno;
    while (n == 0 && then_at && !__atomic_load_n(&in_flight, __ATOMIC_ACQUIRE)) {
        long long left = then_at - mono_ns();
        if (left <= 0) {
            break;
        }
        then_at = 0; /* once: a heartbeat posted meanwhile is the monitor's to look at */
        n = epoll_wait(epfd, events, maxevents, (int)((left + 999999) / 1000000));
        err = errno;
    }
    __atomic_add_fetch(&wakes, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&gil_wanted, 1, __ATOMIC_RELEASE); /* before waiting for the GIL */
    if (!is_finalizing() && !__atomic_exchange_n(&pending_posted, 1, __ATOMIC_RELAXED) &&
        Py_AddPendingCall(pending_hand_over, NULL) < 0) {
        __atomic_store_n(&pending_posted, 0, __ATOMIC_RELAXED); /* full: the polls still do */
    }
    Py_END_ALLOW_THREADS
collect:
    if (n < 0) {
        if (err == EINTR) { /* a signal: its handler runs; the loop goes round (as selectors) */
            if (PyErr_CheckSignals() < 0) {
                return NULL;
            }
            return PyList_New(0);
        }
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *result = PyList_New(n);
    if (result == NULL) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        PyObject *item = Py_BuildValue("(iI)", events[i].data.fd, events[i].events);
        if (item == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, item);
    }
    return result;
}

static PyObject *
mod_hand_overs(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(LLL)", handed, handed_ns, handed_out);
}

static PyObject *
mod_wakes(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromUnsignedLong(__atomic_load_n(&wakes, __ATOMIC_RELAXED));
}

static PyObject *
mod_wait_events_done(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    wanted_no_more();
    Py_RETURN_NONE;
}
#else
#define HAND_OVER 0
static inline void
hand_over(void)
{
}
#endif

static PySendResult
poll(WrapperObject *self, PyObject *arg, PyObject **res, PyObject **stop)
{
    long long t0 = 0;
    if (self->polling) { /* sent into during its own poll: not a poll of its own */
        if (stop != NULL) {
            *stop = NULL;
        }
        return send_into(self->coro, arg, res);
    }
    /* Claimed before any Python code runs (a probe's begin, the first poll's helpers), where
     * another thread could send into it meanwhile; the caller's reference keeps self. */
    self->polling = 1;
    hand_over(); /* the profiler's thread first, if it woke and waits for the GIL */
    if (probe_end == NULL) { /* what the probe seam costs when no probe is set */
        PySendResult status = poll_inner(self, arg, res, stop, &t0);
        self->polling = 0;
        return status;
    }
    ProbeCall pc;
    Py_INCREF(self);
    RecordObject *r = (RecordObject *)Py_NewRef(self->r);
    probe_enter(&pc, r);
    PySendResult status = poll_inner(self, arg, res, stop, &pc.t0);
    probe_exit(&pc, r, status);
    self->polling = 0;
    Py_DECREF(r);
    Py_DECREF(self);
    return status;
}

/* What a StopIteration carries (for a coroutine that is not a native one): 1 if the exception
 * set was a StopIteration (cleared, *value set), else 0. */
static int
take_stop_value(PyObject **value)
{
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) {
        return 0;
    }
    PyObject *exc = fetch_exc();
    PyObject *v = exc != NULL ? ((PyStopIterationObject *)exc)->value : NULL;
    *value = Py_NewRef(v != NULL ? v : Py_None);
    Py_XDECREF(exc);
    return 1;
}

static PySendResult
wrapper_am_send(WrapperObject *self, PyObject *arg, PyObject **result)
{
    PySendResult status = poll(self, arg, result, NULL);
    if (status == PYGEN_ERROR && take_stop_value(result)) {
        return PYGEN_RETURN;
    }
    return status;
}

static PyObject *
wrapper_send(WrapperObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_Format(PyExc_TypeError, "send expected at most 1 argument, got %zd", nargs);
        return NULL;
    }
    PyObject *arg = nargs ? args[0] : Py_None;
    PyObject *res, *stop;
    PySendResult status = poll(self, arg, &res, &stop);
    if (status == PYGEN_NEXT) {
        return res;
    }
    if (status == PYGEN_RETURN) {
        if (stop == NULL) {
            stop = new_stop(res);
        }
        Py_DECREF(res);
        if (stop != NULL) {
            PyErr_SetObject(PyExc_StopIteration, stop);
            Py_DECREF(stop);
        }
    }
    return NULL;
}

static PyObject *
wrapper_iternext(WrapperObject *self)
{
    PyObject *res;
    PySendResult status = poll(self, Py_None, &res, NULL);
    if (status == PYGEN_NEXT) {
        return res;
    }
    if (status == PYGEN_RETURN) {
        if (res != Py_None) { /* a return of None needs no exception at all */
            PyObject *stop = new_stop(res);
            if (stop != NULL) {
                PyErr_SetObject(PyExc_StopIteration, stop);
                Py_DECREF(stop);
            }
        }
        Py_DECREF(res);
    }
    return NULL;
}

static PyObject *
throw_inner(WrapperObject *self, PyObject *typ, PyObject *val, PyObject *tb, long long *t0_out)
{
    RecordObject *r = self->r;
    long long t0;
    if (now_ns(&t0) < 0) {
        return NULL;
    }
    *t0_out = t0;
    if (r->woken && scheduled(r, t0) < 0) {
        internal_error("counting scheduled time", fetch_exc(), (PyObject *)self);
    }
    if (!r->first && first_poll(r, t0) < 0) {
        return NULL;
    }
    int cancel = PyObject_IsInstance(typ, cancelled_error);
    if (cancel == 0 && PyType_Check(typ)) {
        cancel = PyObject_IsSubclass(typ, cancelled_error);
    }
    if (cancel < 0 || (cancel && call_with_time(s_cancel_requested, r, t0) < 0)) {
        return NULL;
    }
    r->start = t0;
    SlotObject *slot = get_slot();
    Py_INCREF(self);
    slot_enter(slot, self);
    self->child = NULL; /* a throw lends and takes no reading (Handoff) */
    handoff.resume_for = NULL;
    PyObject *res = throw_into(self->coro, typ, val, tb);
    slot_leave(slot, self);
    handoff.yielded = NULL;
    if (res != NULL) {
        long long now;
        if (now_ns(&now) < 0) {
            Py_CLEAR(res);
        }
        else {
            long long dt = now - t0;
            r->last_end = now;
            r->start = 0;
            r->polls += 1;
            r->busy += dt;
            r->last = dt;
            if (dt > r->max) {
                r->max = dt;
            }
            if (record_hist_bump(r, dt) < 0) {
                Py_CLEAR(res);
            }
        }
        Py_DECREF(self);
        return res;
    }
    restore_exc(finish_poll(r, t0, fetch_exc()));
    Py_DECREF(self);
    return NULL;
}

static PyObject *
wrapper_throw(WrapperObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "throw expected between 1 and 3 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *typ = args[0];
    PyObject *val = nargs > 1 ? args[1] : Py_None;
    PyObject *tb = nargs > 2 ? args[2] : Py_None;
    long long t0 = 0;
    if (self->polling) { /* thrown into during its own poll: not a poll of its own */
        return throw_into(self->coro, typ, val, tb);
    }
    self->polling = 1; /* claimed at once, as in poll() */
    if (probe_end == NULL) {
        PyObject *res = throw_inner(self, typ, val, tb, &t0);
        self->polling = 0;
        return res;
    }
    ProbeCall pc;
    Py_INCREF(self);
    RecordObject *r = (RecordObject *)Py_NewRef(self->r);
    probe_enter(&pc, r);
    PyObject *res = throw_inner(self, typ, val, tb, &pc.t0);
    probe_exit(&pc, r, res != NULL ? PYGEN_NEXT : PYGEN_ERROR);
    self->polling = 0;
    Py_DECREF(r);
    Py_DECREF(self);
    return res;
}

/* futures._close_record(r, outcome), unless the call has ended. */
static PyObject *
close_record(RecordObject *r, PyObject *outcome)
{
    if (r->finished) {
        Py_RETURN_NONE;
    }
    PyObject *args[2] = {(PyObject *)r, outcome};
    return call_helper(s_close_record, args, 2);
}

static PyObject *
wrapper_close(WrapperObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->polling) { /* closed during its own poll: the coroutine refuses, nothing ends */
        return PyObject_CallMethodNoArgs(self->coro, s_close);
    }
    PyObject *res = PyObject_CallMethodNoArgs(self->coro, s_close);
    PyObject *exc = res == NULL ? fetch_exc() : NULL;
    Py_XDECREF(res);
    /* finally: */
    PyObject *done = close_record(self->r, CLOSED);
    if (done == NULL) {
        PyObject *err = fetch_exc();
        if (exc != NULL && err != NULL) {
            PyException_SetContext(err, exc);
        }
        exc = err != NULL ? err : exc;
    }
    Py_XDECREF(done);
    if (exc != NULL) {
        restore_exc(exc);
        return NULL;
    }
    Py_RETURN_NONE;
}

static void
wrapper_finalize(WrapperObject *self)
{
    RecordObject *r = self->r;
    if (r == NULL || r->finished) {
        return;
    }
    PyObject *pending = fetch_exc(); /* a finalizer must leave the current exception alone */
    /* polled, then dropped unfinished: a task nothing referenced, destroyed while pending */
    PyObject *done = close_record(r, r->first ? s_dropped : NEVER_AWAITED);
    if (done == NULL) {
        internal_error("finalizing a call", fetch_exc(), (PyObject *)self);
    }
    Py_XDECREF(done);
    restore_exc(pending);
}

static int
wrapper_traverse(WrapperObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->coro);
    Py_VISIT(self->r);
    return 0;
}

static int
wrapper_clear(WrapperObject *self)
{
    Py_CLEAR(self->coro);
    Py_CLEAR(self->r);
    return 0;
}

static void
wrapper_dealloc(WrapperObject *self)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) {
        return; /* resurrected */
    }
    PyObject_GC_UnTrack(self);
    Py_TRASHCAN_BEGIN(self, wrapper_dealloc)
    wrapper_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
    Py_TRASHCAN_END
}

/* InstrumentedCoroutine(coro, future): a new call of ``future``. */
static PyObject *
wrapper_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_SetString(PyExc_TypeError, "InstrumentedCoroutine() takes no keyword arguments");
        return NULL;
    }
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "InstrumentedCoroutine() takes 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *coro = args[0], *future = args[1];
    long long now;
    PyObject *stats = field_get(future, FR_STATS);
    if (stats == NULL) {
        return NULL;
    }
    RecordObject *r = record_alloc();
    if (r == NULL || now_ns(&now) < 0 || record_setup(r, future, stats, now) < 0) {
        Py_DECREF(stats);
        Py_XDECREF(r);
        return NULL;
    }
    Py_DECREF(stats);
    WrapperObject *self = (WrapperObject *)WrapperType.tp_alloc(&WrapperType, 0);
    if (self == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    Py_INCREF(coro);
    self->coro = coro;
    self->r = r;
    self->outer = NULL;
    self->polling = 0;
    self->child = NULL;
    self->child_id = 0;
    return (PyObject *)self;
}

static PyObject *
wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "InstrumentedCoroutine() takes no keyword arguments");
        return NULL;
    }
    return wrapper_vectorcall((PyObject *)type, &PyTuple_GET_ITEM(args, 0),
                              (size_t)PyTuple_GET_SIZE(args), NULL);
}

static PyObject *
wrapper_await(WrapperObject *self)
{
    return Py_NewRef(self);
}

static PyObject *
wrapper_getattro(WrapperObject *self, PyObject *name)
{
    PyObject *res = PyObject_GenericGetAttr((PyObject *)self, name);
    if (res != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError) || self->coro == NULL) {
        return res;
    }
    /* cr_frame, cr_code, cr_await, cr_running, __name__, __qualname__... of the real one */
    PyErr_Clear();
    return PyObject_GetAttr(self->coro, name);
}

static PyObject *
wrapper_repr(WrapperObject *self)
{
    if (self->coro == NULL) {
        return PyUnicode_FromString("<asyncflow.InstrumentedCoroutine (cleared)>");
    }
    return PyObject_Repr(self->coro);
}

/* ``__class__`` is the coroutine type, as unittest.mock's spec makes it: isinstance() (so
 * inspect.iscoroutine(), which httpx's trace extension and trio's threads ask) says of the call
 * what it says of the coroutine it wraps. type() is still the wrapper's, and so is every C
 * check of a type (PyCoro_CheckExact, a method of the coroutine type called unbound). */
static PyObject *
wrapper_get_class(PyObject *Py_UNUSED(self), void *Py_UNUSED(closure))
{
    return Py_NewRef((PyObject *)&PyCoro_Type);
}

static PyGetSetDef wrapper_getset[] = {
    {"__class__", wrapper_get_class, NULL, "the coroutine type, as the wrapped call's", NULL},
    {NULL},
};

static PyMethodDef wrapper_methods[] = {
    {"send", (PyCFunction)(void (*)(void))wrapper_send, METH_FASTCALL, "Poll the call: send a value into it."},
    {"throw", (PyCFunction)(void (*)(void))wrapper_throw, METH_FASTCALL,
     "Poll the call: raise an exception inside it."},
    {"close", (PyCFunction)wrapper_close, METH_NOARGS, "Close the call (GeneratorExit)."},
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS, NULL},
    {NULL},
};

static PyMemberDef wrapper_members[] = {
    {"_coro", T_OBJECT, offsetof(WrapperObject, coro), READONLY, "the wrapped coroutine"},
    {"_r", T_OBJECT, offsetof(WrapperObject, r), READONLY, "the call's CallRecord"},
    {NULL},
};

static PyAsyncMethods wrapper_as_async = {
    .am_await = (unaryfunc)wrapper_await,
    .am_send = (sendfunc)wrapper_am_send,
};

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.InstrumentedCoroutine",
    .tp_doc = "A tracked call: behaves as the coroutine it wraps, and records each poll "
              "(the compiled twin of futures.InstrumentedCoroutine).",
    .tp_basicsize = sizeof(WrapperObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = wrapper_new,
    .tp_vectorcall = wrapper_vectorcall,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_finalize = (destructor)wrapper_finalize,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_as_async = &wrapper_as_async,
    .tp_iternext = (iternextfunc)wrapper_iternext,
    .tp_getattro = (getattrofunc)wrapper_getattro,
    .tp_repr = (reprfunc)wrapper_repr,
    .tp_methods = wrapper_methods,
    .tp_members = wrapper_members,
    .tp_getset = wrapper_getset,
};

/* ---- FutureFunction's calls ------------------------------------------------------------------ */

/* What futures.FutureFunction.__call__ does, without a Python frame: call the decorated function
 * (``self.__wrapped__``) with ``args`` and, while a profiler runs, wrap the coroutine it returns.
 * ``nargsf`` may carry PY_VECTORCALL_ARGUMENTS_OFFSET for ``args``. */

/* A subclass of FutureFunction whose two slots every call reads are FutureFunction's own
 * (own_code.OwnFunction: the program's own coroutine functions), found once: read in place as
 * on FutureFunction itself, not through the attribute protocol (~370 instructions a call). */
static PyTypeObject *ff_subclass;

static int
ff_same_slots(PyTypeObject *type)
{
    PyTypeObject *base = fields[FF_WRAPPED].type;
    if (base == NULL || fields[FF_RECORD].type != base || !fields[FF_WRAPPED].offset ||
        !fields[FF_RECORD].offset || !PyType_IsSubtype(type, base)) {
        return 0;
    }
    for (int which = FF_WRAPPED; which <= FF_RECORD; which++) {
        PyObject *name = fields[which].pyname;
        if (_PyType_Lookup(type, name) != _PyType_Lookup(base, name)) {
            return 0; /* (PyType_Lookup leaves no exception set) */
        }
    }
    Py_XSETREF(ff_subclass, (PyTypeObject *)Py_NewRef(type));
    return 1;
}

/* self.<FF_WRAPPED or FF_RECORD>: a new reference, or NULL with an exception set. */
static inline PyObject *
ff_get(PyObject *self, int which)
{
    PyTypeObject *type = Py_TYPE(self);
    if (type != fields[which].type && (type == ff_subclass || ff_same_slots(type))) {
        PyObject *v = *(PyObject **)((char *)self + fields[which].offset);
        if (v != NULL) {
            return Py_NewRef(v);
        }
    }
    return field_get(self, which);
}

static PyObject *
future_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *fn = ff_get(self, FF_WRAPPED); /* coro = self.__wrapped__(*args, **kw) */
    if (fn == NULL) {
        return NULL;
    }
    PyObject *coro = PyObject_Vectorcall(fn, args, nargsf, kwnames);
    Py_DECREF(fn);
    if (coro == NULL) {
        return NULL;
    }
    PyObject *active = global_get(&active_cache, session_dict, s_active); /* borrowed */
    if (active == NULL || active == Py_None) { /* nobody listens */
        if (active == NULL && PyErr_Occurred()) {
            Py_DECREF(coro);
            return NULL;
        }
        return coro;
    }
    PyObject *record = ff_get(self, FF_RECORD);
    PyObject *cls =
        record == NULL ? NULL : global_get(&wrapper_cache, futures_dict, s_wrapper_name);
    PyObject *res = NULL;
    if (cls != NULL) {
        PyObject *wargs[2] = {coro, record};
        res = cls == (PyObject *)&WrapperType ? wrapper_vectorcall(cls, wargs, 2, NULL)
                                              : PyObject_Vectorcall(cls, wargs, 2, NULL);
    }
    else if (record != NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_RuntimeError, "asyncflow: futures.InstrumentedCoroutine is missing");
    }
    Py_XDECREF(record);
    Py_DECREF(coro);
    return res;
}

/* FutureFunction's base on the compiled path. A call of an instance of a Python class whose
 * __call__ is a C method still goes through slot_tp_call: a lookup of __call__, a bound method
 * and an argument tuple made and freed (~300 instructions, a tenth of what a decorated call adds).
 * Instances of this base are called through their vectorcall slot instead, straight into
 * future_call. futures.py removes the reference's __call__ from FutureFunction, which then
 * inherits this tp_call, and says so (calls_without_method), since a heap subclass of 3.11
 * does not inherit the vectorcall flag. Were __call__ set on the class again (benchmarks/run.py
 * does, for the pure-Python column), 3.11 would keep the flag: the vectorcall then calls that
 * __call__ as Python would. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
} FunctionBaseObject;

static PyObject *s_dunder_call;

static PyObject *
function_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (Py_TYPE(self)->tp_call == PyVectorcall_Call) { /* no __call__ of its own: ours */
        return future_call(self, args, nargsf, kwnames);
    }
    /* type(self).__call__(self, *args, **kwargs): looked up on the type, as Python does */
    PyObject *call = _PyType_Lookup(Py_TYPE(self), s_dunder_call); /* borrowed */
    if (call == NULL) {
        PyErr_Format(PyExc_TypeError, "'%.100s' object is not callable", Py_TYPE(self)->tp_name);
        return NULL;
    }
    Py_INCREF(call);
    descrgetfunc get = Py_TYPE(call)->tp_descr_get;
    PyObject *bound = get != NULL ? get(call, self, (PyObject *)Py_TYPE(self)) : Py_NewRef(call);
    Py_DECREF(call);
    if (bound == NULL) {
        return NULL;
    }
    PyObject *res = PyObject_Vectorcall(bound, args, nargsf, kwnames);
    Py_DECREF(bound);
    return res;
}

static PyObject *
function_base_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    FunctionBaseObject *self = (FunctionBaseObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->vectorcall = function_vectorcall;
    }
    return (PyObject *)self;
}

static PyTypeObject FunctionBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.FunctionBase",
    .tp_doc = "futures.FutureFunction's base on the compiled path: its calls go straight to C.",
    .tp_basicsize = sizeof(FunctionBaseObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FunctionBaseObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = function_base_new,
};

PyDoc_STRVAR(calls_without_method_doc,
             "calls_without_method(cls, on=True)\n--\n\n"
             "Call the instances of ``cls``, a subclass of FunctionBase without a __call__ of its "
             "own, through their vectorcall slot (what 3.12 and later set up by themselves); "
             "``on=False`` stops it (a __call__ set on the class is then called as Python would).");

static PyObject *
mod_calls_without_method(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "calls_without_method() takes 1 or 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *cls = args[0];
    int on = nargs < 2 ? 1 : PyObject_IsTrue(args[1]);
    if (on < 0) {
        return NULL;
    }
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &FunctionBaseType)) {
        PyErr_SetString(PyExc_TypeError, "calls_without_method() needs a subclass of FunctionBase");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    if (!on) {
        type->tp_flags &= ~Py_TPFLAGS_HAVE_VECTORCALL;
        Py_RETURN_NONE;
    }
    if (type->tp_call != PyVectorcall_Call) {
        PyErr_Format(PyExc_TypeError, "%s defines __call__: its calls cannot skip it",
                     type->tp_name);
        return NULL;
    }
    type->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
    Py_RETURN_NONE;
}

/* ---- _TaskFactory.__call__: a C method that binds like a function ------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    const char *what; /* the method it is, for its repr */
} FutureCallObject;

static PyObject *
future_call_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
future_call_repr(PyObject *self)
{
    return PyUnicode_FromFormat("<asyncflow compiled %s>", ((FutureCallObject *)self)->what);
}

static PyTypeObject FutureCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.FutureCall",
    .tp_doc = "A method of futures.py's on the compiled path (_TaskFactory.__call__: track the "
              "task's coroutine and make the task).",
    .tp_basicsize = sizeof(FutureCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(FutureCallObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = future_call_get,
    .tp_repr = future_call_repr,
};

/* ---- whole-program mode's task factory: what futures._TaskFactory.__call__ does -------------
 *
 * Every task of the program passes through it, so its common case is here: the task's
 * coroutine is a plain coroutine whose code was seen before (its record found in
 * futures._by_code under the same key), no include/exclude filter is set, and the loop passes
 * no keyword or only ``context``. The rest (a first sight of the code, a filter, anyio's task
 * runner, other arguments) is futures.py's own Python: _task_record, or the whole reference
 * method. */

static PyObject *s_not_creators;
static PyObject *s_task_filter, *s_by_code, *s_task_record, *s_task_kind, *s_py_task_factory,
    *s_cr_code, *s_Task, *s_anyio_runner;
static PyObject *s_context, *kw_loop, *kw_loop_context; /* "context", ("loop",), ("loop", "context") */
static PyObject *asyncio_dict; /* asyncio's namespace: Task is read at each call, as Python does */
static GlobalCache filter_cache, by_code_cache, task_cls_cache;

/* task_record's answers from _by_code, remembered by the code's address (as _by_code keys by
 * id): each valid while _by_code keeps the version it had, which any entry added or gone
 * changes. Nothing is held: the record is the dict's while its version holds. */
#if HAVE_DICT_VERSION
#define TR_SLOTS 8
typedef struct {
    PyObject *code;   /* the key (never dereferenced) */
    PyObject *dict;   /* _by_code then */
    uint64_t version; /* its version then */
    PyObject *record; /* borrowed from the dict */
} TaskRecordHit;
static TaskRecordHit tr_hits[TR_SLOTS];
#endif

/* The record a new task's coroutine is tracked under, or None. New reference; NULL with an
 * exception set. */
static PyObject *
task_record(PyObject *coro)
{
    PyObject *filter = global_get(&filter_cache, futures_dict, s_task_filter);
    PyObject *by_code = filter == Py_None ? global_get(&by_code_cache, futures_dict, s_by_code)
                                          : NULL;
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *code = by_code != NULL && PyDict_CheckExact(by_code)
                         ? PyObject_GetAttr(coro, s_cr_code)
                         : NULL;
    if (code != NULL && PyCode_Check(code) &&
        PyUnicode_Compare(((PyCodeObject *)code)->co_qualname, s_anyio_runner) != 0) {
#if HAVE_DICT_VERSION
        TaskRecordHit *hit = &tr_hits[((uintptr_t)code >> 4) % TR_SLOTS];
        uint64_t version = dict_version(by_code);
        if (hit->code == code && hit->dict == by_code && hit->version == version) {
            Py_DECREF(code);
            return Py_NewRef(hit->record);
        }
#endif
        /* _by_code.get((id(code), None, "task")) */
        PyObject *id = PyLong_FromVoidPtr(code);
        PyObject *key = id == NULL ? NULL : PyTuple_Pack(3, id, Py_None, s_task_kind);
        Py_XDECREF(id);
        PyObject *record = key == NULL ? NULL : PyDict_GetItemWithError(by_code, key);
        Py_XDECREF(key);
#if HAVE_DICT_VERSION
        if (record != NULL) {
            *hit = (TaskRecordHit){code, by_code, version, record};
        }
#endif
        Py_DECREF(code);
        if (record != NULL) {
            return Py_NewRef(record);
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    else {
        Py_XDECREF(code);
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    return call_helper(s_task_record, &coro, 1);
}

/* futures._note_creation, in C: where a task is made, as the first frame outside asyncio and
 * futures.py (the prefixes of _NOT_CREATORS; from the loop's create_task, the current frame,
 * outwards): its code and instruction offset, no
 * line computed, no string made, the frame not kept. Leaves no exception set. */
#define SITE_WALK 8
static GlobalCache not_creators_cache;
/* Whether a file is one of _NOT_CREATORS', remembered by the filename object (held, so that
 * its address is not another's) and the tuple it was decided with (held too). Every slot is
 * looked at (a few pointers): the files a task's creation walks past, asyncio's and the
 * creator's, are the same at each task, and two of them sharing one slot, as a slot chosen by
 * address let them, missed at every task (three PyUnicode_Tailmatch calls a request on the
 * aiohttp service). */
#define NC_SLOTS 8
static PyObject *nc_skip;
static PyObject *nc_file[NC_SLOTS];
static Py_ssize_t nc_in[NC_SLOTS];
static unsigned nc_next; /* the slot a new file takes: the oldest taken */

static Py_ssize_t
not_a_creator(PyObject *filename, PyObject *skip)
{
    if (nc_skip == skip) {
        for (int i = 0; i < NC_SLOTS; i++) {
            if (nc_file[i] == filename) {
                return nc_in[i];
            }
        }
    }
    Py_ssize_t slot = (Py_ssize_t)(nc_next++ % NC_SLOTS);
    Py_ssize_t in = 0;
    for (Py_ssize_t k = 0; in == 0 && k < PyTuple_GET_SIZE(skip); k++) {
        in = PyUnicode_Tailmatch(filename, PyTuple_GET_ITEM(skip, k), 0, PY_SSIZE_T_MAX, -1);
    }
    if (in >= 0) {
        if (nc_skip != skip) { /* decisions made with another tuple: forgotten */
            for (int i = 0; i < NC_SLOTS; i++) {
                Py_CLEAR(nc_file[i]);
            }
            Py_XSETREF(nc_skip, Py_NewRef(skip));
        }
        Py_XSETREF(nc_file[slot], Py_NewRef(filename));
        nc_in[slot] = in;
    }
    return in;
}

static void
note_creation(RecordObject *made)
{
    PyObject *skip = global_get(&not_creators_cache, futures_dict, s_not_creators); /* borrowed */
    if (skip == NULL || !PyTuple_CheckExact(skip)) {
        PyErr_Clear();
        return;
    }
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(frame);
    for (int i = 0; frame != NULL && i < SITE_WALK; i++) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        Py_ssize_t in = not_a_creator(code->co_filename, skip);
        if (in == 0) {
            Py_XSETREF(made->created_code, (PyObject *)code);
            made->created_lasti = PyFrame_GetLasti(frame);
            break;
        }
        Py_DECREF(code);
        if (in < 0) {
            PyErr_Clear();
            break;
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_SETREF(frame, back);
    }
    Py_XDECREF(frame);
}

static PyObject *
task_factory_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                        PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    int with_context = nkw == 1 && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_context) == 0;
    if (nargs != 3 || (nkw != 0 && !with_context)) { /* not as a loop calls it: the reference */
        return call_helper_kw(s_py_task_factory, args, nargs, kwnames);
    }
    PyObject *self = args[0], *loop = args[1], *coro = args[2];
    PyObject *enabled = field_get(self, TF_ENABLED);
    if (enabled == NULL) {
        return NULL;
    }
    PyObject *active = global_get(&active_cache, session_dict, s_active); /* borrowed */
    if (active == NULL && PyErr_Occurred()) {
        Py_DECREF(enabled);
        return NULL;
    }
    int track = PyObject_IsTrue(enabled);
    Py_DECREF(enabled);
    if (track < 0) {
        return NULL;
    }
    PyObject *wrapped = NULL;
    if (track && active != NULL && active != Py_None && PyCoro_CheckExact(coro)) {
        PyObject *record = task_record(coro);
        PyObject *cls = record != NULL && record != Py_None
                            ? global_get(&wrapper_cache, futures_dict, s_wrapper_name)
                            : NULL;
        if (cls != NULL) {
            PyObject *wargs[2] = {coro, record};
            wrapped = cls == (PyObject *)&WrapperType ? wrapper_vectorcall(cls, wargs, 2, NULL)
                                                      : PyObject_Vectorcall(cls, wargs, 2, NULL);
        }
        else if (record != NULL && record != Py_None && !PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "asyncflow: futures.InstrumentedCoroutine is missing");
        }
        Py_XDECREF(record);
        if (PyErr_Occurred()) { /* observing never breaks the program: the task goes untracked */
            Py_CLEAR(wrapped);
            PyObject *err = fetch_exc();
            if (!PyObject_TypeCheck(err, (PyTypeObject *)PyExc_Exception)) {
                restore_exc(err); /* KeyboardInterrupt, SystemExit: the program's, as in Python */
                return NULL;
            }
            internal_error("instrumenting a task", err, self);
        }
    }
    PyObject *use = wrapped != NULL ? wrapped : coro;
    if (track && active != NULL && active != Py_None && Py_IS_TYPE(use, &WrapperType)) {
        /* the task tree (a coroutine tracked here, or a tracked function's, made before): the
         * call polled outermost on this thread now is the creating task's own (one store; no
         * slot on this thread: no call runs here) */
        WrapperObject *outer = tls_slot != NULL ? tls_slot->inner : NULL;
        for (long i = 0; outer != NULL && outer->outer != NULL && i < WALK_LIMIT; i++) {
            outer = outer->outer;
        }
        RecordObject *made = ((WrapperObject *)use)->r;
        if (outer != NULL && outer->r != NULL && made != NULL && outer->r != made) {
            made->parent_call = outer->r->call_id;
        }
        if (made != NULL) {
            note_creation(made);
        }
    }
    PyObject *previous = field_get(self, TF_PREVIOUS);
    PyObject *task = NULL;
    if (previous == NULL) {
        goto done;
    }
    if (previous == Py_None) { /* asyncio.Task(coro, loop=loop, **kwargs) */
        PyObject *cls = global_get(&task_cls_cache, asyncio_dict, s_Task);
        if (cls == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_AttributeError, "module 'asyncio' has no attribute 'Task'");
            }
            goto done;
        }
        PyObject *stack[3] = {use, loop, with_context ? args[3] : NULL};
        task = PyObject_Vectorcall(cls, stack, 1, with_context ? kw_loop_context : kw_loop);
    }
    else { /* previous(loop, coro, **kwargs) */
        PyObject *stack[3] = {loop, use, with_context ? args[3] : NULL};
        task = PyObject_Vectorcall(previous, stack, 2, kwnames);
    }
done:
    Py_XDECREF(previous);
    Py_XDECREF(wrapped);
    return task;
}

/* ---- asyncflow.stream(iterable): the wrapped async iterator ---------------------------------
 *
 * streams.InstrumentedAsyncIteratorPy is the reference. Here the wrapper's __anext__ (the
 * am_anext slot) returns a small awaitable, a Step, that asks the wrapped iterator for its next
 * item only once it is first driven, drives it through am_send, and counts the item in C;
 * the iteration's bookkeeping (resumed, end, a timed item) calls streams.py's _Iteration and
 * _timed_item, as the reference does. asend/athrow/aclose, __getattr__, __repr__ and the
 * finalizer are the reference's own Python methods, inherited by the class streams.py derives
 * from this one. */

static PyObject *streams_dict; /* asyncflow.instrumentation.streams' namespace, set by setup_streams */
static PyObject *s_end, *s_resumed, *s_timed_item, *s_iteration_cls, *s_anext, *s_gi_code,
    *s_co_flags;

/* ---- StreamCounter: the two figures every stream item touches, as C integers ---------------
 *
 * The base of streams.py's StreamStats on the compiled path (the reference keeps them as Python
 * ints in slots): an item adds one to ``items`` in place and compares it with ``arm``, where a
 * Python int had to be read, made again and freed for each item. Python reads and sets both as
 * ints. */

typedef struct {
    PyObject_HEAD
    long long items; /* items counted, exact */
    long long arm;   /* from this item number on, items take the timed path */
} CounterObject;

static void
counter_dealloc(PyObject *self)
{
    Py_TYPE(self)->tp_free(self);
}

static PyGetSetDef counter_getset[] = {
    {"items", (getter)stats_int_get, (setter)stats_int_set, "items counted, exact",
     (void *)offsetof(CounterObject, items)},
    {"arm", (getter)stats_int_get, (setter)stats_int_set,
     "the item number from which the next items take the timed path",
     (void *)offsetof(CounterObject, arm)},
    {NULL},
};

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.StreamCounter",
    .tp_doc = "The C counters of a stream's figures (the base of streams.StreamStats on the "
              "compiled path).",
    .tp_basicsize = sizeof(CounterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = counter_dealloc,
    .tp_getset = counter_getset,
};

typedef struct {
    PyObject_HEAD
    PyObject *it;           /* the wrapped async iterator */
    PyObject *iteration;    /* its streams._Iteration */
    PyObject *stats;        /* iteration.stats (it never changes): the StreamStats counted in */
    CounterObject *counter; /* stats, when its counters are C integers; else NULL (borrowed) */
} AIterObject;

/* The type of an async generator's __anext__() awaitable (CPython's asend): its am_await
 * returns itself, so a step awaits it as it is. Learned from the first async generator seen. */
static PyTypeObject *asend_type;

/* obj.<field> as a borrowed reference when it is read at its slot's offset; NULL otherwise
 * (also when unset), with no exception set: the caller then takes the slow path. */
static inline PyObject *
field_peek(PyObject *obj, int which)
{
    Field *f = &fields[which];
    if (f->offset && Py_IS_TYPE(obj, f->type)) {
        return *(PyObject **)((char *)obj + f->offset);
    }
    return NULL;
}

static PyTypeObject AIterType, StepType;

enum { STEP_FRESH, STEP_STARTED, STEP_DONE };

#define STEP_FREE_MAX 16
static struct StepObject *step_free[STEP_FREE_MAX];
static int step_free_count;

typedef struct StepObject {
    PyObject_HEAD
    AIterObject *owner; /* until the step is done, then NULL */
    PyObject *inner; /* the wrapped iterator's __anext__() awaitable, as an iterator */
    int state;
} StepObject;

/* streams.<name>: borrowed, or NULL with an exception set */
static PyObject *
streams_get(PyObject *name)
{
    if (streams_dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asyncflow: the compiled streams are not set up");
        return NULL;
    }
    PyObject *v = PyDict_GetItemWithError(streams_dict, name);
    if (v == NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_RuntimeError, "asyncflow: streams.%U is missing", name);
    }
    return v;
}

/* it.resumed(), unless there is nothing for it to do (the next item is not timed). */
static int
iteration_resumed(PyObject *iteration)
{
    if (field_peek(iteration, IT_ARMING) == Py_False) {
        return 0; /* the common case, read in place */
    }
    PyObject *arming = field_get(iteration, IT_ARMING);
    if (arming == NULL) {
        return -1;
    }
    int busy = PyObject_IsTrue(arming);
    Py_DECREF(arming);
    if (busy < 0) {
        return -1;
    }
    if (busy) {
        PyObject *res = PyObject_CallMethodNoArgs(iteration, s_resumed);
        if (res == NULL) {
            return -1;
        }
        Py_DECREF(res);
    }
    return 0;
}

/* streams._count(it, item): the item is counted (in ``st``, the iteration's stats), and timed
 * when due. */
static int
count_item(PyObject *iteration, PyObject *st, CounterObject *counter, PyObject *item)
{
    if (counter != NULL) { /* counted in C: st.items += 1; due = st.items >= st.arm */
        if (++counter->items < counter->arm) {
            return 0;
        }
        PyObject *fn = streams_get(s_timed_item);
        PyObject *args[2] = {iteration, item};
        PyObject *res = fn == NULL ? NULL : PyObject_Vectorcall(fn, args, 2, NULL);
        Py_XDECREF(res);
        return res == NULL ? -1 : 0;
    }
    /* A Python StreamStats, in place: st.items += 1; due = st.items >= st.arm */
    PyObject *items = field_peek(st, SS_ITEMS), *armed = field_peek(st, SS_ARM);
    if (items != NULL && armed != NULL && PyLong_CheckExact(items) && PyLong_CheckExact(armed)) {
        int o1, o2;
        long long n = PyLong_AsLongLongAndOverflow(items, &o1);
        long long a = PyLong_AsLongLongAndOverflow(armed, &o2);
        if (!o1 && !o2 && n != -1 && a != -1 && n < LLONG_MAX && n + 1 < a) {
            PyObject *bumped = PyLong_FromLongLong(n + 1);
            if (bumped == NULL) {
                return -1;
            }
            int rc = field_set(st, SS_ITEMS, bumped);
            Py_DECREF(bumped);
            return rc;
        }
        PyErr_Clear();
    }
    Py_INCREF(st);
    int rc = -1;
    PyObject *n = NULL, *arm = NULL;
    if (field_add(st, SS_ITEMS, 1) < 0 || (n = field_get(st, SS_ITEMS)) == NULL ||
        (arm = field_get(st, SS_ARM)) == NULL) {
        goto done;
    }
    int due = PyObject_RichCompareBool(n, arm, Py_GE);
    if (due < 0) {
        goto done;
    }
    if (due) {
        PyObject *fn = streams_get(s_timed_item);
        PyObject *args[2] = {iteration, item};
        PyObject *res = fn == NULL ? NULL : PyObject_Vectorcall(fn, args, 2, NULL);
        if (res == NULL) {
            goto done;
        }
        Py_DECREF(res);
    }
    rc = 0;
done:
    Py_XDECREF(n);
    Py_XDECREF(arm);
    Py_DECREF(st);
    return rc;
}

/* it.end(exc): the iteration ended (exc: NULL for exhausted). Leaves no exception set. */
static void
iteration_end(PyObject *iteration, PyObject *exc)
{
    PyObject *res = PyObject_CallMethodOneArg(iteration, s_end, exc != NULL ? exc : Py_None);
    if (res == NULL) {
        internal_error("ending a stream", fetch_exc(), iteration);
    }
    Py_XDECREF(res);
}

/* What ``await aw`` iterates: aw itself for a coroutine, else what its __await__ returns. */
static PyObject *
awaitable_iter(PyObject *aw)
{
    if (PyCoro_CheckExact(aw)) {
        return Py_NewRef(aw);
    }
    if (PyGen_CheckExact(aw)) { /* a generator-based coroutine (@types.coroutine) */
        PyObject *code = PyObject_GetAttr(aw, s_gi_code);
        PyObject *flags = code == NULL ? NULL : PyObject_GetAttr(code, s_co_flags);
        Py_XDECREF(code);
        if (flags == NULL) {
            return NULL;
        }
        long f = PyLong_AsLong(flags);
        Py_DECREF(flags);
        if (f & CO_ITERABLE_COROUTINE) {
            return Py_NewRef(aw);
        }
    }
    unaryfunc getter = Py_TYPE(aw)->tp_as_async != NULL ? Py_TYPE(aw)->tp_as_async->am_await
                                                        : NULL;
    if (getter == NULL) {
        PyErr_Format(PyExc_TypeError, "object %.100s can't be used in 'await' expression",
                     Py_TYPE(aw)->tp_name);
        return NULL;
    }
    PyObject *res = getter(aw);
    if (res == NULL) {
        return NULL;
    }
    if (PyCoro_CheckExact(res)) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_TypeError, "__await__() returned a coroutine");
        return NULL;
    }
    if (!PyIter_Check(res)) {
        PyErr_Format(PyExc_TypeError, "__await__() returned non-iterator of type '%.100s'",
                     Py_TYPE(res)->tp_name);
        Py_DECREF(res);
        return NULL;
    }
    return res;
}

/* The step ended with ``status``: count the item it returned, or end the iteration with the
 * exception it raised (kept set). */
static PySendResult
step_ended(StepObject *self, PySendResult status, PyObject **result)
{
    if (status == PYGEN_NEXT) {
        return status;
    }
    self->state = STEP_DONE;
    Py_CLEAR(self->inner);
    AIterObject *owner = self->owner;
    self->owner = NULL; /* a done step holds nothing */
    PyObject *iteration = owner->iteration;
    if (status == PYGEN_RETURN) {
        if (count_item(iteration, owner->stats, owner->counter, *result) < 0 &&
            recording_failed("counting a stream item", iteration) < 0) {
            Py_CLEAR(*result); /* the program's interrupt, raised in place of the item */
            Py_DECREF(owner);
            return PYGEN_ERROR;
        }
        Py_DECREF(owner);
        return status;
    }
    PyObject *exc = fetch_exc();
    if (exc != NULL && PyErr_GivenExceptionMatches(exc, PyExc_StopAsyncIteration)) {
        iteration_end(iteration, NULL);
    }
    else {
        iteration_end(iteration, exc);
    }
    restore_exc(exc);
    Py_DECREF(owner);
    return PYGEN_ERROR;
}

static PySendResult
step_am_send(StepObject *self, PyObject *arg, PyObject **result)
{
    *result = NULL;
    if (self->state == STEP_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited __anext__()/asend()");
        return PYGEN_ERROR;
    }
    if (self->state == STEP_FRESH) {
        if (arg != Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "can't send non-None value to a just-started coroutine");
            return PYGEN_ERROR;
        }
        self->state = STEP_STARTED;
        AIterObject *owner = self->owner;
        /* As the reference: it.resumed() first, outside the part whose errors end the
         * iteration; then the wrapped iterator's awaitable, only now. */
        if (iteration_resumed(owner->iteration) < 0) {
            internal_error("timing a stream item", fetch_exc(), owner->iteration);
        }
        PyObject *it = owner->it;
        PyAsyncMethods *am = Py_TYPE(it)->tp_as_async;
        PyObject *aw = am != NULL && am->am_anext != NULL ? am->am_anext(it)
                                                          : PyObject_CallMethodNoArgs(it, s_anext);
        if (aw != NULL && asend_type == NULL && PyAsyncGen_CheckExact(it)) {
            asend_type = (PyTypeObject *)Py_NewRef(Py_TYPE(aw));
        }
        if (aw != NULL && Py_IS_TYPE(aw, asend_type)) {
            self->inner = aw; /* its own awaitable */
        }
        else if (aw != NULL) {
            self->inner = awaitable_iter(aw);
            Py_DECREF(aw);
        }
        if (self->inner == NULL) {
            return step_ended(self, PYGEN_ERROR, result);
        }
    }
    return step_ended(self, PyIter_Send(self->inner, arg, result), result);
}

static PyObject *
step_iternext(StepObject *self)
{
    PyObject *res;
    PySendResult status = step_am_send(self, Py_None, &res);
    if (status == PYGEN_NEXT) {
        return res;
    }
    if (status == PYGEN_RETURN) {
        if (res != Py_None) {
            PyObject *stop = new_stop(res);
            if (stop != NULL) {
                PyErr_SetObject(PyExc_StopIteration, stop);
                Py_DECREF(stop);
            }
        }
        Py_DECREF(res);
    }
    return NULL;
}

static PyObject *
step_send(StepObject *self, PyObject *arg)
{
    PyObject *res;
    PySendResult status = step_am_send(self, arg, &res);
    if (status == PYGEN_RETURN) {
        PyObject *stop = new_stop(res);
        Py_DECREF(res);
        if (stop != NULL) {
            PyErr_SetObject(PyExc_StopIteration, stop);
            Py_DECREF(stop);
        }
        return NULL;
    }
    return status == PYGEN_NEXT ? res : NULL;
}

static PyObject *
step_throw(StepObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "throw expected between 1 and 3 arguments, got %zd", nargs);
        return NULL;
    }
    if (self->state != STEP_STARTED) {
        /* As a coroutine not started, or finished: the exception is raised as it is, and the
         * step is done (the iteration was never asked for this item). */
        self->state = STEP_DONE;
        Py_CLEAR(self->owner);
        PyObject *typ = args[0];
        PyObject *val = nargs > 1 ? args[1] : Py_None;
        PyObject *tb = nargs > 2 ? args[2] : Py_None;
        PyObject *nargs3[3] = {typ, val, tb};
        PyObject *exc = call_helper(s_normalize_throw, nargs3, 3);
        if (exc != NULL) {
            restore_exc(exc);
        }
        return NULL;
    }
    PyObject *meth = PyObject_GetAttr(self->inner, s_throw);
    PyObject *res = meth == NULL ? NULL : PyObject_Vectorcall(meth, args, (size_t)nargs, NULL);
    Py_XDECREF(meth);
    PySendResult status = PYGEN_NEXT;
    if (res == NULL) {
        status = take_stop_value(&res) ? PYGEN_RETURN : PYGEN_ERROR;
    }
    status = step_ended(self, status, &res);
    if (status == PYGEN_RETURN) {
        PyObject *stop = new_stop(res);
        Py_DECREF(res);
        if (stop != NULL) {
            PyErr_SetObject(PyExc_StopIteration, stop);
            Py_DECREF(stop);
        }
        return NULL;
    }
    return status == PYGEN_NEXT ? res : NULL;
}

static PyObject *
step_close(StepObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->state != STEP_STARTED) {
        self->state = STEP_DONE;
        Py_CLEAR(self->owner);
        Py_RETURN_NONE;
    }
    /* As the reference's coroutine, closed while it awaits: the awaitable is closed, then
     * GeneratorExit (or what closing raised) ends the iteration. */
    self->state = STEP_DONE;
    PyObject *inner = self->inner;
    self->inner = NULL;
    PyObject *err = NULL;
    PyObject *meth = PyObject_GetAttr(inner, s_close);
    if (meth == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
        }
        else {
            err = fetch_exc();
        }
    }
    else {
        PyObject *res = PyObject_CallNoArgs(meth);
        Py_DECREF(meth);
        if (res == NULL) {
            err = fetch_exc();
        }
        Py_XDECREF(res);
    }
    Py_DECREF(inner);
    PyObject *ended = err != NULL ? Py_NewRef(err) : PyObject_CallNoArgs(PyExc_GeneratorExit);
    if (ended == NULL) {
        Py_XDECREF(err);
        return NULL;
    }
    AIterObject *owner = self->owner;
    self->owner = NULL;
    iteration_end(owner->iteration, ended);
    Py_DECREF(owner);
    Py_DECREF(ended);
    if (err != NULL) {
        restore_exc(err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static void
step_finalize(StepObject *self)
{
    if (self->state != STEP_STARTED || self->owner == NULL) {
        return;
    }
    PyObject *pending = fetch_exc();
    PyObject *res = step_close(self, NULL);
    if (res == NULL) {
        PyErr_WriteUnraisable((PyObject *)self);
    }
    Py_XDECREF(res);
    restore_exc(pending);
}

static int
step_traverse(StepObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->owner);
    Py_VISIT(self->inner);
    return 0;
}

static int
step_clear(StepObject *self)
{
    Py_CLEAR(self->owner);
    Py_CLEAR(self->inner);
    return 0;
}

static void
step_dealloc(StepObject *self)
{
    if (self->state == STEP_STARTED &&
        PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) {
        return; /* resurrected */
    }
    PyObject_GC_UnTrack(self);
    step_clear(self);
    /* A step per item: keep the memory of a few for the next ones, as CPython does for its own
     * asend objects (the object is dead; aiter_anext initializes it anew). */
    if (step_free_count < STEP_FREE_MAX && Py_IS_TYPE(self, &StepType)) {
        step_free[step_free_count++] = self;
        return;
    }
    PyObject_GC_Del(self);
}

static PyObject *
step_await(StepObject *self)
{
    return Py_NewRef(self);
}

static PyObject *
step_repr(StepObject *self)
{
    return PyUnicode_FromFormat("<asyncflow stream step of %R>",
                                self->owner != NULL ? self->owner->it : Py_None);
}

static PyObject *
step_get_await(StepObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->inner != NULL ? self->inner : Py_None);
}

static PyObject *
step_get_running(StepObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(Py_False);
}

static PyObject *
step_get_none(StepObject *self, void *Py_UNUSED(closure))
{
    Py_RETURN_NONE;
}

static PyGetSetDef step_getset[] = {
    {"cr_await", (getter)step_get_await, NULL, "the awaitable the step waits on", NULL},
    {"cr_running", (getter)step_get_running, NULL, NULL, NULL},
    {"cr_frame", (getter)step_get_none, NULL, "None: a step has no Python frame", NULL},
    {NULL},
};

static PyMethodDef step_methods[] = {
    {"send", (PyCFunction)step_send, METH_O, "Drive the step: send a value into it."},
    {"throw", (PyCFunction)(void (*)(void))step_throw, METH_FASTCALL,
     "Raise an exception inside the step."},
    {"close", (PyCFunction)step_close, METH_NOARGS, "Close the step."},
    {NULL},
};

static PyAsyncMethods step_as_async = {
    .am_await = (unaryfunc)step_await,
    .am_send = (sendfunc)step_am_send,
};

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.StreamStep",
    .tp_doc = "One __anext__() of a wrapped async iterator: awaits the wrapped iterator's and "
              "counts the item.",
    .tp_basicsize = sizeof(StepObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)step_dealloc,
    .tp_finalize = (destructor)step_finalize,
    .tp_traverse = (traverseproc)step_traverse,
    .tp_clear = (inquiry)step_clear,
    .tp_as_async = &step_as_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)step_iternext,
    .tp_repr = (reprfunc)step_repr,
    .tp_methods = step_methods,
    .tp_getset = step_getset,
};

static PyObject *
aiter_anext(AIterObject *self)
{
    StepObject *step;
    if (step_free_count > 0) { /* the memory of a step freed before (see step_dealloc) */
        step = step_free[--step_free_count];
        PyObject_Init((PyObject *)step, &StepType);
    }
    else if ((step = PyObject_GC_New(StepObject, &StepType)) == NULL) {
        return NULL;
    }
    step->owner = (AIterObject *)Py_NewRef(self);
    step->inner = NULL;
    step->state = STEP_FRESH;
    PyObject_GC_Track(step);
    return (PyObject *)step;
}

static PyObject *
aiter_aiter(AIterObject *self)
{
    return Py_NewRef(self);
}

/* InstrumentedAsyncIterator(it, record) */
static PyObject *
aiter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"it", "record", NULL};
    PyObject *it, *record;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:InstrumentedAsyncIterator", names, &it,
                                     &record)) {
        return NULL;
    }
    PyObject *cls = streams_get(s_iteration_cls);
    if (cls == NULL) {
        return NULL;
    }
    PyObject *iteration = PyObject_CallOneArg(cls, record);
    if (iteration == NULL) {
        return NULL;
    }
    PyObject *stats = field_get(iteration, IT_STATS);
    if (stats == NULL) {
        Py_DECREF(iteration);
        return NULL;
    }
    AIterObject *self = (AIterObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(iteration);
        Py_DECREF(stats);
        return NULL;
    }
    self->it = Py_NewRef(it);
    self->iteration = iteration;
    self->stats = stats;
    self->counter = PyObject_TypeCheck(stats, &CounterType) ? (CounterObject *)stats : NULL;
    return (PyObject *)self;
}

static int
aiter_traverse(AIterObject *self, visitproc visit, void *arg)
{
    /* not Py_TYPE(self): the heap subclass's subtype_traverse visits it */
    Py_VISIT(self->it);
    Py_VISIT(self->iteration);
    Py_VISIT(self->stats);
    return 0;
}

static int
aiter_clear(AIterObject *self)
{
    self->counter = NULL;
    Py_CLEAR(self->it);
    Py_CLEAR(self->iteration);
    Py_CLEAR(self->stats);
    return 0;
}

static void
aiter_dealloc(AIterObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    aiter_clear(self);
    type->tp_free((PyObject *)self);
}

static PyMemberDef aiter_members[] = {
    {"_it", T_OBJECT, offsetof(AIterObject, it), READONLY, "the wrapped async iterator"},
    {"_iteration", T_OBJECT, offsetof(AIterObject, iteration), READONLY,
     "its streams._Iteration"},
    {NULL},
};

static PyAsyncMethods aiter_as_async = {
    .am_aiter = (unaryfunc)aiter_aiter,
    .am_anext = (unaryfunc)aiter_anext,
};

static PyTypeObject AIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.AsyncIteratorBase",
    .tp_doc = "The compiled part of streams.InstrumentedAsyncIterator: __aiter__ and __anext__.",
    .tp_basicsize = sizeof(AIterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = aiter_new,
    .tp_dealloc = (destructor)aiter_dealloc,
    .tp_traverse = (traverseproc)aiter_traverse,
    .tp_clear = (inquiry)aiter_clear,
    .tp_as_async = &aiter_as_async,
    .tp_members = aiter_members,
};

PyDoc_STRVAR(setup_streams_doc, "setup_streams(streams_namespace)\n--\n\n"
                                "Connect the compiled stream wrapper to streams.py's helpers.");

static PyObject *
mod_setup_streams(PyObject *module, PyObject *ns)
{
    if (!PyDict_Check(ns)) {
        PyErr_SetString(PyExc_TypeError, "setup_streams() takes a namespace (a dict)");
        return NULL;
    }
    if (fields_setup(NS_STREAMS, ns) < 0) {
        return NULL;
    }
    Py_XSETREF(streams_dict, Py_NewRef(ns));
    Py_RETURN_NONE;
}

/* ---- the collector's fold of finished calls --------------------------------------------------
 *
 * collector.Collector._fold_finished_py is the reference; this is the same loop for the
 * compiled path, run on the profiler's thread for every finished call that waits in the buffer
 * (while a live reporter or a user's recorder is handed every call; otherwise end_returned
 * folds a call where it finishes, with fold_one alone): a decorated fan-out finishes a call
 * every microsecond or two, and the Python loop took ~200 ns of that thread's CPU each (about
 * 45 ns here). Unlike the reference, it adds the calls taken to collector.taken once, at the
 * end (also when one fails): ``dropped``, read on the same thread after the fold, is the
 * same. */

static PyObject *s_call_hist, *s_recent, *s_future, *s_finished_at, *s_created_at, *s_add,
    *s_taken, *s_maxlen;

/* obj.<name> as a long long */
static int
attr_ll(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Fold one finished call into its future's figures: 1 if folded, 0 if it belongs to an earlier
 * session, -1 on error. */
static int
fold_one(PyObject *r, PyObject *keep, PyObject *live, PyObject *to_users)
{
    PyObject *st, *future, *fst = NULL, *hist = NULL, *recent = NULL;
    long long created, finished;
    int rc = -1;
    if (Py_IS_TYPE(r, &RecordType) && ((RecordObject *)r)->stats != NULL &&
        ((RecordObject *)r)->future != NULL) {
        RecordObject *rec = (RecordObject *)r;
        st = Py_NewRef(rec->stats);
        future = Py_NewRef(rec->future);
        created = rec->created;
        finished = rec->finished;
    }
    else {
        st = PyObject_GetAttr(r, s_stats);
        future = st == NULL ? NULL : PyObject_GetAttr(r, s_future);
        if (future == NULL || attr_ll(r, s_finished_at, &finished) < 0 ||
            attr_ll(r, s_created_at, &created) < 0) {
            goto done;
        }
    }
    if ((fst = field_get(future, FR_STATS)) == NULL) {
        goto done;
    }
    if (fst != st) { /* a call from an earlier session finished late: not ours to count */
        rc = 0;
        goto done;
    }
    int c_stats = Py_IS_TYPE(st, &StatsType);
    hist = c_stats ? Py_XNewRef(((StatsObject *)st)->call_hist) : PyObject_GetAttr(st, s_call_hist);
    if (hist == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_AttributeError, "call_hist");
        }
        goto done;
    }
    if (hist_bump(hist, finished - created) < 0) {
        goto done;
    }
    recent = c_stats ? Py_XNewRef(((StatsObject *)st)->recent) : PyObject_GetAttr(st, s_recent);
    if (recent == NULL || recent == Py_None) { /* deque(maxlen=keep), kept on the stats */
        if (recent == NULL && PyErr_Occurred()) {
            goto done;
        }
        Py_XDECREF(recent);
        PyObject *kwnames = PyTuple_Pack(1, s_maxlen);
        PyObject *stack[1] = {keep};
        recent = kwnames == NULL ? NULL
                                 : PyObject_Vectorcall((PyObject *)deque_type, stack, 0, kwnames);
        Py_XDECREF(kwnames);
        if (recent == NULL) {
            goto done;
        }
        /* Made while another thread may have made one (the allocation can run a collection,
         * finalizers, a switch of the GIL): the first one set is the log. */
        if (c_stats) {
            StatsObject *cs = (StatsObject *)st;
            if (cs->recent == NULL || cs->recent == Py_None) {
                Py_XSETREF(cs->recent, Py_NewRef(recent));
            }
            else {
                Py_SETREF(recent, Py_NewRef(cs->recent));
            }
        }
        else if (PyObject_SetAttr(st, s_recent, recent) < 0) {
            goto done;
        }
    }
    PyObject *args[2] = {recent, r};
    PyObject *res = Py_IS_TYPE(recent, deque_type) ? PyObject_Vectorcall(deque_append, args, 2, NULL)
                                                  : PyObject_CallMethodOneArg(recent, s_append, r);
    if (res == NULL) {
        goto done;
    }
    Py_DECREF(res);
    rc = 1;
    if (live != Py_None) {
        res = PyObject_CallMethodOneArg(live, s_add, r);
        rc = res == NULL ? -1 : rc;
        Py_XDECREF(res);
    }
    if (rc > 0 && to_users != Py_None) {
        res = PyObject_CallOneArg(to_users, r);
        rc = res == NULL ? -1 : rc;
        Py_XDECREF(res);
    }
done:
    Py_XDECREF(st);
    Py_XDECREF(future);
    Py_XDECREF(fst);
    Py_XDECREF(hist);
    Py_XDECREF(recent);
    return rc;
}

PyDoc_STRVAR(fold_finished_doc,
             "fold_finished(collector, finished, keep, live, to_users)\n--\n\n"
             "Fold every finished call waiting in the deque ``finished`` into its future's "
             "figures (collector.Collector._fold_finished, in C); returns how many were "
             "folded. ``keep``: the size of a new log of recent calls; ``live``: the live "
             "reporter or None; ``to_users``: called with each folded call, or None. Adds the "
             "calls taken to ``collector.taken``, also when one fails.");

static PyObject *
mod_fold_finished(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "fold_finished() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *collector = args[0], *finished = args[1], *keep = args[2], *live = args[3],
             *to_users = args[4];
    if (deque_popleft == NULL || !Py_IS_TYPE(finished, deque_type)) {
        PyErr_SetString(PyExc_TypeError, "fold_finished() needs the session's deque (after setup())");
        return NULL;
    }
    long long taken = 0, folded = 0;
    int failed = 0;
    for (;;) {
        PyObject *r = PyObject_Vectorcall(deque_popleft, &finished, 1, NULL);
        if (r == NULL) {
            if (PyErr_ExceptionMatches(PyExc_IndexError)) { /* empty */
                PyErr_Clear();
            }
            else {
                failed = 1;
            }
            break;
        }
        taken += 1; /* before anything that may fail: ``dropped`` counts on it */
        int rc = fold_one(r, keep, live, to_users);
        Py_DECREF(r);
        if (rc < 0) {
            failed = 1;
            break;
        }
        folded += rc;
    }
    PyObject *pending = failed ? fetch_exc() : NULL;
    PyObject *before = PyObject_GetAttr(collector, s_taken);
    PyObject *delta = before == NULL ? NULL : PyLong_FromLongLong(taken);
    PyObject *after = delta == NULL ? NULL : PyNumber_Add(before, delta);
    int stored = after == NULL ? -1 : PyObject_SetAttr(collector, s_taken, after);
    Py_XDECREF(before);
    Py_XDECREF(delta);
    Py_XDECREF(after);
    if (pending != NULL) {
        if (stored < 0) {
            PyErr_Clear(); /* the fold's own error says more */
        }
        restore_exc(pending);
        return NULL;
    }
    return stored < 0 ? NULL : PyLong_FromLongLong(folded);
}

/* ---- module functions ----------------------------------------------------------------------- */

static PyObject *
get_global(PyObject *dict, const char *name)
{
    PyObject *v = PyDict_GetItemString(dict, name);
    if (v == NULL) {
        PyErr_Format(PyExc_RuntimeError, "asyncflow: %s is missing", name);
        return NULL;
    }
    return Py_NewRef(v);
}

PyDoc_STRVAR(setup_doc, "setup(futures_namespace, clock_namespace, session_namespace)\n--\n\n"
                        "Connect the compiled hot path to futures.py's helpers and state.");

static PyObject *
mod_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) ||
        !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "setup() takes three namespaces (dicts)");
        return NULL;
    }
    PyObject *stats = PyImport_ImportModule("asyncflow.stats");
    if (stats == NULL) {
        return NULL;
    }
    PyObject *b = PyObject_GetAttrString(stats, "BUCKETS");
    Py_DECREF(stats);
    if (b == NULL) {
        return NULL;
    }
    long buckets = PyLong_AsLong(b);
    Py_DECREF(b);
    if (buckets != BUCKETS) {
        PyErr_Format(PyExc_RuntimeError,
                     "asyncflow: stats.BUCKETS is %ld, the compiled hot path counts %d", buckets,
                     BUCKETS);
        return NULL;
    }
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL) {
        return NULL;
    }
    PyObject *pc = PyObject_GetAttrString(time, "perf_counter_ns");
    Py_DECREF(time);
    if (pc == NULL) {
        return NULL;
    }
    Py_XSETREF(perf_counter_ns, pc);
    Py_XSETREF(futures_dict, Py_NewRef(args[0]));
    Py_XSETREF(clock_dict, Py_NewRef(args[1]));
    Py_XSETREF(session_dict, Py_NewRef(args[2]));
    PyObject *ids = get_global(futures_dict, "_call_ids");
    PyObject *ready = get_global(futures_dict, "READY");
    PyObject *returned = get_global(futures_dict, "RETURNED");
    PyObject *closed = get_global(futures_dict, "CLOSED");
    PyObject *never = get_global(futures_dict, "NEVER_AWAITED");
    PyObject *suspended = get_global(futures_dict, "SUSPENDED");
    PyObject *raised = get_global(futures_dict, "RAISED");
    PyObject *outcome_cancelled = get_global(futures_dict, "OUTCOME_CANCELLED");
    PyObject *asyncio = get_global(futures_dict, "asyncio");
    PyObject *cancelled = asyncio ? PyObject_GetAttrString(asyncio, "CancelledError") : NULL;
    Py_XDECREF(asyncio);
    if (!ids || !ready || !returned || !closed || !never || !cancelled || !suspended || !raised ||
        !outcome_cancelled) {
        Py_XDECREF(suspended);
        Py_XDECREF(raised);
        Py_XDECREF(outcome_cancelled);
        Py_XDECREF(ids);
        Py_XDECREF(ready);
        Py_XDECREF(returned);
        Py_XDECREF(closed);
        Py_XDECREF(never);
        Py_XDECREF(cancelled);
        return NULL;
    }
    Py_XSETREF(call_ids, ids);
    Py_XSETREF(READY, ready);
    Py_XSETREF(RETURNED, returned);
    Py_XSETREF(CLOSED, closed);
    Py_XSETREF(NEVER_AWAITED, never);
    Py_XSETREF(SUSPENDED, suspended);
    Py_XSETREF(RAISED, raised);
    Py_XSETREF(CANCELLED, outcome_cancelled);
    Py_XSETREF(cancelled_error, cancelled);
    if (fields_setup(NS_FUTURES, futures_dict) < 0 || fields_setup(NS_SESSION, session_dict) < 0) {
        return NULL;
    }
    PyObject *grl = get_global(futures_dict, "_get_running_loop");
    PyObject *tasks = get_global(futures_dict, "_current_tasks");
    PyObject *loops = get_global(futures_dict, "loops");
    asyncio = get_global(futures_dict, "asyncio");
    PyObject *ct = asyncio ? PyObject_GetAttrString(asyncio, "current_task") : NULL;
    Py_XDECREF(asyncio);
    if (!grl || !tasks || !loops || !ct || !PyModule_Check(loops)) {
        Py_XDECREF(grl);
        Py_XDECREF(tasks);
        Py_XDECREF(loops);
        Py_XDECREF(ct);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "asyncflow: futures.loops is not a module");
        }
        return NULL;
    }
    Py_XSETREF(get_running_loop, grl);
    if (PyDict_Check(tasks)) {
        Py_XSETREF(current_tasks, tasks);
    }
    else {
        Py_CLEAR(current_tasks);
        Py_DECREF(tasks);
    }
    Py_XSETREF(current_task, ct);
    Py_CLEAR(task_type);
    Py_CLEAR(task_get_name);
    asyncio = get_global(futures_dict, "asyncio");
    PyObject *tt = asyncio ? PyObject_GetAttrString(asyncio, "Task") : NULL;
    if (tt != NULL && PyModule_Check(asyncio)) {
        Py_XSETREF(asyncio_dict, Py_NewRef(PyModule_GetDict(asyncio)));
    }
    else if (tt != NULL) {
        Py_CLEAR(tt);
        PyErr_SetString(PyExc_RuntimeError, "asyncflow: futures.asyncio is not a module");
    }
    Py_XDECREF(asyncio);
    if (tt == NULL) {
        Py_DECREF(loops);
        return NULL;
    }
    if (PyType_Check(tt) && PyType_HasFeature((PyTypeObject *)tt, Py_TPFLAGS_IMMUTABLETYPE)) {
        PyObject *gn = PyDict_GetItemWithError(((PyTypeObject *)tt)->tp_dict, s_get_name);
        if (gn != NULL && Py_IS_TYPE(gn, &PyMethodDescr_Type)) {
            task_type = (PyTypeObject *)Py_NewRef(tt);
            task_get_name = Py_NewRef(gn);
        }
        else if (PyErr_Occurred()) {
            Py_DECREF(tt);
            Py_DECREF(loops);
            return NULL;
        }
    }
    Py_DECREF(tt);
    Py_XSETREF(loops_dict, Py_NewRef(PyModule_GetDict(loops)));
    Py_XSETREF(loops_module, loops);
    PyObject *deque = get_global(futures_dict, "deque");
    PyObject *append = deque == NULL ? NULL : PyObject_GetAttr(deque, s_append);
    if (append == NULL || !PyType_Check(deque)) {
        Py_XDECREF(deque);
        Py_XDECREF(append);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "asyncflow: futures.deque is not a class");
        }
        return NULL;
    }
    Py_XSETREF(deque_type, (PyTypeObject *)deque);
    Py_XSETREF(deque_append, append);
    PyObject *popleft = PyObject_GetAttrString((PyObject *)deque_type, "popleft");
    if (popleft == NULL) {
        return NULL;
    }
    Py_XSETREF(deque_popleft, popleft);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(running_call_doc,
             "running_call() -> CallRecord | None\n--\n\n"
             "The record of the innermost tracked call being polled on this thread now, or\n"
             "None: running_calls(threading.get_ident())[0], without the lookups.");

static PyObject *
mod_running_call(PyObject *module, PyObject *Py_UNUSED(unused))
{
    SlotObject *slot = tls_slot; /* NULL: no call was ever polled on this thread */
    if (slot != NULL && slot->inner != NULL && slot->inner->r != NULL) {
        return Py_NewRef((PyObject *)slot->inner->r);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(running_calls_doc,
             "running_calls(thread_id) -> (inner, outer)\n--\n\n"
             "The innermost and the outermost tracked calls being polled on a thread now (their "
             "CallRecords), or (None, None).");

static PyObject *
mod_running_calls(PyObject *module, PyObject *arg)
{
    unsigned long ident = PyLong_AsUnsignedLong(arg);
    if (ident == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    WrapperObject *inner = NULL;
    PyThreadState *ts = PyThreadState_Get(); /* this thread's, most often: no walk */
    if (ts->thread_id != ident) {
        ts = PyInterpreterState_ThreadHead(PyInterpreterState_Get());
    }
    for (; ts != NULL; ts = PyThreadState_Next(ts)) {
        if (ts->thread_id != ident || ts->dict == NULL) {
            continue;
        }
        PyObject *slot = PyDict_GetItemWithError(ts->dict, s_slot_key);
        if (slot == NULL && PyErr_Occurred()) {
            return NULL;
        }
        if (slot != NULL && Py_IS_TYPE(slot, &SlotType)) {
            inner = ((SlotObject *)slot)->inner;
        }
        break;
    }
    if (inner == NULL) {
        return PyTuple_Pack(2, Py_None, Py_None);
    }
    WrapperObject *outer = inner;
    for (long i = 0; outer->outer != NULL && i < WALK_LIMIT; i++) {
        outer = outer->outer;
    }
    return PyTuple_Pack(2, inner->r ? (PyObject *)inner->r : Py_None,
                        outer->r ? (PyObject *)outer->r : Py_None);
}

PyDoc_STRVAR(move_call_doc,
             "move_call(call, record): routes._move in C. The running call record ``call`` becomes "
             "a call of the future ``record`` from now on (a request's task's call, moved to its "
             "route's future once the framework routed it): in the new future's live calls and "
             "count, out of the old one's. Nothing when the call is of an earlier session, or "
             "moved there already.");

/* stats.created += delta: in place in a compiled FutureStats */
static inline int
created_add(PyObject *stats, long long delta)
{
    if (Py_IS_TYPE(stats, &StatsType)) {
        ((StatsObject *)stats)->created += delta;
        return 0;
    }
    return field_add(stats, FS_CREATED, delta);
}

static PyObject *
mod_move_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !Py_IS_TYPE(args[0], &RecordType)) {
        PyErr_SetString(PyExc_TypeError, "move_call(call record, future record)");
        return NULL;
    }
    RecordObject *call = (RecordObject *)args[0];
    PyObject *record = args[1];
    if (call->future == NULL || call->stats == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *old = Py_NewRef(call->stats);
    PyObject *new = field_get(record, FR_STATS);
    PyObject *current = new == NULL ? NULL : field_get(call->future, FR_STATS);
    PyObject *key = NULL, *old_live = NULL, *new_live = NULL, *result = NULL;
    if (current == NULL) {
        goto done;
    }
    if (current != old || old == new) { /* of an earlier session, or moved already */
        result = Py_NewRef(Py_None);
        goto done;
    }
    key = PyLong_FromLongLong(call->call_id);
    new_live = key == NULL ? NULL : stats_field(new, FS_LIVE);
    old_live = new_live == NULL ? NULL : stats_field(old, FS_LIVE);
    if (old_live == NULL || PyObject_SetItem(new_live, key, (PyObject *)call) < 0 ||
        created_add(new, 1) < 0) {
        goto done;
    }
    if (Py_IS_TYPE(new, &StatsType) && !((StatsObject *)new)->first_call) {
        ((StatsObject *)new)->first_call = call->created; /* a route's first request */
    }
    Py_SETREF(call->future, Py_NewRef(record)); /* (its hist is its stats' poll histogram) */
    Py_SETREF(call->stats, Py_NewRef(new));
    if (created_add(old, -1) < 0) {
        goto done;
    }
    if (PyDict_CheckExact(old_live)) {
        if (PyDict_DelItem(old_live, key) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                goto done;
            }
            PyErr_Clear();
        }
    }
    else {
        PyObject *gone = PyObject_CallMethod(old_live, "pop", "OO", key, Py_None);
        if (gone == NULL) {
            goto done;
        }
        Py_DECREF(gone);
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(old);
    Py_XDECREF(new);
    Py_XDECREF(current);
    Py_XDECREF(key);
    Py_XDECREF(old_live);
    Py_XDECREF(new_live);
    return result;
}

PyDoc_STRVAR(set_poll_probe_doc,
             "set_poll_probe(probe, begin, end)\n--\n\n"
             "Call begin(record) before and end(record, token, t0_ns, dt_ns, outcome) after every "
             "poll (all three None: no probe). Used by futures.set_poll_probe, which is the API.");

static PyObject *
mod_set_poll_probe(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_poll_probe() takes three arguments");
        return NULL;
    }
    int on = args[0] != Py_None;
    if (on && (!PyCallable_Check(args[1]) || !PyCallable_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "set_poll_probe(): begin and end must be callable");
        return NULL;
    }
    /* No Python code runs until all three are set (or cleared): a poll, which checks probe_end,
     * sees all of them or none; the old ones are released last. */
    PyObject *old[3] = {probe_obj, probe_begin, probe_end};
    probe_obj = on ? Py_NewRef(args[0]) : NULL;
    probe_begin = on ? Py_NewRef(args[1]) : NULL;
    probe_end = on ? Py_NewRef(args[2]) : NULL;
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(old[i]);
    }
    Py_RETURN_NONE;
}

/* fields(): {"Class.attr": True if read at its slot's offset, False if by attribute}. */
static PyObject *
mod_fields(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyDict_New();
    for (int i = 0; out != NULL && i < N_FIELDS; i++) {
        PyObject *key = PyUnicode_FromFormat("%s.%s", fields[i].cls, fields[i].name);
        if (key == NULL || PyDict_SetItem(out, key, fields[i].offset ? Py_True : Py_False) < 0) {
            Py_XDECREF(key);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(key);
    }
    return out;
}

static PyObject *
mod_bucket_of(PyObject *module, PyObject *arg)
{
    long long ns = PyLong_AsLongLong(arg);
    if (ns == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromSsize_t(bucket_of(ns));
}

static PyObject *
mod_running_loop(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *loop = running_loop();
    if (loop == NULL) {
        return NULL;
    }
#if FAST_RUNNING_LOOP
    PyObject *fast = holder_type != NULL ? Py_True : Py_False;
#else
    PyObject *fast = Py_False;
#endif
    return Py_BuildValue("(NO)", loop, fast);
}

static PyObject *
mod_now_ns(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    long long ns;
    if (now_ns(&ns) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(ns);
}

static PyObject *
mod_clock_read_cost(PyObject *module, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n <= 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "clock_read_cost(n) needs n > 0");
        }
        return NULL;
    }
    /* Timed by the thread's CPU time, as the benchmarks time their runs: on a machine shared
     * with other work, the wall clock would count the time this thread waited for a core. */
    struct timespec a, b, ts;
    volatile long long sink = 0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (long i = 0; i < n; i++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        sink += ts.tv_nsec;
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    (void)sink;
    double spent = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    return PyFloat_FromDouble(spent / (double)n);
}

/* ---- FifoHook: a plain FIFO queue's _put and _get --------------------------------------------
 *
 * queues._fifo_hooks is the reference; the compiled hooks do its common path in C (the integer
 * updates of the channel's figures, one vectorcall to the storage's append or popleft) and call
 * back into Python for the rest: a timed send (record.sample_send) and every get from the one
 * that takes a timed message (queues' _timed_get). The figures are ChannelStats' slots, read at
 * their offsets (found once, when the hook is made; through the attribute protocol otherwise).
 * The storage is the queue's _queue at each call, as asyncio's own _put/_get read it: a program
 * may replace it (`q._queue = collections.deque()` empties a queue). The hook holds the queue
 * weakly (no cycle through its _put), and the storage's bound method until _queue changes. */

enum { FH_SENT, FH_TAKEN, FH_MAX_SIZE, FH_NEXT_SEND, FH_NEXT_RECV, FH_N };
static const char *fh_names[FH_N] = {"sent", "taken", "max_size", "next_send", "next_recv"};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int is_put;
    PyObject *queue;   /* a weak reference to the queue */
    PyObject *storage; /* the queue's _queue as last seen */
    PyObject *move;    /* storage.append (put) or storage.popleft (get) */
    PyObject *stats;   /* the channel's ChannelStats, reset in place, never replaced */
    PyObject *slow;    /* record.sample_send(msg_id, item) (put) or _timed_get() (get) */
    PyTypeObject *stats_type;
    Py_ssize_t offsets[FH_N]; /* 0: not a slot of stats_type */
    PyObject *names[FH_N];
} FifoHookObject;

static PyTypeObject FifoHookType;
static PyObject *fh_pynames[FH_N];
static PyObject *s_queue_storage; /* "_queue" */

/* Bring h->storage (and h->move) up to the queue's _queue now; 0, or -1 with an exception set
 * (no _queue: asyncio's own hook fails alike). A queue that is gone (a hook kept and called
 * after it) leaves the storage last seen. */
static int
fh_sync(FifoHookObject *h)
{
    PyObject *queue;
    if (h->queue == NULL) { /* cleared by the cyclic collector, then called by a finaliser */
        PyErr_SetString(PyExc_RuntimeError, "FifoHook: called after it was cleared");
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    if (PyWeakref_GetRef(h->queue, &queue) <= 0) {
        return queue == NULL && PyErr_Occurred() ? -1 : 0;
    }
#else
    queue = PyWeakref_GET_OBJECT(h->queue);
    if (queue == Py_None) {
        return 0;
    }
    Py_INCREF(queue);
#endif
    PyObject *storage = PyObject_GetAttr(queue, s_queue_storage);
    Py_DECREF(queue);
    if (storage == NULL) {
        return -1;
    }
    if (storage != h->storage) { /* replaced: the common case costs the look-up alone */
        PyObject *move = PyObject_GetAttrString(storage, h->is_put ? "append" : "popleft");
        if (move == NULL) {
            Py_DECREF(storage);
            return -1;
        }
        Py_SETREF(h->move, move);
        Py_SETREF(h->storage, storage);
        return 0;
    }
    Py_DECREF(storage);
    return 0;
}

/* stats.<figure> as a C integer; -1 with an exception set on failure (not an int, too big). */
static int
fh_get(FifoHookObject *h, int which, long long *out)
{
    PyObject *v = NULL;
    if (h->offsets[which] && Py_IS_TYPE(h->stats, h->stats_type)) {
        v = Py_XNewRef(*(PyObject **)((char *)h->stats + h->offsets[which]));
    }
    if (v == NULL && (v = PyObject_GetAttr(h->stats, fh_pynames[which])) == NULL) {
        return -1; /* an unset slot: AttributeError, as Python */
    }
    if (!PyLong_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "ChannelStats.%s is not an int", fh_names[which]);
        Py_DECREF(v);
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int
fh_set(FifoHookObject *h, int which, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) {
        return -1;
    }
    if (h->offsets[which] && Py_IS_TYPE(h->stats, h->stats_type)) {
        PyObject **slot = (PyObject **)((char *)h->stats + h->offsets[which]);
        PyObject *old = *slot;
        *slot = v;
        Py_XDECREF(old);
        return 0;
    }
    int rc = PyObject_SetAttr(h->stats, fh_pynames[which], v);
    Py_DECREF(v);
    return rc;
}

static PyObject *
fifo_put(FifoHookObject *h, PyObject *item)
{
    if (fh_sync(h) < 0) {
        return NULL;
    }
    PyObject *res = PyObject_CallOneArg(h->move, item); /* first: a refused item was not sent */
    if (res == NULL) {
        return NULL;
    }
    Py_DECREF(res);
    long long msg_id, max_size, next_send;
    Py_ssize_t size;
    if (fh_get(h, FH_SENT, &msg_id) < 0 || fh_set(h, FH_SENT, ++msg_id) < 0 ||
        (size = PyObject_Size(h->storage)) < 0 || fh_get(h, FH_MAX_SIZE, &max_size) < 0 ||
        (size > max_size && fh_set(h, FH_MAX_SIZE, size) < 0) ||
        fh_get(h, FH_NEXT_SEND, &next_send) < 0) {
        goto error;
    }
    if (msg_id >= next_send) {
        PyObject *id = PyLong_FromLongLong(msg_id);
        if (id == NULL) {
            goto error;
        }
        PyObject *args[2] = {id, item};
        res = PyObject_Vectorcall(h->slow, args, 2, NULL);
        Py_DECREF(id);
        if (res == NULL) {
            goto error;
        }
        Py_DECREF(res);
    }
    Py_RETURN_NONE;
error: /* observing never breaks the program; the program's own interrupt goes on */
    if (recording_failed("recording a queue put", (PyObject *)h) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
fifo_get(FifoHookObject *h)
{
    long long taken, next_recv;
    if (fh_get(h, FH_TAKEN, &taken) < 0 || fh_get(h, FH_NEXT_RECV, &next_recv) < 0) {
        /* not as the hook left them: the reference's _timed_get reads them again, as Python */
        PyErr_Clear();
        return PyObject_CallNoArgs(h->slow);
    }
    if (taken + 1 >= next_recv) {
        return PyObject_CallNoArgs(h->slow);
    }
    if (fh_sync(h) < 0 || fh_set(h, FH_TAKEN, taken + 1) < 0) {
        return NULL;
    }
    return PyObject_CallNoArgs(h->move);
}

static PyObject *
fifo_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FifoHookObject *h = (FifoHookObject *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || nargs != h->is_put) {
        PyErr_Format(PyExc_TypeError, h->is_put ? "_put() takes exactly one argument (%zd given)"
                                                : "_get() takes no arguments (%zd given)",
                     nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames)));
        return NULL;
    }
    return h->is_put ? fifo_put(h, args[0]) : fifo_get(h);
}

static PyObject *
fifo_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"kind", "queue", "storage", "stats", "slow", NULL};
    const char *kind;
    PyObject *queue, *storage, *stats, *slow;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOOOO:FifoHook", names, &kind, &queue,
                                     &storage, &stats, &slow)) {
        return NULL;
    }
    if (!PyWeakref_CheckRef(queue)) {
        PyErr_Format(PyExc_TypeError, "FifoHook: queue must be a weak reference, got %.100s",
                     Py_TYPE(queue)->tp_name);
        return NULL;
    }
    int is_put = strcmp(kind, "put") == 0;
    if (!is_put && strcmp(kind, "get") != 0) {
        PyErr_Format(PyExc_ValueError, "FifoHook: kind must be 'put' or 'get', got %R",
                     PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    PyObject *move = PyObject_GetAttrString(storage, is_put ? "append" : "popleft");
    if (move == NULL) {
        return NULL;
    }
    FifoHookObject *h = PyObject_GC_New(FifoHookObject, type);
    if (h == NULL) {
        Py_DECREF(move);
        return NULL;
    }
    h->vectorcall = fifo_vectorcall;
    h->is_put = is_put;
    h->queue = Py_NewRef(queue);
    h->storage = Py_NewRef(storage);
    h->move = move;
    h->stats = Py_NewRef(stats);
    h->slow = Py_NewRef(slow);
    h->stats_type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(stats));
    for (int i = 0; i < FH_N; i++) {
        h->offsets[i] = 0;
        PyObject *descr = _PyType_Lookup(h->stats_type, fh_pynames[i]); /* borrowed */
        if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) {
                h->offsets[i] = member->offset;
            }
        }
    }
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

static int
fifo_traverse(FifoHookObject *h, visitproc visit, void *arg)
{
    Py_VISIT(h->queue);
    Py_VISIT(h->storage);
    Py_VISIT(h->move);
    Py_VISIT(h->stats);
    Py_VISIT(h->slow);
    return 0;
}

static int
fifo_clear(FifoHookObject *h)
{
    Py_CLEAR(h->queue);
    Py_CLEAR(h->storage);
    Py_CLEAR(h->move);
    Py_CLEAR(h->stats);
    Py_CLEAR(h->slow);
    return 0;
}

static void
fifo_dealloc(FifoHookObject *h)
{
    PyObject_GC_UnTrack(h);
    fifo_clear(h);
    Py_CLEAR(h->stats_type);
    PyObject_GC_Del(h);
}

static PyObject *
fifo_offsets(FifoHookObject *h, PyObject *Py_UNUSED(ignored))
{
    PyObject *d = PyDict_New();
    for (int i = 0; d != NULL && i < FH_N; i++) {
        if (PyDict_SetItem(d, fh_pynames[i], h->offsets[i] ? Py_True : Py_False) < 0) {
            Py_CLEAR(d);
        }
    }
    return d;
}

static PyMethodDef fifo_methods[] = {
    {"fields", (PyCFunction)fifo_offsets, METH_NOARGS,
     "fields(): which figures the hook reads at their slot's offset (True) rather than through "
     "the attribute protocol (False)."},
    {NULL},
};

static PyTypeObject FifoHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.FifoHook",
    .tp_doc = "FifoHook(kind, queue, storage, stats, slow): a plain FIFO queue's compiled _put "
              "('put': slow is record.sample_send) or _get ('get': slow is the reference's timed "
              "get); queue is a weak reference to the queue, whose _queue it reads each call.",
    .tp_basicsize = sizeof(FifoHookObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FifoHookObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = fifo_new,
    .tp_dealloc = (destructor)fifo_dealloc,
    .tp_traverse = (traverseproc)fifo_traverse,
    .tp_clear = (inquiry)fifo_clear,
    .tp_methods = fifo_methods,
};

/* ---- scheduled time: asyncio's call_soon, stamping a task's wake-up ------------------------
 *
 * futures._call_soon is the reference: while a profiler runs, BaseEventLoop.call_soon is this
 * method, which stamps the moment on the task's own call when the callback is a task's wake-up
 * or first step, then runs asyncio's: inlined out of debug mode, as the reference does (see
 * wake_inline), else asyncio's own (wake_original). In C, as a method descriptor of the loop
 * class: no frame, no repacking of the arguments, no attribute look-up but the task's _coro. */

/* the type of the latest call_soon callback's owner that was no task (held): the isinstance()
 * of its next callbacks is not asked again */
static PyTypeObject *wake_not_task;
static PyObject *wake_original;  /* asyncio's call_soon (a function), while hooked */
static PyObject *wake_py_stamp;  /* futures._stamp_woken: a Python wrapper's stamp */
static PyTypeObject *wake_py_type; /* ... and that wrapper's type */
static PyObject *s_coro_attr, *s_self_attr, *s_task_types;
/* asyncio's BaseEventLoop._check_closed when wake_original is asyncio's own call_soon, which is
 * then inlined (see wake_call_soon); NULL otherwise */
static PyObject *wake_check_closed;
static PyObject *s_debug_attr, *s_closed_attr, *s_check_closed_attr, *s_call_soon_attr,
    *s_context_kw;

/* The C task's step wrappers (TaskStepMethWrapper; 3.11's TaskWakeupMethWrapper too), learned
 * at first sight, whose task is read at the offset where their __self__ was found (checked on
 * that first one: asyncio's struct keeps the task first, but this does not assume it). */
#define WAKE_KINDS 2
static PyTypeObject *wake_kinds[WAKE_KINDS];
static Py_ssize_t wake_kind_offset[WAKE_KINDS];
static int wake_kind_step[WAKE_KINDS]; /* a step wrapper (not a wake-up's) */

/* What a call_soon callback is a method of, borrowed; NULL when it is no method (no error).
 * *step: whether it is a C task's step wrapper (its next step, scheduled by the task itself). */
static PyObject *
wake_owner(PyObject *cb, int *step)
{
    *step = 0;
    if (PyCFunction_Check(cb)) { /* 3.12+: a C task's wake-up */
        return PyCFunction_GET_SELF(cb);
    }
    if (PyMethod_Check(cb)) { /* the Python Task's __step and __wakeup */
        return PyMethod_GET_SELF(cb);
    }
    PyTypeObject *type = Py_TYPE(cb);
    int i = 0;
    for (; i < WAKE_KINDS && wake_kinds[i] != NULL; i++) {
        if (wake_kinds[i] == type) {
            *step = wake_kind_step[i];
            return *(PyObject **)((char *)cb + wake_kind_offset[i]);
        }
    }
    const char *name = type->tp_name;
    size_t n = strlen(name);
    if (i == WAKE_KINDS || n < 11 || strcmp(name + n - 11, "MethWrapper") != 0 ||
        type->tp_basicsize < (Py_ssize_t)(sizeof(PyObject) + sizeof(PyObject *))) {
        return NULL;
    }
    PyObject *self = PyObject_GetAttr(cb, s_self_attr);
    if (self == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(self); /* the wrapper holds its task */
    Py_ssize_t end = type->tp_basicsize - (Py_ssize_t)sizeof(PyObject *);
    for (Py_ssize_t off = sizeof(PyObject); off <= end; off += sizeof(PyObject *)) {
        if (*(PyObject **)((char *)cb + off) == self) {
            wake_kinds[i] = (PyTypeObject *)Py_NewRef(type);
            wake_kind_offset[i] = off;
            wake_kind_step[i] = strstr(name, "Step") != NULL;
            break;
        }
    }
    *step = strstr(name, "Step") != NULL;
    return self;
}

/* Where asyncio.Task (the C one, an immutable type) keeps its coroutine: found once, as the one
 * slot of a task that holds its ``_coro`` (a tracked call, which nothing else of the task
 * holds), read there from then on; 0 while not known. */
static Py_ssize_t wake_coro_offset;

static void
wake_learn_coro(PyObject *task, PyObject *coro)
{
    Py_ssize_t found = 0;
    PyTypeObject *type = Py_TYPE(task);
    Py_ssize_t end = type->tp_basicsize - (Py_ssize_t)sizeof(PyObject *);
    for (Py_ssize_t off = sizeof(PyObject); off <= end; off += sizeof(PyObject *)) {
        if (*(PyObject **)((char *)task + off) == coro) {
            if (found) {
                return; /* twice: not known */
            }
            found = off;
        }
    }
    wake_coro_offset = found;
}

/* Frames of an untracked task's coroutine followed down to a tracked call (futures.WAKE_HOPS) */
#define WAKE_HOPS 4

/* Whether ``coro`` is a tracked call's wrapper, compiled or Python. */
static inline int
wake_tracked(PyObject *coro)
{
    return Py_IS_TYPE(coro, &WrapperType) || (wake_py_type != NULL && Py_IS_TYPE(coro, wake_py_type));
}

/* futures._call_soon's stamp, in C. Leaves no exception set. */
static void
wake_stamp(PyObject *cb)
{
    int step;
    PyObject *task = wake_owner(cb, &step);
    if (task == NULL) {
        return;
    }
    if (task_type == NULL || !Py_IS_TYPE(task, task_type)) { /* as futures._TASK_TYPES says */
        if (Py_IS_TYPE(task, wake_not_task)) {
            return; /* (a protocol's or a future's method, say: asked before) */
        }
        PyObject *types = PyDict_GetItemWithError(futures_dict, s_task_types); /* borrowed */
        int is = types == NULL ? -1 : PyObject_IsInstance(task, types);
        if (is <= 0) {
            if (is == 0) {
                Py_XSETREF(wake_not_task, (PyTypeObject *)Py_NewRef(Py_TYPE(task)));
            }
            PyErr_Clear();
            return;
        }
    }
    PyObject *coro;
    if (wake_coro_offset && Py_IS_TYPE(task, task_type)) { /* asyncio.Task's _coro, at its place */
        coro = Py_XNewRef(*(PyObject **)((char *)task + wake_coro_offset));
    }
    else {
        coro = PyObject_GetAttr(task, s_coro_attr);
        if (coro == NULL) {
            PyErr_Clear();
            return;
        }
        if (Py_IS_TYPE(coro, &WrapperType) && task_type != NULL && Py_IS_TYPE(task, task_type)) {
            wake_learn_coro(task, coro);
        }
    }
    if (coro == NULL) {
        return;
    }
    if (!wake_tracked(coro)) {
        /* an untracked task (anyio's TaskHandle._run_coro, a coroutine filtered out): its
         * wake-up resumes the first tracked call its coroutine awaits, within WAKE_HOPS frames
         * (futures._awaited_call) */
        for (int hops = 0; hops < WAKE_HOPS && coro != NULL && !wake_tracked(coro); hops++) {
            PyObject *next = awaited_by(coro);
            Py_DECREF(coro);
            coro = next;
        }
        if (coro == NULL || !wake_tracked(coro)) {
            Py_XDECREF(coro);
            return;
        }
    }
    if (Py_IS_TYPE(coro, &WrapperType)) {
        RecordObject *r = ((WrapperObject *)coro)->r;
        long long now;
        if (r != NULL && !r->woken && !r->finished) {
            if (step && r->last_end && !r->start) {
                /* a task's next step, scheduled by the task right after its poll ended: that
                 * poll's end is the moment (no clock read) */
                r->woken = r->last_end;
            }
            else if (now_ns(&now) < 0) {
                internal_error("stamping a task's wake-up", fetch_exc(), coro);
            }
            else {
                r->woken = now;
            }
        }
    }
    else if (wake_py_stamp != NULL && Py_IS_TYPE(coro, wake_py_type)) {
        /* the Python wrapper (benchmarks/run.py's pure-Python column) */
        PyObject *res = PyObject_CallOneArg(wake_py_stamp, coro);
        if (res == NULL) {
            internal_error("stamping a task's wake-up", fetch_exc(), coro);
        }
        Py_XDECREF(res);
    }
    Py_DECREF(coro);
}

/* asyncio's call_soon out of debug mode, as asyncio (3.11 to 3.13) runs it: ``_check_closed()``
 * (read in place when it is asyncio's own), then ``self._call_soon(callback, args, context)``,
 * through ``self`` so that a loop's override of either still runs. Two Python frames fewer than
 * calling asyncio's call_soon, on every wake-up. Returns NULL with no exception set when the
 * call is not one it takes (debug mode, a keyword other than ``context``, a closed loop): the
 * caller then calls asyncio's own. Py_None (which _call_soon never returns) with an exception
 * set when a call it made failed. */
static PyObject *
wake_inline(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *context = Py_None;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        if (PyTuple_GET_SIZE(kwnames) != 1 || PyTuple_GET_ITEM(kwnames, 0) != s_context_kw) {
            return NULL;
        }
        context = args[nargs];
    }
    PyObject *debug = PyObject_GetAttr(self, s_debug_attr);
    if (debug == NULL) {
        PyErr_Clear(); /* asyncio's own then says what is wrong, as it would */
        return NULL;
    }
    Py_DECREF(debug);
    if (debug != Py_False) {
        return NULL; /* debug mode: its checks, and its tracebacks' last frame, are asyncio's */
    }
    PyObject *check = _PyType_Lookup(Py_TYPE(self), s_check_closed_attr); /* borrowed */
    if (check == wake_check_closed) {
        PyObject *closed = PyObject_GetAttr(self, s_closed_attr);
        int is = closed == NULL ? -1 : PyObject_IsTrue(closed);
        Py_XDECREF(closed);
        if (is != 0) {
            PyErr_Clear();
            return NULL; /* closed: asyncio's own raises its error, with its frames */
        }
    }
    else {
        PyObject *done = PyObject_CallMethodNoArgs(self, s_check_closed_attr);
        if (done == NULL) {
            return Py_None;
        }
        Py_DECREF(done);
    }
    PyObject *rest = PyTuple_New(nargs - 1);
    if (rest == NULL) {
        return Py_None;
    }
    for (Py_ssize_t i = 1; i < nargs; i++) {
        PyTuple_SET_ITEM(rest, i - 1, Py_NewRef(args[i]));
    }
    PyObject *stack[4] = {self, args[0], rest, context};
    PyObject *handle = PyObject_VectorcallMethod(s_call_soon_attr, stack, 4, NULL);
    Py_DECREF(rest);
    return handle == NULL ? Py_None : handle;
}

static PyObject *
wake_call_soon(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (wake_original == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asyncflow: call_soon's hook outlived asyncio's");
        return NULL;
    }
    if (nargs >= 1) {
        wake_stamp(args[0]);
        if (wake_check_closed != NULL) {
            PyObject *handle = wake_inline(self, args, nargs, kwnames);
            if (handle == Py_None) { /* (asyncio's _call_soon never returns None) */
                return NULL;
            }
            if (handle != NULL) {
                return handle;
            }
        }
    }
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8];
    PyObject **stack = total + 1 <= 8 ? small : PyMem_New(PyObject *, total + 1);
    if (stack == NULL) {
        return PyErr_NoMemory();
    }
    stack[0] = self;
    for (Py_ssize_t i = 0; i < total; i++) {
        stack[i + 1] = args[i];
    }
    PyObject *res = PyObject_Vectorcall(wake_original, stack, nargs + 1, kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    return res;
}

static PyMethodDef wake_def = {
    "call_soon", (PyCFunction)(void (*)(void))wake_call_soon, METH_FASTCALL | METH_KEYWORDS,
    "asyncio's call_soon, while asyncflow measures scheduled time: a task's wake-up is stamped "
    "on its call, then asyncio's call_soon runs."};

static PyObject *
mod_wake_hook(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyType_Check(args[0]) || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "wake_hook(loop_class, call_soon, stamp, "
                                         "python_wrapper_type, check_closed)");
        return NULL;
    }
    if (futures_dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asyncflow: wake_hook() before setup()");
        return NULL;
    }
    if ((s_coro_attr == NULL && (s_coro_attr = PyUnicode_InternFromString("_coro")) == NULL) ||
        (s_self_attr == NULL && (s_self_attr = PyUnicode_InternFromString("__self__")) == NULL) ||
        (s_task_types == NULL &&
         (s_task_types = PyUnicode_InternFromString("_TASK_TYPES")) == NULL) ||
        (s_debug_attr == NULL && (s_debug_attr = PyUnicode_InternFromString("_debug")) == NULL) ||
        (s_closed_attr == NULL &&
         (s_closed_attr = PyUnicode_InternFromString("_closed")) == NULL) ||
        (s_check_closed_attr == NULL &&
         (s_check_closed_attr = PyUnicode_InternFromString("_check_closed")) == NULL) ||
        (s_call_soon_attr == NULL &&
         (s_call_soon_attr = PyUnicode_InternFromString("_call_soon")) == NULL) ||
        (s_context_kw == NULL &&
         (s_context_kw = PyUnicode_InternFromString("context")) == NULL)) {
        return NULL;
    }
    Py_XSETREF(wake_check_closed, args[4] == Py_None ? NULL : Py_NewRef(args[4]));
    Py_XSETREF(wake_original, Py_NewRef(args[1]));
    Py_XSETREF(wake_py_stamp, Py_NewRef(args[2]));
    Py_XSETREF(wake_py_type, (PyTypeObject *)Py_NewRef(args[3]));
    return PyDescr_NewMethod((PyTypeObject *)args[0], &wake_def);
}


/* ---- whole-program mode's routes: a framework's hooked methods --------------------------------
 *
 * routes.py's hooks of aiohttp (``Application._handle``, ``UrlMappingMatchInfo.freeze``), run
 * once a request each. A RouteHook calls the framework's own method, then decides the common
 * case in C: the request's task was tracked by the task factory and is in its first poll (the
 * task's call is the outermost running here), and, for ``freeze``, the route's future is known
 * already. Anything else is the hook's Python rest (``rest``), given the method's arguments and
 * its result: the reference, with its own handling of errors. It binds like a function (a
 * method descriptor) and has a ``__dict__``, for functools.wraps. */

enum { ROUTE_HANDLE, ROUTE_FREEZE };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *original; /* the framework's method */
    PyObject *rest;     /* the Python rest: rest(*args, result) */
    PyObject *cache;    /* freeze: id(route) -> (a weak reference to it, its future) */
    PyObject *holder;   /* freeze: the _Unmatched holder (its ``record``, once made) */
    PyObject *route_attr; /* freeze: the match info's attribute that holds the route */
    PyObject *dict;
} RouteHookObject;

static PyObject *s_task_tracked, *s_record_attr;

/* Whether the weak reference ``ref`` is to ``obj`` (alive: the caller holds it). */
static int
weak_is(PyObject *ref, PyObject *obj)
{
    if (!PyWeakref_Check(ref)) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target;
    if (PyWeakref_GetRef(ref, &target) <= 0) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(target);
    return target == obj;
#else
    return PyWeakref_GET_OBJECT(ref) == obj;
#endif
}

/* The outermost tracked call running on this thread (borrowed), or NULL. */
static inline RecordObject *
outermost_call(void)
{
    WrapperObject *outer = tls_slot != NULL ? tls_slot->inner : NULL;
    for (long i = 0; outer != NULL && outer->outer != NULL && i < WALK_LIMIT; i++) {
        outer = outer->outer;
    }
    return outer != NULL ? outer->r : NULL;
}

/* 1: ``call`` is a task's call in its first poll (made by the task factory for what runs now);
 * 0: not; -1: an error. */
static int
fresh_task_call(RecordObject *call)
{
    if (call == NULL || call->polls != 0 || call->future == NULL) {
        return 0;
    }
    PyObject *by = field_get(call->future, FR_TRACKED_BY);
    if (by == NULL) {
        return -1;
    }
    int is = by == s_task_tracked ? 1 : PyUnicode_Check(by) ? PyUnicode_Compare(by, s_task_tracked) == 0 : 0;
    Py_DECREF(by);
    return is;
}

/* freeze's common case: 1 decided (the task's call moved, or nothing to do), 0 for the rest,
 * -1 an error. */
static int
route_freeze_fast(RouteHookObject *hook, PyObject *info)
{
    PyObject *route = PyObject_GetAttr(info, hook->route_attr);
    if (route == NULL) {
        return -1;
    }
    PyObject *key = PyLong_FromVoidPtr(route);
    PyObject *known = key == NULL ? NULL : PyDict_GetItemWithError(hook->cache, key); /* borrowed */
    Py_XDECREF(key);
    int decided = 0;
    if (known != NULL && PyTuple_CheckExact(known) && PyTuple_GET_SIZE(known) == 2 &&
        weak_is(PyTuple_GET_ITEM(known, 0), route)) {
        PyObject *record = PyTuple_GET_ITEM(known, 1);
        WrapperObject *inner = tls_slot != NULL ? tls_slot->inner : NULL;
        RecordObject *here = inner != NULL ? inner->r : NULL;
        RecordObject *outer = outermost_call();
        if (here == NULL) {
            decided = 1; /* no tracked call runs here: nothing to move */
        }
        else if (here == outer) { /* (else: a call _handle made, inside another: the rest) */
            PyObject *unmatched = PyObject_GetAttr(hook->holder, s_record_attr);
            if (unmatched == NULL) {
                decided = -1;
            }
            else if (here->polls != 0 || here->future != unmatched) {
                int fresh = fresh_task_call(outer);
                if (fresh > 0) {
                    PyObject *args[2] = {(PyObject *)outer, record};
                    PyObject *moved = mod_move_call(NULL, args, 2);
                    decided = moved == NULL ? -1 : 1;
                    Py_XDECREF(moved);
                }
                else {
                    decided = fresh < 0 ? -1 : 1;
                }
            }
            Py_XDECREF(unmatched);
        }
    }
    else if (PyErr_Occurred()) {
        decided = -1;
    }
    Py_DECREF(route);
    return decided;
}

static PyObject *
route_hook_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    RouteHookObject *hook = (RouteHookObject *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *result = PyObject_Vectorcall(hook->original, args, nargs, kwnames);
    if (result == NULL || kwnames != NULL || nargs < 1) {
        return result; /* (a call unlike the framework's own: left as it is) */
    }
    PyObject *active = global_get(&active_cache, session_dict, s_active); /* borrowed */
    if (active == NULL || active == Py_None) {
        PyErr_Clear();
        return result;
    }
    int decided;
    if (hook->kind == ROUTE_HANDLE) {
        decided = fresh_task_call(outermost_call()); /* freeze() moves the task's call */
    }
    else {
        decided = route_freeze_fast(hook, args[0]);
    }
    if (decided > 0) {
        return result;
    }
    PyErr_Clear(); /* (the rest meets the same error, in its own handling) */
    PyObject *small[4];
    if (nargs + 1 > 4) {
        return result;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        small[i] = args[i];
    }
    small[nargs] = result;
    PyObject *out = PyObject_Vectorcall(hook->rest, small, nargs + 1, NULL);
    Py_DECREF(result);
    return out;
}

static PyObject *
route_hook_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

#define ROUTE_HOOK_OBJECTS(X) X(original) X(rest) X(cache) X(holder) X(route_attr) X(dict)

static int
route_hook_traverse(RouteHookObject *self, visitproc visit, void *arg)
{
#define VISIT(name) Py_VISIT(self->name);
    ROUTE_HOOK_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int
route_hook_clear(RouteHookObject *self)
{
#define CLEAR(name) Py_CLEAR(self->name);
    ROUTE_HOOK_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void
route_hook_dealloc(RouteHookObject *self)
{
    PyObject_GC_UnTrack(self);
    route_hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
route_hook_repr(RouteHookObject *self)
{
    return PyUnicode_FromFormat("<asyncflow route hook of %R>", self->original);
}

static PyGetSetDef route_hook_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject RouteHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncflow.instrumentation._speedups.RouteHook",
    .tp_doc = "A framework's method hooked by routes.py: its common case in C, the rest in Python.",
    .tp_basicsize = sizeof(RouteHookObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(RouteHookObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = route_hook_get,
    .tp_dictoffset = offsetof(RouteHookObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_getset = route_hook_getset,
    .tp_traverse = (traverseproc)route_hook_traverse,
    .tp_clear = (inquiry)route_hook_clear,
    .tp_dealloc = (destructor)route_hook_dealloc,
    .tp_repr = (reprfunc)route_hook_repr,
};

PyDoc_STRVAR(route_hook_doc,
             "route_hook(kind, original, rest, cache=None, holder=None, route_attr=None)\n--\n\n"
             "A hook of a framework's method (routes.py): kind 'handle' (aiohttp's "
             "Application._handle) or 'freeze' (its UrlMappingMatchInfo.freeze, which needs "
             "cache, holder and route_attr). It calls original, decides the common case in C and "
             "leaves the rest to rest(*args, result).");

static PyObject *
mod_route_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 6 || !PyUnicode_Check(args[0]) || !PyCallable_Check(args[1]) ||
        !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "route_hook(kind, original, rest, cache=None, holder=None, route_attr=None)");
        return NULL;
    }
    int kind;
    if (PyUnicode_CompareWithASCIIString(args[0], "handle") == 0) {
        kind = ROUTE_HANDLE;
    }
    else if (PyUnicode_CompareWithASCIIString(args[0], "freeze") == 0) {
        kind = ROUTE_FREEZE;
        if (nargs != 6 || !PyDict_CheckExact(args[3]) || !PyUnicode_Check(args[5])) {
            PyErr_SetString(PyExc_TypeError,
                            "route_hook('freeze', ...) needs a dict cache, a holder and an "
                            "attribute name");
            return NULL;
        }
    }
    else {
        PyErr_SetString(PyExc_ValueError, "route_hook: kind is 'handle' or 'freeze'");
        return NULL;
    }
    if ((s_task_tracked == NULL && (s_task_tracked = PyUnicode_InternFromString("task")) == NULL) ||
        (s_record_attr == NULL && (s_record_attr = PyUnicode_InternFromString("record")) == NULL)) {
        return NULL;
    }
    RouteHookObject *hook = PyObject_GC_New(RouteHookObject, &RouteHookType);
    if (hook == NULL) {
        return NULL;
    }
    hook->vectorcall = route_hook_vectorcall;
    hook->kind = kind;
    hook->original = Py_NewRef(args[1]);
    hook->rest = Py_NewRef(args[2]);
    hook->cache = kind == ROUTE_FREEZE ? Py_NewRef(args[3]) : NULL;
    hook->holder = kind == ROUTE_FREEZE ? Py_NewRef(args[4]) : NULL;
    hook->route_attr = kind == ROUTE_FREEZE ? Py_NewRef(args[5]) : NULL;
    hook->dict = NULL;
    PyObject_GC_Track(hook);
    return (PyObject *)hook;
}


static PyMethodDef module_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))mod_setup, METH_FASTCALL, setup_doc},
    {"wake_hook", (PyCFunction)(void (*)(void))mod_wake_hook, METH_FASTCALL,
     "wake_hook(loop_class, call_soon, stamp, python_wrapper_type, check_closed): the method "
     "that stands for asyncio's call_soon while scheduled time is measured "
     "(futures.hook_wakes); check_closed is asyncio's BaseEventLoop._check_closed when "
     "call_soon is asyncio's own, which is then inlined, else None."},
    {"running_call", (PyCFunction)mod_running_call, METH_NOARGS, running_call_doc},
    {"running_calls", (PyCFunction)mod_running_calls, METH_O, running_calls_doc},
    {"move_call", (PyCFunction)(void (*)(void))mod_move_call, METH_FASTCALL, move_call_doc},
    {"route_hook", (PyCFunction)(void (*)(void))mod_route_hook, METH_FASTCALL, route_hook_doc},
    {"set_poll_probe", (PyCFunction)(void (*)(void))mod_set_poll_probe, METH_FASTCALL,
     set_poll_probe_doc},
    {"setup_streams", (PyCFunction)mod_setup_streams, METH_O, setup_streams_doc},
    {"calls_without_method", (PyCFunction)(void (*)(void))mod_calls_without_method,
     METH_FASTCALL, calls_without_method_doc},
    {"fold_finished", (PyCFunction)(void (*)(void))mod_fold_finished, METH_FASTCALL,
     fold_finished_doc},
    {"fields", (PyCFunction)mod_fields, METH_NOARGS,
     "fields(): which slots of futures', _session's and streams' classes the compiled path reads "
     "at their offsets (True) rather than through the attribute protocol (False)."},
    {"bucket_of", (PyCFunction)mod_bucket_of, METH_O,
     "bucket_of(ns): the histogram bucket (as asyncflow.stats.bucket_of) the hot path bumps."},
    {"clock_read_cost", (PyCFunction)mod_clock_read_cost, METH_O,
     "clock_read_cost(n): the mean cost in ns of one monotonic clock read in C, over n reads, "
     "in the thread's CPU time (the floor the benchmarks compare the hot path with)."},
    {"running_loop", (PyCFunction)mod_running_loop, METH_NOARGS,
     "running_loop(): asyncio's running loop as a call's first poll reads it (after setup()); "
     "True as a second item once it reads asyncio's holder without a system call."},
    {"now_ns", (PyCFunction)mod_now_ns, METH_NOARGS,
     "now_ns(): asyncflow.clock.now_ns() as the hot path reads it (after setup())."},
#if HAND_OVER
    {"wait_events", (PyCFunction)(void (*)(void))mod_wait_events, METH_FASTCALL,
     wait_events_doc},
    {"wait_events_done", (PyCFunction)mod_wait_events_done, METH_NOARGS,
     "wait_events_done(): the thread that waited in wait_events() will not wait there again."},
    {"heartbeats_in_flight", (PyCFunction)(void (*)(void))mod_heartbeats_in_flight,
     METH_FASTCALL,
     "heartbeats_in_flight(n=None): the count of the loop monitor's heartbeats in flight (as "
     "it was), set to n if given."},
    {"heartbeat_posted", (PyCFunction)mod_heartbeat_posted, METH_NOARGS,
     "heartbeat_posted(): a heartbeat was posted to a loop (one more in flight)."},
    {"heartbeat_landed", (PyCFunction)mod_heartbeat_landed, METH_NOARGS,
     "heartbeat_landed(): a heartbeat ran on its loop, or was given up (one fewer in flight)."},
    {"wakes", (PyCFunction)mod_wakes, METH_NOARGS,
     "wakes(): how often the thread in wait_events() woke from a wait, each a batch of work."},
    {"hand_overs", (PyCFunction)mod_hand_overs, METH_NOARGS,
     "hand_overs(): the GIL's hand-overs to the thread in wait_events() so far: how many, their "
     "time in ns, and how many ran out before it was back waiting."},
#endif
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "asyncflow.instrumentation._speedups",
    .m_doc = "asyncflow's compiled hot path: the coroutine wrapper and its per-call record.",
    .m_size = -1,
    .m_methods = module_methods,
};

#define INTERN(var, text)                                                                      \
    do {                                                                                       \
        var = PyUnicode_InternFromString(text);                                                \
        if (var == NULL) {                                                                     \
            return NULL;                                                                       \
        }                                                                                      \
    } while (0)

PyMODINIT_FUNC
PyInit__speedups(void)
{
    INTERN(s_now_ns, "now_ns");
    INTERN(s_stats, "stats");
    INTERN(s_poll_hist, "poll_hist");
    INTERN(s_live, "live");
    INTERN(s_created, "created");
    INTERN(s_first_call, "first_call");
    INTERN(s_first_caller, "first_caller");
    INTERN(s_dropped, "dropped"); /* futures.DROPPED */
    INTERN(s_send, "send");
    INTERN(s_throw, "throw");
    INTERN(s_close, "close");
    INTERN(s_first_poll, "_first_poll");
    INTERN(s_finish_poll, "_finish_poll");
    INTERN(s_cancel_requested, "_cancel_requested");
    INTERN(s_scheduled, "_scheduled");
    INTERN(s_normalize_throw, "_normalize_throw");
    INTERN(s_close_record, "_close_record");
    INTERN(s_session, "_session");
    INTERN(s_internal_error, "internal_error");
    INTERN(s_log_result, "log_result");
    INTERN(s_returned, "returned");
    INTERN(s_polls_done, "polls_done");
    INTERN(s_busy_done, "busy_done");
    INTERN(s_idle_done, "idle_done");
    INTERN(s_max_poll_done, "max_poll_done");
    INTERN(s_active, "active");
    INTERN(s_finished, "finished");
    INTERN(s_appended, "appended");
    INTERN(s_append, "append");
    INTERN(s_get_running_loop, "_get_running_loop");
    INTERN(s_loops, "loops");
    INTERN(s_last_key, "last_key");
    INTERN(s_see, "see");
    INTERN(s_current_tasks, "_current_tasks");
    INTERN(s_asyncio, "asyncio");
    INTERN(s_current_task, "current_task");
    INTERN(s_get_name, "get_name");
    INTERN(s_wrapper_name, "InstrumentedCoroutine");
    INTERN(s_slot_key, "asyncflow.running_call");
    INTERN(s_id, "id");
    INTERN(s_probe_failed, "_probe_failed");
    INTERN(s_dunder_call, "__call__");
    INTERN(s_cr_await, "cr_await");
    INTERN(s_gi_yieldfrom, "gi_yieldfrom");
    cr_await_get = getset_getter(&PyCoro_Type, "cr_await");
    gi_yieldfrom_get = getset_getter(&PyGen_Type, "gi_yieldfrom");
    INTERN(s_new_poll_histogram, "_new_poll_histogram");
    INTERN(s_task_filter, "task_filter");
    INTERN(s_call_hist, "call_hist");
    INTERN(s_recent, "recent");
    INTERN(s_future, "future");
    INTERN(s_finished_at, "finished");
    INTERN(s_created_at, "created");
    INTERN(s_add, "add");
    INTERN(s_taken, "taken");
    INTERN(s_maxlen, "maxlen");
    INTERN(s_by_code, "_by_code");
    INTERN(s_task_record, "_task_record");
    INTERN(s_task_kind, "task");
    INTERN(s_py_task_factory, "_py_task_factory_call");
    INTERN(s_not_creators, "_NOT_CREATORS");
    INTERN(s_cr_code, "cr_code");
    INTERN(s_Task, "Task");
    INTERN(s_anyio_runner, "TaskHandle._run_coro");
    INTERN(s_context, "context");
    if ((kw_loop = Py_BuildValue("(s)", "loop")) == NULL ||
        (kw_loop_context = Py_BuildValue("(ss)", "loop", "context")) == NULL) {
        return NULL;
    }
#if HAND_OVER
    if (hand_over_init() < 0) {
        return NULL;
    }
#endif
#if FAST_RUNNING_LOOP
    INTERN(s_holder_key, "__asyncio_running_event_loop__");
    if (pthread_atfork(NULL, NULL, forked_child) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "asyncflow: pthread_atfork failed");
        return NULL;
    }
#endif
    INTERN(s_end, "end");
    INTERN(s_resumed, "resumed");
    INTERN(s_timed_item, "_timed_item");
    INTERN(s_iteration_cls, "_Iteration");
    INTERN(s_anext, "__anext__");
    INTERN(s_gi_code, "gi_code");
    INTERN(s_co_flags, "co_flags");
    for (int i = 0; i < FH_N; i++) {
        INTERN(fh_pynames[i], fh_names[i]);
    }
    INTERN(s_queue_storage, "_queue");
    for (Py_ssize_t i = 0; i < BUCKETS; i++) {
        bucket_ints[i] = PyLong_FromSsize_t(i);
        if (bucket_ints[i] == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&RecordType) < 0 || PyType_Ready(&WrapperType) < 0 ||
        PyType_Ready(&HistType) < 0 || PyType_Ready(&StatsType) < 0 ||
        PyType_Ready(&SlotType) < 0 || PyType_Ready(&FutureCallType) < 0 ||
        PyType_Ready(&FunctionBaseType) < 0 ||
        PyType_Ready(&AIterType) < 0 || PyType_Ready(&StepType) < 0 ||
        PyType_Ready(&CounterType) < 0 ||
        PyType_Ready(&FifoHookType) < 0 || PyType_Ready(&RouteHookType) < 0) {
        return NULL;
    }
    FutureCallObject *factory_call = PyObject_New(FutureCallObject, &FutureCallType);
    if (factory_call == NULL) {
        return NULL;
    }
    factory_call->vectorcall = task_factory_vectorcall;
    factory_call->what = "_TaskFactory.__call__";
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        Py_DECREF(factory_call);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "CallRecord", (PyObject *)&RecordType) < 0 ||
        PyModule_AddObjectRef(m, "InstrumentedCoroutine", (PyObject *)&WrapperType) < 0 ||
        PyModule_AddIntConstant(m, "BUCKETS", BUCKETS) < 0 ||
        PyModule_AddObjectRef(m, "FunctionBase", (PyObject *)&FunctionBaseType) < 0 ||
        PyModule_AddObjectRef(m, "task_factory_call", (PyObject *)factory_call) < 0 ||
        PyModule_AddObjectRef(m, "AsyncIteratorBase", (PyObject *)&AIterType) < 0 ||
        PyModule_AddObjectRef(m, "StreamStep", (PyObject *)&StepType) < 0 ||
        PyModule_AddObjectRef(m, "StreamCounter", (PyObject *)&CounterType) < 0 ||
        PyModule_AddObjectRef(m, "PollHistogram", (PyObject *)&HistType) < 0 ||
        PyModule_AddObjectRef(m, "FutureStats", (PyObject *)&StatsType) < 0 ||
        PyModule_AddObjectRef(m, "FifoHook", (PyObject *)&FifoHookType) < 0) {
        Py_DECREF(factory_call);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(factory_call);
    return m;
}
