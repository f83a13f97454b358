/*
 * coord_negot_int.h - a generation's negotiation state, shared by the two
 * files that serve it: coord_negot.c (tensor negotiation, the response
 * log and cache, resume after a restart, stalls) and coord_rendezvous.c
 * (the rendezvous, sessions, process sets, the GPU communicator's id).
 * Nothing else includes it: the rest of the coordinator sees coord_negot.h.
 * The rules, the cache's table, the log and resume's logic themselves are
 * in negotiation/, without I/O.
 */
#ifndef KOLO_COORDINATOR_COORD_NEGOT_INT_H
#define KOLO_COORDINATOR_COORD_NEGOT_INT_H

#include "coord_negot.h"

#include "cache.h"
#include "creds.h"
#include "kolo.pb-c.h"
#include "resp_log.h"
#include "round.h"
#include "topology.h"

#define NEGOT_BUCKETS 4096
#define NEGOT_MAX_WAIT_MS 30000
#define NEGOT_MAX_SETS 64 /* process sets alive at once in one generation */
#define NEGOT_MAX_REPLY_BYTES (8u << 20)
/* ids 1..ROUND_MAX_ID: the ranks' readiness bitmaps cover them (round.h) */
#define NEGOT_CACHE_MAX (ROUND_MAX_ID + 1)
#define NEGOT_DEFAULT_FUSION (64ll << 20)
#define STALL_WARN_MS 60000

/* One rank's request for one tensor, copied out of the message. */
struct entry {
    char *name;
    uint32_t cache_id;
    struct tensor_req **reqs; /* [size]; NULL = not yet submitted */
    uint8_t *borrowed;  /* [size]; 1 = reqs[r] is the cache template (in reqs' block) */
    int count;
    uint64_t first_mono;
    uint64_t *arrive_us; /* [size]; when each rank's request came in (in reqs' block) */
    bool warned;
    struct entry *hnext;
    struct entry *prev, *next; /* pending list, arrival order */
};

struct peer {
    bool joined;
    char *host_id;
    char **addrs;
    int naddrs;
    int pid;
    char *shm_name;
    char *machine; /* RendezvousRequest.machine */
    uint64_t kept_segment; /* RendezvousRequest.kept_segment */
    char *data_host; /* ADDR of addrs[0] "tcp:ADDR:PORT", NULL when not that */
    int port;
    bool compact; /* its rendezvous asked for the compact peer table */
    struct rpc_call *parked;
    uint64_t deadline;
    /* sessions: this rank left the session (kolo_fini), or already asks
     * to join the next one (parked until every rank left this one) */
    bool left;
    struct rpc_call *next;
    uint64_t next_deadline;
};

struct negot {
    uint64_t job_id, generation;
    uint32_t session; /* see "sessions" in worker/runtime/ctx.c */
    int32_t set;      /* process set; 0 = the job */
    int size;
    /* without a cluster token: the job's credential from the coordinator's
     * own secret, the root of the mesh key rendezvous replies carry
     * (common/creds.h); empty with a token (ranks derive it themselves) */
    char job_cred[CREDS_JOB_HEX];
    int64_t fusion_threshold;
    int64_t stall_warning_ms, stall_shutdown_ms;
    /* rendezvous */
    struct peer *peers;
    int joined, nleft;
    bool complete;
    /* the topology rendezvous replies carry (negotiation/topology.h),
     * made from peers once complete; topo.size 0: not made since the
     * peers last changed */
    struct topology topo;
    /* the complete rendezvous reply in its compact form, packed once for
     * every rank that asks for it (rendezvous_answer; it holds the
     * data-plane key, zeroed when freed); NULL until then, and again
     * when the peers or the GPU id change */
    uint8_t *compact_reply;
    size_t compact_len;
    /* the GPU communicator's ncclUniqueId, posted by rank 0 (nccl_relay) */
    uint8_t nccl_id[128];
    size_t nccl_id_len;
    /* negotiation */
    struct entry *buckets[NEGOT_BUCKETS];
    struct entry *head, *tail;
    struct resp_log log;
    uint64_t *cursor;  /* per rank: first index not yet received */
    struct rpc_call **parked;
    uint64_t *parked_deadline;
    bool *rank_joined;
    int njoined, last_joined;
    /* stragglers: per rank, how long after the first rank its requests
     * arrive (moving average over tensors, seconds) */
    double *lag_s;
    /* with readiness rounds: per rank, its moving average wait per agreed
     * op (telemetry); round_waits once any rank reported one */
    double *round_wait_s;
    bool round_waits;
    bool shut;
    uint32_t calls_since_trim;
    struct timeline *tl; /* the job's (coord_timeline.c), borrowed; NULL: none */
    /* the job's elastic state (set 0 of an elastic job; else NULL),
     * borrowed: every reply carries its pending membership update */
    const struct elastic *el;
    /* resuming after a coordinator restart (see "resuming" below) */
    struct resume_in {
        Kolo__NegotiateRequest *req;
        struct rpc_call *call;
    } *res;
    int nresumed;
    uint64_t resume_deadline; /* monotonic; 0 = no resume started */
    char *resume_failed;
    /* the response cache (negotiation/cache.h): the ids given, each with
     * the signature a by-id submission stands for (lent to entries) */
    struct tensor_cache *cache;
    uint32_t next_id;             /* the next id never given */
    /* An elastic generation's start: the last generation's cache, frozen,
     * and as the rendezvous reply carries it (borrowing from carried) */
    struct tensor_cache *carried;
    Kolo__CacheEntry **carry;
    size_t ncarry;
    void *carry_block;
    struct entry **cache_pending; /* [id]: the entry awaiting it */
    bool rounds, rounds_known;   /* every rank runs readiness rounds: ids may be reused */
    uint64_t evictions;
};

/* coord_negot.c */
struct negot *negot_new(const struct coord *c, const struct job *j, int size, int32_t set);
/* worker_job: the job of a worker's call, fenced (coord_worker_fence), with
 * a negotiation for its generation; NULL when the call was answered. */
struct job *worker_job(struct coord *c, struct rpc_call *call, enum coord_method m);
/* resume_drop ends the resume calls still parked (mu held). */
void resume_drop(struct negot *n, int code, const char *why);

/* coord_rendezvous.c */
void coord_rpc_rendezvous(struct coord *c, struct rpc_call *call);
struct negot **negot_slot(struct coord *c, struct job *j, struct rpc_call *call, uint32_t set,
                          int size, enum coord_method m);
void rendezvous_answer(struct negot *n, struct rpc_call *call);
void rendezvous_not_yet(struct rpc_call *call);
void negot_drop_parked(struct negot *n, int code, const char *why);
void session_drained(struct coord *c, struct job *j, struct negot **slot);
void set_drained(struct job *j, struct negot **slot);

#endif
