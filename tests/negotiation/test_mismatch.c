/*
 * test_mismatch.c - negotiation/mismatch.c as a table of cases: two
 * ranks' requests (a reference and one that differs in one field), how
 * many ranks joined, and the text Horovod gives; plus the cases that need
 * more than two ranks or none.
 */
#include <stdio.h>
#include <string.h>

#include "kolo/abi.h"
#include "mismatch.h"
#include "test.h"

static int64_t s23[] = {2, 3}, s32[] = {3, 2}, s24[] = {2, 4}, s5[] = {5}, s53[] = {5, 3},
               s73[] = {7, 3}, s74[] = {7, 4};

/* R: every field; AR: an allreduce; C: another collective (SUM, no scaling,
 * on the CPU) */
#define R(coll_, dtype_, op_, ndim_, shape_, pre_, root_, device_)                                 \
    {.coll = (coll_), .dtype = (dtype_), .op = (op_), .ndim = (ndim_), .shape = (shape_),           \
     .prescale = (pre_), .postscale = 1, .root = (root_), .device = (device_)}
#define AR(dtype_, op_, ndim_, shape_, pre_, device_)                                              \
    R(KOLO_COLL_ALLREDUCE, dtype_, op_, ndim_, shape_, pre_, 0, device_)
#define AR32 AR(KOLO_FLOAT32, KOLO_SUM, 2, s23, 1, -1)
#define C(coll_, dtype_, ndim_, shape_, root_) R(coll_, dtype_, KOLO_SUM, ndim_, shape_, 1, root_, -1)

struct mm_case {
    const char *what;
    struct tensor_req a, b;
    int size, njoined;
    const char *want; /* "" when the requests agree */
};

static const struct mm_case cases[] = {
    {"identical allreduces agree", AR32, AR32, 2, 0, ""},
    {"different collectives", AR32, C(KOLO_COLL_ALLGATHER, KOLO_FLOAT32, 2, s23, 0), 2, 0,
     "Mismatched operations: One rank did an ALLREDUCE, but another rank did an ALLGATHER."},
    {"different dtypes", AR32, AR(KOLO_INT32, KOLO_SUM, 2, s23, 1, -1), 2, 0,
     "Mismatched data types: One rank had type HOROVOD_FLOAT32, but another rank had type "
     "HOROVOD_INT32."},
    {"CPU and GPU", AR32, AR(KOLO_FLOAT32, KOLO_SUM, 2, s23, 1, 0), 2, 0,
     "Mismatched ALLREDUCE CPU/GPU device selection: One rank specified device CPU, but another "
     "rank specified device GPU."},
    {"two GPUs are both GPU", AR(KOLO_FLOAT32, KOLO_SUM, 2, s23, 1, 0),
     AR(KOLO_FLOAT32, KOLO_SUM, 2, s23, 1, 1), 2, 0, ""},
    {"allreduce shapes", AR32, AR(KOLO_FLOAT32, KOLO_SUM, 2, s32, 1, -1), 2, 0,
     "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2, 3], but another "
     "rank sent a tensor of shape [3, 2]."},
    {"allreduce rank", AR32, AR(KOLO_FLOAT32, KOLO_SUM, 1, s5, 1, -1), 2, 0,
     "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2, 3], but another "
     "rank sent a tensor of shape [5]."},
    {"scaling factors", AR32, AR(KOLO_FLOAT32, KOLO_SUM, 2, s23, 0.5, -1), 2, 0,
     "Mismatched prescale and/or postscale factors: One rank sent factors 1, 1, but another "
     "rank sent factors 0.5, 1."},
    {"reductions", AR32, AR(KOLO_FLOAT32, KOLO_MAX, 2, s23, 1, -1), 2, 0,
     "Mismatched reduction operation: One rank requested op SUM, but another rank requested op "
     "MAX."},
    {"broadcast ignores op and scaling",
     C(KOLO_COLL_BROADCAST, KOLO_INT64, 1, s5, 1),
     R(KOLO_COLL_BROADCAST, KOLO_INT64, KOLO_MAX, 1, s5, 3, 1, -1),
     2, 0, ""},
    {"broadcast roots",
     C(KOLO_COLL_BROADCAST, KOLO_INT64, 1, s5, 0), C(KOLO_COLL_BROADCAST, KOLO_INT64, 1, s5, 1),
     2, 0,
     "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank "
     "specified root rank 1."},
    {"broadcast root out of range",
     C(KOLO_COLL_BROADCAST, KOLO_UINT8, 1, s5, 2), C(KOLO_COLL_BROADCAST, KOLO_UINT8, 1, s5, 2),
     2, 0, "Invalid BROADCAST root rank 2 for 2 rank(s)."},
    {"allgather may differ in the first dimension",
     C(KOLO_COLL_ALLGATHER, KOLO_FLOAT64, 2, s53, 0), C(KOLO_COLL_ALLGATHER, KOLO_FLOAT64, 2, s73, 0),
     2, 0, ""},
    {"allgather other dimensions",
     C(KOLO_COLL_ALLGATHER, KOLO_FLOAT64, 2, s73, 0), C(KOLO_COLL_ALLGATHER, KOLO_FLOAT64, 2, s74, 0),
     2, 0,
     "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 equal to 3, "
     "but another rank sent a tensor with dimension 1 equal to 4."},
    {"alltoall ranks",
     C(KOLO_COLL_ALLTOALL, KOLO_INT8, 2, s24, 0), C(KOLO_COLL_ALLTOALL, KOLO_INT8, 1, s5, 0), 2, 0,
     "Mismatched ALLTOALL tensor shapes: One rank sent a tensor of rank 2, but another rank "
     "sent a tensor of rank 1."},
    {"allgather of a scalar", C(KOLO_COLL_ALLGATHER, KOLO_INT32, 0, NULL, 0),
     C(KOLO_COLL_ALLGATHER, KOLO_INT32, 0, NULL, 0), 2, 0,
     "Process-set rank zero tried to ALLGATHER a rank-zero tensor."},
    {"reducescatter of a scalar", C(KOLO_COLL_REDUCESCATTER, KOLO_INT32, 0, NULL, 0),
     C(KOLO_COLL_REDUCESCATTER, KOLO_INT32, 0, NULL, 0), 2, 0,
     "Process-set rank zero tried to REDUCESCATTER a rank-zero tensor."},
    {"allreduce of a scalar is fine", AR(KOLO_FLOAT32, KOLO_SUM, 0, NULL, 1, -1),
     AR(KOLO_FLOAT32, KOLO_SUM, 0, NULL, 1, -1), 2, 0, ""},
    {"allreduce with a joined rank", AR32, AR32, 3, 1, ""},
    {"allgather with a joined rank",
     C(KOLO_COLL_ALLGATHER, KOLO_FLOAT32, 1, s5, 0), C(KOLO_COLL_ALLGATHER, KOLO_FLOAT32, 1, s5, 0),
     3, 1,
     "Allgather is not supported with Join at this time. Specify sparse_as_dense=True if using "
     "DistributedOptimizer"},
    {"broadcast with a joined rank",
     C(KOLO_COLL_BROADCAST, KOLO_FLOAT32, 1, s5, 0), C(KOLO_COLL_BROADCAST, KOLO_FLOAT32, 1, s5, 0),
     3, 1,
     "Broadcast is not supported with Join at this time."},
    {"alltoall with a joined rank",
     C(KOLO_COLL_ALLTOALL, KOLO_FLOAT32, 1, s5, 0), C(KOLO_COLL_ALLTOALL, KOLO_FLOAT32, 1, s5, 0),
     3, 1,
     "Alltoall is not supported with Join at this time."},
    {"reducescatter with a joined rank",
     C(KOLO_COLL_REDUCESCATTER, KOLO_FLOAT32, 1, s5, 0),
     C(KOLO_COLL_REDUCESCATTER, KOLO_FLOAT32, 1, s5, 0), 3, 1,
     "Reducescatter is not supported with Join at this time."},
    {"an unknown dtype", AR(99, KOLO_SUM, 2, s23, 1, -1), AR(99, KOLO_SUM, 2, s23, 1, -1), 2, 0,
     "Invalid request for tensor t."},
    {"an unknown reduction", AR(KOLO_FLOAT32, KOLO_OP_COUNT, 2, s23, 1, -1), AR32, 2, 0,
     "Invalid request for tensor t."},
    {"an unknown collective", C(42, KOLO_FLOAT32, 0, NULL, 0), C(42, KOLO_FLOAT32, 0, NULL, 0), 2, 0,
     "Invalid request for tensor t."},
    {"the first difference is named (dtype before shape)", AR32,
     AR(KOLO_FLOAT16, KOLO_SUM, 2, s32, 1, -1), 2, 0,
     "Mismatched data types: One rank had type HOROVOD_FLOAT32, but another rank had type "
     "HOROVOD_FLOAT16."},
};

static void test_cases(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct mm_case *t = &cases[i];
        const struct tensor_req *reqs[4] = {&t->a, &t->b, NULL, NULL};
        char err[512] = "not written";
        mismatch_check("t", reqs, t->size, t->njoined, err, sizeof err);
        if (strcmp(err, t->want) != 0) {
            fprintf(stderr, "case \"%s\":\n  got  \"%s\"\n  want \"%s\"\n", t->what, err, t->want);
            test_failures++;
        }
    }
}

/* A rank that has not submitted yet is skipped; the reference is the first
 * rank that did; no request at all is an internal error. */
static void test_missing_ranks(void)
{
    struct tensor_req a = AR32, b = AR(KOLO_FLOAT32, KOLO_MIN, 2, s23, 1, -1);
    const struct tensor_req *late[3] = {NULL, &a, &b};
    char err[512];
    mismatch_check("t", late, 3, 0, err, sizeof err);
    CHECK_EQ_STR(err, "Mismatched reduction operation: One rank requested op SUM, but another "
                      "rank requested op MIN.");
    const struct tensor_req *one[3] = {NULL, NULL, &a};
    mismatch_check("t", one, 3, 0, err, sizeof err);
    CHECK_EQ_STR(err, "");
    const struct tensor_req *none[2] = {NULL, NULL};
    mismatch_check("grad.w", none, 2, 0, err, sizeof err);
    CHECK_EQ_STR(err, "internal error: no request for grad.w");
}

static void test_names(void)
{
    CHECK_EQ_STR(mismatch_coll_name(KOLO_COLL_REDUCESCATTER), "REDUCESCATTER");
    CHECK_EQ_STR(mismatch_coll_name(99), "UNKNOWN");
    CHECK_EQ_STR(mismatch_dtype_name(KOLO_BFLOAT16), "HOROVOD_BFLOAT16");
    CHECK_EQ_STR(mismatch_dtype_name(KOLO_DTYPE_COUNT), "UNKNOWN");
    CHECK_EQ_STR(mismatch_op_name(KOLO_PRODUCT), "PRODUCT");
    CHECK_EQ_STR(mismatch_op_name(77), "?");
    char text[64];
    struct tensor_req t = AR32;
    tensor_shape_text(text, sizeof text, &t);
    CHECK_EQ_STR(text, "[2, 3]");
    t.ndim = 0;
    tensor_shape_text(text, sizeof text, &t);
    CHECK_EQ_STR(text, "[]");
}

/* The shutdown text: the coordinator names the rank; a peer told by the
 * leaver's own round does not know it. */
static void test_shutdown_text(void)
{
    char t[300];
    mismatch_shutdown_text(t, sizeof t, 2, "kolo_fini");
    CHECK(strncmp(t, "Horovod has been shut down: rank 2 left the job (kolo_fini). This was "
                     "caused by an exception on one of the ranks",
                  96) == 0);
    mismatch_shutdown_text(t, sizeof t, -1, "");
    CHECK(strncmp(t, "Horovod has been shut down: a rank left the job (shutdown).", 59) == 0);
    CHECK(strstr(t, "after one of the ranks finished execution.") != NULL);
}

int main(void)
{
    test_cases();
    test_missing_ranks();
    test_names();
    test_shutdown_text();
    TEST_DONE();
}
