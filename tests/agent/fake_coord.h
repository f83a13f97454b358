/*
 * fake_coord.h - a small stand-in for the coordinator's AgentService, for
 * the agent's tests: it answers RegisterHost, Heartbeat (parking it like
 * the real one) and Report, records what it receives, and can be told to
 * misbehave (forget the session, fail reports).
 *
 * Like the coordinator, it applies a Report's lines before its events and
 * numbers everything it records in one sequence (order), so tests can
 * check what came before what.
 */
#ifndef KOLO_TESTS_AGENT_FAKE_COORD_H
#define KOLO_TESTS_AGENT_FAKE_COORD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kolo.pb-c.h"

struct fake_event {
    uint64_t job_id, generation;
    int rank;
    int kind;
    int pid;
    int exit_code;
    int term_signal;
    char message[256];
    uint64_t order;
};

struct fake_line {
    uint64_t job_id;
    int rank;
    int stream;
    char *text;
    uint64_t order;
};

struct fake_parked {
    struct rpc_call *call;
    uint64_t deadline;
};

struct fake_coord {
    struct rpc_server *srv;
    pthread_mutex_t mu;
    pthread_t tick;
    bool stop;

    uint32_t heartbeat_ms;
    uint32_t stop_grace_ms;
    uint64_t version;
    uint8_t *desired_reply; /* packed HeartbeatReply with the desired set */
    size_t desired_len;

    char session[64];
    int session_counter;
    int registrations;
    char host_id[64];
    char agent_instance[64];
    Kolo__RunningWorker last_running[64];
    size_t n_last_running;
    int32_t slots;
    int heartbeats;
    int reports;
    int duplicate_batches;
    uint64_t last_batch_seq;

    struct fake_event *events;
    size_t n_events, cap_events;
    struct fake_line *lines;
    size_t n_lines, cap_lines;
    uint64_t order;

    /* Faults: the next N heartbeats forget the session and answer ESTALE;
     * the next N reports fail with EIO. */
    int stale_heartbeats;
    int fail_reports;

    struct fake_parked parked[32];
    size_t n_parked;
};

/* fake_open starts a fake on url ("tcp://127.0.0.1:0" or "inproc://x"). */
int fake_open(struct fake_coord **out, const char *url, uint32_t heartbeat_ms);
/* fake_open_token: the same, requiring the cluster token on every call. */
int fake_open_token(struct fake_coord **out, const char *url, uint32_t heartbeat_ms,
                    const char *token);
const char *fake_url(struct fake_coord *fc);
void fake_close(struct fake_coord *fc);

/* fake_set_desired replaces the desired set (specs are packed at once, the
 * caller keeps them) and wakes a parked heartbeat. */
void fake_set_desired(struct fake_coord *fc, Kolo__WorkerSpec **specs, size_t n);

void fake_lock(struct fake_coord *fc);
void fake_unlock(struct fake_coord *fc);

/* Under the lock: the first event of kind for (job, rank), or NULL. */
const struct fake_event *fake_find_event(struct fake_coord *fc, int kind, uint64_t job_id,
                                         int rank);
/* Locking helpers for polling. */
int fake_count_events(struct fake_coord *fc, int kind);
bool fake_get_event(struct fake_coord *fc, int kind, uint64_t job_id, int rank,
                    struct fake_event *out);
int fake_registrations(struct fake_coord *fc);

/* A WorkerSpec whose argv is {"sh", "-c", script}; free with spec_free. */
Kolo__WorkerSpec *spec_sh(uint64_t job_id, uint64_t generation, int rank, int size,
                          const char *script);
void spec_free(Kolo__WorkerSpec *s);

/* wait_until polls cond every 10 ms for at most ms; true when it held. */
#define WAIT_UNTIL(cond, ms)                                                                       \
    ({                                                                                             \
        uint64_t until_ = now_mono_ms() + (ms);                                                    \
        bool ok_;                                                                                  \
        while (!(ok_ = (cond)) && now_mono_ms() < until_)                                          \
            usleep(10000);                                                                         \
        ok_;                                                                                       \
    })

#endif
