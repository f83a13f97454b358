/*
 * settings.h - libkolo's knobs: every KOLO_ and HOROVOD_ environment
 * variable the library reads, declared once in LIBKOLO_SETTINGS (name,
 * Horovod alias, type, default, range, help) and read only through this
 * file. kolo_init checks them all (settings_check): a value that does not
 * parse or is out of range fails the init with the variable named, rather
 * than being ignored. The accessors read the environment when called, so
 * a test or a program may change a variable between inits, and a backend
 * used without a context (the transport and shared-memory tests) reads the
 * same table. docs/libkolo.md's "Environment" table lists exactly these
 * (tests/worker/test_settings.c compares them).
 *
 * Types: STR (any text; CHOICE: one of the words in `range`), INT (a
 * decimal integer within [min, max]), BOOL (0/1, true/false, yes/no,
 * on/off), SIZE (bytes: 64, 4k, 16M, 1G; within [min, max]). A default of
 * NULL means unset: the code that reads the knob decides (settings_set
 * tells whether it was given).
 */
#ifndef KOLO_WORKER_SETTINGS_H
#define KOLO_WORKER_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* X(ID, env, alias or NULL, type, default or NULL, min, max, choices, help) */
#define LIBKOLO_SETTINGS(X)                                                                        \
    /* set by the agent (kolo run) for every worker */                                             \
    X(COORDINATOR, "KOLO_COORDINATOR", NULL, STR, NULL, 0, 0, NULL,                                \
      "the coordinator's RPC address")                                                            \
    X(TOKEN, "KOLO_TOKEN", NULL, STR, NULL, 0, 0, NULL,                                            \
      "a cluster token, for workers started by hand")                                             \
    X(JOB_TOKEN, "KOLO_JOB_TOKEN", NULL, STR, NULL, 0, 0, NULL, "the job's credential")            \
    X(JOB, "KOLO_JOB", NULL, INT, "0", 0, INT64_MAX, NULL, "the job's id")                         \
    X(GENERATION, "KOLO_GENERATION", NULL, INT, "0", 0, INT64_MAX, NULL, "the generation")         \
    X(RANK, "KOLO_RANK", NULL, INT, "-1", -1, INT32_MAX, NULL, "this worker's rank")               \
    X(SIZE, "KOLO_SIZE", "HOROVOD_SIZE", INT, "-1", -1, INT32_MAX, NULL,                           \
      "the number of ranks (without KOLO_COORDINATOR: unset or 1)")                               \
    X(LOCAL_RANK, "KOLO_LOCAL_RANK", NULL, INT, "0", 0, INT32_MAX, NULL, "rank on this host")      \
    X(LOCAL_SIZE, "KOLO_LOCAL_SIZE", NULL, INT, "1", 1, INT32_MAX, NULL, "ranks on this host")     \
    X(CROSS_RANK, "KOLO_CROSS_RANK", NULL, INT, "0", 0, INT32_MAX, NULL, "this host's index")      \
    X(CROSS_SIZE, "KOLO_CROSS_SIZE", NULL, INT, "1", 1, INT32_MAX, NULL, "the number of hosts")    \
    X(HOST_ID, "KOLO_HOST_ID", NULL, STR, NULL, 0, 0, NULL,                                        \
      "ranks with the same host id share memory")                                                 \
    X(ELASTIC, "KOLO_ELASTIC", NULL, BOOL, "0", 0, 0, NULL, "the job is elastic")                  \
    X(WORKER_ID, "KOLO_WORKER_ID", NULL, INT, "0", 0, INT64_MAX, NULL, "an elastic worker's id")   \
    X(ELASTIC_TIMEOUT_MS, "KOLO_ELASTIC_TIMEOUT_MS", NULL, INT, "0", 0, INT32_MAX, NULL,           \
      "how long an elastic rendezvous may wait (0: the coordinator's)")                           \
    /* tuning and choices */                                                                      \
    X(TIMEOUT_MS, "KOLO_TIMEOUT_MS", NULL, INT, "0", 0, INT32_MAX, NULL,                           \
      "rendezvous deadline and data-plane liveness window (0: 30000)")                            \
    X(DATA_ADDR, "KOLO_DATA_ADDR", NULL, STR, NULL, 0, 0, NULL,                                    \
      "the address peers connect to")                                                             \
    X(FUSION_THRESHOLD, "KOLO_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", SIZE, NULL, 0,        \
      INT64_MAX, NULL, "fusion buffer bytes (0 disables fusion; unset: 64 MiB)")                  \
    X(DISABLE_SHM, "KOLO_DISABLE_SHM", NULL, BOOL, "0", 0, 0, NULL, "TCP even on one host")        \
    X(DATA_ENCRYPT, "KOLO_DATA_ENCRYPT", NULL, BOOL, "0", 0, 0, NULL,                              \
      "seal the TCP data plane (AES-256-GCM)")                                                    \
    X(CRYPTO_LIBRARY, "KOLO_CRYPTO_LIBRARY", NULL, STR, NULL, 0, 0, NULL,                          \
      "the libcrypto an encrypted data plane loads")                                              \
    X(FAST_PATH, "KOLO_FAST_PATH", NULL, CHOICE, "auto", 0, 0, "auto 1 0",                         \
      "readiness rounds: auto or 1 on, 0 every op through the coordinator")                       \
    X(TELEMETRY, "KOLO_TELEMETRY", NULL, BOOL, "1", 0, 0, NULL,                                   \
      "where each rank's time goes and the rounds' waits, reported (0: off, to measure their cost)") \
    X(SPIN_US, "KOLO_SPIN_US", NULL, INT, NULL, 0, 1000000, NULL,                                  \
      "µs a waiter spins before it sleeps (unset: 20; shared memory on crowded hosts less)")      \
    X(YIELD_US, "KOLO_YIELD_US", NULL, INT, NULL, 0, 1000000, NULL,                                \
      "µs a shared-memory waiter yields after spinning (unset: 0; crowded hosts more)")           \
    X(FAULT_CACHE_SKEW, "KOLO_FAULT_CACHE_SKEW", NULL, BOOL, "0", 0, 0, NULL,                    \
      "fault injection (tests): a resume reports a response cache that differs from the others'") \
    X(SHM_CHUNK, "KOLO_SHM_CHUNK", NULL, SIZE, NULL, 1, 1ll << 30, NULL,                           \
      "shared-memory pipeline chunk bytes (unset: 1 MiB)")                                        \
    X(SHM_SMALL, "KOLO_SHM_SMALL", NULL, SIZE, NULL, 0, 64ll << 20, NULL,                          \
      "shared-memory small-message slot bytes (unset: 64 KiB)")                                   \
    X(HIER_LANES, "KOLO_HIER_LANES", NULL, SIZE, NULL, 0, INT64_MAX, NULL,                         \
      "across hosts, allreduces from this many bytes use every lane (unset: 128 KiB)")            \
    X(KEEP_SEGMENTS, "KOLO_KEEP_SEGMENTS", NULL, BOOL, "1", 0, 0, NULL,                          \
      "an elastic rank keeps its host's shared segment across a reset (0: new ones each time)")  \
    X(SNAPSHOT_KEEP, "KOLO_SNAPSHOT_KEEP", NULL, INT, "0", 0, 100000, NULL,                        \
      "snapshots the coordinator keeps for this job (0: the coordinator's)")                      \
    X(SNAPSHOT_CHUNK_BYTES, "KOLO_SNAPSHOT_CHUNK_BYTES", NULL, SIZE, "768k", 4096, 896ll << 10,   \
      NULL, "snapshot upload chunk bytes (a chunk and its meta fit in one RPC request, 1 MiB)")   \
    X(LOG_LEVEL, "KOLO_LOG_LEVEL", NULL, STR, "off", 0, 0, NULL,                                   \
      "trace, debug, info, warn, error or off (common/log.c reads and checks it)")               \
    /* Horovod's stall inspector */                                                               \
    X(STALL_CHECK_DISABLE, "HOROVOD_STALL_CHECK_DISABLE", NULL, BOOL, "0", 0, 0, NULL,             \
      "no stall warnings")                                                                        \
    X(STALL_CHECK_TIME_SECONDS, "HOROVOD_STALL_CHECK_TIME_SECONDS", NULL, INT, "0", 0, INT32_MAX,  \
      NULL, "seconds before a stall warning (0: 60)")                                             \
    X(STALL_SHUTDOWN_TIME_SECONDS, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", NULL, INT, "0", 0,       \
      INT32_MAX, NULL, "seconds before a stall fails the operations (0: never)")                  \
    /* Horovod's timeline: rank 0 keeps a copy there (timeline.c) */                              \
    X(TIMELINE, "HOROVOD_TIMELINE", NULL, STR, NULL, 0, 0, NULL,                                   \
      "rank 0 writes the job's timeline (traced by the coordinator) to this path")                \
    /* GPUs */                                                                                    \
    X(GPU_STAGING, "KOLO_GPU_STAGING", NULL, CHOICE, NULL, 0, 0, "0 1",                            \
      "ranks sharing a GPU: 1 stage through host memory, 0 try NCCL (unset: stage if shared)")    \
    X(HIERARCHICAL_ALLREDUCE, "KOLO_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE",     \
      CHOICE, NULL, 0, 0, "0 1 force", "GPU allreduce within hosts, then across (force: always)") \
    X(NCCL_LIBRARY, "KOLO_NCCL_LIBRARY", NULL, STR, NULL, 0, 0, NULL, "the libnccl to load")       \
    X(CUDART_LIBRARY, "KOLO_CUDART_LIBRARY", NULL, STR, NULL, 0, 0, NULL,                          \
      "the CUDA runtime to load")                                                                 \
    X(CUDA_DRIVER_LIBRARY, "KOLO_CUDA_DRIVER_LIBRARY", NULL, STR, NULL, 0, 0, NULL,                \
      "the CUDA driver library to load")

enum setting {
#define SETTING_ENUM_(id, env, alias, type, def, min, max, choices, help) SET_##id,
    LIBKOLO_SETTINGS(SETTING_ENUM_)
#undef SETTING_ENUM_
    SET_COUNT
};

enum setting_type { SETTING_STR, SETTING_CHOICE, SETTING_INT, SETTING_BOOL, SETTING_SIZE };

struct setting_info {
    const char *env, *alias;
    enum setting_type type;
    const char *def;
    int64_t min, max;
    const char *choices;
    const char *help;
};

/* the table, SET_COUNT entries in enum order */
extern const struct setting_info settings_table[SET_COUNT];

/* settings_raw: the variable's text (the alias's when the name is unset
 * or empty), or NULL when neither is set. */
const char *settings_raw(enum setting s);
/* settings_set: the variable (or its alias) is given */
bool settings_set(enum setting s);
/* settings_str: the text, else the default (may be NULL) */
const char *settings_str(enum setting s);
/* settings_int: INT, BOOL (0/1) and SIZE values; the default when unset,
 * or when the text is invalid (kolo_init refuses that first), or `unset`
 * when there is no default. */
int64_t settings_int(enum setting s, int64_t unset);
/* settings_check: every knob parses and is in range; else KOLO_EINVAL
 * with the variable, its value and what it takes in err. */
int settings_check(char *err, size_t errlen);

#endif
