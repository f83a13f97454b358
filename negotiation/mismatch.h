/*
 * mismatch.h - the pure rules that decide whether the ranks' requests for
 * one tensor agree, in Horovod's words. No I/O, no lock, no struct of the
 * coordinator: the coordinator hands in every rank's request, the rules
 * answer "" or the text every rank then fails with. tests/negotiation
 * checks them as a table of cases.
 */
#ifndef KOLO_NEGOTIATION_MISMATCH_H
#define KOLO_NEGOTIATION_MISMATCH_H

#include <stddef.h>
#include <stdint.h>

/* One rank's request for a tensor (values from include/kolo/abi.h). */
struct tensor_req {
    uint32_t coll, dtype, op;
    int ndim;
    int64_t *shape;
    double prescale, postscale;
    int root;
    int device; /* -1: CPU */
    int32_t *splits;
    int nsplits;
};

/* mismatch_check compares the requests of the size ranks for the tensor
 * called name (reqs[r] NULL for a rank that has not submitted it), njoined
 * of which have joined (kolo_join), and writes Horovod's error text into
 * err, or "" when they agree. The first submitted request is the
 * reference; a request with an unknown collective, dtype or reduction is
 * "Invalid request for tensor NAME.". */
void mismatch_check(const char *name, const struct tensor_req *const *reqs, int size, int njoined,
                    char *err, size_t errlen);

/* Horovod's names: "ALLREDUCE", "HOROVOD_FLOAT32", "SUM"; "UNKNOWN" (or
 * "?" for a reduction) outside the tables. */
const char *mismatch_coll_name(uint32_t coll);
const char *mismatch_dtype_name(uint32_t dtype);
const char *mismatch_op_name(uint32_t op);

/* mismatch_shutdown_text writes Horovod's text for the operations that
 * were pending when a rank left the job (kolo_fini), the one every other
 * rank fails them with: rank < 0 when who left is not known (the leaver's
 * own last round told a peer, not the coordinator). */
void mismatch_shutdown_text(char *out, size_t size, int rank, const char *reason);

/* tensor_shape_text writes "[2, 3]" (Horovod's shape format). */
void tensor_shape_text(char *out, size_t size, const struct tensor_req *t);

#endif
