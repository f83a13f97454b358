/*
 * plan.c - see plan.h.
 */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "errors.h"

static bool dtype_is_float(kolo_dtype dt)
{
    return dt == KOLO_FLOAT16 || dt == KOLO_BFLOAT16 || dt == KOLO_FLOAT32 || dt == KOLO_FLOAT64;
}

static int malformed(const struct plan *p, char *why, size_t whylen)
{
    snprintf(why, whylen, "malformed %s response", abi_coll_name(p->coll));
    return KOLO_EPROTO;
}

static size_t *zalloc(size_t n, int *rc)
{
    size_t *v = calloc(n ? n : 1, sizeof(*v));
    if (!v)
        *rc = KOLO_ENOMEM;
    return v;
}

void plan_scales(struct plan *p, double prescale, double postscale, int size)
{
    p->pre = prescale == 0 ? 1.0 : prescale;
    p->post = postscale == 0 ? 1.0 : postscale;
    p->post_factor = p->post;
    p->post_divisor = 1;
    if (p->op == KOLO_AVERAGE) {
        if (dtype_is_float(p->dt))
            p->post_factor = p->post / size;
        else
            p->post_divisor = size;
    }
}

static int plan_allreduce(struct plan *p, const Kolo__Response *r, int size, bool have_first)
{
    int rc = 0;
    p->k = r->n_names;
    if (r->n_sizes < p->k)
        return KOLO_EPROTO;
    if (p->k <= PLAN_INLINE) {
        p->count = p->count_inline;
        p->offset = p->offset_inline;
    } else {
        p->count = zalloc(p->k, &rc);
        p->offset = zalloc(p->k, &rc);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < p->k; i++) {
        if (r->sizes[i] < 0)
            return KOLO_EPROTO;
        p->count[i] = (size_t)r->sizes[i];
        p->offset[i] = p->total;
        p->total += p->count[i];
    }
    p->fused = !(p->k == 1 && have_first);
    plan_scales(p, r->prescale, r->postscale, size);
    return 0;
}

static int plan_reducescatter(struct plan *p, const Kolo__Response *r, int size)
{
    int rc = 0;
    int64_t total = r->n_sizes ? r->sizes[0] : 0;
    int64_t row = r->n_row_elems && r->row_elems[0] > 0 ? r->row_elems[0] : 1;
    if (total < 0)
        return KOLO_EPROTO;
    int64_t rows = total / row;
    p->total = (size_t)total;
    p->rows = rows;
    p->rank_count = zalloc((size_t)size, &rc);
    if (rc)
        return rc;
    for (int i = 0; i < size; i++)
        p->rank_count[i] = (size_t)((rows / size + (i < rows % size ? 1 : 0)) * row);
    plan_scales(p, r->prescale, r->postscale, size);
    return 0;
}

static int plan_allgather(struct plan *p, const Kolo__Response *r, int size)
{
    int rc = 0;
    size_t row = (size_t)(r->n_row_elems ? r->row_elems[0] : 1) * p->es;
    if (r->n_sizes < (size_t)size)
        return KOLO_EPROTO;
    p->recv_bytes = zalloc((size_t)size, &rc);
    if (rc)
        return rc;
    for (int i = 0; i < size; i++) {
        if (r->sizes[i] < 0)
            return KOLO_EPROTO;
        p->recv_bytes[i] = (size_t)r->sizes[i] * row;
        p->rows += r->sizes[i];
        p->result_bytes += p->recv_bytes[i];
    }
    return 0;
}

/* sizes is the matrix of rows: sizes[s * size + d] from s to d. */
static int plan_alltoall(struct plan *p, const Kolo__Response *r, int rank, int size)
{
    int rc = 0;
    size_t n = (size_t)size, me = (size_t)rank;
    size_t row = (size_t)(r->n_row_elems ? r->row_elems[0] : 1) * p->es;
    if (r->n_sizes < n * n)
        return KOLO_EPROTO;
    p->send_bytes = zalloc(n, &rc);
    p->recv_bytes = zalloc(n, &rc);
    p->recv_rows = calloc(n, sizeof(*p->recv_rows));
    if (rc || !p->recv_rows)
        return KOLO_ENOMEM;
    for (size_t d = 0; d < n; d++) {
        int64_t to = r->sizes[me * n + d], from = r->sizes[d * n + me];
        if (to < 0 || from < 0 || from > INT32_MAX)
            return KOLO_EPROTO;
        p->send_bytes[d] = (size_t)to * row;
        p->recv_bytes[d] = (size_t)from * row;
        p->recv_rows[d] = (int32_t)from;
        p->rows += from;
        p->result_bytes += p->recv_bytes[d];
    }
    return 0;
}

int plan_make(struct plan *p, const Kolo__Response *r, int rank, int size, bool have_first,
              char *why, size_t whylen)
{
    memset(p, 0, sizeof(*p));
    p->coll = (kolo_coll)r->coll;
    p->dt = (kolo_dtype)r->dtype;
    p->op = (kolo_op)r->op;
    p->es = abi_dtype_size((int)r->dtype);
    p->pre = p->post = p->post_factor = 1.0;
    p->post_divisor = 1;
    if (size < 1 || rank < 0 || rank >= size || (p->es == 0 && p->coll != KOLO_COLL_BARRIER))
        return malformed(p, why, whylen);
    int rc = 0;
    switch (p->coll) {
    case KOLO_COLL_ALLREDUCE:
        rc = plan_allreduce(p, r, size, have_first);
        break;
    case KOLO_COLL_REDUCESCATTER:
        rc = plan_reducescatter(p, r, size);
        break;
    case KOLO_COLL_ALLGATHER:
        rc = plan_allgather(p, r, size);
        break;
    case KOLO_COLL_ALLTOALL:
        rc = plan_alltoall(p, r, rank, size);
        break;
    default: /* broadcast, barrier, join: nothing to plan */
        break;
    }
    if (rc == KOLO_EPROTO)
        return malformed(p, why, whylen);
    if (rc)
        snprintf(why, whylen, "out of memory");
    return rc;
}

void plan_free(struct plan *p)
{
    if (p->count != p->count_inline)
        free(p->count);
    if (p->offset != p->offset_inline)
        free(p->offset);
    free(p->rank_count);
    free(p->send_bytes);
    free(p->recv_bytes);
    free(p->recv_rows);
    memset(p, 0, sizeof(*p));
}
