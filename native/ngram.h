/* Prompt-lookup drafting: find the sequence's own last n tokens earlier in the sequence and
 * propose what followed them. runtime/speculative/prompt_lookup.py is the reference.
 *
 *   tokens = [5 6 7 9 5 6 7 8 1 5 6 7], n = 3: the pattern [5 6 7] last occurred at 4,
 *   so the draft is what followed it there: [8 1 5 ...] (up to k tokens).
 *
 * Longest n first (n_max down to n_min); for each n the most recent earlier occurrence
 * wins. C standard library only.
 */
#ifndef OUTRIDER_NGRAM_H
#define OUTRIDER_NGRAM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Writes up to k draft tokens into out; returns how many (0: no match). n_min >= 1. */
static size_t or_ngram_lookup(const int32_t *t, size_t len, size_t n_min, size_t n_max,
                              size_t k, int32_t *out) {
    if (k == 0 || n_min == 0) return 0;
    for (size_t n = n_max; n >= n_min; n--) {
        if (len < n + 1) continue; /* the pattern plus at least one earlier start */
        const int32_t *pat = t + len - n;
        /* starts s with s + n <= len - 1: the match is followed by at least one token */
        for (size_t s = len - n; s-- > 0;) {
            if (t[s] == pat[0] && memcmp(t + s, pat, n * sizeof *t) == 0) {
                size_t start = s + n, m = len - start < k ? len - start : k;
                memcpy(out, t + start, m * sizeof *t);
                return m;
            }
        }
    }
    return 0;
}

#endif /* OUTRIDER_NGRAM_H */
