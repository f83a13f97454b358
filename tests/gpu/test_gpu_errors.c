/*
 * test_gpu_errors.c - GPU requests that cannot run give a clear error at
 * submit, never a crash, and leave the context usable for CPU work.
 *
 * Runs on every host. Without a GPU (or without the GPU backend in the
 * build) a request on device 0 must fail with KOLO_ENOTSUP and say why.
 * With a GPU, a host pointer passed as device memory and a device that
 * does not exist must fail with KOLO_EINVAL. Either way a CPU allreduce
 * afterwards still works.
 */
#include <string.h>

#include "gpu_job.h"

static int gpus;
static char gpu_why[512];

static void cpu_still_works(kolo_ctx *ctx, int size)
{
    float in[3] = {1, 2, 3}, out[3] = {0};
    kolo_handle h;
    REQUIRE(kolo_allreduce_async(ctx, "after", in, out, 3, KOLO_FLOAT32, KOLO_SUM, &h) == 0);
    CHECK_EQ_INT(kolo_wait(ctx, h, 10000), 0);
    CHECK(out[2] == 3.0f * (float)size);
}

static void t_errors(kolo_ctx *ctx, int rank, int size)
{
    (void)rank;
    float host[4] = {0};
    int64_t shape[1] = {4};
    kolo_request req = {.coll = KOLO_COLL_ALLREDUCE,
                        .name = "gpu",
                        .sendbuf = host,
                        .recvbuf = host,
                        .dtype = KOLO_FLOAT32,
                        .ndim = 1,
                        .shape = shape,
                        .op = KOLO_SUM,
                        .device = 0};
    kolo_handle h = 0;
    if (gpus == 0) {
        /* no GPU: refused at submit, with the reason */
        int rv = kolo_submit(ctx, &req, 1, &h);
        CHECK_EQ_INT(rv, KOLO_ENOTSUP);
        const char *e = kolo_last_error(ctx);
        fprintf(stderr, "no-GPU error: %s\n", e);
        CHECK(strstr(e, "GPU") != NULL);
        CHECK(strstr(e, kolo_nccl_built() ? "CUDA" : "GPU backend") != NULL);
        CHECK_EQ_INT(kolo_submit_stream(ctx, &req, 1, NULL, &h), KOLO_ENOTSUP);
        req.coll = KOLO_COLL_BROADCAST;
        CHECK_EQ_INT(kolo_submit(ctx, &req, 1, &h), KOLO_ENOTSUP);
        kolo_request join = {.coll = KOLO_COLL_JOIN, .device = 0};
        CHECK_EQ_INT(kolo_submit(ctx, &join, 1, &h), KOLO_ENOTSUP);
    } else {
        /* host memory named as GPU memory */
        CHECK_EQ_INT(kolo_submit(ctx, &req, 1, &h), KOLO_EINVAL);
        fprintf(stderr, "host-pointer error: %s\n", kolo_last_error(ctx));
        CHECK(strstr(kolo_last_error(ctx), "host memory") != NULL);
        /* a device that does not exist */
        req.device = gpus + 3;
        CHECK_EQ_INT(kolo_submit(ctx, &req, 1, &h), KOLO_EINVAL);
        CHECK(strstr(kolo_last_error(ctx), "does not exist") != NULL);
    }
    /* a bad handle and NULL arguments fail cleanly */
    CHECK_EQ_INT(kolo_result_copy(ctx, 12345, host, NULL), KOLO_ENOTFOUND);
    CHECK_EQ_INT(kolo_submit_stream(NULL, &req, 1, NULL, &h), KOLO_EINVAL);
    cpu_still_works(ctx, size);
}

int main(void)
{
    gpus = kolo_gpu_count(gpu_why, sizeof(gpu_why));
    printf("GPU backend: NCCL %d, CUDA %d; GPUs: %d%s%s\n", kolo_nccl_built(), kolo_cuda_built(),
           gpus, gpus ? "" : " - ", gpus ? "" : gpu_why);
    CHECK(gpus > 0 || gpu_why[0]);
    job_coord_start();
    job_run(1, t_errors);
    job_run(2, t_errors);
    job_coord_stop();
    TEST_DONE();
}
