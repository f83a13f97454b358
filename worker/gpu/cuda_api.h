/*
 * cuda_api.h - the CUDA runtime, CUDA driver and NCCL entry points the
 * GPU backend uses, as tables of function pointers filled by dlopen.
 *
 * Why dlopen: one libkolo build must run on hosts with and without GPUs,
 * and a CPU-only job must not pay for (or depend on) CUDA. The headers
 * give the types; nothing links against libcudart, libcuda or libnccl.
 * The libraries are loaded the first time a process touches a GPU tensor
 * (gpu_libs_load) and never unloaded: the CUDA runtime registers exit
 * handlers, and unloading it under them crashes at exit. A process that
 * already loaded them (PyTorch) gets the same copies back from dlopen,
 * which matches by soname, so kolo and the framework share one runtime
 * and one primary context per device.
 *
 * Optional entry points (NULL when the loaded library is too old):
 * ncclCommSplit (hierarchical allreduce), ncclRedOpCreatePreMulSum
 * (scaling folded into the reduction), cudaMemcpyBatchAsync (CUDA 13's
 * signature; batched fusion-buffer copies) and the driver API (the PTX
 * scaling kernels). Everything else is required.
 *
 * Only compiled when CMake found the CUDA and NCCL headers
 * (KOLO_HAVE_NCCL); see nccl_exec.h for what the rest of libkolo calls.
 */
#ifndef KOLO_WORKER_CUDA_API_H
#define KOLO_WORKER_CUDA_API_H

#if KOLO_HAVE_NCCL

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>

#include "kolo.h"

struct cuda_rt {
    cudaError_t (*GetDeviceCount)(int *);
    cudaError_t (*SetDevice)(int);
    cudaError_t (*GetDevice)(int *);
    cudaError_t (*RuntimeGetVersion)(int *);
    cudaError_t (*DriverGetVersion)(int *);
    const char *(*GetErrorString)(cudaError_t);
    cudaError_t (*GetLastError)(void);
    cudaError_t (*DeviceGetPCIBusId)(char *, int, int);
    cudaError_t (*DeviceGetStreamPriorityRange)(int *, int *);
    cudaError_t (*StreamCreateWithPriority)(cudaStream_t *, unsigned int, int);
    cudaError_t (*StreamDestroy)(cudaStream_t);
    cudaError_t (*StreamSynchronize)(cudaStream_t);
    cudaError_t (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned int);
    cudaError_t (*EventCreateWithFlags)(cudaEvent_t *, unsigned int);
    cudaError_t (*EventDestroy)(cudaEvent_t);
    cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
    cudaError_t (*EventQuery)(cudaEvent_t);
    cudaError_t (*Malloc)(void **, size_t);
    cudaError_t (*Free)(void *);
    cudaError_t (*MallocAsync)(void **, size_t, cudaStream_t);
    cudaError_t (*FreeAsync)(void *, cudaStream_t);
    cudaError_t (*HostAlloc)(void **, size_t, unsigned int);
    cudaError_t (*FreeHost)(void *);
    cudaError_t (*MemcpyAsync)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
    cudaError_t (*MemsetAsync)(void *, int, size_t, cudaStream_t);
    cudaError_t (*PointerGetAttributes)(struct cudaPointerAttributes *, const void *);
    /* CUDA >= 13 signature; NULL before */
    cudaError_t (*MemcpyBatchAsync)(void *const *, const void *const *, const size_t *, size_t,
                                    struct cudaMemcpyAttributes *, size_t *, size_t, cudaStream_t);
};

struct cuda_drv {
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
    CUresult (*GetErrorString)(CUresult, const char **);
};

struct nccl_fns {
    ncclResult_t (*GetVersion)(int *);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *); /* opt */
    const char *(*GetErrorString)(ncclResult_t);
    const char *(*GetLastError)(ncclComm_t); /* optional */
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                  ncclComm_t, cudaStream_t);
    ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                           ncclComm_t, cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*RedOpCreatePreMulSum)(ncclRedOp_t *, void *, ncclDataType_t,
                                         ncclScalarResidence_t, ncclComm_t); /* optional */
    ncclResult_t (*RedOpDestroy)(ncclRedOp_t, ncclComm_t);                   /* optional */
};

struct gpu_libs {
    struct cuda_rt rt;
    struct cuda_drv drv; /* all NULL if libcuda or a symbol is missing */
    struct nccl_fns nccl;
    int nccl_version;    /* e.g. 22803 */
    int runtime_version; /* e.g. 13000 */
    int device_count;    /* visible devices when loaded */
};

/*
 * gpu_libs_load loads the CUDA runtime, NCCL and (optionally) the driver
 * API once per process and counts the visible devices. Returns the tables,
 * or NULL with the reason in err: the library that is missing, or "no
 * CUDA device" with the runtime's words. Thread-safe; the outcome is
 * cached, so a host without GPUs pays for the probe once.
 * $KOLO_CUDART_LIBRARY and $KOLO_NCCL_LIBRARY override the file names.
 */
const struct gpu_libs *gpu_libs_load(char *err, size_t errlen);

/* The text of a CUDA or NCCL result, never NULL. */
const char *gpu_cuda_str(cudaError_t e);
const char *gpu_nccl_str(ncclResult_t r);

/*
 * The scaling kernels (PTX, JIT-compiled by the driver on first use; no
 * nvcc at build time). gpu_scale_launch queues buf[i] = S(buf[i]) on
 * stream for count elements of dtype, where S is:
 *   floating types: x * factor (float16/bfloat16 in float32, rounded to
 *     nearest even, as reduce_scale does on the CPU; divisor ignored);
 *   integer types: trunc(trunc(x / divisor) * factor) in double,
 *     saturated to the type's range, NaN -> 0 (reduce_divide followed by
 *     reduce_scale).
 * Returns 0, or KOLO_ENOTSUP with the reason in err when the driver API
 * or the JIT is unavailable, KOLO_EIO when the launch fails. The module is
 * loaded per device the first time it is needed (dev must be current).
 */
int gpu_scale_launch(const struct gpu_libs *g, int dev, kolo_dtype dt, void *buf, size_t count,
                     double factor, double divisor, cudaStream_t stream, char *err, size_t errlen);

/* The NCCL type for a kolo dtype for reductions; -1 when NCCL has none
 * (int16). Data movement needs no type: it moves ncclUint8 bytes. */
int gpu_nccl_type(kolo_dtype dt);

#endif /* KOLO_HAVE_NCCL */
#endif
