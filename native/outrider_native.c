/* Outrider's native kernels, built by the package build as `runtime._native`.
 *
 * The Python glue only: arguments arrive as buffers (numpy arrays, or a numpy view over
 * the float32 pointer from llama_get_logits_ith) and are read in place, never copied into
 * Python objects; the kernels run with the GIL released. The math lives in sampling.h,
 * verify.h and ngram.h; runtime/native.py is the Python face (with the numpy fallback).
 *
 *   transform(logits_f32, out_f64_or_f32, temperature, top_k, top_p, min_p) -> kept count
 *   sample(probs_f64_or_f32, u) -> token id
 *   verify(drafts_i32, p, q_or_None, u_f64_or_None, mode) -> (accepted, tokens tuple)
 *   ngram_lookup(tokens_i32, ngram_min, ngram_max, k) -> list of draft ids
 *   version() -> ABI version
 *   Stepper: the per-step decode path over one llama context (stepper.c, step.h)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ngram.h"
#include "sampling.h"
#include "verify.h"

#define OR_ABI_VERSION 2

int or_stepper_register(PyObject *module); /* stepper.c */

/* Raised for broken logits (NaN, nothing finite); runtime/native.py turns it into the same
 * SettingsError the numpy path raises. Created once at import, never changed. */
static PyObject *LogitsError = NULL;

/* 'd', 'f' or 'i' (4-byte int) for a native-order buffer of that type, else 0. */
static char buffer_kind(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=') f++;
#if PY_LITTLE_ENDIAN
    else if (*f == '<') f++;
#endif
    if (f[0] == '\0' || f[1] != '\0') return 0;
    if (f[0] == 'd' && v->itemsize == 8) return 'd';
    if (f[0] == 'f' && v->itemsize == 4) return 'f';
    if ((f[0] == 'i' || f[0] == 'l') && v->itemsize == 4) return 'i';
    return 0;
}

/* A C-contiguous buffer of `ndim` dimensions whose kind is one of `kinds`. */
static int get_buffer(PyObject *obj, Py_buffer *v, int ndim, const char *kinds, int writable,
                      const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) != 0) return -1;
    char kind = buffer_kind(v);
    if (v->ndim != ndim || kind == 0 || strchr(kinds, kind) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous %d-D array of %s", name, ndim,
                     strcmp(kinds, "i") == 0 ? "int32" : (strcmp(kinds, "f") == 0 ? "float32"
                                                                : "float64 or float32"));
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static PyObject *native_version(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(OR_ABI_VERSION);
}

static PyObject *native_transform(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *logits_obj, *out_obj;
    or_settings st;
    long long top_k;
    if (!PyArg_ParseTuple(args, "OOdLdd:transform", &logits_obj, &out_obj, &st.temperature,
                          &top_k, &st.top_p, &st.min_p))
        return NULL;
    st.top_k = (int64_t)top_k;
    if (!(st.temperature >= 0.0) || top_k < 0 || !(st.top_p > 0.0 && st.top_p <= 1.0) ||
        !(st.min_p >= 0.0 && st.min_p < 1.0)) {
        PyErr_SetString(PyExc_ValueError,
                        "need temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p < 1");
        return NULL;
    }
    Py_buffer lv, ov;
    if (get_buffer(logits_obj, &lv, 1, "f", 0, "logits") != 0) return NULL;
    if (get_buffer(out_obj, &ov, 1, "df", 1, "out") != 0) {
        PyBuffer_Release(&lv);
        return NULL;
    }
    Py_ssize_t n = lv.shape[0];
    if (n == 0 || ov.shape[0] != n) {
        PyBuffer_Release(&lv);
        PyBuffer_Release(&ov);
        PyErr_SetString(PyExc_ValueError, "logits must be one non-empty row and out as long");
        return NULL;
    }
    double *o64 = buffer_kind(&ov) == 'd' ? (double *)ov.buf : NULL;
    float *o32 = o64 ? NULL : (float *)ov.buf;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = or_transform((const float *)lv.buf, (size_t)n, &st, o64, o32);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&lv);
    PyBuffer_Release(&ov);
    if (rc == OR_ERR_NAN) {
        PyErr_SetString(LogitsError,
                        "the model produced NaN logits; the weights or the context are broken");
        return NULL;
    }
    if (rc == OR_ERR_ALL_INF) {
        PyErr_SetString(LogitsError, "every logit is -inf: nothing can be sampled");
        return NULL;
    }
    if (rc < 0) return PyErr_NoMemory();
    return PyLong_FromLongLong((long long)rc);
}

static PyObject *native_sample(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *probs_obj;
    double u;
    if (!PyArg_ParseTuple(args, "Od:sample", &probs_obj, &u)) return NULL;
    Py_buffer pv;
    if (get_buffer(probs_obj, &pv, 1, "df", 0, "probs") != 0) return NULL;
    size_t n = (size_t)pv.shape[0], idx = 0;
    if (n == 0) {
        PyBuffer_Release(&pv);
        PyErr_SetString(PyExc_ValueError, "probs must not be empty");
        return NULL;
    }
    if (buffer_kind(&pv) == 'd') idx = or_sample_f64((const double *)pv.buf, n, u);
    else idx = or_sample_f32((const float *)pv.buf, n, u);
    PyBuffer_Release(&pv);
    return PyLong_FromSize_t(idx);
}

static int parse_mode(const char *mode) {
    if (strcmp(mode, "leviathan") == 0) return OR_LEVIATHAN;
    if (strcmp(mode, "greedy") == 0) return OR_GREEDY;
    if (strcmp(mode, "greedy_match") == 0) return OR_GREEDY_MATCH;
    return -1;
}

static PyObject *native_verify(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *x_obj, *p_obj, *q_obj, *u_obj;
    const char *mode_name;
    if (!PyArg_ParseTuple(args, "OOOOs:verify", &x_obj, &p_obj, &q_obj, &u_obj, &mode_name))
        return NULL;
    int mode = parse_mode(mode_name);
    if (mode < 0) {
        PyErr_Format(PyExc_ValueError, "unknown verify mode %R (leviathan, greedy, greedy_match)",
                     PyTuple_GET_ITEM(args, 4));
        return NULL;
    }
    Py_buffer xv, pv, qv, uv;
    int have_q = q_obj != Py_None, have_u = u_obj != Py_None;
    int got_x = 0, got_p = 0, got_q = 0, got_u = 0;
    PyObject *result = NULL;
    int32_t *out = NULL;

    if (get_buffer(x_obj, &xv, 1, "i", 0, "drafts") != 0) goto done;
    got_x = 1;
    if (get_buffer(p_obj, &pv, 2, "df", 0, "p") != 0) goto done;
    got_p = 1;
    const size_t k = (size_t)xv.shape[0], n = (size_t)pv.shape[1];
    const char kind = buffer_kind(&pv);
    if ((size_t)pv.shape[0] != k + 1 || n == 0) {
        PyErr_Format(PyExc_ValueError, "p must have k + 1 = %zu non-empty rows", k + 1);
        goto done;
    }
    if (have_q) {
        if (get_buffer(q_obj, &qv, 2, kind == 'd' ? "d" : "f", 0, "q (same type as p)") != 0)
            goto done;
        got_q = 1;
        if ((size_t)qv.shape[0] != k || (size_t)qv.shape[1] != n) {
            PyErr_Format(PyExc_ValueError, "q must be k = %zu rows as wide as p", k);
            goto done;
        }
    }
    if (have_u) {
        if (get_buffer(u_obj, &uv, 1, "d", 0, "u") != 0) goto done;
        got_u = 1;
        if ((size_t)uv.shape[0] < k + 1) {
            PyErr_Format(PyExc_ValueError, "u needs k + 1 = %zu uniform draws", k + 1);
            goto done;
        }
    } else if (mode != OR_GREEDY) {
        PyErr_SetString(PyExc_ValueError, "u (k + 1 uniform draws) is needed unless greedy");
        goto done;
    }
    const int32_t *x = (const int32_t *)xv.buf;
    for (size_t i = 0; i < k; i++) {
        if (x[i] < 0 || (size_t)x[i] >= n) {
            PyErr_Format(PyExc_ValueError, "draft token %d is outside the vocabulary (%zu)",
                         (int)x[i], n);
            goto done;
        }
    }
    out = (int32_t *)PyMem_Malloc((k + 1) * sizeof *out);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t accepted;
    const double *u = got_u ? (const double *)uv.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    if (kind == 'd')
        accepted = or_verify_f64(mode, x, k, (const double *)pv.buf,
                                 got_q ? (const double *)qv.buf : NULL, n, u, out);
    else
        accepted = or_verify_f32(mode, x, k, (const float *)pv.buf,
                                 got_q ? (const float *)qv.buf : NULL, n, u, out);
    Py_END_ALLOW_THREADS
    if (accepted == OR_ERR_ZERO_Q) {
        PyErr_SetString(PyExc_ValueError,
                        "a draft token has zero probability under its draft distribution q");
        goto done;
    }
    PyObject *tokens = PyTuple_New((Py_ssize_t)accepted + 1);
    if (!tokens) goto done;
    for (int64_t i = 0; i <= accepted; i++) {
        PyObject *t = PyLong_FromLong((long)out[i]);
        if (!t) {
            Py_DECREF(tokens);
            goto done;
        }
        PyTuple_SET_ITEM(tokens, (Py_ssize_t)i, t);
    }
    result = Py_BuildValue("(LN)", (long long)accepted, tokens);
done:
    PyMem_Free(out);
    if (got_x) PyBuffer_Release(&xv);
    if (got_p) PyBuffer_Release(&pv);
    if (got_q) PyBuffer_Release(&qv);
    if (got_u) PyBuffer_Release(&uv);
    return result;
}

static PyObject *native_ngram_lookup(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *t_obj;
    Py_ssize_t n_min, n_max, k;
    if (!PyArg_ParseTuple(args, "Onnn:ngram_lookup", &t_obj, &n_min, &n_max, &k)) return NULL;
    if (n_min < 1 || n_max < n_min || k < 0) {
        PyErr_SetString(PyExc_ValueError, "need 1 <= ngram_min <= ngram_max and k >= 0");
        return NULL;
    }
    Py_buffer tv;
    if (get_buffer(t_obj, &tv, 1, "i", 0, "tokens") != 0) return NULL;
    int32_t *out = (int32_t *)PyMem_Malloc(((size_t)k + 1) * sizeof *out);
    if (!out) {
        PyBuffer_Release(&tv);
        return PyErr_NoMemory();
    }
    size_t m;
    Py_BEGIN_ALLOW_THREADS
    m = or_ngram_lookup((const int32_t *)tv.buf, (size_t)tv.shape[0], (size_t)n_min,
                        (size_t)n_max, (size_t)k, out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&tv);
    PyObject *list = PyList_New((Py_ssize_t)m);
    for (size_t i = 0; list && i < m; i++) {
        PyObject *v = PyLong_FromLong((long)out[i]);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    PyMem_Free(out);
    return list;
}

static PyMethodDef native_methods[] = {
    {"version", native_version, METH_NOARGS, "ABI version of the native kernels."},
    {"transform", native_transform, METH_VARARGS,
     "transform(logits_f32, out, temperature, top_k, top_p, min_p) -> kept count\n\n"
     "Writes runtime.kernels.transform's distribution of one row of float32 logits into out\n"
     "(float64 or float32, same length). Raises LogitsError for NaN or no finite logit."},
    {"sample", native_sample, METH_VARARGS,
     "sample(probs, u) -> id: runtime.kernels.sample (inverse CDF with one uniform draw)."},
    {"verify", native_verify, METH_VARARGS,
     "verify(drafts_i32, p, q_or_None, u_or_None, mode) -> (accepted, tokens)\n\n"
     "runtime.verify.verify: p is (k+1, n), q is (k, n) or None (point masses), u has k+1\n"
     "draws; mode is 'leviathan', 'greedy' or 'greedy_match'."},
    {"ngram_lookup", native_ngram_lookup, METH_VARARGS,
     "ngram_lookup(tokens_i32, ngram_min, ngram_max, k) -> draft ids (prompt lookup)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "runtime._native", "Outrider's native kernels.", -1, native_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    LogitsError = PyErr_NewExceptionWithDoc(
        "runtime._native.LogitsError", "Logits that cannot be sampled (NaN, nothing finite).",
        PyExc_ValueError, NULL);
    if (!LogitsError || PyModule_AddObjectRef(m, "LogitsError", LogitsError) < 0) {
        Py_XDECREF(LogitsError);
        Py_DECREF(m);
        return NULL;
    }
    if (or_stepper_register(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
