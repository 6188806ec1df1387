/* Outrider's native kernels, built by the package build as `runtime._native`.
 *
 * Filled in by the speculative-decoding work: the per-row distribution transform
 * (temperature, top-k, top-p, min-p, softmax) and the verify step, in place on float32
 * logits. Until then the module only reports its version.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *native_version(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(1);
}

static PyMethodDef native_methods[] = {
    {"version", native_version, METH_NOARGS, "ABI version of the native kernels."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "runtime._native", "Outrider's native kernels.", -1, native_methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
