/*
 * nccl_load.c - loading the CUDA runtime, the driver API and NCCL at run
 * time, and the scaling kernels written in PTX.
 *
 * Loading happens once per process (pthread_once) and its outcome, good
 * or bad, is kept: a CPU-only host answers "no CUDA device" from then on
 * without probing again. See cuda_api.h for why dlopen.
 *
 * Scaling kernels. kolo needs to multiply device buffers by a factor
 * (prescale, postscale, AVERAGE where NCCL cannot fold it into the
 * reduction: integer types with scaling, MIN/MAX/PRODUCT with scaling,
 * the hierarchical and staged paths). Requiring nvcc at build time would
 * make the GPU backend depend on the full toolkit on every build host, so
 * the kernels are PTX text generated here, one entry point per dtype,
 * and JIT-compiled by the driver (cuModuleLoadData) the first time a
 * device needs them. The arithmetic mirrors reduce_scale/reduce_divide
 * (reduce.c) so the GPU and CPU paths give the same bits for integers and
 * the same rounding for floating types. The PTX targets sm_60 so that any
 * GPU a current driver supports can run it.
 */
#include "cuda_api.h"

#if KOLO_HAVE_NCCL

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "settings.h"
#include "util.h"

static struct gpu_libs libs;
static bool libs_ok;
static char libs_err[512];
static pthread_once_t libs_once = PTHREAD_ONCE_INIT;

static void *open_first(enum setting env, const char *const *names, char *tried, size_t n)
{
    const char *forced = settings_raw(env);
    if (forced && forced[0]) {
        void *h = dlopen(forced, RTLD_NOW | RTLD_GLOBAL);
        if (!h)
            snprintf(tried, n, "%s", dlerror());
        return h;
    }
    tried[0] = '\0';
    for (size_t i = 0; names[i]; i++) {
        /* RTLD_GLOBAL: NCCL itself looks up the runtime's symbols. */
        void *h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (h)
            return h;
        size_t len = strlen(tried);
        snprintf(tried + len, n - len, "%s%s", len ? ", " : "", names[i]);
    }
    return NULL;
}

#define SYM(h, table, field, name, required)                                                       \
    do {                                                                                           \
        *(void **)&(table).field = dlsym(h, name);                                                 \
        if (!(table).field && (required)) {                                                        \
            snprintf(libs_err, sizeof(libs_err), "%s is missing from the loaded library", name);   \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void load_once(void)
{
    static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                               NULL};
    static const char *const nccl_names[] = {"libnccl.so.2", "libnccl.so", NULL};
    static const char *const cuda_names[] = {"libcuda.so.1", "libcuda.so", NULL};
    char tried[300];
    void *rt = open_first(SET_CUDART_LIBRARY, cudart_names, tried, sizeof(tried));
    if (!rt) {
        snprintf(libs_err, sizeof(libs_err),
                 "the CUDA runtime is not installed or not on the library path (tried %s)", tried);
        return;
    }
    struct cuda_rt *r = &libs.rt;
    SYM(rt, *r, GetDeviceCount, "cudaGetDeviceCount", true);
    SYM(rt, *r, SetDevice, "cudaSetDevice", true);
    SYM(rt, *r, GetDevice, "cudaGetDevice", true);
    SYM(rt, *r, RuntimeGetVersion, "cudaRuntimeGetVersion", true);
    SYM(rt, *r, DriverGetVersion, "cudaDriverGetVersion", true);
    SYM(rt, *r, GetErrorString, "cudaGetErrorString", true);
    SYM(rt, *r, GetLastError, "cudaGetLastError", true);
    SYM(rt, *r, DeviceGetPCIBusId, "cudaDeviceGetPCIBusId", true);
    SYM(rt, *r, DeviceGetStreamPriorityRange, "cudaDeviceGetStreamPriorityRange", true);
    SYM(rt, *r, StreamCreateWithPriority, "cudaStreamCreateWithPriority", true);
    SYM(rt, *r, StreamDestroy, "cudaStreamDestroy", true);
    SYM(rt, *r, StreamSynchronize, "cudaStreamSynchronize", true);
    SYM(rt, *r, StreamWaitEvent, "cudaStreamWaitEvent", true);
    SYM(rt, *r, EventCreateWithFlags, "cudaEventCreateWithFlags", true);
    SYM(rt, *r, EventDestroy, "cudaEventDestroy", true);
    SYM(rt, *r, EventRecord, "cudaEventRecord", true);
    SYM(rt, *r, EventQuery, "cudaEventQuery", true);
    SYM(rt, *r, Malloc, "cudaMalloc", true);
    SYM(rt, *r, Free, "cudaFree", true);
    SYM(rt, *r, MallocAsync, "cudaMallocAsync", true);
    SYM(rt, *r, FreeAsync, "cudaFreeAsync", true);
    SYM(rt, *r, HostAlloc, "cudaHostAlloc", true);
    SYM(rt, *r, FreeHost, "cudaFreeHost", true);
    SYM(rt, *r, MemcpyAsync, "cudaMemcpyAsync", true);
    SYM(rt, *r, MemsetAsync, "cudaMemsetAsync", true);
    SYM(rt, *r, PointerGetAttributes, "cudaPointerGetAttributes", true);
    r->RuntimeGetVersion(&libs.runtime_version);
    /* cudaMemcpyBatchAsync changed its signature in CUDA 13 (no failIdx);
     * only the 13 form is declared by our headers, so only it is used. */
    if (libs.runtime_version >= 13000)
        SYM(rt, *r, MemcpyBatchAsync, "cudaMemcpyBatchAsync", false);

    int n = 0;
    cudaError_t e = r->GetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        snprintf(libs_err, sizeof(libs_err), "no CUDA device is visible to this process (%s)",
                 e != cudaSuccess ? r->GetErrorString(e) : "device count 0");
        r->GetLastError(); /* clear the sticky-less error state */
        return;
    }
    libs.device_count = n;

    void *nc = open_first(SET_NCCL_LIBRARY, nccl_names, tried, sizeof(tried));
    if (!nc) {
        snprintf(libs_err, sizeof(libs_err),
                 "NCCL is not installed or not on the library path (tried %s)", tried);
        return;
    }
    struct nccl_fns *f = &libs.nccl;
    SYM(nc, *f, GetVersion, "ncclGetVersion", true);
    SYM(nc, *f, GetUniqueId, "ncclGetUniqueId", true);
    SYM(nc, *f, CommInitRankConfig, "ncclCommInitRankConfig", true);
    SYM(nc, *f, CommAbort, "ncclCommAbort", true);
    SYM(nc, *f, CommGetAsyncError, "ncclCommGetAsyncError", true);
    SYM(nc, *f, CommSplit, "ncclCommSplit", false);
    SYM(nc, *f, GetErrorString, "ncclGetErrorString", true);
    SYM(nc, *f, GetLastError, "ncclGetLastError", false);
    SYM(nc, *f, AllReduce, "ncclAllReduce", true);
    SYM(nc, *f, ReduceScatter, "ncclReduceScatter", true);
    SYM(nc, *f, Reduce, "ncclReduce", true);
    SYM(nc, *f, AllGather, "ncclAllGather", true);
    SYM(nc, *f, Broadcast, "ncclBroadcast", true);
    SYM(nc, *f, Send, "ncclSend", true);
    SYM(nc, *f, Recv, "ncclRecv", true);
    SYM(nc, *f, GroupStart, "ncclGroupStart", true);
    SYM(nc, *f, GroupEnd, "ncclGroupEnd", true);
    SYM(nc, *f, RedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", false);
    SYM(nc, *f, RedOpDestroy, "ncclRedOpDestroy", false);
    if (!f->RedOpDestroy)
        f->RedOpCreatePreMulSum = NULL;
    f->GetVersion(&libs.nccl_version);

    /* The driver API is optional: without it only the scaling kernels are
     * missing, and operations that need them say so. */
    void *drv = open_first(SET_CUDA_DRIVER_LIBRARY, cuda_names, tried, sizeof(tried));
    if (drv) {
        struct cuda_drv d = {0};
        *(void **)&d.ModuleLoadData = dlsym(drv, "cuModuleLoadData");
        *(void **)&d.ModuleGetFunction = dlsym(drv, "cuModuleGetFunction");
        *(void **)&d.LaunchKernel = dlsym(drv, "cuLaunchKernel");
        *(void **)&d.GetErrorString = dlsym(drv, "cuGetErrorString");
        if (d.ModuleLoadData && d.ModuleGetFunction && d.LaunchKernel && d.GetErrorString)
            libs.drv = d;
    }
    libs_ok = true;
    LOGI("kolo", "GPU backend: %d CUDA device(s), CUDA runtime %d, NCCL %d", n,
         libs.runtime_version, libs.nccl_version);
}

const struct gpu_libs *gpu_libs_load(char *err, size_t errlen)
{
    pthread_once(&libs_once, load_once);
    if (!libs_ok) {
        if (err)
            snprintf(err, errlen, "%s", libs_err);
        return NULL;
    }
    return &libs;
}

const char *gpu_cuda_str(cudaError_t e)
{
    const char *s = libs.rt.GetErrorString ? libs.rt.GetErrorString(e) : NULL;
    return s ? s : "unknown CUDA error";
}

const char *gpu_nccl_str(ncclResult_t r)
{
    const char *s = libs.nccl.GetErrorString ? libs.nccl.GetErrorString(r) : NULL;
    return s ? s : "unknown NCCL error";
}

int gpu_nccl_type(kolo_dtype dt)
{
    switch (dt) {
    case KOLO_UINT8:
        return ncclUint8;
    case KOLO_INT8:
        return ncclInt8;
    case KOLO_INT32:
        return ncclInt32;
    case KOLO_INT64:
        return ncclInt64;
    case KOLO_FLOAT16:
        return ncclFloat16;
    case KOLO_BFLOAT16:
        return ncclBfloat16;
    case KOLO_FLOAT32:
        return ncclFloat32;
    case KOLO_FLOAT64:
        return ncclFloat64;
    default:
        return -1; /* int16: NCCL has no 16-bit integer */
    }
}

/* ---------------------------------------------------------------- PTX */

/*
 * One kernel per dtype: a grid-stride loop over count elements,
 *   kolo_scale_<dtype>(u64 buf, u64 count, f64 factor, f64 divisor).
 * Registers: %rd1 buf, %rd2 count, %rd3 index, %rd5 stride, %rd6 the
 * element's address; %fd1 factor, %fd2 divisor. The per-dtype body loads
 * [%rd6], scales, and stores back.
 */
static const char ptx_head[] = ".version 7.0\n"
                               ".target sm_60\n"
                               ".address_size 64\n";

static const char ptx_entry[] =
    ".visible .entry kolo_scale_%s(.param .u64 p_buf, .param .u64 p_n, .param .f64 p_factor,\n"
    "                              .param .f64 p_div)\n"
    "{\n"
    "  .reg .pred %%p<4>;\n"
    "  .reg .b16 %%h<4>;\n"
    "  .reg .b32 %%r<12>;\n"
    "  .reg .b64 %%rd<12>;\n"
    "  .reg .f32 %%f<4>;\n"
    "  .reg .f64 %%fd<6>;\n"
    "  ld.param.u64 %%rd1, [p_buf];\n"
    "  ld.param.u64 %%rd2, [p_n];\n"
    "  ld.param.f64 %%fd1, [p_factor];\n"
    "  ld.param.f64 %%fd2, [p_div];\n"
    "  cvta.to.global.u64 %%rd1, %%rd1;\n"
    "  mov.u32 %%r1, %%ctaid.x;\n"
    "  mov.u32 %%r2, %%ntid.x;\n"
    "  mov.u32 %%r3, %%tid.x;\n"
    "  mov.u32 %%r4, %%nctaid.x;\n"
    "  mul.wide.u32 %%rd3, %%r1, %%r2;\n"
    "  cvt.u64.u32 %%rd4, %%r3;\n"
    "  add.u64 %%rd3, %%rd3, %%rd4;\n"
    "  mul.wide.u32 %%rd5, %%r4, %%r2;\n"
    "  cvt.rn.f32.f64 %%f3, %%fd1;\n"
    "LOOP:\n"
    "  setp.ge.u64 %%p1, %%rd3, %%rd2;\n"
    "  @%%p1 bra DONE;\n"
    "  mad.lo.u64 %%rd6, %%rd3, %d, %%rd1;\n"
    "%s"
    "  add.u64 %%rd3, %%rd3, %%rd5;\n"
    "  bra LOOP;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

static const char body_f32[] = "  ld.global.f32 %f1, [%rd6];\n"
                               "  mul.rn.f32 %f1, %f1, %f3;\n"
                               "  st.global.f32 [%rd6], %f1;\n";

static const char body_f64[] = "  ld.global.f64 %fd3, [%rd6];\n"
                               "  mul.rn.f64 %fd3, %fd3, %fd1;\n"
                               "  st.global.f64 [%rd6], %fd3;\n";

static const char body_f16[] = "  ld.global.b16 %h1, [%rd6];\n"
                               "  cvt.f32.f16 %f1, %h1;\n"
                               "  mul.rn.f32 %f1, %f1, %f3;\n"
                               "  cvt.rn.f16.f32 %h1, %f1;\n"
                               "  st.global.b16 [%rd6], %h1;\n";

/* bfloat16 by hand (cvt to and from bf16 needs newer GPUs): widen by a
 * shift, round to nearest even by adding 0x7fff plus the lowest kept
 * bit, keep NaN a (quiet) NaN. */
static const char body_bf16[] = "  ld.global.u16 %h1, [%rd6];\n"
                                "  cvt.u32.u16 %r5, %h1;\n"
                                "  shl.b32 %r5, %r5, 16;\n"
                                "  mov.b32 %f1, %r5;\n"
                                "  mul.rn.f32 %f1, %f1, %f3;\n"
                                "  mov.b32 %r5, %f1;\n"
                                "  and.b32 %r6, %r5, 2147483647;\n"
                                "  setp.gt.u32 %p2, %r6, 2139095040;\n"
                                "  shr.u32 %r7, %r5, 16;\n"
                                "  and.b32 %r7, %r7, 1;\n"
                                "  add.u32 %r7, %r7, 32767;\n"
                                "  add.u32 %r7, %r5, %r7;\n"
                                "  shr.u32 %r7, %r7, 16;\n"
                                "  shr.u32 %r6, %r5, 16;\n"
                                "  or.b32 %r6, %r6, 64;\n"
                                "  selp.b32 %r7, %r6, %r7, %p2;\n"
                                "  cvt.u16.u32 %h1, %r7;\n"
                                "  st.global.u16 [%rd6], %h1;\n";

/* Integers: to double, divide and truncate, multiply, truncate with
 * saturation (cvt.rzi saturates and maps NaN to 0), clamp to the
 * stored type's range. %s: the load type, %s: its width's store type,
 * %d/%d: the range. */
static const char body_int_fmt[] = "  ld.global.%s %%r5, [%%rd6];\n"
                                   "  cvt.rn.f64.s32 %%fd3, %%r5;\n"
                                   "  div.rn.f64 %%fd3, %%fd3, %%fd2;\n"
                                   "  cvt.rzi.f64.f64 %%fd3, %%fd3;\n"
                                   "  mul.rn.f64 %%fd3, %%fd3, %%fd1;\n"
                                   "  cvt.rzi.s32.f64 %%r5, %%fd3;\n"
                                   "  max.s32 %%r5, %%r5, %d;\n"
                                   "  min.s32 %%r5, %%r5, %d;\n"
                                   "  st.global.%s [%%rd6], %%r5;\n";

static const char body_i32[] = "  ld.global.s32 %r5, [%rd6];\n"
                               "  cvt.rn.f64.s32 %fd3, %r5;\n"
                               "  div.rn.f64 %fd3, %fd3, %fd2;\n"
                               "  cvt.rzi.f64.f64 %fd3, %fd3;\n"
                               "  mul.rn.f64 %fd3, %fd3, %fd1;\n"
                               "  cvt.rzi.s32.f64 %r5, %fd3;\n"
                               "  st.global.s32 [%rd6], %r5;\n";

static const char body_i64[] = "  ld.global.s64 %rd7, [%rd6];\n"
                               "  cvt.rn.f64.s64 %fd3, %rd7;\n"
                               "  div.rn.f64 %fd3, %fd3, %fd2;\n"
                               "  cvt.rzi.f64.f64 %fd3, %fd3;\n"
                               "  mul.rn.f64 %fd3, %fd3, %fd1;\n"
                               "  cvt.rzi.s64.f64 %rd7, %fd3;\n"
                               "  st.global.s64 [%rd6], %rd7;\n";

static const char *const dtype_tag[KOLO_DTYPE_COUNT] = {"u8",  "i8",   "i16", "i32", "i64",
                                                        "f16", "bf16", "f32", "f64"};

/* The whole module's text (malloc'd), for every dtype. Exposed to the
 * tests through gpu_scale_ptx so ptxas can check it on a build host. */
char *gpu_scale_ptx(void);

char *gpu_scale_ptx(void)
{
    size_t cap = 64 << 10, len = 0;
    char *out = malloc(cap);
    char body[1024];
    if (!out)
        return NULL;
    len += (size_t)snprintf(out, cap, "%s", ptx_head);
    for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
        const char *b = body;
        switch (dt) {
        case KOLO_UINT8:
            snprintf(body, sizeof(body), body_int_fmt, "u8", 0, 255, "u8");
            break;
        case KOLO_INT8:
            snprintf(body, sizeof(body), body_int_fmt, "s8", -128, 127, "u8");
            break;
        case KOLO_INT16:
            snprintf(body, sizeof(body), body_int_fmt, "s16", -32768, 32767, "u16");
            break;
        case KOLO_INT32:
            b = body_i32;
            break;
        case KOLO_INT64:
            b = body_i64;
            break;
        case KOLO_FLOAT16:
            b = body_f16;
            break;
        case KOLO_BFLOAT16:
            b = body_bf16;
            break;
        case KOLO_FLOAT32:
            b = body_f32;
            break;
        default:
            b = body_f64;
            break;
        }
        int w = snprintf(out + len, cap - len, ptx_entry, dtype_tag[dt],
                         (int)kolo_dtype_size((kolo_dtype)dt), b);
        if (w < 0 || (size_t)w >= cap - len) {
            free(out);
            return NULL;
        }
        len += (size_t)w;
    }
    return out;
}

#define MAX_DEVICES 64

static pthread_mutex_t mod_mu = PTHREAD_MUTEX_INITIALIZER;
static CUfunction mod_fn[MAX_DEVICES][KOLO_DTYPE_COUNT];
static bool mod_tried[MAX_DEVICES];
static char mod_err[MAX_DEVICES][200];

static void load_module(const struct gpu_libs *g, int dev)
{
    mod_tried[dev] = true;
    if (!g->drv.ModuleLoadData) {
        snprintf(mod_err[dev], sizeof(mod_err[dev]),
                 "the CUDA driver API (libcuda.so.1) could not be loaded");
        return;
    }
    char *ptx = gpu_scale_ptx();
    if (!ptx) {
        snprintf(mod_err[dev], sizeof(mod_err[dev]), "out of memory");
        return;
    }
    CUmodule m;
    CUresult r = g->drv.ModuleLoadData(&m, ptx);
    free(ptx);
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        g->drv.GetErrorString(r, &s);
        snprintf(mod_err[dev], sizeof(mod_err[dev]), "the driver cannot JIT the kernels: %s",
                 s ? s : "?");
        return;
    }
    for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
        char name[64];
        snprintf(name, sizeof(name), "kolo_scale_%s", dtype_tag[dt]);
        if (g->drv.ModuleGetFunction(&mod_fn[dev][dt], m, name) != CUDA_SUCCESS) {
            snprintf(mod_err[dev], sizeof(mod_err[dev]), "kernel %s missing", name);
            return;
        }
    }
    /* the module stays loaded for the life of the process */
}

int gpu_scale_launch(const struct gpu_libs *g, int dev, kolo_dtype dt, void *buf, size_t count,
                     double factor, double divisor, cudaStream_t stream, char *err, size_t errlen)
{
    if (count == 0)
        return 0;
    if (dev < 0 || dev >= MAX_DEVICES || (unsigned)dt >= KOLO_DTYPE_COUNT) {
        snprintf(err, errlen, "scaling: bad device %d or dtype %d", dev, (int)dt);
        return KOLO_EINVAL;
    }
    pthread_mutex_lock(&mod_mu);
    if (!mod_tried[dev])
        load_module(g, dev);
    CUfunction fn = mod_fn[dev][dt];
    pthread_mutex_unlock(&mod_mu);
    if (!fn) {
        snprintf(err, errlen, "the GPU scaling kernels are unavailable: %s", mod_err[dev]);
        return KOLO_ENOTSUP;
    }
    unsigned long long n = count;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)buf;
    void *args[] = {&p, &n, &factor, &divisor};
    size_t blocks = (count + 255) / 256;
    if (blocks > 8192)
        blocks = 8192;
    CUresult r =
        g->drv.LaunchKernel(fn, (unsigned)blocks, 1, 1, 256, 1, 1, 0, (CUstream)stream, args, NULL);
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        g->drv.GetErrorString(r, &s);
        snprintf(err, errlen, "scaling kernel launch failed: %s", s ? s : "?");
        return KOLO_EIO;
    }
    return 0;
}

#endif /* KOLO_HAVE_NCCL */
