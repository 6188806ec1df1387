/* The Python face of step.h: `runtime._native.Stepper`, one per llama context.
 *
 *   Stepper(ctx, n_vocab, capacity, decode_fn, get_logits_fn, eog_flags)
 *   step(entries) -> (rc, results | None)        one batched decode and its sampling
 *   run(entries, max_steps, max_seconds, stop_on_finish, doorbell=0)
 *       -> (rc, steps, [(tokens, err)])
 *                                                 decode steps back to back (plain decoding)
 *   draft(slot, pos, k, cfg, greedy, p_min, stop_on_eog, q_out, feed) -> (tokens, n_eval, rc, err)
 *   profile(on)                                   keep the clocks below (off by default)
 *   timings() -> (decode_wall, decode_cpu, sample_wall, n_decodes)
 *
 * ctx and the two functions are addresses (ints) from llama-cpp-python's loaded libllama;
 * eog_flags is n_vocab bytes (1: end of generation). An entry of `step` is one decoding
 * sequence, in batch order:
 *
 *   (slot, pos, fed, cfg, q[, mask])
 *     fed  an int: the one token to decode (one output row), or a tuple (t, x1..xk): the
 *          token and k drafts to verify (k + 1 output rows)
 *     cfg  None: the caller samples this entry's rows itself (from llama_get_logits);
 *          else (mode, temperature, top_k, top_p, min_p, rng) with mode 0 greedy,
 *          1 leviathan, 2 greedy_match and rng a numpy BitGenerator's capsule (or None
 *          at temperature 0)
 *     q    None, or the draft's distributions (k, nq) float64 for a leviathan round
 *     mask None, or a constraint's mask for the one fed token's row (TokenMask.step_form):
 *          (allows, ids, n_vocab) with ids an ascending int64 array of the allowed
 *          tokens (allows true) or the refused ones, and every token at or past n_vocab
 *          refused; the row is masked before it is sampled, as Sampler.prepared does
 *
 * Its result: None (cfg None), a token id (one fed token), (accepted, tokens) (a round),
 * or a negative int (OR_ERR_*: the entry's rows could not be sampled; OR_ERR_CONSTRAINT:
 * the mask left nothing to sample). rc is llama_decode's code; results is None unless it
 * is 0. The decode and the sampling run without the GIL.
 *
 * `run` is `step` repeated without coming back to Python, for sequences that only decode
 * and are sampled here: each entry (slot, pos, token, cfg, remaining, stop_on_eog) feeds
 * its sampled token to the next decode until it has taken `remaining` tokens or sampled an
 * end-of-generation token (with stop_on_eog); the run ends when none is left, after
 * max_steps decodes, once max_seconds have passed (checked after each decode), at the
 * first sequence that ends when stop_on_finish, once the int32 at address `doorbell` is
 * non-zero (checked after each decode: another thread rang it, a request or a cancel came
 * in; 0: no doorbell), or at a decode that fails (rc; the steps before it stand). Each
 * result is the tokens sampled and 0, or an OR_ERR_* code after them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* verify.h's whole-row kernels are outrider_native.c's; gcc's constant propagation of
 * or_transform's NULL float32 output trips a false -Wnonnull. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wnonnull"
#endif
#include "step.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* One sequence of a run: where it is, its sampling, how many tokens it may still take. */
typedef struct {
    int32_t slot, pos, token, remaining, count, err, stop_on_eog, active;
    or_seq_cfg cfg;
} or_runner;

/* A run: its sequences, their tokens (m rows of max_steps), its limits and its outcome.
 * `entries` (the Python list) keeps the generators alive while it runs. */
typedef struct or_run {
    or_runner *r;
    int32_t *out;
    Py_ssize_t m;
    int max_steps, stop_on_finish, steps;
    double max_seconds;
    const volatile int32_t *doorbell; /* NULL: none */
    int32_t rc;
    PyObject *entries;
} or_run;

typedef struct {
    int32_t slot, pos, first, n_fed, row;
    int native, have_q, have_mask;
    size_t nq;
    or_seq_cfg cfg;
    Py_buffer qv, mv; /* mv: the mask's ids */
    or_mask mask;
    int64_t result;
} or_entry;

typedef struct {
    PyObject_HEAD
    or_decoder dec;
    int32_t n_vocab;
    uint8_t *eog;
    double *p, *qpad, *u;
    float *masked; /* a masked row (n_vocab floats) */
    int32_t *out, *drafts; /* drafts: the fed tokens as given (the batch may hold stand-ins) */
    or_entry *entries;
    size_t n_entries_cap;
    PyObject *keep; /* the eog bytes object */
    or_step_clock clock;
} StepperObject;

static void stepper_dealloc(StepperObject *self) {
    PyMem_Free(self->dec.token);
    PyMem_Free(self->dec.pos);
    PyMem_Free(self->dec.n_seq_id);
    PyMem_Free(self->dec.seq_id);
    PyMem_Free(self->dec.seq_ptr);
    PyMem_Free(self->dec.logits);
    PyMem_Free(self->p);
    PyMem_Free(self->qpad);
    PyMem_Free(self->u);
    PyMem_Free(self->masked);
    PyMem_Free(self->out);
    PyMem_Free(self->drafts);
    PyMem_Free(self->entries);
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int stepper_init(StepperObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"ctx", "n_vocab", "capacity", "decode_fn", "get_logits_fn",
                             "eog_flags", NULL};
    unsigned long long ctx, decode, get_logits;
    int n_vocab, capacity;
    PyObject *eog;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KiiKKS:Stepper", kwlist, &ctx, &n_vocab,
                                     &capacity, &decode, &get_logits, &eog))
        return -1;
    if (!ctx || !decode || !get_logits || n_vocab <= 0 || capacity <= 0) {
        PyErr_SetString(PyExc_ValueError, "Stepper needs a context, both functions, n_vocab > 0 "
                                          "and capacity > 0");
        return -1;
    }
    if (PyBytes_GET_SIZE(eog) != n_vocab) {
        PyErr_SetString(PyExc_ValueError, "eog_flags must hold n_vocab bytes");
        return -1;
    }
    if (self->dec.token) {
        PyErr_SetString(PyExc_RuntimeError, "Stepper is already initialised");
        return -1;
    }
    size_t c = (size_t)capacity, n = (size_t)n_vocab;
    or_decoder *d = &self->dec;
    d->ctx = (void *)(uintptr_t)ctx;
    d->decode = (or_decode_fn)(uintptr_t)decode;
    d->get_logits = (or_get_logits_fn)(uintptr_t)get_logits;
    d->capacity = capacity;
    d->token = PyMem_Calloc(c, sizeof(int32_t));
    d->pos = PyMem_Calloc(c, sizeof(int32_t));
    d->n_seq_id = PyMem_Calloc(c, sizeof(int32_t));
    d->seq_id = PyMem_Calloc(c, sizeof(int32_t));
    d->seq_ptr = PyMem_Calloc(c, sizeof(int32_t *));
    d->logits = PyMem_Calloc(c, sizeof(int8_t));
    self->p = PyMem_Calloc(n, sizeof(double));
    self->qpad = PyMem_Calloc(n, sizeof(double));
    self->u = PyMem_Calloc(c + 1, sizeof(double));
    self->masked = PyMem_Calloc(n, sizeof(float));
    self->out = PyMem_Calloc(c + 1, sizeof(int32_t));
    self->drafts = PyMem_Calloc(c + 1, sizeof(int32_t));
    if (!d->token || !d->pos || !d->n_seq_id || !d->seq_id || !d->seq_ptr || !d->logits ||
        !self->p || !self->qpad || !self->u || !self->masked || !self->out || !self->drafts) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < c; i++) {
        d->n_seq_id[i] = 1;
        d->seq_ptr[i] = &d->seq_id[i];
    }
    self->n_vocab = n_vocab;
    d->clock = &self->clock;
    Py_INCREF(eog);
    self->keep = eog;
    self->eog = (uint8_t *)PyBytes_AS_STRING(eog);
    return 0;
}

/* (mode, temperature, top_k, top_p, min_p, rng capsule or None[, owner]): the owner, the
 * numpy Generator, is there to keep the capsule's BitGenerator alive with the tuple. */
static int parse_cfg(PyObject *obj, or_seq_cfg *c) {
    PyObject *rng, *owner = NULL;
    long long top_k;
    if (!PyTuple_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "cfg must be a tuple");
        return -1;
    }
    if (!PyArg_ParseTuple(obj, "idLddO|O:cfg", &c->mode, &c->st.temperature, &top_k,
                          &c->st.top_p, &c->st.min_p, &rng, &owner))
        return -1;
    c->st.top_k = (int64_t)top_k;
    if (c->mode < OR_STEP_GREEDY || c->mode > OR_STEP_GREEDY_MATCH) {
        PyErr_SetString(PyExc_ValueError, "cfg mode must be 0, 1 or 2");
        return -1;
    }
    if (c->mode != OR_STEP_GREEDY &&
        (!(c->st.temperature > 0.0) || top_k < 0 || !(c->st.top_p > 0.0 && c->st.top_p <= 1.0) ||
         !(c->st.min_p >= 0.0 && c->st.min_p < 1.0))) {
        PyErr_SetString(PyExc_ValueError,
                        "need temperature > 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p < 1");
        return -1;
    }
    c->rng = NULL;
    if (c->mode != OR_STEP_GREEDY) {
        c->rng = (or_bitgen *)PyCapsule_GetPointer(rng, "BitGenerator");
        if (!c->rng) return -1;
    }
    return 0;
}

static void release_entry(or_entry *e) {
    if (e->have_q) PyBuffer_Release(&e->qv);
    if (e->have_mask) PyBuffer_Release(&e->mv);
    e->have_q = e->have_mask = 0;
}

static void release_entries(StepperObject *self, size_t n) {
    for (size_t i = 0; i < n; i++) release_entry(&self->entries[i]);
}

/* (allows, ids, n_vocab) into e->mask, holding the ids' buffer in e->mv. */
static int parse_mask(PyObject *obj, or_entry *e) {
    PyObject *ids;
    int allows;
    Py_ssize_t limit;
    if (!PyTuple_Check(obj) || !PyArg_ParseTuple(obj, "pOn:mask", &allows, &ids, &limit)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "mask must be a tuple");
        return -1;
    }
    if (PyObject_GetBuffer(ids, &e->mv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return -1;
    e->have_mask = 1;
    const char *f = e->mv.format ? e->mv.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (e->mv.ndim != 1 || e->mv.itemsize != 8 || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0)) {
        PyErr_SetString(PyExc_TypeError, "mask ids must be a C-contiguous int64 array");
        return -1;
    }
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "a mask's n_vocab must be >= 0");
        return -1;
    }
    e->mask.allows = allows;
    e->mask.ids = (const int64_t *)e->mv.buf;
    e->mask.n_ids = (size_t)e->mv.shape[0];
    e->mask.limit = (size_t)limit;
    return 0;
}

/* Parse one entry into e and its tokens into the batch from index *n_tokens. */
static int parse_entry(StepperObject *self, PyObject *item, or_entry *e, int32_t *n_tokens,
                       int32_t *n_rows) {
    PyObject *fed, *cfg, *q, *mask;
    e->have_q = e->have_mask = 0;
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 5 || PyTuple_GET_SIZE(item) > 6) {
        PyErr_SetString(PyExc_TypeError, "an entry is (slot, pos, fed, cfg, q[, mask])");
        return -1;
    }
    e->slot = (int32_t)PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
    e->pos = (int32_t)PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
    if (PyErr_Occurred()) return -1;
    fed = PyTuple_GET_ITEM(item, 2);
    cfg = PyTuple_GET_ITEM(item, 3);
    q = PyTuple_GET_ITEM(item, 4);
    mask = PyTuple_GET_SIZE(item) == 6 ? PyTuple_GET_ITEM(item, 5) : Py_None;
    or_decoder *d = &self->dec;
    int32_t i = *n_tokens;
    e->first = i;
    e->row = *n_rows;
    if (PyLong_Check(fed)) {
        if (i >= d->capacity) goto overflow;
        long t = PyLong_AsLong(fed);
        if (t < 0 || t >= self->n_vocab) goto bad_token;
        or_decoder_put(d, i, (int32_t)t, e->pos, e->slot, 1);
        e->n_fed = 1;
    } else if (PyTuple_Check(fed) && PyTuple_GET_SIZE(fed) >= 2) {
        Py_ssize_t m = PyTuple_GET_SIZE(fed);
        if (i + m > d->capacity) goto overflow;
        for (Py_ssize_t j = 0; j < m; j++) {
            long t = PyLong_AsLong(PyTuple_GET_ITEM(fed, j));
            if (t == -1 && PyErr_Occurred()) return -1;
            /* a draft model's id may lie past the target's vocabulary: never evaluated
             * beyond its rejection, but the batch needs a valid id */
            if (t < 0 || t > INT32_MAX || (j == 0 && t >= self->n_vocab)) goto bad_token;
            self->drafts[i + j] = (int32_t)t;
            or_decoder_put(d, i + (int32_t)j, t < self->n_vocab ? (int32_t)t : 0,
                           e->pos + (int32_t)j, e->slot, 1);
        }
        e->n_fed = (int32_t)m;
    } else {
        PyErr_SetString(PyExc_TypeError, "fed must be a token or a tuple of 2 or more tokens");
        return -1;
    }
    *n_tokens = i + e->n_fed;
    *n_rows += e->n_fed;
    e->native = cfg != Py_None;
    if (e->native && parse_cfg(cfg, &e->cfg) != 0) return -1;
    if (q != Py_None) {
        if (PyObject_GetBuffer(q, &e->qv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return -1;
        e->have_q = 1;
        const char *f = e->qv.format ? e->qv.format : "B";
        if (*f == '@' || *f == '=' || *f == '<') f++;
        if (e->qv.ndim != 2 || e->qv.itemsize != 8 || strcmp(f, "d") != 0 ||
            e->qv.shape[0] < e->n_fed - 1 || e->qv.shape[1] <= 0) {
            PyErr_SetString(PyExc_TypeError, "q must be a C-contiguous (k, n) float64 array");
            return -1;
        }
        e->nq = (size_t)e->qv.shape[1];
    }
    if (mask != Py_None) {
        /* a round's rows each need the grammar's state after the drafts before them:
         * Python verifies those (SamplingVerifier) */
        if (!e->native || e->n_fed != 1) {
            PyErr_SetString(PyExc_ValueError, "a mask needs a cfg and one fed token");
            return -1;
        }
        if (parse_mask(mask, e) != 0) return -1;
    }
    return 0;
overflow:
    PyErr_Format(PyExc_ValueError, "batch overflow: more than %d tokens", (int)d->capacity);
    return -1;
bad_token:
    PyErr_Format(PyExc_ValueError, "a token outside the vocabulary (%d)", (int)self->n_vocab);
    return -1;
}

/* Sample (or verify) one entry from the rows; no GIL. */
static void sample_entry(StepperObject *self, or_entry *e, const float *rows) {
    const size_t n = (size_t)self->n_vocab;
    const float *x = rows + (size_t)e->row * n;
    if (e->n_fed == 1) {
        e->result = e->have_mask
                        ? or_sample_masked(x, n, &e->mask, &e->cfg, self->masked, self->p)
                        : or_sample_row(x, n, &e->cfg, self->p);
        return;
    }
    const size_t k = (size_t)e->n_fed - 1;
    e->result = or_verify_rows(x, n, self->drafts + e->first + 1, k,
                               e->have_q ? (const double *)e->qv.buf : NULL, e->nq, &e->cfg,
                               self->p, self->qpad, self->u, self->out + e->first);
}

static PyObject *entry_result(StepperObject *self, const or_entry *e) {
    if (!e->native) Py_RETURN_NONE;
    if (e->result < 0 || e->n_fed == 1) return PyLong_FromLongLong((long long)e->result);
    const int32_t *out = self->out + e->first;
    PyObject *tokens = PyTuple_New((Py_ssize_t)e->result + 1);
    if (!tokens) return NULL;
    for (int64_t i = 0; i <= e->result; i++) {
        PyObject *t = PyLong_FromLong((long)out[i]);
        if (!t) {
            Py_DECREF(tokens);
            return NULL;
        }
        PyTuple_SET_ITEM(tokens, (Py_ssize_t)i, t);
    }
    return Py_BuildValue("(LN)", (long long)e->result, tokens);
}

static PyObject *stepper_step(StepperObject *self, PyObject *entries_obj) {
    if (!self->dec.token) {
        PyErr_SetString(PyExc_RuntimeError, "Stepper is not initialised");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(entries_obj, "entries must be a list");
    if (!seq) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    if ((size_t)m > self->n_entries_cap) {
        or_entry *grown = PyMem_Realloc(self->entries, (size_t)m * sizeof *grown);
        if (!grown) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        self->entries = grown;
        self->n_entries_cap = (size_t)m;
    }
    int32_t n_tokens = 0, n_rows = 0;
    size_t parsed = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (parse_entry(self, PySequence_Fast_GET_ITEM(seq, i), &self->entries[i], &n_tokens,
                        &n_rows) != 0) {
            release_entry(&self->entries[i]);
            release_entries(self, parsed);
            Py_DECREF(seq);
            return NULL;
        }
        parsed++;
    }
    Py_DECREF(seq);
    int32_t rc = 0;
    if (n_tokens > 0) {
        float *rows = NULL;
        Py_BEGIN_ALLOW_THREADS
        rc = or_decoder_run(&self->dec, n_tokens, &rows);
        if (rc == 0) {
            or_step_clock *clock = self->dec.clock;
            or_tick t = or_tick_start(clock, 0);
            for (size_t i = 0; i < parsed; i++)
                if (self->entries[i].native) sample_entry(self, &self->entries[i], rows);
            or_tick_add(clock, t, &clock->sample_wall, NULL);
        }
        Py_END_ALLOW_THREADS
    }
    release_entries(self, parsed);
    if (rc != 0) return Py_BuildValue("(iO)", (int)rc, Py_None);
    PyObject *results = PyList_New((Py_ssize_t)parsed);
    if (!results) return NULL;
    for (size_t i = 0; i < parsed; i++) {
        PyObject *r = entry_result(self, &self->entries[i]);
        if (!r) {
            Py_DECREF(results);
            return NULL;
        }
        PyList_SET_ITEM(results, (Py_ssize_t)i, r);
    }
    return Py_BuildValue("(iN)", 0, results);
}

/* The run itself: decodes back to back, no Python (see the module comment). */
static void run_loop(or_decoder *d, const uint8_t *eog, size_t n, double *scratch,
                     or_run *job) {
    or_runner *r = job->r;
    const double t_start = or_now(CLOCK_MONOTONIC);
    job->rc = 0;
    job->steps = 0;
    while (job->steps < job->max_steps) {
        int32_t n_tokens = 0;
        for (Py_ssize_t i = 0; i < job->m; i++)
            if (r[i].active) or_decoder_put(d, n_tokens++, r[i].token, r[i].pos, r[i].slot, 1);
        float *rows = NULL;
        job->rc = or_decoder_run(d, n_tokens, &rows);
        if (job->rc != 0) break;
        job->steps++;
        or_tick t = or_tick_start(d->clock, 0);
        int finished = 0, left = 0;
        int32_t row = 0;
        for (Py_ssize_t i = 0; i < job->m; i++) {
            or_runner *e = &r[i];
            if (!e->active) continue;
            int64_t tok = or_sample_row(rows + (size_t)row++ * n, n, &e->cfg, scratch);
            if (tok < 0) {
                e->err = (int32_t)tok;
                e->active = 0;
                finished = 1;
                continue;
            }
            job->out[(size_t)i * (size_t)job->max_steps + (size_t)e->count++] = (int32_t)tok;
            if (--e->remaining == 0 || (e->stop_on_eog && eog[tok])) {
                e->active = 0;
                finished = 1;
                continue;
            }
            e->token = (int32_t)tok;
            e->pos++;
            left++;
        }
        or_tick_add(d->clock, t, &d->clock->sample_wall, NULL);
        if (!left || (finished && job->stop_on_finish) || (job->doorbell && *job->doorbell) ||
            or_now(CLOCK_MONOTONIC) - t_start >= job->max_seconds)
            break;
    }
}

static void run_free(or_run *job) {
    PyMem_RawFree(job->r);
    PyMem_RawFree(job->out);
    Py_CLEAR(job->entries);
    job->r = NULL;
    job->out = NULL;
}

/* Parse run(...)'s arguments into *job; -1 with an exception set. */
static int run_parse(StepperObject *self, PyObject *args, or_run *job) {
    PyObject *entries_obj;
    Py_ssize_t doorbell = 0;
    memset(job, 0, sizeof *job);
    if (!PyArg_ParseTuple(args, "Oidp|n:run", &entries_obj, &job->max_steps, &job->max_seconds,
                          &job->stop_on_finish, &doorbell))
        return -1;
    job->doorbell = (const volatile int32_t *)(uintptr_t)doorbell;
    if (!self->dec.token) {
        PyErr_SetString(PyExc_RuntimeError, "Stepper is not initialised");
        return -1;
    }
    if (job->max_steps < 1) {
        PyErr_SetString(PyExc_ValueError, "run needs max_steps >= 1");
        return -1;
    }
    PyObject *seq = PySequence_Fast(entries_obj, "entries must be a list");
    if (!seq) return -1;
    job->entries = seq;
    job->m = PySequence_Fast_GET_SIZE(seq);
    if (job->m < 1 || job->m > self->dec.capacity) {
        PyErr_SetString(PyExc_ValueError, "run needs between 1 and capacity entries");
        run_free(job);
        return -1;
    }
    /* raw allocations: the run writes them without the GIL */
    job->r = PyMem_RawCalloc((size_t)job->m, sizeof *job->r);
    job->out = PyMem_RawMalloc((size_t)job->m * (size_t)job->max_steps * sizeof *job->out);
    if (!job->r || !job->out) {
        run_free(job);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < job->m; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *cfg;
        or_runner *e = &job->r[i];
        if (!PyTuple_Check(item) ||
            !PyArg_ParseTuple(item, "iiiOip:run entry", &e->slot, &e->pos, &e->token, &cfg,
                              &e->remaining, &e->stop_on_eog) ||
            parse_cfg(cfg, &e->cfg) != 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError,
                                "a run entry is (slot, pos, token, cfg, remaining, stop_on_eog)");
            run_free(job);
            return -1;
        }
        if (e->token < 0 || e->token >= self->n_vocab || e->remaining < 1) {
            PyErr_SetString(PyExc_ValueError, "a run entry needs a token in the vocabulary and "
                                              "remaining >= 1");
            run_free(job);
            return -1;
        }
        e->active = 1;
    }
    return 0;
}

/* (rc, steps, [(tokens, err)]) of a finished run, which is then freed. */
static PyObject *run_results(or_run *job) {
    PyObject *results = PyList_New(job->m);
    for (Py_ssize_t i = 0; results && i < job->m; i++) {
        const or_runner *e = &job->r[i];
        PyObject *tokens = PyTuple_New(e->count);
        for (int32_t j = 0; tokens && j < e->count; j++) {
            PyObject *v = PyLong_FromLong(
                (long)job->out[(size_t)i * (size_t)job->max_steps + (size_t)j]);
            if (!v) Py_CLEAR(tokens);
            else PyTuple_SET_ITEM(tokens, j, v);
        }
        PyObject *pair = tokens ? Py_BuildValue("(Ni)", tokens, (int)e->err) : NULL;
        if (!pair) Py_CLEAR(results);
        else PyList_SET_ITEM(results, i, pair);
    }
    PyObject *out = results ? Py_BuildValue("(iiN)", (int)job->rc, job->steps, results) : NULL;
    run_free(job);
    return out;
}

static PyObject *stepper_run(StepperObject *self, PyObject *args) {
    or_run job;
    if (run_parse(self, args, &job) != 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    run_loop(&self->dec, self->eog, (size_t)self->n_vocab, self->p, &job);
    Py_END_ALLOW_THREADS
    return run_results(&job);
}

static PyObject *stepper_draft(StepperObject *self, PyObject *args) {
    int slot, pos, greedy, stop_on_eog;
    Py_ssize_t k;
    double p_min;
    PyObject *cfg_obj, *q_obj, *feed_obj;
    if (!PyArg_ParseTuple(args, "iinOpdpOO:draft", &slot, &pos, &k, &cfg_obj, &greedy, &p_min,
                          &stop_on_eog, &q_obj, &feed_obj))
        return NULL;
    if (!self->dec.token) {
        PyErr_SetString(PyExc_RuntimeError, "Stepper is not initialised");
        return NULL;
    }
    if (k < 1 || k > self->dec.capacity) {
        PyErr_SetString(PyExc_ValueError, "draft k must be between 1 and the batch capacity");
        return NULL;
    }
    or_seq_cfg cfg;
    if (parse_cfg(cfg_obj, &cfg) != 0) return NULL;
    /* the feed goes into self->drafts (capacity ints), untouched by the round itself */
    if (!PyTuple_Check(feed_obj) || PyTuple_GET_SIZE(feed_obj) + k > self->dec.capacity) {
        PyErr_SetString(PyExc_ValueError, "feed must be a tuple, with k, within the batch");
        return NULL;
    }
    Py_ssize_t n_feed = PyTuple_GET_SIZE(feed_obj);
    for (Py_ssize_t i = 0; i < n_feed; i++) {
        long t = PyLong_AsLong(PyTuple_GET_ITEM(feed_obj, i));
        if (t == -1 && PyErr_Occurred()) return NULL;
        if (t < 0 || t >= self->n_vocab) {
            PyErr_SetString(PyExc_ValueError, "a feed token outside the vocabulary");
            return NULL;
        }
        self->drafts[i] = (int32_t)t;
    }
    Py_buffer qv;
    int have_q = 0;
    const size_t n = (size_t)self->n_vocab;
    if (cfg.mode != OR_STEP_GREEDY) {
        if (q_obj == Py_None ||
            PyObject_GetBuffer(q_obj, &qv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "q_out is needed above temperature 0");
            return NULL;
        }
        have_q = 1;
        const char *f = qv.format ? qv.format : "B";
        if (*f == '@' || *f == '=' || *f == '<') f++;
        if (qv.ndim != 2 || qv.itemsize != 8 || strcmp(f, "d") != 0 || qv.shape[0] < k ||
            (size_t)qv.shape[1] != n) {
            PyBuffer_Release(&qv);
            PyErr_SetString(PyExc_TypeError, "q_out must be a writable (k, n_vocab) float64 array");
            return NULL;
        }
    }
    size_t n_eval = 0;
    int32_t rc = 0;
    int64_t got;
    Py_BEGIN_ALLOW_THREADS
    got = or_draft_round(&self->dec, n, slot, pos, self->drafts, (size_t)n_feed, (size_t)k,
                         &cfg, greedy, p_min,
                         stop_on_eog ? self->eog : NULL, have_q ? (double *)qv.buf : NULL,
                         self->out, &n_eval, &rc);
    Py_END_ALLOW_THREADS
    if (have_q) PyBuffer_Release(&qv);
    int err = got < 0 ? (int)got : 0;
    Py_ssize_t count = got < 0 ? 0 : (Py_ssize_t)got;
    PyObject *tokens = PyTuple_New(count);
    if (!tokens) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyLong_FromLong((long)self->out[i]);
        if (!t) {
            Py_DECREF(tokens);
            return NULL;
        }
        PyTuple_SET_ITEM(tokens, i, t);
    }
    return Py_BuildValue("(Nnii)", tokens, (Py_ssize_t)n_eval, (int)rc, err);
}

static PyObject *stepper_timings(StepperObject *self, PyObject *noargs) {
    (void)noargs;
    const or_step_clock *c = &self->clock;
    return Py_BuildValue("(dddL)", c->decode_wall, c->decode_cpu, c->sample_wall,
                         (long long)c->n_decode);
}

static PyObject *stepper_profile(StepperObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    self->clock.on = v;
    Py_RETURN_NONE;
}

static PyMethodDef stepper_methods[] = {
    {"step", (PyCFunction)stepper_step, METH_O,
     "step(entries) -> (rc, results or None): fill the batch, llama_decode, sample."},
    {"run", (PyCFunction)stepper_run, METH_VARARGS,
     "run(entries, max_steps, max_seconds, stop_on_finish, doorbell=0) -> (rc, steps, "
     "[(tokens, err)])"},
    {"draft", (PyCFunction)stepper_draft, METH_VARARGS,
     "draft(slot, pos, k, cfg, greedy, p_min, stop_on_eog, q_out, feed) -> (tokens, n_eval, rc, "
     "err): a draft model's round (feed: tokens to decode first)."},
    {"profile", (PyCFunction)stepper_profile, METH_O,
     "profile(on): keep the decode and sampling clocks (off by default: they cost a system "
     "call each)."},
    {"timings", (PyCFunction)stepper_timings, METH_NOARGS,
     "timings() -> (decode_wall, decode_cpu, sample_wall, n_decodes) in seconds."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepperType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "runtime._native.Stepper",
    .tp_basicsize = sizeof(StepperObject),
    .tp_dealloc = (destructor)stepper_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The per-step decode path over one llama context (native/step.h).",
    .tp_methods = stepper_methods,
    .tp_init = (initproc)stepper_init,
    .tp_new = PyType_GenericNew,
};

/* Called from PyInit__native. */
int or_stepper_register(PyObject *module) {
    if (PyType_Ready(&StepperType) < 0) return -1;
    if (PyModule_AddIntConstant(module, "STEP_ABI", 3) < 0) return -1;
    Py_INCREF(&StepperType);
    if (PyModule_AddObject(module, "Stepper", (PyObject *)&StepperType) < 0) {
        Py_DECREF(&StepperType);
        return -1;
    }
    return 0;
}
