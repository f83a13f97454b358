/*
 * nccl_exec.c - the GPU backend: set-up, execution and completion of
 * operations on GPU tensors (see nccl_exec.h for the life of one).
 *
 * Set-up is lazy and collective. Nothing of CUDA is loaded until a
 * request names a device; the backend itself is built by the first GPU
 * response of the log, which every rank executes at the same point, so
 * the ranks can talk over the CPU data plane there:
 *   1. each rank selects its device, creates its stream (non-blocking,
 *      highest priority) and notes the device's PCI bus id and its host;
 *   2. an allgather of these records over the CPU backend: a rank that
 *      failed makes every rank fail the op with its reason, and two ranks
 *      on one GPU (NCCL refuses them in one communicator) choose the
 *      staged backend for everyone (cuda_coll.h);
 *   3. rank 0 makes the ncclUniqueId and posts it to the coordinator,
 *      which hands it to the other ranks (the rendezvous call,
 *      coord_negot.c: nccl_relay);
 *      every rank calls ncclCommInitRankConfig, non-blocking, polled
 *      against the deadline; with hierarchical allreduce the local and
 *      cross communicators are split off it (ncclCommSplit);
 *   4. a second allgather agrees on the outcome, so that all ranks use
 *      the communicator or none does.
 * Rank 0's environment decides for all: KOLO_GPU_STAGING (1: always
 * staged, 0: never), KOLO_HIERARCHICAL_ALLREDUCE or
 * HOROVOD_HIERARCHICAL_ALLREDUCE (1: hierarchical when every host has
 * the same number >1 of ranks and there are >1 hosts; "force": whenever
 * NCCL can split, for tests on one GPU).
 *
 * Execution queues everything on the backend's stream: waits for the
 * producers' events, batched copies into the device fusion buffer
 * (cudaMemcpyBatchAsync where the runtime has it), scaling folded into
 * NCCL (ncclAvg, ncclRedOpCreatePreMulSum) or done by the PTX kernels of
 * nccl_load.c, the collective, the copies out. Then a completion event
 * goes to the finaliser thread, which polls it (spin briefly, then
 * sleep), NCCL's asynchronous error, the deadline and the context's
 * sticky error, and completes the operations. A membership change (the
 * context's sticky error) aborts the communicator even when it is idle,
 * so a generation's communicator is never left to hang; the next
 * generation builds its own in its own context.
 */
#include "nccl_exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "settings.h"
#include "log.h"
#include "plan.h"
#include "util.h"
#include "ctx_model.h"
#include "ops.h"

#if KOLO_HAVE_NCCL

#include "cuda_api.h"
#include "cuda_coll.h"

#define FIN_TICK_MS 50
#define REC_MSG     176

/* ---------------------------------------------------------------- events */

/* Events are cached per device for the whole process: creating one costs
 * a few microseconds, and every GPU operation needs two. */
#define EV_DEVICES 64
#define EV_KEEP    256
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaEvent_t ev_pool[EV_DEVICES][EV_KEEP];
static int ev_count[EV_DEVICES];

/* An event of device dev, which must be current. NULL on failure. */
static cudaEvent_t ev_get(const struct gpu_libs *g, int dev)
{
    cudaEvent_t ev = NULL;
    pthread_mutex_lock(&ev_mu);
    if (dev >= 0 && dev < EV_DEVICES && ev_count[dev] > 0)
        ev = ev_pool[dev][--ev_count[dev]];
    pthread_mutex_unlock(&ev_mu);
    if (!ev && g->rt.EventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        g->rt.GetLastError();
        return NULL;
    }
    return ev;
}

static void ev_put(const struct gpu_libs *g, int dev, cudaEvent_t ev)
{
    if (!ev)
        return;
    pthread_mutex_lock(&ev_mu);
    if (dev >= 0 && dev < EV_DEVICES && ev_count[dev] < EV_KEEP) {
        ev_pool[dev][ev_count[dev]++] = ev;
        ev = NULL;
    }
    pthread_mutex_unlock(&ev_mu);
    if (ev)
        g->rt.EventDestroy(ev);
}

/* ---------------------------------------------------------------- state */

/* A queued response waiting for its completion event. */
struct pending {
    cudaEvent_t done;
    uint64_t deadline;
    size_t n;
    kolo_handle *handles;
    uint32_t *cache_ids;
    size_t ncache;
    /* allgather / alltoall: the device result and its shape */
    void *result;
    size_t result_bytes;
    int64_t result_rows;
    int32_t *recv_splits;
    bool has_result;
    struct pending *next;
};

enum gpu_state { GPU_NEW, GPU_READY, GPU_FAILED };

struct gpu {
    const struct gpu_libs *g;
    int device;
    enum gpu_state state;
    int fail_code;
    char fail_msg[512];
    cudaStream_t stream;
    struct coll *nccl;   /* NULL when staged */
    struct coll *staged; /* over the CPU backend, always there once ready */
    bool batch_broken;   /* cudaMemcpyBatchAsync refused once: use the loop */
    void *fusion;
    size_t fusion_cap;
    /* batched copies */
    void **bdst;
    const void **bsrc;
    size_t *bsize;
    size_t bcap;
    /* the finaliser */
    pthread_t fin;
    bool fin_running;
    pthread_mutex_t fmu;
    pthread_cond_t fcv;
    struct pending *head, *tail;
    bool fin_stop;
    volatile bool abort_flag;
};

/* Makes dev current on this thread; *prev gets the old one to restore. */
static void use_device(const struct gpu_libs *g, int dev, int *prev)
{
    *prev = -1;
    if (g->rt.GetDevice(prev) != cudaSuccess) {
        g->rt.GetLastError();
        *prev = -1;
    }
    if (*prev != dev)
        g->rt.SetDevice(dev);
}

static void restore_device(const struct gpu_libs *g, int dev, int prev)
{
    if (prev >= 0 && prev != dev)
        g->rt.SetDevice(prev);
}

/* ---------------------------------------------------------------- submit */


/* p must be memory of device dev (or managed memory). */
static int check_ptr(struct kolo_ctx *c, const struct gpu_libs *g, const void *p, int dev,
                     const char *what)
{
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof(a));
    cudaError_t e = g->rt.PointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        g->rt.GetLastError();
        return ctx_error(c, KOLO_EINVAL, "the %s buffer %p is not CUDA memory (%s)", what, p,
                     gpu_cuda_str(e));
    }
    if (a.type == cudaMemoryTypeManaged)
        return 0;
    if (a.type != cudaMemoryTypeDevice)
        return ctx_error(c, KOLO_EINVAL,
                     "the %s buffer %p is host memory, but the operation names GPU %d", what, p,
                     dev);
    if (a.device != dev)
        return ctx_error(c, KOLO_EINVAL, "the %s buffer %p is on GPU %d, not on GPU %d", what, p,
                     a.device, dev);
    return 0;
}

int gpu_validate(struct kolo_ctx *c, const kolo_request *r)
{
    char why[512];
    const struct gpu_libs *g = gpu_libs_load(why, sizeof(why));
    if (!g)
        return ctx_error(c, KOLO_ENOTSUP, "cannot run a collective on a GPU tensor (device %d): %s",
                     r->device, why);
    if (r->device >= g->device_count)
        return ctx_error(c, KOLO_EINVAL, "GPU %d does not exist: this process sees %d GPU(s)",
                     r->device, g->device_count);
    if (c->gpu && c->gpu->device != r->device)
        return ctx_error(c, KOLO_ENOTSUP,
                     "this process already uses GPU %d and kolo, like Horovod, runs one GPU per "
                     "process: put every tensor on GPU %d (torch.cuda.set_device(local_rank))",
                     c->gpu->device, c->gpu->device);
    if (request_elems(r) == 0)
        return 0;
    int rc = 0;
    if (r->sendbuf)
        rc = check_ptr(c, g, r->sendbuf, r->device, "input");
    if (!rc && r->recvbuf && r->recvbuf != r->sendbuf)
        rc = check_ptr(c, g, r->recvbuf, r->device, "output");
    return rc;
}

static struct gpu *gpu_new(const struct gpu_libs *g, int dev)
{
    struct gpu *gp = calloc(1, sizeof(*gp));
    if (!gp)
        return NULL;
    gp->g = g;
    gp->device = dev;
    pthread_mutex_init(&gp->fmu, NULL);
    cond_init_monotonic(&gp->fcv);
    return gp;
}

int gpu_op_attach(struct kolo_ctx *c, struct op *op, void *stream)
{
    char why[512];
    int dev = op->req.device;
    const struct gpu_libs *g = gpu_libs_load(why, sizeof(why));
    if (!g)
        return ctx_error(c, KOLO_ENOTSUP, "cannot use GPU %d: %s", dev, why);
    if (dev >= g->device_count)
        return ctx_error(c, KOLO_EINVAL, "GPU %d does not exist: this process sees %d GPU(s)", dev,
                     g->device_count);
    if (!c->gpu && !(c->gpu = gpu_new(g, dev)))
        return ctx_error(c, KOLO_ENOMEM, "out of memory");
    if (c->gpu->device != dev)
        return ctx_error(c, KOLO_ENOTSUP, "this process already uses GPU %d (one GPU per process)",
                     c->gpu->device);
    if (op->req.coll == KOLO_COLL_JOIN) {
        c->gpu_join_device = dev;
        return 0;
    }
    if (op->req.coll == KOLO_COLL_BARRIER)
        return 0;
    int prev;
    use_device(g, dev, &prev);
    cudaEvent_t ev = ev_get(g, dev);
    cudaError_t e = ev ? g->rt.EventRecord(ev, (cudaStream_t)stream) : cudaErrorMemoryAllocation;
    restore_device(g, dev, prev);
    if (e != cudaSuccess) {
        g->rt.GetLastError();
        ev_put(g, dev, ev);
        return ctx_error(c, KOLO_EINVAL, "cannot record an event on the given CUDA stream: %s",
                     gpu_cuda_str(e));
    }
    op->gpu_event = ev;
    return 0;
}

bool gpu_response_is_gpu(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops, size_t k)
{
    for (size_t i = 0; i < k; i++)
        if (ops[i])
            return ops[i]->req.device >= 0;
    /* No op of ours: we joined; the others reduce on the device we named. */
    return r->coll == KOLO_COLL_ALLREDUCE && c->gpu_join_device >= 0 && c->gpu;
}

void gpu_op_free(struct op *op)
{
    if (!op->gpu_event && !op->gpu_result)
        return;
    const struct gpu_libs *g = gpu_libs_load(NULL, 0);
    if (!g)
        return;
    int dev = op->req.device, prev;
    use_device(g, dev, &prev);
    if (op->gpu_event)
        ev_put(g, dev, (cudaEvent_t)op->gpu_event);
    /* Ordered after the caller's last copy of it (kolo_result_copy). */
    if (op->gpu_result)
        g->rt.FreeAsync(op->gpu_result, (cudaStream_t)op->gpu_result_stream);
    restore_device(g, dev, prev);
    op->gpu_event = op->gpu_result = NULL;
}

/* ---------------------------------------------------------------- set-up */

/* What each rank tells the others in set-up steps 2 and 4. */
struct gpu_rec {
    int32_t ok;
    int32_t staging;      /* rank 0's KOLO_GPU_STAGING: -1 unset, 0, 1 */
    int32_t hierarchical; /* rank 0's: 0 off, 1 on, 2 force */
    int32_t device;
    uint64_t host; /* the host (boot id and name) */
    char bus[32];  /* the GPU's PCI bus id */
    char msg[REC_MSG];
};

static uint64_t host_key(void)
{
    char id[128] = "", name[128] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(id, sizeof(id), f))
            id[0] = '\0';
        fclose(f);
    }
    gethostname(name, sizeof(name) - 1);
    char both[300];
    snprintf(both, sizeof(both), "%s/%s", id, name);
    return str_hash(both);
}

/* a CHOICE knob of words 0, 1 (and force): -1 unset, 0, 1, 2 for force */
static int choice_of(enum setting s)
{
    const char *v = settings_raw(s);
    if (!v)
        return -1;
    return strcmp(v, "force") == 0 ? 2 : strcmp(v, "0") != 0;
}

/* Every rank's record, in rank order (over the CPU data plane). */
static int exchange(struct kolo_ctx *c, const struct gpu_rec *mine, struct gpu_rec *all,
                    uint64_t deadline, char *why, size_t n)
{
    if (c->size == 1) {
        all[0] = *mine;
        return 0;
    }
    size_t *bytes = calloc((size_t)c->size, sizeof(size_t));
    if (!bytes)
        return KOLO_ENOMEM;
    for (int r = 0; r < c->size; r++)
        bytes[r] = sizeof(*mine);
    int rc = c->coll->ops->allgatherv(c->coll, mine, all, bytes, deadline);
    free(bytes);
    if (rc)
        snprintf(why, n, "GPU set-up over the CPU data plane failed: %s",
                 c->coll->why[0] ? c->coll->why : kolo_strerror(rc));
    return rc;
}

static bool ctx_sticky(struct kolo_ctx *c)
{
    pthread_mutex_lock(&c->mu);
    bool s = c->sticky != 0;
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* Step 3a: rank 0's id through the coordinator (one rank keeps its own).
 * Rank 0 posts the id, or, when it could not make one (ok false), a
 * two-byte marker that tells the others so at once instead of at the
 * deadline. */
static int relay_id(struct kolo_ctx *c, ncclUniqueId *id, bool ok, uint64_t deadline, char *why,
                    size_t n)
{
    static uint8_t ask = 1, failed[2] = {0xff, 0xff};
    if (c->size == 1) { /* nobody to hand it to (alone, no coordinator either) */
        if (!ok)
            snprintf(why, n, "rank 0 could not create the NCCL id");
        return ok ? 0 : KOLO_EIO;
    }
    for (;;) {
        uint64_t now = now_mono_ms();
        if (now >= deadline) {
            snprintf(why, n, "rank 0's NCCL id did not arrive before the deadline");
            return KOLO_ETIMEDOUT;
        }
        if (ctx_sticky(c)) {
            snprintf(why, n, "the generation ended during GPU set-up");
            return KOLO_ESHUTDOWN;
        }
        uint32_t wait = (uint32_t)deadline_left(deadline, 5000);
        Kolo__RendezvousRequest req = KOLO__RENDEZVOUS_REQUEST__INIT;
        req.size = c->size;
        req.session = c->session;
        req.process_set = c->process_set;
        if (c->rank == 0) {
            req.nccl_id.data = ok ? (uint8_t *)id->internal : failed;
            req.nccl_id.len = ok ? sizeof(id->internal) : sizeof(failed);
            wait = 0;
        } else {
            req.nccl_id.data = &ask;
            req.nccl_id.len = 1;
            req.wait_ms = wait;
        }
        size_t len = kolo__rendezvous_request__get_packed_size(&req);
        uint8_t *buf = malloc(len + 1);
        if (!buf)
            return KOLO_ENOMEM;
        kolo__rendezvous_request__pack(&req, buf);
        void *out = NULL;
        size_t olen = 0;
        char err[256] = "";
        int code = rpc_client_call(c->rpc, "WorkerService.Rendezvous", buf, len, &out, &olen,
                                   (int)wait + 5000, err, sizeof(err));
        free(buf);
        if (code == KOLO_ETIMEDOUT || code == KOLO_ECONNREFUSED || code == KOLO_EIO) {
            free(out);
            usleep(50000); /* the coordinator may be restarting */
            continue;
        }
        if (code) {
            free(out);
            snprintf(why, n, "relaying the NCCL id through the coordinator: %s", err);
            return code;
        }
        Kolo__RendezvousReply *rep = kolo__rendezvous_reply__unpack(NULL, olen, out);
        free(out);
        if (!rep) {
            snprintf(why, n, "malformed rendezvous reply");
            return KOLO_EPROTO;
        }
        size_t got = rep->nccl_id.len;
        if (got == sizeof(id->internal) && c->rank != 0)
            memcpy(id->internal, rep->nccl_id.data, sizeof(id->internal));
        kolo__rendezvous_reply__free_unpacked(rep, NULL);
        if (got == sizeof(id->internal))
            return 0;
        if (got > 1 || c->rank == 0) {
            snprintf(why, n, "rank 0 could not create the NCCL id");
            return KOLO_EIO;
        }
    }
}

/* Polls a non-blocking communicator until its pending call finished. */
static int comm_settle(struct kolo_ctx *c, const struct gpu_libs *g, ncclComm_t comm,
                       ncclResult_t r, uint64_t deadline, const char *what, char *why, size_t n)
{
    for (unsigned iter = 0; r == ncclInProgress; iter++) {
        if ((iter & 63) == 63 && (now_mono_ms() >= deadline || ctx_sticky(c))) {
            snprintf(why, n, "%s: %s", what,
                     ctx_sticky(c) ? "the generation ended"
                                   : "not every rank joined before the deadline");
            return KOLO_ETIMEDOUT;
        }
        usleep(iter < 100 ? 50 : 1000);
        if (g->nccl.CommGetAsyncError(comm, &r) != ncclSuccess)
            r = ncclInternalError;
    }
    if (r != ncclSuccess) {
        const char *last = g->nccl.GetLastError ? g->nccl.GetLastError(comm) : NULL;
        snprintf(why, n, "%s: %s%s%s", what, gpu_nccl_str(r), last && last[0] ? ": " : "",
                 last ? last : "");
        return KOLO_EIO;
    }
    return 0;
}

static void *fin_main(void *arg);

/* Steps 3 and 4 (NCCL mode): the communicators, or a reason. */
static int build_comms(struct kolo_ctx *c, struct gpu *gp, const struct gpu_rec *all,
                       ncclUniqueId *id, uint64_t deadline, char *why, size_t n)
{
    const struct gpu_libs *g = gp->g;
    ncclComm_t comm = NULL, local = NULL, cross = NULL;
    bool ok = true;
    if (c->rank == 0) {
        ncclResult_t r = g->nccl.GetUniqueId(id);
        ok = r == ncclSuccess;
        if (!ok)
            LOGW("kolo", "ncclGetUniqueId: %s", gpu_nccl_str(r));
    }
    int rc = relay_id(c, id, ok, deadline, why, n);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    if (!rc) {
        ncclResult_t r = g->nccl.CommInitRankConfig(&comm, c->size, *id, c->rank, &cfg);
        rc = comm_settle(c, g, comm, r, deadline, "ncclCommInitRank", why, n);
    }
    /* Hierarchy: hosts by their key, in order of first rank. */
    int L = 0, hosts = 0, my_host = 0, my_local = 0;
    bool homogeneous = true;
    for (int r = 0; r < c->size; r++) {
        int first = r;
        for (int q = 0; q < r; q++)
            if (all[q].host == all[r].host) {
                first = q;
                break;
            }
        if (first == r)
            hosts++;
        if (all[r].host == all[c->rank].host) {
            if (r < c->rank)
                my_local++;
            L++;
            if (r == c->rank)
                my_host = first;
        }
    }
    for (int r = 0; r < c->size; r++) {
        int cnt = 0;
        for (int q = 0; q < c->size; q++)
            cnt += all[q].host == all[r].host;
        homogeneous = homogeneous && cnt == L;
    }
    int hier = all[0].hierarchical;
    bool split =
        !rc && g->nccl.CommSplit && homogeneous && (hier == 2 || (hier == 1 && L > 1 && hosts > 1));
    if (hier > 0 && !split && !rc && c->rank == 0)
        LOGI("kolo", "hierarchical allreduce not used: %s",
             !g->nccl.CommSplit ? "this NCCL has no ncclCommSplit"
             : !homogeneous     ? "hosts have different numbers of ranks"
                                : "it needs several hosts with several GPUs each");
    if (split) {
        ncclConfig_t lc = NCCL_CONFIG_INITIALIZER, xc = NCCL_CONFIG_INITIALIZER;
        lc.blocking = 0;
        xc.blocking = 0;
        /* Non-blocking: both the new communicator and the parent must
         * have settled before the parent is used again. */
        ncclResult_t r = g->nccl.CommSplit(comm, my_host, c->rank, &local, &lc);
        rc = comm_settle(c, g, local ? local : comm, r, deadline, "ncclCommSplit (host)", why, n);
        if (!rc)
            rc = comm_settle(c, g, comm, ncclInProgress, deadline, "ncclCommSplit (host)", why, n);
        if (!rc) {
            r = g->nccl.CommSplit(comm, my_local, c->rank, &cross, &xc);
            rc = comm_settle(c, g, cross ? cross : comm, r, deadline, "ncclCommSplit (cross)", why,
                             n);
        }
        if (!rc)
            rc = comm_settle(c, g, comm, ncclInProgress, deadline, "ncclCommSplit (cross)", why, n);
    }
    /* Step 4: all or none. */
    struct gpu_rec mine = {.ok = rc == 0}, *res = calloc((size_t)c->size, sizeof(*res));
    if (!res)
        rc = rc ? rc : KOLO_ENOMEM;
    snprintf(mine.msg, sizeof(mine.msg), "%s", rc ? why : "");
    /* A rank may reach this only at the deadline (stuck in init for a
     * rank that failed before it): give the exchange time beyond it. */
    int xrc =
        res ? exchange(c, &mine, res, deadline + (uint64_t)c->timeout_ms, why, n) : KOLO_ENOMEM;
    if (xrc) {
        rc = xrc;
    } else {
        for (int r = 0; r < c->size && !rc; r++)
            if (!res[r].ok) {
                snprintf(why, n, "rank %d could not build the NCCL communicator: %s", r,
                         res[r].msg);
                rc = KOLO_EIO;
            }
    }
    free(res);
    if (!rc)
        rc = nccl_coll_create(g, comm, split ? local : NULL, split ? cross : NULL, my_local, L,
                              c->rank, c->size, gp->stream, &gp->nccl);
    if (rc) {
        ncclComm_t all3[3] = {comm, local, cross};
        for (int i = 0; i < 3; i++)
            if (all3[i])
                g->nccl.CommAbort(all3[i]);
        return rc;
    }
    if (c->rank == 0)
        LOGI("kolo", "NCCL communicator of %d rank(s) ready%s", c->size,
             split ? " (hierarchical allreduce)" : "");
    return 0;
}

/*
 * The set-up (top of the file). Returns 0, or a code with the reason in
 * gp->fail_msg: the backend is then GPU_FAILED and every GPU op fails
 * with it. A failure of the CPU data plane itself is returned as is, to
 * become the context's sticky error.
 */
static int gpu_setup(struct kolo_ctx *c, struct gpu *gp, uint64_t deadline)
{
    const struct gpu_libs *g = gp->g;
    char why[512] = "";
    struct gpu_rec mine;
    memset(&mine, 0, sizeof(mine));
    mine.ok = 1;
    mine.device = gp->device;
    mine.host = host_key();
    mine.staging = choice_of(SET_GPU_STAGING);
    int hier = choice_of(SET_HIERARCHICAL_ALLREDUCE);
    mine.hierarchical = hier < 0 ? 0 : hier;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    cudaError_t e = g->rt.SetDevice(gp->device);
    int lo = 0, hi = 0;
    if (e == cudaSuccess)
        e = g->rt.DeviceGetStreamPriorityRange(&lo, &hi);
    if (e == cudaSuccess)
        e = g->rt.StreamCreateWithPriority(&gp->stream, cudaStreamNonBlocking, hi);
    if (e == cudaSuccess)
        e = g->rt.DeviceGetPCIBusId(mine.bus, sizeof(mine.bus), gp->device);
    if (e != cudaSuccess) {
        g->rt.GetLastError();
        mine.ok = 0;
        snprintf(mine.msg, sizeof(mine.msg), "GPU %d: %s", gp->device, gpu_cuda_str(e));
    }
    struct gpu_rec *all = calloc((size_t)c->size, sizeof(*all));
    if (!all)
        return KOLO_ENOMEM;
    int rc = exchange(c, &mine, all, deadline, why, sizeof(why));
    if (rc) {
        free(all);
        snprintf(gp->fail_msg, sizeof(gp->fail_msg), "%s", why);
        return rc; /* the CPU data plane failed: sticky */
    }
    for (int r = 0; r < c->size && !rc; r++)
        if (!all[r].ok) {
            snprintf(why, sizeof(why), "GPU set-up failed on rank %d: %s", r, all[r].msg);
            rc = KOLO_EIO;
        }
    /* Several ranks on one GPU: NCCL refuses them in one communicator. */
    bool shared = false;
    for (int r = 0; r < c->size && !shared; r++)
        for (int q = 0; q < r && !shared; q++)
            shared = all[q].host == all[r].host && strcmp(all[q].bus, all[r].bus) == 0;
    bool staged = all[0].staging == 1 || (all[0].staging != 0 && shared);
    if (!rc && !staged)
        rc = build_comms(c, gp, all, &id, deadline, why, sizeof(why));
    if (!rc)
        rc = staged_coll_create(g, c->coll, gp->device, gp->stream, &gp->staged);
    if (!rc && pthread_create(&gp->fin, NULL, fin_main, c) != 0)
        rc = KOLO_ESYS;
    free(all);
    if (rc) {
        gp->state = GPU_FAILED;
        gp->fail_code = rc == KOLO_ETIMEDOUT || rc == KOLO_ESHUTDOWN ? rc : KOLO_EIO;
        snprintf(gp->fail_msg, sizeof(gp->fail_msg), "%s", why[0] ? why : kolo_strerror(rc));
        LOGW("kolo", "rank %d: %s", c->rank, gp->fail_msg);
        return 0; /* the backend failed, not the context */
    }
    gp->fin_running = true;
    gp->state = GPU_READY;
    if (c->rank == 0)
        LOGI("kolo", "GPU backend ready: %s on %d rank(s)%s", gp->nccl ? "nccl" : "staged", c->size,
             shared && !gp->nccl ? " (several ranks share a GPU)" : "");
    return 0;
}

/* ---------------------------------------------------------------- execution */

static int ensure_fusion(struct gpu *gp, size_t need)
{
    if (need <= gp->fusion_cap)
        return 0;
    size_t cap = gp->fusion_cap ? gp->fusion_cap : 1 << 20;
    while (cap < need)
        cap *= 2;
    /* Stream-ordered: the old buffer goes once earlier work is done. */
    if (gp->fusion)
        gp->g->rt.FreeAsync(gp->fusion, gp->stream);
    gp->fusion = NULL;
    gp->fusion_cap = 0;
    if (gp->g->rt.MallocAsync(&gp->fusion, cap, gp->stream) != cudaSuccess) {
        gp->g->rt.GetLastError();
        return KOLO_ENOMEM;
    }
    gp->fusion_cap = cap;
    return 0;
}

static int ensure_batch(struct gpu *gp, size_t n)
{
    if (n <= gp->bcap)
        return 0;
    size_t cap = n < 64 ? 64 : n;
    void **d = realloc(gp->bdst, cap * sizeof(*d));
    if (d)
        gp->bdst = d;
    const void **s = realloc(gp->bsrc, cap * sizeof(*s));
    if (s)
        gp->bsrc = s;
    size_t *z = realloc(gp->bsize, cap * sizeof(*z));
    if (z)
        gp->bsize = z;
    if (!d || !s || !z)
        return KOLO_ENOMEM;
    gp->bcap = cap;
    return 0;
}

/* The n copies in gp->bdst/bsrc/bsize, device to device, in one call
 * where the runtime batches them. */
static int copy_batch(struct gpu *gp, size_t n)
{
    const struct gpu_libs *g = gp->g;
    if (n == 0)
        return 0;
    if (n > 1 && g->rt.MemcpyBatchAsync && !gp->batch_broken) {
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof(attr));
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t idx = 0;
        if (g->rt.MemcpyBatchAsync(gp->bdst, gp->bsrc, gp->bsize, n, &attr, &idx, 1, gp->stream) ==
            cudaSuccess)
            return 0;
        g->rt.GetLastError();
        gp->batch_broken = true;
        LOGD("kolo", "cudaMemcpyBatchAsync refused; copying one by one");
    }
    for (size_t i = 0; i < n; i++)
        if (g->rt.MemcpyAsync(gp->bdst[i], gp->bsrc[i], gp->bsize[i], cudaMemcpyDeviceToDevice,
                              gp->stream) != cudaSuccess) {
            g->rt.GetLastError();
            return KOLO_EIO;
        }
    return 0;
}

static int scale(struct gpu *gp, kolo_dtype dt, void *buf, size_t count, double factor,
                 double divisor, char *why, size_t n)
{
    if (factor == 1.0 && divisor == 1.0)
        return 0;
    return gpu_scale_launch(gp->g, gp->device, dt, buf, count, factor, divisor, gp->stream, why, n);
}

/* A reduction's division and factor, after it (plan.h). */
static int post_scale(struct gpu *gp, const struct plan *pl, void *buf, size_t count, char *why,
                      size_t n)
{
    return scale(gp, pl->dt, buf, count, pl->post_factor, pl->post_divisor, why, n);
}

static const char *coll_why(struct coll *cl, int rc)
{
    return cl->why[0] ? cl->why : kolo_strerror(rc);
}

/* The backend for a reduction of dt: NCCL unless it lacks the type. */
static struct coll *reducer(struct gpu *gp, kolo_dtype dt)
{
    return gp->nccl && gpu_nccl_type(dt) >= 0 ? gp->nccl : gp->staged;
}

static int run_allreduce(struct gpu *gp, const struct plan *pl, struct op **ops,
                         uint64_t deadline, char *why, size_t wn)
{
    size_t es = pl->es, total = pl->total;
    kolo_dtype dt = pl->dt;
    struct coll *use = reducer(gp, dt);
    const void *in;
    void *out;
    int rc;
    if (!pl->fused) {
        in = ops[0]->req.sendbuf;
        out = ops[0]->req.recvbuf;
    } else {
        if (ensure_fusion(gp, total * es + 1) || ensure_batch(gp, pl->k)) {
            snprintf(why, wn, "cannot allocate the GPU fusion buffer (%zu bytes)", total * es);
            return KOLO_ENOMEM;
        }
        char *buf = gp->fusion;
        size_t nb = 0;
        for (size_t i = 0; i < pl->k; i++) {
            size_t bytes = pl->count[i] * es;
            char *at = buf + pl->offset[i] * es;
            if (ops[i] && bytes) {
                gp->bdst[nb] = at;
                gp->bsrc[nb] = ops[i]->req.sendbuf;
                gp->bsize[nb++] = bytes;
            } else if (bytes && gp->g->rt.MemsetAsync(at, 0, bytes, gp->stream) !=
                                    cudaSuccess) { /* joined: contribute zeros */
                snprintf(why, wn, "cudaMemsetAsync failed");
                return KOLO_EIO;
            }
        }
        if (copy_batch(gp, nb)) {
            snprintf(why, wn, "copying into the GPU fusion buffer failed");
            return KOLO_EIO;
        }
        in = out = buf;
    }
    if (total) {
        rc = KOLO_ENOTSUP;
        if (use == gp->nccl && (pl->op == KOLO_SUM || pl->op == KOLO_AVERAGE))
            rc = nccl_coll_allreduce_scaled(use, dt, pl->op == KOLO_AVERAGE, pl->pre * pl->post,
                                            in, out, total, deadline);
        if (rc == KOLO_ENOTSUP) {
            rc = 0;
            if (pl->pre != 1.0) {
                if (in != out &&
                    gp->g->rt.MemcpyAsync(out, in, total * es, cudaMemcpyDeviceToDevice,
                                          gp->stream) != cudaSuccess) {
                    snprintf(why, wn, "device copy failed");
                    return KOLO_EIO;
                }
                rc = scale(gp, dt, out, total, pl->pre, 1.0, why, wn);
                in = out;
            }
            if (!rc) {
                rc = use->ops->allreduce(use, dt, pl->op, in, out, total, deadline);
                if (rc)
                    snprintf(why, wn, "%s", coll_why(use, rc));
            }
            if (!rc)
                rc = post_scale(gp, pl, out, total, why, wn);
        } else if (rc) {
            snprintf(why, wn, "%s", coll_why(use, rc));
        }
        if (rc)
            return rc;
    }
    if (pl->fused) {
        size_t nb = 0;
        for (size_t i = 0; i < pl->k; i++) {
            size_t bytes = pl->count[i] * es;
            if (ops[i] && bytes) {
                gp->bdst[nb] = ops[i]->req.recvbuf;
                gp->bsrc[nb] = (char *)gp->fusion + pl->offset[i] * es;
                gp->bsize[nb++] = bytes;
            }
        }
        if (copy_batch(gp, nb)) {
            snprintf(why, wn, "copying out of the GPU fusion buffer failed");
            return KOLO_EIO;
        }
    }
    return 0;
}

static int run_reducescatter(struct kolo_ctx *c, struct gpu *gp, const struct plan *pl,
                             struct op *o, uint64_t deadline, char *why, size_t wn)
{
    kolo_dtype dt = pl->dt;
    size_t es = pl->es, total = pl->total;
    struct coll *use = reducer(gp, dt);
    const void *in = o->req.sendbuf;
    int rc = 0;
    if (total == 0)
        return 0;
    rc = KOLO_ENOTSUP;
    if (use == gp->nccl)
        rc = nccl_coll_reducescatter_scaled(use, dt, pl->op == KOLO_AVERAGE, pl->pre * pl->post,
                                            in, o->req.recvbuf, pl->rank_count, deadline);
    if (rc == KOLO_ENOTSUP) {
        rc = 0;
        if (pl->pre != 1.0) {
            if (ensure_fusion(gp, total * es + 1) ||
                gp->g->rt.MemcpyAsync(gp->fusion, in, total * es, cudaMemcpyDeviceToDevice,
                                      gp->stream) != cudaSuccess) {
                snprintf(why, wn, "cannot stage the prescaled input");
                return KOLO_ENOMEM;
            }
            rc = scale(gp, dt, gp->fusion, total, pl->pre, 1.0, why, wn);
            in = gp->fusion;
        }
        if (!rc) {
            rc = use->ops->reducescatter(use, dt, KOLO_SUM, in, o->req.recvbuf, pl->rank_count,
                                         deadline);
            if (rc)
                snprintf(why, wn, "%s", coll_why(use, rc));
        }
        if (!rc)
            rc = post_scale(gp, pl, o->req.recvbuf, pl->rank_count[c->rank], why, wn);
    } else if (rc) {
        snprintf(why, wn, "%s", coll_why(use, rc));
    }
    return rc;
}

/* Allocates the device result of an allgather/alltoall on the stream. */
static int result_alloc(struct gpu *gp, struct pending *p, size_t bytes)
{
    if (gp->g->rt.MallocAsync(&p->result, bytes + 1, gp->stream) != cudaSuccess) {
        gp->g->rt.GetLastError();
        p->result = NULL;
        return KOLO_ENOMEM;
    }
    p->result_bytes = bytes;
    p->has_result = true;
    return 0;
}

static int run_allgather(struct gpu *gp, const struct plan *pl, struct op *o, struct pending *p,
                         uint64_t deadline, char *why, size_t wn)
{
    struct coll *use = gp->nccl ? gp->nccl : gp->staged;
    int rc = result_alloc(gp, p, pl->result_bytes);
    if (!rc && pl->result_bytes) {
        rc = use->ops->allgatherv(use, o->req.sendbuf, p->result, pl->recv_bytes, deadline);
        if (rc)
            snprintf(why, wn, "%s", coll_why(use, rc));
    }
    p->result_rows = pl->rows;
    return rc;
}

static int run_alltoall(struct kolo_ctx *c, struct gpu *gp, struct plan *pl, struct op *o,
                        struct pending *p, uint64_t deadline, char *why, size_t wn)
{
    size_t sent = 0;
    for (int d = 0; d < c->size; d++)
        sent += pl->send_bytes[d];
    p->recv_splits = pl->recv_rows; /* the pending's now */
    pl->recv_rows = NULL;
    struct coll *use = gp->nccl ? gp->nccl : gp->staged;
    int rc = result_alloc(gp, p, pl->result_bytes);
    if (!rc && (pl->result_bytes || sent)) {
        rc = use->ops->alltoallv(use, o->req.sendbuf, pl->send_bytes, p->result, pl->recv_bytes,
                                 deadline);
        if (rc)
            snprintf(why, wn, "%s", coll_why(use, rc));
    }
    p->result_rows = pl->rows;
    return rc;
}

static int run_broadcast(struct kolo_ctx *c, struct gpu *gp, const Kolo__Response *r, struct op *o,
                         uint64_t deadline, char *why, size_t wn)
{
    size_t bytes = (size_t)(r->n_sizes ? r->sizes[0] : 0) * kolo_dtype_size(r->dtype);
    if (!bytes)
        return 0;
    if (c->rank == r->root && o->req.sendbuf != o->req.recvbuf &&
        gp->g->rt.MemcpyAsync(o->req.recvbuf, o->req.sendbuf, bytes, cudaMemcpyDeviceToDevice,
                              gp->stream) != cudaSuccess) {
        snprintf(why, wn, "device copy failed");
        return KOLO_EIO;
    }
    struct coll *use = gp->nccl ? gp->nccl : gp->staged;
    int rc = use->ops->broadcast(use, o->req.recvbuf, bytes, r->root, deadline);
    if (rc)
        snprintf(why, wn, "%s", coll_why(use, rc));
    return rc;
}

static void pending_free(const struct gpu_libs *g, struct gpu *gp, struct pending *p)
{
    if (!p)
        return;
    if (p->result)
        g->rt.FreeAsync(p->result, gp->stream);
    ev_put(g, gp->device, p->done);
    free(p->handles);
    free(p->cache_ids);
    free(p->recv_splits);
    free(p);
}

void gpu_exec_response(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops,
                       uint64_t deadline)
{
    size_t k = r->n_names;
    struct gpu *gp = c->gpu;
    if (gp && gp->state == GPU_NEW) {
        int rc = gpu_setup(c, gp, deadline);
        if (rc) { /* the CPU data plane broke: sticky */
            ops_finish(c, ops, k, rc, gp->fail_msg, NULL, 0);
            return;
        }
    }
    if (!gp || gp->state != GPU_READY) {
        char msg[600];
        snprintf(msg, sizeof(msg), "the GPU backend is unavailable: %s",
                 gp ? gp->fail_msg : "no GPU was named by this rank");
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < k; i++)
            if (ops[i])
                ops_complete(c, ops[i], gp ? gp->fail_code : KOLO_ENOTSUP, msg);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    const struct gpu_libs *g = gp->g;
    int prev;
    use_device(g, gp->device, &prev);
    char why[512] = "";
    int rc = 0;
    struct pending *p = calloc(1, sizeof(*p));
    if (p)
        p->handles = calloc(k + 1, sizeof(kolo_handle));
    if (!p || !p->handles) {
        rc = KOLO_ENOMEM;
        snprintf(why, sizeof(why), "out of memory");
    }
    /* The producers: the stream waits for each tensor's event. */
    for (size_t i = 0; i < k; i++) {
        if (!ops[i])
            continue;
        if (ops[i]->gpu_event) {
            if (!rc && g->rt.StreamWaitEvent(gp->stream, (cudaEvent_t)ops[i]->gpu_event, 0) !=
                           cudaSuccess) {
                g->rt.GetLastError();
                rc = KOLO_EIO;
                snprintf(why, sizeof(why), "cudaStreamWaitEvent failed");
            }
            ev_put(g, gp->device, (cudaEvent_t)ops[i]->gpu_event);
            ops[i]->gpu_event = NULL;
        }
        if (p && p->handles)
            p->handles[p->n++] = ops[i]->handle;
    }
    struct plan pl = {0};
    if (!rc)
        rc = plan_make(&pl, r, c->rank, c->size, ops[0] != NULL, why, sizeof(why));
    if (!rc) {
        switch (r->coll) {
        case KOLO_COLL_ALLREDUCE:
            rc = run_allreduce(gp, &pl, ops, deadline, why, sizeof(why));
            if (!rc && r->n_cache_ids) {
                p->cache_ids = malloc(r->n_cache_ids * sizeof(uint32_t));
                if (p->cache_ids) {
                    /* by position among this rank's ops, as handles are */
                    size_t j = 0;
                    for (size_t i = 0; i < k && i < r->n_cache_ids; i++)
                        if (ops[i])
                            p->cache_ids[j++] = r->cache_ids[i];
                    p->ncache = j;
                }
            }
            break;
        case KOLO_COLL_ALLGATHER:
            if (ops[0])
                rc = run_allgather(gp, &pl, ops[0], p, deadline, why, sizeof(why));
            break;
        case KOLO_COLL_ALLTOALL:
            if (ops[0])
                rc = run_alltoall(c, gp, &pl, ops[0], p, deadline, why, sizeof(why));
            break;
        case KOLO_COLL_REDUCESCATTER:
            if (ops[0])
                rc = run_reducescatter(c, gp, &pl, ops[0], deadline, why, sizeof(why));
            break;
        case KOLO_COLL_BROADCAST:
            if (ops[0])
                rc = run_broadcast(c, gp, r, ops[0], deadline, why, sizeof(why));
            break;
        default:
            rc = KOLO_EPROTO;
            snprintf(why, sizeof(why), "collective %u cannot run on a GPU", r->coll);
            break;
        }
    }
    plan_free(&pl);
    if (!rc) {
        p->done = ev_get(g, gp->device);
        if (!p->done || g->rt.EventRecord(p->done, gp->stream) != cudaSuccess) {
            g->rt.GetLastError();
            rc = KOLO_EIO;
            snprintf(why, sizeof(why), "cannot record the completion event");
        }
    }
    restore_device(g, gp->device, prev);
    if (rc) {
        /* The stream and the communicator are in an unknown state. */
        if (gp->nccl)
            nccl_coll_abort(gp->nccl, why);
        ops_finish(c, ops, k, rc, why[0] ? why : kolo_strerror(rc), NULL, 0);
        pending_free(g, gp, p);
        return;
    }
    p->deadline = deadline;
    pthread_mutex_lock(&gp->fmu);
    if (gp->tail)
        gp->tail->next = p;
    else
        gp->head = p;
    gp->tail = p;
    pthread_cond_signal(&gp->fcv);
    pthread_mutex_unlock(&gp->fmu);
}

/* ---------------------------------------------------------------- the finaliser */

/* Completes p's operations with rc (mu taken here). */
static void complete(struct kolo_ctx *c, struct gpu *gp, struct pending *p, int rc, const char *why)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < p->n; i++) {
        struct op *op = ops_lookup(c, p->handles[i]);
        if (!op || op->state == OP_DONE)
            continue; /* failed meanwhile (sticky) and perhaps released */
        if (rc == 0) {
            if (p->has_result) {
                op->gpu_result = p->result;
                op->result_bytes = p->result_bytes;
                op->result_rows = p->result_rows;
                op->recv_splits = p->recv_splits;
                op->has_result = true;
                p->result = NULL;
                p->recv_splits = NULL;
            }
            if (i < p->ncache && p->cache_ids[i])
                ops_cache_put(c, op, p->cache_ids[i]);
        }
        ops_complete(c, op, rc, why);
    }
    if (rc && !c->sticky) {
        c->sticky = rc;
        snprintf(c->sticky_msg, sizeof(c->sticky_msg), "%s", why);
        ops_fail_all(c, c->sticky, c->sticky_msg);
        LOGW("kolo", "rank %d: GPU data plane failed: %s", c->rank, why);
    }
    pthread_mutex_unlock(&c->mu);
    (void)gp;
}

/* Waits for p's event, watching NCCL, the deadline and the context. */
static int await(struct kolo_ctx *c, struct gpu *gp, struct pending *p, char *why, size_t n)
{
    for (;;) {
        uint64_t slice = now_mono_ms() + FIN_TICK_MS;
        int rc =
            gpu_event_wait(gp->g, p->done, p->deadline && p->deadline < slice ? p->deadline : slice,
                           &gp->abort_flag, why, n);
        if (rc != KOLO_ETIMEDOUT)
            return rc;
        if (p->deadline && now_mono_ms() >= p->deadline)
            return rc; /* "did not finish before the deadline" */
        if (gp->nccl && (rc = nccl_coll_check(gp->nccl, why, n)) != 0)
            return rc;
        if (ctx_sticky(c)) {
            snprintf(why, n, "the generation ended while a GPU operation ran");
            return KOLO_ESHUTDOWN;
        }
    }
}

static void *fin_main(void *arg)
{
    thread_name("kolo-gpu-fin");
    struct kolo_ctx *c = arg;
    struct gpu *gp = c->gpu;
    const struct gpu_libs *g = gp->g;
    g->rt.SetDevice(gp->device);
    pthread_mutex_lock(&gp->fmu);
    for (;;) {
        if (!gp->head) {
            if (gp->fin_stop)
                break;
            struct timespec ts;
            mono_deadline(&ts, FIN_TICK_MS);
            pthread_cond_timedwait(&gp->fcv, &gp->fmu, &ts);
            if (!gp->head && gp->nccl && !gp->fin_stop) {
                /* Idle: a membership change aborts the communicator now,
                 * rather than leaving it to the next operation. */
                pthread_mutex_unlock(&gp->fmu);
                if (ctx_sticky(c))
                    nccl_coll_abort(gp->nccl, "the generation ended");
                pthread_mutex_lock(&gp->fmu);
            }
            continue;
        }
        struct pending *p = gp->head;
        pthread_mutex_unlock(&gp->fmu);
        char why[512] = "";
        int rc = await(c, gp, p, why, sizeof(why));
        if (rc && gp->nccl)
            nccl_coll_abort(gp->nccl, why); /* kernels still queued end now */
        complete(c, gp, p, rc, why);
        pthread_mutex_lock(&gp->fmu);
        gp->head = p->next;
        if (!gp->head)
            gp->tail = NULL;
        pthread_mutex_unlock(&gp->fmu);
        pending_free(g, gp, p);
        pthread_mutex_lock(&gp->fmu);
    }
    pthread_mutex_unlock(&gp->fmu);
    return NULL;
}

void gpu_ctx_fini(struct kolo_ctx *c)
{
    struct gpu *gp = c->gpu;
    if (!gp)
        return;
    const struct gpu_libs *g = gp->g;
    int prev;
    use_device(g, gp->device, &prev);
    /* Abort, never destroy: ncclCommDestroy may wait for peers. */
    if (gp->nccl)
        nccl_coll_abort(gp->nccl, "kolo_fini");
    if (gp->fin_running) {
        pthread_mutex_lock(&gp->fmu);
        gp->fin_stop = true;
        gp->abort_flag = true;
        pthread_cond_signal(&gp->fcv);
        pthread_mutex_unlock(&gp->fmu);
        pthread_join(gp->fin, NULL);
    }
    while (gp->head) {
        struct pending *p = gp->head;
        gp->head = p->next;
        pending_free(g, gp, p);
    }
    if (gp->nccl)
        gp->nccl->ops->destroy(gp->nccl);
    if (gp->staged)
        gp->staged->ops->destroy(gp->staged);
    if (gp->fusion)
        g->rt.FreeAsync(gp->fusion, gp->stream);
    if (gp->stream)
        g->rt.StreamDestroy(gp->stream); /* returns at once; work drains */
    restore_device(g, gp->device, prev);
    free(gp->bdst);
    free(gp->bsrc);
    free(gp->bsize);
    pthread_mutex_destroy(&gp->fmu);
    pthread_cond_destroy(&gp->fcv);
    free(gp);
    c->gpu = NULL;
}

/* ---------------------------------------------------------------- public */

int kolo_result_copy(kolo_ctx *c, kolo_handle h, void *dst, void *stream)
{
    if (!c)
        return KOLO_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rv;
    struct op *op = ops_finished(c, h, true, &rv);
    if (op && op->result_bytes && !dst)
        rv = ctx_error(c, KOLO_EINVAL, "the destination is NULL");
    else if (op && op->gpu_result && op->result_bytes) {
        const struct gpu_libs *g = gpu_libs_load(NULL, 0);
        int prev;
        use_device(g, op->req.device, &prev);
        cudaError_t e = g->rt.MemcpyAsync(dst, op->gpu_result, op->result_bytes, cudaMemcpyDefault,
                                          (cudaStream_t)stream);
        restore_device(g, op->req.device, prev);
        if (e != cudaSuccess) {
            g->rt.GetLastError();
            rv = ctx_error(c, KOLO_EINVAL, "copying the result failed: %s", gpu_cuda_str(e));
        } else {
            op->gpu_result_stream = stream;
        }
    } else if (op && op->result && op->result_bytes) {
        memcpy(dst, op->result, op->result_bytes);
    }
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int kolo_nccl_built(void)
{
    return NCCL_VERSION_CODE;
}

int kolo_cuda_built(void)
{
    return CUDART_VERSION;
}

int kolo_gpu_count(char *why, size_t len)
{
    const struct gpu_libs *g = gpu_libs_load(why, len);
    return g ? g->device_count : 0;
}

#else /* no KOLO_HAVE_NCCL: the stubs */

static const char no_backend[] =
    "this build of kolo has no GPU backend: the CUDA and NCCL headers were not found when it "
    "was built (install CUDA with NCCL, then rebuild)";

int gpu_validate(struct kolo_ctx *c, const kolo_request *r)
{
    snprintf(c->last_error, sizeof(c->last_error),
             "cannot run a collective on a GPU tensor (device %d): %s", r->device, no_backend);
    return KOLO_ENOTSUP;
}

int gpu_op_attach(struct kolo_ctx *c, struct op *op, void *stream)
{
    (void)stream;
    return gpu_validate(c, &op->req);
}

bool gpu_response_is_gpu(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops, size_t k)
{
    (void)c;
    (void)r;
    (void)ops;
    (void)k;
    return false;
}

void gpu_exec_response(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops,
                       uint64_t deadline)
{
    (void)r;
    (void)ops;
    (void)deadline;
    (void)c;
}

void gpu_op_free(struct op *op)
{
    (void)op;
}

void gpu_ctx_fini(struct kolo_ctx *c)
{
    (void)c;
}

int kolo_result_copy(kolo_ctx *c, kolo_handle h, void *dst, void *stream)
{
    (void)stream;
    if (!c)
        return KOLO_EINVAL;
    pthread_mutex_lock(&c->mu);
    struct op *op = ops_lookup(c, h);
    int rv = 0;
    if (!op)
        rv = KOLO_ENOTFOUND;
    else if (op->state != OP_DONE)
        rv = KOLO_ESTATE;
    else if (op->status)
        rv = op->status;
    else if (op->result_bytes && !dst)
        rv = KOLO_EINVAL;
    else if (op->result && op->result_bytes)
        memcpy(dst, op->result, op->result_bytes);
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int kolo_nccl_built(void)
{
    return 0;
}

int kolo_cuda_built(void)
{
    return 0;
}

int kolo_gpu_count(char *why, size_t len)
{
    if (why && len)
        snprintf(why, len, "%s", no_backend);
    return 0;
}

#endif /* KOLO_HAVE_NCCL */

int kolo_submit_stream(kolo_ctx *c, const kolo_request *reqs, int n, void *stream,
                       kolo_handle *handles)
{
    if (!c || !reqs || n < 1 || !handles)
        return KOLO_EINVAL;
    return ops_submit(c, reqs, n, stream, handles);
}
