/* Comparing a result with its reference element by element (see test_support.h). */
#include <math.h>

#include "test_support.h"

void reference_scale(const double *ref, const double *low, size_t n, double *max_ref, double *base_err) {
    size_t e;
    *max_ref = *base_err = 0.0;
    for (e = 0; e < n; ++e) {
        const double a = fabs(ref[e]);
        if (a > *max_ref) *max_ref = a;
        if (low != NULL) {
            const double err = fabs(low[e] - ref[e]);
            if (err > *base_err) *base_err = err;
        }
    }
}

element_errors element_errors_none(void) {
    element_errors e = {0.0, -1, -1, -1, -1, 0.0, 0.0, 0};
    return e;
}

void element_errors_add(element_errors *e, int64_t b, int64_t i, int64_t h, int64_t col, double out, double ref,
                        double tol, int must_be_zero) {
    const double err = fabs(out - ref);
    if (!(err <= e->max_err)) e->max_err = isnan(err) ? INFINITY : err;
    if (e->b >= 0 || ((err <= tol) && !(must_be_zero && out != 0.0))) return;
    e->b = (long long)b;
    e->i = (long long)i;
    e->h = (long long)h;
    e->col = (long long)col;
    e->out = out;
    e->ref = ref;
    e->must_be_zero = must_be_zero;
}

long long first_written_gap(flashattn_dtype_t dtype, const void *host, const unsigned char *inside, size_t elems) {
    const size_t es = test_dtype_size(dtype);
    size_t e;
    for (e = 0; e < elems; ++e)
        if (!inside[e] && !test_is_poison(dtype, (const unsigned char *)host + es * e)) return (long long)e;
    return -1;
}
