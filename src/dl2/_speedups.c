/* dl2._speedups: the recorder's two hottest steps in C, each for the common case only.
 *
 * Optional: where it cannot be built (or DL2_PURE_PYTHON is set) dl2 runs the same steps
 * in Python.  Both keep their state in the Python objects the Python code uses, and
 * fall back to the Python code for anything but the common case, so the two cannot
 * disagree on what they write; tests run the recorder's unit tests both ways.
 *
 * 1. capture(frame): dl2.record.stack.capture_py's walk, for stacks seen before.
 *
 * The recorder captures the user's stack at every communication call.  In Python the
 * walk costs about 0.2 us per frame (attribute reads, two dict lookups, list appends);
 * here it reads the same caches that the Python walk fills (dl2.record.stack's _kinds,
 * _cache and _ids) and returns the same (api, stack id).  It only reads: whenever
 * anything it needs is missing (a file, code object, instruction offset or stack not
 * seen yet) it calls the Python walk, which fills the caches, and returns its answer.
 * tests/unit/test_speedups.py checks that both give the same answers.
 *
 * 2. EncoderCore: the base of dl2.trace.schema.stream.StreamEncoder.  It holds the
 * encoder's hot fields (C integers, read and written by the Python code as plain
 * attributes) and op_hot(), which writes the op record of a collective in the steady
 * state of a training loop (the previous op a blocking one that returned, its records
 * held back; the op's description known; nothing else pending) exactly as
 * StreamEncoder.op does, and returns False for anything else, having changed nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>

#define PARTS_MAX 64

static PyObject *kinds;    /* co_filename -> kind */
static PyObject *cache;    /* id(code) -> (code, kind, {f_lasti: frame text}) */
static PyObject *ids;      /* tuple of frame texts -> stack id */
static PyObject *fallback; /* the Python capture(frame) */
static long k_user, k_third, k_api;
static Py_ssize_t max_frames, max_walk;

static PyObject *
setup(PyObject *module, PyObject *args)
{
    PyObject *k, *c, *i, *f;
    long user, third, api;
    Py_ssize_t frames, walk;
    if (!PyArg_ParseTuple(args, "O!O!O!Olllnn", &PyDict_Type, &k, &PyDict_Type, &c,
                          &PyDict_Type, &i, &f, &user, &third, &api, &frames, &walk))
        return NULL;
    if (frames < 1 || frames > PARTS_MAX || walk < 0) {
        PyErr_SetString(PyExc_ValueError, "_speedups.setup: frame limits out of range");
        return NULL;
    }
    Py_INCREF(k);
    Py_INCREF(c);
    Py_INCREF(i);
    Py_INCREF(f);
    Py_XSETREF(kinds, k);
    Py_XSETREF(cache, c);
    Py_XSETREF(ids, i);
    Py_XSETREF(fallback, f);
    k_user = user;
    k_third = third;
    k_api = api;
    max_frames = frames;
    max_walk = walk;
    Py_RETURN_NONE;
}

/* The next frame out (a new reference, or NULL at the outermost); drops ``f``. */
static PyFrameObject *
back(PyFrameObject *f)
{
    PyFrameObject *b = PyFrame_GetBack(f);
    Py_DECREF(f);
    return b;
}

/* The cached text of frame ``f`` at its current instruction (borrowed), or NULL if
 * none is cached yet. */
static PyObject *
frame_text(PyObject *lines, PyFrameObject *f)
{
    PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(f));
    if (lasti == NULL)
        return NULL;
    PyObject *text = PyDict_GetItemWithError(lines, lasti);
    Py_DECREF(lasti);
    return text;
}

static PyObject *
capture(PyObject *module, PyObject *frame)
{
    if (fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_speedups.setup was not called");
        return NULL;
    }
    if (!PyFrame_Check(frame))
        return PyObject_CallOneArg(fallback, frame);

    /* The user stack's frame texts, held (not borrowed): a frame or tuple allocated
     * below may run the garbage collector, and a finaliser may record, and so clear a
     * full cache. */
    PyObject *parts[PARTS_MAX];
    Py_ssize_t n = 0;
    PyObject *api = Py_None;
    Py_INCREF(api);
    PyFrameObject *f = (PyFrameObject *)frame;
    Py_INCREF(f);
    /* Library and API frames up to the first recorded one (user code or another
     * installed package); the outermost API function there names the call. */
    while (f != NULL) {
        PyCodeObject *code = PyFrame_GetCode(f);
        PyObject *kind = PyDict_GetItemWithError(kinds, code->co_filename);
        if (kind == NULL) {
            Py_DECREF(code);
            goto slow;
        }
        long k = PyLong_AsLong(kind);
        if (k == -1 && PyErr_Occurred()) {
            Py_DECREF(code);
            goto slow;
        }
        if (k == k_user || k == k_third) {
            Py_DECREF(code);
            break;
        }
        if (k == k_api) {
            Py_INCREF(code->co_name);
            Py_SETREF(api, code->co_name);
        }
        Py_DECREF(code);
        f = back(f);
    }

    /* The user stack: user_stack_id(f) without its ``lines``. */
    int own = 0;
    for (Py_ssize_t walked = 0; walked < max_walk && f != NULL; walked++) {
        PyCodeObject *code = PyFrame_GetCode(f);
        PyObject *key = PyLong_FromVoidPtr(code);
        Py_DECREF(code); /* the frame holds it */
        if (key == NULL)
            goto slow;
        PyObject *entry = PyDict_GetItemWithError(cache, key);
        Py_DECREF(key);
        if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 3)
            goto slow;
        long k = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
        if (k == -1 && PyErr_Occurred())
            goto slow;
        PyObject *lines = PyTuple_GET_ITEM(entry, 2);
        if (k == k_user) {
            PyObject *text = frame_text(lines, f);
            if (text == NULL)
                goto slow;
            if (n > 0 && text == parts[n - 1]) { /* recursion: kept once */
                f = back(f);
                continue;
            }
            Py_INCREF(text);
            if (n < max_frames - 1) {
                parts[n++] = text;
                own = 1;
                f = back(f);
                continue;
            }
            if (n < max_frames)
                parts[n++] = text;
            else
                Py_SETREF(parts[n - 1], text); /* the outermost kept: the user's */
            break;
        }
        if (k == k_third && n < max_frames) {
            PyObject *text = frame_text(lines, f);
            if (text == NULL)
                goto slow;
            Py_INCREF(text);
            parts[n++] = text;
            if (n >= max_frames && own)
                break;
        }
        f = back(f);
    }
    Py_XDECREF(f);
    f = NULL;

    PyObject *stack = PyTuple_New(n);
    if (stack == NULL)
        goto slow;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(stack, i, parts[i]); /* the tuple takes our references */
    n = 0;
    PyObject *sid = PyDict_GetItemWithError(ids, stack);
    Py_XINCREF(sid);
    Py_DECREF(stack);
    if (sid == NULL)
        goto slow;
    PyObject *result = PyTuple_Pack(2, api, sid);
    Py_DECREF(sid);
    Py_DECREF(api);
    return result;

slow:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(parts[i]);
    Py_XDECREF(f);
    Py_DECREF(api);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallOneArg(fallback, frame);
}


/* -- 2. the stream encoder's hot path --------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    /* objects the Python encoder owns and may replace (None until it sets them) */
    PyObject *lock, *tail, *open, *descs, *descs_defined, *seqs, *sink, *waits, *issued,
        *stores;
    long long t0, us, last, last_sid, next_id, ops_before, due;
    unsigned long long last_tid;
} Core;

static PyObject *s_acquire, *s_release, *s_popleft, *s_failed;

static int
core_traverse(Core *self, visitproc visit, void *arg)
{
    Py_VISIT(self->lock);
    Py_VISIT(self->tail);
    Py_VISIT(self->open);
    Py_VISIT(self->descs);
    Py_VISIT(self->descs_defined);
    Py_VISIT(self->seqs);
    Py_VISIT(self->sink);
    Py_VISIT(self->waits);
    Py_VISIT(self->issued);
    Py_VISIT(self->stores);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
core_clear(Core *self)
{
    Py_CLEAR(self->lock);
    Py_CLEAR(self->tail);
    Py_CLEAR(self->open);
    Py_CLEAR(self->descs);
    Py_CLEAR(self->descs_defined);
    Py_CLEAR(self->seqs);
    Py_CLEAR(self->sink);
    Py_CLEAR(self->waits);
    Py_CLEAR(self->issued);
    Py_CLEAR(self->stores);
    return 0;
}

static void
core_dealloc(Core *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    core_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Python's floor division by 1000 (times are ns; records say us). */
static long long
us_of(long long ns)
{
    long long q = ns / 1000;
    if ((ns % 1000) != 0 && ns < 0)
        q -= 1;
    return q;
}

/* Item ``i`` of tuple ``t`` as a C integer; -1 with ``*ok`` cleared if it is not one. */
static long long
item_ll(PyObject *t, Py_ssize_t i, int *ok)
{
    PyObject *v = PyTuple_GET_ITEM(t, i);
    if (!PyLong_CheckExact(v)) {
        *ok = 0;
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    return x;
}

static int
call_lock(PyObject *lock, PyObject *name)
{
    PyObject *r = PyObject_CallMethodNoArgs(lock, name);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* op_hot(oid, t, tid, key, seq, is_async, sid) -> bool.  Under the encoder's lock:
 * checks everything first and returns False (nothing changed) unless the op is the
 * common case; then updates the state and writes as StreamEncoder.op would. */
static PyObject *
core_op_hot(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "op_hot takes 7 arguments");
        return NULL;
    }
    PyObject *key = args[3], *seq_obj = args[4], *is_async = args[5];
    long long oid = PyLong_AsLongLong(args[0]);
    long long t = PyLong_AsLongLong(args[1]);
    unsigned long long tid = PyLong_AsUnsignedLongLong(args[2]);
    long long sid = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    if (self->lock == NULL || self->tail == NULL || self->open == NULL ||
        self->descs == NULL || self->descs_defined == NULL || self->seqs == NULL ||
        self->sink == NULL || !PyDict_CheckExact(self->open) ||
        !PyDict_CheckExact(self->descs) || !PyDict_CheckExact(self->seqs) ||
        !PyAnySet_Check(self->descs_defined))
        Py_RETURN_FALSE;

    PyObject *lock = self->lock, *tail = self->tail;
    Py_INCREF(lock);
    Py_INCREF(tail);
    if (call_lock(lock, s_acquire) < 0) {
        Py_DECREF(lock);
        Py_DECREF(tail);
        return NULL;
    }
    PyObject *result = Py_False;
    PyObject *issued = NULL, *ret = NULL, *data = NULL, *entry = NULL, *next_seq = NULL;
    int ok = 1;
    if (self->due <= 0) /* a checkpoint is due: StreamEncoder.op writes it */
        goto done;

    /* -- checks (nothing changes) -- */
    long long last = self->last, prev_us = self->us, wid = 0, k_dt = 0, k_dur = 0, r_dt = 0;
    int k = 0, r = 0;
    Py_ssize_t n = PyObject_Size(tail);
    if (n < 0)
        goto error;
    if (n == 2) {
        issued = PySequence_GetItem(tail, 0);
        ret = PySequence_GetItem(tail, 1);
        if (issued == NULL || ret == NULL)
            goto error;
        if (!PyTuple_CheckExact(issued) || PyTuple_GET_SIZE(issued) != 5 ||
            !PyTuple_CheckExact(ret) || PyTuple_GET_SIZE(ret) != 3 ||
            PyTuple_GET_ITEM(ret, 2) != Py_None)
            goto done;
        long long i_oid = item_ll(issued, 0, &ok), i_wid = item_ll(issued, 1, &ok);
        long long i_at = item_ll(issued, 2, &ok), i_sid = item_ll(issued, 4, &ok);
        long long r_id = item_ll(ret, 0, &ok), r_t = item_ll(ret, 1, &ok);
        PyObject *i_tid = PyTuple_GET_ITEM(issued, 3);
        if (!ok || !PyLong_CheckExact(i_tid))
            goto done;
        unsigned long long i_tidv = PyLong_AsUnsignedLongLong(i_tid);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            goto done;
        }
        if (i_oid != last || i_wid != last + 1 || r_id != i_wid || r_t == 0 ||
            i_tidv != self->last_tid || i_sid != self->last_sid)
            goto done;
        long long at = us_of(i_at - self->t0), end = us_of(r_t - self->t0);
        k_dt = at - prev_us;
        k_dur = end - at;
        prev_us = end;
        wid = i_wid;
        last = wid;
        k = 1;
    }
    else if (n == 1) {
        /* The previous op an async one, issued: its held ret (a DDP bucket after
         * another).  StreamEncoder._ret of an op no wait or store call has that id,
         * open and not an eager send: it becomes issued, and its ret is ["r",dt]. */
        ret = PySequence_GetItem(tail, 0);
        if (ret == NULL)
            goto error;
        if (!PyTuple_CheckExact(ret) || PyTuple_GET_SIZE(ret) != 3 ||
            PyTuple_GET_ITEM(ret, 2) != Py_None)
            goto done;
        long long r_id = item_ll(ret, 0, &ok), r_t = item_ll(ret, 1, &ok);
        if (!ok || r_id != last || self->waits == NULL || !PyDict_CheckExact(self->waits) ||
            self->stores == NULL || !PyDict_CheckExact(self->stores) ||
            self->issued == NULL || !PySet_CheckExact(self->issued))
            goto done;
        PyObject *r_key = PyTuple_GET_ITEM(ret, 0);
        int has = PyDict_Contains(self->waits, r_key);
        if (has == 0 && PyDict_GET_SIZE(self->stores))
            has = PyDict_Contains(self->stores, r_key);
        if (has < 0)
            goto error;
        if (has)
            goto done;
        PyObject *r_entry = PyDict_GetItemWithError(self->open, r_key); /* borrowed */
        if (r_entry == NULL) {
            if (PyErr_Occurred())
                goto error;
            goto done;
        }
        if (!PyTuple_CheckExact(r_entry) || PyTuple_GET_SIZE(r_entry) < 7 ||
            PyTuple_GET_ITEM(r_entry, 6) != Py_False)
            goto done; /* an eager send leaves open: StreamEncoder._ret does that */
        long long end = us_of(r_t - self->t0);
        r_dt = end - prev_us;
        prev_us = end;
        r = 1;
    }
    else if (n != 0)
        goto done;

    PyObject *desc = PyDict_GetItemWithError(self->descs, key); /* borrowed */
    if (desc == NULL) {
        if (PyErr_Occurred())
            goto error;
        goto done;
    }
    if (!PyTuple_CheckExact(desc) || PyTuple_GET_SIZE(desc) < 9)
        goto done;
    PyObject *did = PyTuple_GET_ITEM(desc, 0), *skey = PyTuple_GET_ITEM(desc, 2);
    if (skey == Py_None || PyTuple_GET_ITEM(desc, 3) != Py_None ||
        PyTuple_GET_ITEM(desc, 8) != Py_None || !PyLong_CheckExact(did))
        goto done;
    int defined = PySet_Contains(self->descs_defined, did);
    if (defined < 0)
        goto error;
    if (!defined)
        goto done;
    Py_INCREF(desc); /* held across the calls below */
    Py_INCREF(skey);
    PyObject *expected_obj = PyDict_GetItemWithError(self->seqs, skey);
    long long expected = 0;
    if (expected_obj == NULL) {
        if (PyErr_Occurred())
            goto error_desc;
    }
    else {
        if (!PyLong_CheckExact(expected_obj))
            goto done_desc;
        expected = PyLong_AsLongLong(expected_obj);
        if (expected == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto done_desc;
        }
    }
    if (seq_obj != Py_None) {
        if (!PyLong_CheckExact(seq_obj))
            goto done_desc;
        long long seq = PyLong_AsLongLong(seq_obj);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            goto done_desc;
        }
        if (seq != expected)
            goto done_desc;
    }
    if (oid != last + 1)
        goto done_desc;

    /* -- what can fail, before anything changes -- */
    long long did_v = PyLong_AsLongLong(did);
    long long us = us_of(t - self->t0);
    char line[128];
    int size;
    if (k)
        size = snprintf(line, sizeof line, "[\"k\",%lld,%lld]\n[\"o\",%lld,%lld]\n", k_dt,
                        k_dur, us - prev_us, did_v);
    else if (r)
        size = snprintf(line, sizeof line, "[\"r\",%lld]\n[\"o\",%lld,%lld]\n", r_dt,
                        us - prev_us, did_v);
    else
        size = snprintf(line, sizeof line, "[\"o\",%lld,%lld]\n", us - prev_us, did_v);
    if (size < 0 || (size_t)size >= sizeof line)
        goto done_desc;
    data = PyBytes_FromStringAndSize(line, size);
    next_seq = PyLong_FromLongLong(expected + 1);
    entry = Py_BuildValue("(LLOLOOO)", oid, us, did, expected, Py_None, is_async,
                          PyTuple_GET_ITEM(desc, 5));
    if (data == NULL || next_seq == NULL || entry == NULL)
        goto error_desc;

    /* -- the change -- */
    if (k) {
        PyObject *r = PyObject_CallMethodNoArgs(tail, s_popleft);
        Py_XDECREF(r);
        r = r ? PyObject_CallMethodNoArgs(tail, s_popleft) : NULL;
        if (r == NULL)
            goto error_desc;
        Py_DECREF(r);
        if (wid >= self->next_id)
            self->next_id = wid + 1;
        /* its op record was the last one: neither issued nor dropped yet */
        PyObject *op_key = PyTuple_GET_ITEM(issued, 0);
        if (PyDict_DelItem(self->open, op_key) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError))
                goto error_desc;
            PyErr_Clear();
        }
    }
    if (r) {
        PyObject *popped = PyObject_CallMethodNoArgs(tail, s_popleft);
        if (popped == NULL)
            goto error_desc;
        Py_DECREF(popped);
        if (PySet_Add(self->issued, PyTuple_GET_ITEM(ret, 0)) < 0)
            goto error_desc;
    }
    if (PyDict_SetItem(self->seqs, skey, next_seq) < 0 ||
        PyDict_SetItem(self->open, args[0], entry) < 0)
        goto error_desc;
    self->us = us;
    self->last = oid;
    self->last_tid = tid;
    self->last_sid = sid;
    self->ops_before += 1;
    if (oid >= self->next_id)
        self->next_id = oid + 1;
    PyObject *sink = self->sink;
    Py_INCREF(sink); /* held while it runs */
    PyObject *wrote = PyObject_CallOneArg(sink, data);
    Py_DECREF(sink);
    if (wrote == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_OSError))
            goto error_desc;
        /* as StreamEncoder.op: the stream stops writing, the job goes on */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *r = PyObject_CallMethodOneArg((PyObject *)self, s_failed, value);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (r == NULL)
            goto error_desc;
        Py_DECREF(r);
    }
    else {
        Py_DECREF(wrote);
        self->due -= PyBytes_GET_SIZE(data);
    }
    result = Py_True;

done_desc:
    Py_DECREF(desc);
    Py_DECREF(skey);
done:
    Py_XDECREF(issued);
    Py_XDECREF(ret);
    Py_XDECREF(data);
    Py_XDECREF(entry);
    Py_XDECREF(next_seq);
    if (call_lock(lock, s_release) < 0)
        result = NULL;
    Py_DECREF(lock);
    Py_DECREF(tail);
    Py_XINCREF(result);
    return result;

error_desc:
    Py_DECREF(desc);
    Py_DECREF(skey);
error:
    Py_XDECREF(issued);
    Py_XDECREF(ret);
    Py_XDECREF(data);
    Py_XDECREF(entry);
    Py_XDECREF(next_seq);
    {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        call_lock(lock, s_release);
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(lock);
    Py_DECREF(tail);
    return NULL;
}

static PyMethodDef core_methods[] = {
    {"op_hot", (PyCFunction)(void (*)(void))core_op_hot, METH_FASTCALL,
     "op_hot(oid, t, tid, key, seq, is_async, sid) -> bool: StreamEncoder.op of a "
     "collective in the steady state, or False (nothing done) for anything else."},
    {NULL, NULL, 0, NULL},
};

#define OBJ(name, field) {name, T_OBJECT, offsetof(Core, field), 0, NULL}
#define LL(name, field) {name, T_LONGLONG, offsetof(Core, field), 0, NULL}
static PyMemberDef core_members[] = {
    OBJ("lock", lock),
    OBJ("tail", tail),
    OBJ("open", open),
    OBJ("_descs", descs),
    OBJ("_descs_defined", descs_defined),
    OBJ("seqs", seqs),
    OBJ("_sink", sink),
    OBJ("waits", waits),
    OBJ("issued", issued),
    OBJ("stores", stores),
    LL("t0", t0),
    LL("_us", us),
    LL("_last", last),
    LL("_last_sid", last_sid),
    LL("next_id", next_id),
    LL("ops_before", ops_before),
    LL("_due", due),
    {"_last_tid", T_ULONGLONG, offsetof(Core, last_tid), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_doc, "The hot fields of a stream encoder, and op_hot() over them."},
    {Py_tp_traverse, core_traverse},
    {Py_tp_clear, core_clear},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_methods, core_methods},
    {Py_tp_members, core_members},
    {0, NULL},
};

static PyType_Spec core_spec = {
    "dl2._speedups.EncoderCore",
    sizeof(Core),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    core_slots,
};

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(kinds, cache, ids, fallback, USER, THIRD, API, MAX_FRAMES, MAX_WALK): the "
     "caches to read and the Python capture to call on a miss."},
    {"capture", capture, METH_O,
     "capture(frame) -> (api, stack id), as dl2.record.stack's Python capture."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups",
    "The recorder's stack walk and stream encoder's hot path, in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    s_acquire = PyUnicode_InternFromString("acquire");
    s_release = PyUnicode_InternFromString("release");
    s_popleft = PyUnicode_InternFromString("popleft");
    s_failed = PyUnicode_InternFromString("_failed");
    if (s_acquire == NULL || s_release == NULL || s_popleft == NULL || s_failed == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *core = PyType_FromSpec(&core_spec);
    if (core == NULL || PyModule_AddObject(m, "EncoderCore", core) < 0) {
        Py_XDECREF(core);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
