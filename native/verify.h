/* The speculative verify step, in plain C; runtime/verify.py is the reference.
 *
 * One round: drafts x[0..k), target distributions p[0..k] (k+1 rows of n), draft
 * distributions q[0..k) (or none: a deterministic drafter, q = point mass), and k+1
 * uniform draws u supplied by the caller so that runs are reproducible.
 *
 *   OR_LEVIATHAN     accept x_i iff u_i < min(1, p_i(x_i) / q_i(x_i)); at the first rejection
 *                    draw from norm(max(0, p_i - q_i)) with u_k; all accepted: draw from p_k.
 *                    Without q: accept iff u_i < p_i(x_i); residual = p_i without x_i.
 *   OR_GREEDY        temperature 0: accept iff argmax p_i == x_i; correction = argmax p_i.
 *   OR_GREEDY_MATCH  llama.cpp's rule: the target draws y_i ~ p_i with u_i; accept iff
 *                    y_i == x_i, else emit y_i; all accepted: draw from p_k with u_k.
 *
 * out receives accepted drafts then one correction (or bonus) token: accepted + 1 ids.
 */
#ifndef OUTRIDER_VERIFY_H
#define OUTRIDER_VERIFY_H

#include "sampling.h"

enum { OR_LEVIATHAN = 0, OR_GREEDY = 1, OR_GREEDY_MATCH = 2 };

enum { OR_ERR_ZERO_Q = -10 }; /* a draft token the draft distribution gives no mass */

/* The residual draw for float32 rows, sequential as numpy's float32 cumsum. */
static size_t or_residual_f32(const float *p, const float *q, size_t skip, size_t n, double u) {
    float total = 0;
    for (size_t j = 0; j < n; j++) {
        float r = q ? p[j] - q[j] : (j == skip ? 0.0f : p[j]);
        total += r > 0 ? r : 0.0f;
    }
    if (total == 0) return or_sample_f32(p, n, u); /* p == q: cannot reject; as numpy */
    float target = (float)u * total, cum = 0;
    size_t idx = n - 1;
    for (size_t j = 0; j < n; j++) {
        float r = q ? p[j] - q[j] : (j == skip ? 0.0f : p[j]);
        cum += r > 0 ? r : 0.0f;
        if (cum > target) {
            idx = j;
            break;
        }
    }
    for (;;) {
        float r = q ? p[idx] - q[idx] : (idx == skip ? 0.0f : p[idx]);
        if (r > 0 || idx == 0) return idx;
        idx--;
    }
}

/* The residual draw for float64 rows, a block at a time (see or_draw). */
static size_t or_residual_f64(const double *p, const double *q, size_t skip, size_t n,
                              double u) {
    size_t idx = or_draw(p, q, skip, n, u);
    return idx == SIZE_MAX ? or_sample_f64(p, n, u) : idx;
}

/* Instantiated for double and float: the arithmetic stays in the arrays' type, as numpy's. */
#define OR_DEFINE_VERIFY(T, SUFFIX)                                                        \
    static size_t or_argmax_##SUFFIX(const T *p, size_t n) {                              \
        size_t best = 0;                                                                   \
        for (size_t i = 1; i < n; i++)                                                     \
            if (p[i] > p[best]) best = i;                                                  \
        return best;                                                                       \
    }                                                                                      \
                                                                                           \
    static int64_t or_verify_##SUFFIX(int mode, const int32_t *x, size_t k, const T *p,    \
                                      const T *q, size_t n, const double *u,               \
                                      int32_t *out) {                                      \
        for (size_t i = 0; i < k; i++) {                                                   \
            const T *pi = p + i * n;                                                       \
            const size_t xi = (size_t)x[i];                                                \
            if (mode == OR_GREEDY) {                                                       \
                size_t a = or_argmax_##SUFFIX(pi, n);                                      \
                if (a != xi) {                                                             \
                    out[i] = (int32_t)a;                                                   \
                    return (int64_t)i;                                                     \
                }                                                                          \
            } else if (mode == OR_GREEDY_MATCH) {                                          \
                size_t y = or_sample_##SUFFIX(pi, n, u[i]);                                \
                if (y != xi) {                                                             \
                    out[i] = (int32_t)y;                                                   \
                    return (int64_t)i;                                                     \
                }                                                                          \
            } else {                                                                       \
                const T *qi = q ? q + i * n : NULL;                                        \
                double ratio = (double)pi[xi];                                             \
                if (qi) {                                                                  \
                    double qx = (double)qi[xi];                                            \
                    if (!(qx > 0.0)) return OR_ERR_ZERO_Q;                                 \
                    ratio /= qx;                                                           \
                }                                                                          \
                if (ratio > 1.0) ratio = 1.0;                                              \
                if (!(u[i] < ratio)) {                                                     \
                    out[i] = (int32_t)or_residual_##SUFFIX(pi, qi, xi, n, u[k]);           \
                    return (int64_t)i;                                                     \
                }                                                                          \
            }                                                                              \
            out[i] = x[i];                                                                 \
        }                                                                                  \
        const T *last = p + k * n;                                                         \
        out[k] = (int32_t)(mode == OR_GREEDY ? or_argmax_##SUFFIX(last, n)                 \
                                             : or_sample_##SUFFIX(last, n, u[k]));         \
        return (int64_t)k;                                                                 \
    }

OR_DEFINE_VERIFY(double, f64)
OR_DEFINE_VERIFY(float, f32)

#endif /* OUTRIDER_VERIFY_H */
