/*
 * ctx.c - joining a job (rendezvous, data plane) and the background thread.
 *
 * kolo_init: open the RPC client; open a TCP listener (every rank, so any
 * placement works); if the environment says every rank of the job is on
 * this host, the first local rank also creates the shared segment for the
 * shmcoll backend. Rendezvous through the coordinator returns every
 * rank's host id, addresses, pid and the segment name. All on one host
 * with a segment: shmcoll. Otherwise: a full mesh of TCP connections
 * (rank r dials every lower rank, accepts every higher one) under the
 * ring backend. Everything is bounded by the config's timeout.
 *
 * Background thread: see ctx_model.h. Negotiation errors that mean the
 * generation is over (stale, the job ended, a rank left) become a sticky
 * error that fails every pending and future operation; transport errors
 * towards the coordinator are retried until the timeout, since the
 * coordinator may be restarting.
 */
#include "ctx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "resume.h"
#include "settings.h"
#include "creds.h"
#include "log.h"
#include "hier.h"
#include "keep.h"
#include "shm_names.h"
#include "mesh.h"
#include "topology.h"
#include "seal.h"
#include "transport.h"
#include "util.h"
#include "exec.h"
#include "fastpath.h"
#include "nccl_exec.h"
#include "ops.h"
#include "report.h"
#include "snapshot.h"
#include "solo.h"
#include "timeline.h"

#define RENDEZVOUS_SLICE_MS 5000

static void negotiate_send(struct kolo_ctx *c, bool shutdown, const char *reason);
static void negotiate_done(void *arg, int code, const void *rep, size_t len, const char *err);
static void request_fill(Kolo__TensorRequest *t, const struct op *o);
struct negot_call;
static int negotiate_call(struct kolo_ctx *c, const Kolo__NegotiateRequest *req, int timeout_ms,
                          struct negot_call *nc, void *a1, void *a2, void *a3);
#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_FUSION (64ll << 20)

/* Sets the sticky error and fails everything pending (mu held). */
void ctx_fail(struct kolo_ctx *c, int code, const char *msg)
{
    if (!c->sticky) {
        c->sticky = code;
        snprintf(c->sticky_msg, sizeof(c->sticky_msg), "%s", msg);
        if (code != KOLO_ESHUTDOWN || c->inflight || c->q_head)
            LOGW("kolo", "rank %d: %s (%s)", c->rank, msg, kolo_errname(code));
    }
    ops_fail_all(c, c->sticky, c->sticky_msg);
    pthread_cond_signal(&c->wake);
}

/* ---------------------------------------------------------------- config */

/* The first non-loopback IPv4 address, or 127.0.0.1. */
static void default_data_addr(char *out, size_t n)
{
    struct ifaddrs *ifs = NULL, *i;
    str_copy(out, "127.0.0.1", n);
    if (getifaddrs(&ifs) != 0)
        return;
    for (i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        struct sockaddr_in *sin = (struct sockaddr_in *)i->ifa_addr;
        if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127)
            continue;
        inet_ntop(AF_INET, &sin->sin_addr, out, (socklen_t)n);
        break;
    }
    freeifaddrs(ifs);
}

static int config_from_env(kolo_config *cfg, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->coordinator = settings_str(SET_COORDINATOR);
    cfg->token = settings_str(SET_TOKEN);
    cfg->job_token = settings_str(SET_JOB_TOKEN);
    cfg->job_id = (uint64_t)settings_int(SET_JOB, 0);
    cfg->generation = (uint64_t)settings_int(SET_GENERATION, 0);
    cfg->rank = (int)settings_int(SET_RANK, -1);
    cfg->size = (int)settings_int(SET_SIZE, -1);
    cfg->local_rank = (int)settings_int(SET_LOCAL_RANK, 0);
    cfg->local_size = (int)settings_int(SET_LOCAL_SIZE, 1);
    cfg->cross_rank = (int)settings_int(SET_CROSS_RANK, 0);
    cfg->cross_size = (int)settings_int(SET_CROSS_SIZE, 1);
    cfg->host_id = settings_str(SET_HOST_ID);
    cfg->data_addr = settings_str(SET_DATA_ADDR);
    cfg->timeout_ms = (int)settings_int(SET_TIMEOUT_MS, 0);
    if (settings_set(SET_FUSION_THRESHOLD)) {
        cfg->fusion_threshold = settings_int(SET_FUSION_THRESHOLD, 0);
        if (cfg->fusion_threshold == 0)
            cfg->fusion_threshold = -1; /* Horovod: 0 disables fusion */
    }
    cfg->disable_shm = (int)settings_int(SET_DISABLE_SHM, 0);
    cfg->encrypt_data = (int)settings_int(SET_DATA_ENCRYPT, 0);
    if (settings_int(SET_ELASTIC, 0)) {
        cfg->worker_id = (uint64_t)settings_int(SET_WORKER_ID, 0);
        cfg->elastic_timeout_ms = (int)settings_int(SET_ELASTIC_TIMEOUT_MS, 0);
    }
    if (!cfg->coordinator || !cfg->coordinator[0])
        return 0; /* alone: solo_config decides (solo.c) */
    if (cfg->rank < 0 || cfg->size < 1 || !cfg->job_id) {
        snprintf(err, errlen,
                 "KOLO_COORDINATOR is set but not all of KOLO_JOB, KOLO_RANK and KOLO_SIZE: run "
                 "the program with `kolo run`, or unset KOLO_COORDINATOR to run it alone");
        return KOLO_EINVAL;
    }
    return 0;
}

/* ---------------------------------------------------------------- rendezvous */

struct rdv {
    int listen_fd;
    int port;
    char addr[64];
    char shm_name[64];
    struct coll *shm; /* created by the local leader before rendezvous */
    /* elastic: the segment kept from the last generation (keep.h), what
     * this rank reports of it, and what its host does with it */
    struct coll *held;
    uint64_t kept;
    enum keep_plan plan;
    Kolo__RendezvousReply *reply;
    /* What the reply told of every rank, in either of its forms (see
     * peer_view): pointers into the reply, or into parsed. */
    const char **host_id;  /* [nhosts] */
    const char **host_shm; /* [nhosts]: the host's segment, "" none */
    const char **host_machine; /* [nhosts]: its boot id, "" unknown */
    const char **peer_addr; /* [size]: where rank r listens */
    int *peer_port;         /* [size] */
    int *peer_pid;          /* [size] */
    uint64_t *peer_kept;    /* [size]: its kept segment (keep.h), 0 none */
    char (*parsed)[64];    /* [size]: the addresses of a full peer table */
};

static void rdv_free(struct rdv *rv)
{
    if (rv->reply)
        kolo__rendezvous_reply__free_unpacked(rv->reply, NULL);
    free(rv->host_id);
    free(rv->host_shm);
    free(rv->host_machine);
    free(rv->peer_addr);
    free(rv->peer_port);
    free(rv->peer_pid);
    free(rv->peer_kept);
    free(rv->parsed);
    if (rv->held)
        rv->held->ops->destroy(rv->held);
}

/* One Rendezvous call. 0 with *rep set, 0 with *rep NULL when the
 * coordinator could not be reached (the caller retries until its own
 * deadline), or an error. */
static int rendezvous_call(struct kolo_ctx *c, const Kolo__RendezvousRequest *req,
                           Kolo__RendezvousReply **rep, char *err, size_t errlen)
{
    *rep = NULL;
    size_t len = kolo__rendezvous_request__get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    void *out = NULL;
    size_t olen = 0;
    if (!buf)
        return KOLO_ENOMEM;
    kolo__rendezvous_request__pack(req, buf);
    int code = rpc_client_call(c->rpc, "WorkerService.Rendezvous", buf, len, &out, &olen,
                               (int)req->wait_ms + 5000, err, errlen);
    free(buf);
    /* busy: the coordinator holds as many calls as it takes (retried
     * until this call's deadline); the rendezvous goes on until its own */
    if (code == KOLO_ETIMEDOUT || code == KOLO_ECONNREFUSED || code == KOLO_EIO ||
        code == KOLO_EBUSY) {
        usleep(100000);
        return 0;
    }
    if (code)
        return code;
    *rep = kolo__rendezvous_reply__unpack(NULL, olen, out);
    free(out);
    if (!*rep) {
        snprintf(err, errlen, "malformed rendezvous reply");
        return KOLO_EPROTO;
    }
    return 0;
}

static int rendezvous(struct kolo_ctx *c, const kolo_config *cfg, struct rdv *rv, char *err,
                      size_t errlen)
{
    uint64_t deadline = ctx_deadline(c);
    char addr_text[96];
    snprintf(addr_text, sizeof(addr_text), "tcp:%s:%d", rv->addr, rv->port);
    char *addrs[1] = {addr_text};
    for (;;) {
        uint64_t now = now_mono_ms();
        if (now >= deadline) {
            snprintf(err, errlen, "rendezvous: not every rank joined within %d ms",
                     c->timeout_ms);
            return KOLO_ETIMEDOUT;
        }
        uint32_t wait = (uint32_t)deadline_left(deadline, RENDEZVOUS_SLICE_MS);
        Kolo__RendezvousRequest req = KOLO__RENDEZVOUS_REQUEST__INIT;
        req.host_id = (char *)(cfg->host_id ? cfg->host_id : "");
        req.data_addrs = addrs;
        req.n_data_addrs = 1;
        req.pid = (int32_t)getpid();
        req.shm_name = rv->shm_name;
        req.wait_ms = wait;
        req.size = c->size;
        req.fusion_threshold = c->fusion_threshold;
        req.stall_warning_ms = c->stall_warning_ms;
        req.stall_shutdown_ms = c->stall_shutdown_ms;
        req.session = c->session;
        req.process_set = c->process_set;
        req.compact_peers = true;
        req.machine = (char *)machine_id();
        req.kept_segment = rv->kept;
        Kolo__RendezvousReply *rep = NULL;
        int code = rendezvous_call(c, &req, &rep, err, errlen);
        if (code)
            return code;
        if (!rep)
            continue; /* the coordinator may be starting or restarting */
        /* complete: the peer table, or its compact form in the hosts */
        if (rep->complete && (rep->n_peers == (size_t)c->size ||
                              (rep->n_peers == 0 && rep->n_hosts > 0))) {
            rv->reply = rep;
            /* rank 0's (0 from an older coordinator: ours) */
            c->fused_threshold = rep->fusion_threshold ? rep->fusion_threshold
                                                       : c->fusion_threshold;
            return 0;
        }
        kolo__rendezvous_reply__free_unpacked(rep, NULL);
    }
}

/* Elastic: asks for this worker's place in the current generation, until
 * it is formed or the deadline passes; fills the topology fields of cfg. */
static int ask_place(struct kolo_ctx *c, kolo_config *cfg, uint64_t deadline, char *err,
                     size_t errlen)
{
    uint64_t budget = deadline > now_mono_ms() ? deadline - now_mono_ms() : 0;
    for (;;) {
        uint64_t now = now_mono_ms();
        if (now >= deadline) {
            snprintf(err, errlen, "no place in the elastic job within its timeout");
            return KOLO_ETIMEDOUT;
        }
        uint32_t wait = (uint32_t)deadline_left(deadline, RENDEZVOUS_SLICE_MS);
        Kolo__RendezvousRequest req = KOLO__RENDEZVOUS_REQUEST__INIT;
        req.worker_id = cfg->worker_id;
        req.wait_ms = wait;
        req.host_id = (char *)(cfg->host_id ? cfg->host_id : "");
        req.shm_name = "";
        Kolo__RendezvousReply *rep = NULL;
        int code = rendezvous_call(c, &req, &rep, err, errlen);
        if (code)
            return code;
        if (!rep)
            continue; /* the coordinator may be starting or restarting */
        bool placed = rep->generation != 0 && rep->size > 0 && rep->rank >= 0 &&
                      rep->rank < rep->size;
        if (!placed && rep->spare)
            deadline = now_mono_ms() + budget; /* a hot spare waits as long as it is one */
        if (placed) {
            cfg->generation = rep->generation;
            cfg->rank = rep->rank;
            cfg->size = rep->size;
            cfg->local_rank = rep->local_rank;
            cfg->local_size = rep->local_size;
            cfg->cross_rank = rep->cross_rank;
            cfg->cross_size = rep->cross_size;
        }
        kolo__rendezvous_reply__free_unpacked(rep, NULL);
        if (placed)
            return 0;
    }
}

/* The key this generation's mesh proves (common/creds.h): derived from
 * the job's credential, or for a coordinator without a token the one its
 * rendezvous reply carries. */
static int data_key(const struct kolo_ctx *c, const struct rdv *rv, unsigned char key[32],
                    char *err, size_t errlen)
{
    char cred[CREDS_JOB_HEX];
    const char *job_cred = c->coord_token;
    if (job_cred && !c->coord_token_job) {
        creds_job(c->coord_token, c->job, cred);
        job_cred = cred;
    }
    if (job_cred) {
        creds_data_key(job_cred, c->job, c->generation, c->session, c->process_set, key);
        memset(cred, 0, sizeof cred);
        return 0;
    }
    if (rv->reply->data_key.len == CREDS_KEY_LEN) {
        memcpy(key, rv->reply->data_key.data, CREDS_KEY_LEN);
        return 0;
    }
    snprintf(err, errlen, "the coordinator sent no data-plane key and this rank has no token "
             "(a coordinator older than this libkolo?)");
    return KOLO_EPROTO;
}

/* The rendezvous reply's view of every rank (rv->host_id .. rv->peer_pid),
 * from its compact form (each host of the topology with its ranks'
 * address, ports and pids, RendezvousRequest.compact_peers) or from an
 * older coordinator's peer table (one PeerInfo a rank, "tcp:ADDR:PORT"
 * parsed into rv->parsed). */
static int peer_view(struct rdv *rv, const struct topology *t, int size, char *err,
                     size_t errlen)
{
    const Kolo__RendezvousReply *rep = rv->reply;
    rv->host_id = calloc((size_t)t->nhosts, sizeof(*rv->host_id));
    rv->host_shm = calloc((size_t)t->nhosts, sizeof(*rv->host_shm));
    rv->host_machine = calloc((size_t)t->nhosts, sizeof(*rv->host_machine));
    rv->peer_addr = calloc((size_t)size, sizeof(*rv->peer_addr));
    rv->peer_port = calloc((size_t)size, sizeof(*rv->peer_port));
    rv->peer_pid = calloc((size_t)size, sizeof(*rv->peer_pid));
    rv->peer_kept = calloc((size_t)size, sizeof(*rv->peer_kept));
    bool table = rep->n_peers == (size_t)size;
    if (table)
        rv->parsed = calloc((size_t)size, sizeof(*rv->parsed));
    if (!rv->host_id || !rv->host_shm || !rv->host_machine || !rv->peer_addr || !rv->peer_port || !rv->peer_pid ||
        !rv->peer_kept || (table && !rv->parsed))
        return KOLO_ENOMEM;
    for (int h = 0; h < t->nhosts; h++) {
        const Kolo__TopoHost *th = table ? NULL : rep->hosts[h];
        if (th && (th->n_ports != th->n_ranks || th->n_pids != th->n_ranks ||
                   (th->n_kept_segments && th->n_kept_segments != th->n_ranks))) {
            snprintf(err, errlen, "the coordinator's peer table lists %zu ranks of host %s but "
                     "%zu ports, %zu pids and %zu kept segments", th->n_ranks, th->host_id,
                     th->n_ports, th->n_pids, th->n_kept_segments);
            return KOLO_EPROTO;
        }
        const Kolo__PeerInfo *lead = table ? rep->peers[topology_rank(t, h, 0)] : NULL;
        rv->host_id[h] = th ? th->host_id : lead->host_id;
        rv->host_shm[h] = th ? th->shm_name : lead->shm_name;
        rv->host_machine[h] = th ? th->machine : lead->machine;
        for (int i = 0; i < t->count[h]; i++) {
            int r = topology_rank(t, h, i);
            if (th) {
                rv->peer_addr[r] = th->data_host;
                rv->peer_port[r] = th->ports[i];
                rv->peer_pid[r] = th->pids[i];
                rv->peer_kept[r] = th->n_kept_segments ? th->kept_segments[i] : 0;
            } else {
                const Kolo__PeerInfo *p = rep->peers[r];
                for (size_t k = 0; k < p->n_data_addrs; k++)
                    if (tcp_addr_parse(p->data_addrs[k], rv->parsed[r], sizeof(rv->parsed[r]),
                                       &rv->peer_port[r]))
                        break;
                rv->peer_addr[r] = rv->parsed[r];
                rv->peer_pid[r] = p->pid;
                rv->peer_kept[r] = p->kept_segment;
            }
            if (rv->peer_port[r] <= 0 || rv->peer_port[r] > 65535 || !rv->peer_addr[r][0]) {
                snprintf(err, errlen, "rank %d sent no usable data-plane address", r);
                return KOLO_EPROTO;
            }
        }
    }
    return 0;
}

/* Every rank's host id for the context (c->peer_hosts): one block of
 * size pointers followed by each host's id once. */
static char **host_table(const struct rdv *rv, const struct topology *t, int size)
{
    size_t bytes = (size_t)size * sizeof(char *);
    for (int h = 0; h < t->nhosts; h++)
        bytes += strlen(rv->host_id[h]) + 1;
    char **ptrs = malloc(bytes);
    if (!ptrs)
        return NULL;
    char *text = (char *)(ptrs + size);
    for (int h = 0; h < t->nhosts; h++) {
        size_t n = strlen(rv->host_id[h]) + 1;
        memcpy(text, rv->host_id[h], n);
        for (int i = 0; i < t->count[h]; i++)
            ptrs[topology_rank(t, h, i)] = text;
        text += n;
    }
    return ptrs;
}

/* The ranks of this generation that run on this rank's machine: its
 * host's, and those of every other host that reported the same boot id
 * (hosts as network namespaces or containers of one machine). */
static int ranks_on_machine(const struct rdv *rv, const struct topology *t, int rank)
{
    int mine = t->host[rank], n = t->count[mine];
    const char *me = rv->host_machine[mine];
    for (int h = 0; me && me[0] && h < t->nhosts; h++)
        if (h != mine && rv->host_machine[h] && !strcmp(rv->host_machine[h], me))
            n += t->count[h];
    return n;
}

/* Spin briefly on the sockets when every rank on this machine has a CPU
 * to itself (KOLO_SPIN_US; 0 never): a 4 B allreduce between two hosts
 * then costs about the round trip, not a wake-up on each side. On a
 * crowded machine a spinning rank would take the CPU a peer needs (2
 * namespace hosts x 2 ranks on 2 CPUs, 4 B: 113 us spinning, 67 us not). */
static bool spin_on_sockets(const struct kolo_ctx *c)
{
    return c->machine_ranks <= usable_cpus();
}

/* Every rank with every other over TCP: only when some host's ranks
 * cannot share memory (KOLO_DISABLE_SHM, or a segment that could not be
 * made). */
static int connect_mesh(struct kolo_ctx *c, struct rdv *rv, char *err, size_t errlen)
{
    struct mesh_spec spec = {.me = {.job = c->job,
                                    .generation = c->generation,
                                    .rank = c->rank,
                                    .encrypt = c->encrypt_data},
                             .size = c->size,
                             .listen_fd = rv->listen_fd,
                             .deadline = ctx_deadline(c)};
    struct xport **peers = calloc((size_t)c->size, sizeof(*peers));
    int code = 0;
    if (!peers) {
        code = KOLO_ENOMEM;
        goto out;
    }
    if ((code = data_key(c, rv, spec.me.key, err, errlen)) != 0)
        goto out;
    spec.hosts = rv->peer_addr;
    spec.ports = rv->peer_port;
    code = mesh_connect(&spec, peers, err, errlen);
    memset(spec.me.key, 0, sizeof spec.me.key);
    if (code)
        goto out;
    bool spin = spin_on_sockets(c);
    for (int r = 0; r < c->size; r++)
        if (peers[r])
            peers[r]->spin = spin;
    code = ring_create(c->rank, c->size, peers, &c->coll);
    if (code)
        snprintf(err, errlen, "cannot set up the ring: %s", kolo_strerror(code));
out:
    free(peers);
    return code;
}

/* The generation's topology: the coordinator's, or (an older one sent
 * none) derived from the peer table by the same rule. */
static int make_topology(const struct rdv *rv, int size, struct topology *t, char *err,
                         size_t errlen)
{
    const Kolo__RendezvousReply *rep = rv->reply;
    char why[160];
    int code;
    if (rep->n_hosts > 0) {
        int *counts = calloc(rep->n_hosts, sizeof(int));
        int *ranks = calloc((size_t)size + 1, sizeof(int));
        size_t k = 0;
        code = counts && ranks ? 0 : KOLO_ENOMEM;
        for (size_t h = 0; !code && h < rep->n_hosts; h++) {
            counts[h] = (int)rep->hosts[h]->n_ranks;
            for (size_t i = 0; i < rep->hosts[h]->n_ranks && k < (size_t)size + 1; i++)
                ranks[k++] = rep->hosts[h]->ranks[i];
        }
        if (!code && k > (size_t)size) {
            snprintf(why, sizeof why, "more ranks than %d", size);
            code = KOLO_EPROTO;
        } else if (!code) {
            code = topology_set(t, size, (int)rep->n_hosts, counts, ranks, why, sizeof why);
        }
        free(counts);
        free(ranks);
    } else {
        const char **ids = calloc((size_t)size, sizeof(*ids));
        bool *leads = calloc((size_t)size, sizeof(*leads));
        code = ids && leads ? 0 : KOLO_ENOMEM;
        for (int r = 0; !code && r < size; r++) {
            ids[r] = rep->peers[r]->host_id;
            leads[r] = rep->peers[r]->shm_name[0] != '\0';
        }
        if (!code)
            code = topology_derive(t, size, ids, leads, why, sizeof why);
        free(ids);
        free(leads);
    }
    if (code == KOLO_ENOMEM)
        snprintf(err, errlen, "out of memory reading the topology");
    else if (code)
        snprintf(err, errlen, "the coordinator's topology is unusable: %s", why);
    return code;
}

/* true when every host of more than one rank has its shared segment */
static bool hosts_have_segments(const struct rdv *rv, const struct topology *t)
{
    for (int h = 0; h < t->nhosts; h++)
        if (t->count[h] > 1 && !rv->host_shm[h][0])
            return false;
    return true;
}

/* What this rank's host does with the segments its ranks kept (keep.h),
 * in rv->plan: every member decides alike from the same codes. A leader
 * that kept one made none and says so by its segment's name, also to a
 * coordinator that does not relay the codes. */
static int host_plan(struct rdv *rv, const struct topology *t, int rank)
{
    int h = t->host[rank], n = t->count[h];
    uint64_t *codes = malloc((size_t)n * sizeof *codes);
    if (!codes)
        return KOLO_ENOMEM;
    for (int i = 0; i < n; i++)
        codes[i] = rv->peer_kept[topology_rank(t, h, i)];
    rv->plan = keep_plan(codes, n, rv->held ? rv->held->size : 0);
    free(codes);
    if (rv->plan == KEEP_NONE && !strcmp(rv->host_shm[h], KEEP_DEFERRED))
        rv->plan = KEEP_FRESH;
    return 0;
}

/* KEEP_REUSE (keep.h): the segment this rank kept, re-armed with the
 * rest of its host. */
static int rearm_segment(struct kolo_ctx *c, struct rdv *rv, const struct topology *t,
                         struct coll **out, char *err, size_t errlen)
{
    int h = t->host[c->rank];
    uint32_t token = (uint32_t)c->generation ? (uint32_t)c->generation : 1;
    int code = shmcoll_rearm(rv->held, token, ctx_deadline(c));
    if (code) {
        snprintf(err, errlen, "cannot re-arm the shared segment host %s kept: %s",
                 rv->host_id[h], rv->held->why);
        return code;
    }
    *out = rv->held;
    rv->held = NULL;
    shmcoll_share_cpus(*out, c->machine_ranks);
    if (t->local[c->rank] == 0)
        LOGI("kolo", "rank %d: host %s keeps its shared segment in generation %llu (%d ranks)",
             c->rank, rv->host_id[h], (unsigned long long)c->generation, t->count[h]);
    return 0;
}

/* KEEP_FRESH (keep.h): the segment's name, derived from the generation's
 * key; the leader makes it now (rv->shm). */
static int fresh_segment(struct kolo_ctx *c, struct rdv *rv, const struct topology *t,
                         char *name, size_t len)
{
    int h = t->host[c->rank];
    unsigned char key[CREDS_KEY_LEN];
    char why[160];
    int code = data_key(c, rv, key, why, sizeof why);
    if (!code)
        code = shm_names_derive(c->job, c->generation, rv->peer_pid[topology_rank(t, h, 0)],
                                rv->host_id[h], key, sizeof key, name, len);
    explicit_bzero(key, sizeof key);
    if (!code && t->local[c->rank] == 0) {
        code = shmcoll_create(name, 0, t->count[h], 0, &rv->shm);
        LOGI("kolo", "rank %d: host %s makes a new shared segment in generation %llu: its "
             "ranks changed (%d now)", c->rank, rv->host_id[h], (unsigned long long)c->generation,
             t->count[h]);
    }
    return code;
}

/* Attaches a host's segment; one that its leader makes after the
 * rendezvous (after_rendezvous) may not be there yet. */
static int attach_segment(const struct kolo_ctx *c, bool after_rendezvous, const char *name,
                          int me, int n, struct coll **out)
{
    uint64_t deadline = ctx_deadline(c);
    for (;;) {
        int code = shmcoll_attach(name, me, n, 0, out);
        if (code != KOLO_ENOTFOUND || !after_rendezvous || now_mono_ms() >= deadline)
            return code;
        usleep(200);
    }
}

/* This host's segment, as member t->local[rank] of t->count[host]: the
 * one this rank made (it leads the host), or its leader's. */
static int host_segment(struct kolo_ctx *c, struct rdv *rv, const struct topology *t,
                        struct coll **out, char *err, size_t errlen)
{
    int h = t->host[c->rank], me = t->local[c->rank], n = t->count[h];
    int code = 0;
    if (rv->shm && (me != 0 || rv->shm->size != n)) {
        snprintf(err, errlen, "host %s has %d rank(s) in this generation and rank %d leads it, "
                 "but this rank made a segment for %d (KOLO_LOCAL_RANK / KOLO_LOCAL_SIZE disagree "
                 "with the ranks' host ids)", rv->host_id[h], n, topology_rank(t, h, 0),
                 rv->shm->size);
        return KOLO_EPROTO;
    }
    if (rv->plan == KEEP_REUSE)
        return rearm_segment(c, rv, t, out, err, errlen);
    char fresh[64];
    const char *name = rv->host_shm[h];
    if (rv->plan == KEEP_FRESH && (code = fresh_segment(c, rv, t, fresh, sizeof fresh)) != 0) {
        snprintf(err, errlen, "cannot make the shared segment of host %s: %s", rv->host_id[h],
                 kolo_strerror(code));
        return code;
    }
    if (rv->plan == KEEP_FRESH)
        name = fresh;
    if (rv->shm) {
        *out = rv->shm;
        rv->shm = NULL;
    } else if ((code = attach_segment(c, rv->plan == KEEP_FRESH, name, me, n, out)) != 0) {
        snprintf(err, errlen, "cannot attach the shared segment %s of host %s: %s", name,
                 rv->host_id[h], kolo_strerror(code));
        return code;
    }
    shmcoll_share_cpus(*out, c->machine_ranks);
    int *pids = calloc((size_t)n, sizeof(int));
    if (!pids)
        return KOLO_ENOMEM; /* *out is destroyed by the caller */
    for (int i = 0; i < n; i++)
        pids[i] = rv->peer_pid[topology_rank(t, h, i)];
    code = shmcoll_ready(*out, pids, ctx_deadline(c));
    free(pids);
    if (code)
        snprintf(err, errlen, "shared-memory setup failed: %s", (*out)->why);
    return code;
}

/* A job on several hosts (or one whose ranks are not numbered in its
 * segment's order): the host's segment and this rank's lane links. */
static int connect_hier(struct kolo_ctx *c, struct rdv *rv, const struct topology *t, char *err,
                        size_t errlen)
{
    struct coll *local = NULL;
    struct hier_spec spec = {.topo = t,
                             .rank = c->rank,
                             .listen_fd = rv->listen_fd,
                             .hosts = rv->peer_addr,
                             .ports = rv->peer_port,
                             .me = {.job = c->job,
                                    .generation = c->generation,
                                    .rank = c->rank,
                                    .encrypt = c->encrypt_data},
                             .spin = spin_on_sockets(c),
                             .deadline = ctx_deadline(c)};
    int code = data_key(c, rv, spec.me.key, err, errlen);
    if (!code && t->count[t->host[c->rank]] > 1)
        code = host_segment(c, rv, t, &local, err, errlen);
    spec.local = local;
    if (!code && (code = hier_create(&spec, &c->coll, err, errlen)) == 0) {
        rv->listen_fd = -1; /* the coll keeps it, for alltoall's links */
        local = NULL;
    }
    memset(spec.me.key, 0, sizeof spec.me.key);
    if (local)
        local->ops->destroy(local);
    return code;
}

static int setup_data_plane(struct kolo_ctx *c, const kolo_config *cfg, char *err, size_t errlen)
{
    struct rdv rv = {.listen_fd = -1};
    struct topology t = {0};
    int code;
    if (cfg->data_addr && cfg->data_addr[0])
        str_copy(rv.addr, cfg->data_addr, sizeof(rv.addr));
    else
        default_data_addr(rv.addr, sizeof(rv.addr));
    /* Only on the address peers are told: nothing else of this host's
     * networks reaches the port. */
    if ((code = tcp_listen(rv.addr, &rv.listen_fd, &rv.port)) != 0) {
        snprintf(err, errlen, "cannot open the data-plane listener on %s: %s", rv.addr,
                 kolo_strerror(code));
        return code;
    }
    /* An elastic rank may hold its host's segment from the last
     * generation (keep.h): it says so; a leader holding one that fits
     * makes none. */
    if (c->elastic && !c->process_set && settings_int(SET_KEEP_SEGMENTS, 1))
        rv.held = keep_take(c->job, c->worker_id);
    bool lead = cfg->local_size > 1 && cfg->local_rank == 0 && !cfg->disable_shm;
    bool defer = lead && rv.held && rv.held->rank == 0 && rv.held->size == cfg->local_size;
    if (rv.held && (defer || !lead) && !cfg->disable_shm)
        rv.kept = keep_code(rv.held);
    if (defer)
        str_copy(rv.shm_name, KEEP_DEFERRED, sizeof(rv.shm_name));
    /* The first rank of a host makes the host's segment before the
     * rendezvous, which tells its name to the others. */
    if (lead && !defer) {
        shm_segment_name(c->job, c->generation, rv.shm_name, sizeof(rv.shm_name));
        if (shmcoll_create(rv.shm_name, 0, cfg->local_size, 0, &rv.shm) != 0) {
            LOGW("kolo", "cannot create the shared segment; using TCP");
            rv.shm = NULL;
            rv.shm_name[0] = '\0';
        }
    }
    if ((code = rendezvous(c, cfg, &rv, err, errlen)) != 0)
        goto out;
    if ((code = make_topology(&rv, c->size, &t, err, errlen)) != 0)
        goto out;
    if ((code = peer_view(&rv, &t, c->size, err, errlen)) != 0) {
        if (code == KOLO_ENOMEM)
            snprintf(err, errlen, "out of memory reading the peer table");
        goto out;
    }
    c->machine_ranks = ranks_on_machine(&rv, &t, c->rank);
    if ((code = host_plan(&rv, &t, c->rank)) != 0) {
        snprintf(err, errlen, "out of memory reading the kept segments");
        goto out;
    }
    /* A later elastic generation starts with the last one's response
     * cache, the same table on every rank (fast_init takes it). */
    if (rv.reply && rv.reply->n_cache > 0) {
        size_t bad = 0;
        tcache_free(c->carried);
        c->carried = tcache_new();
        code = c->carried ? resume_table_load(c->carried, rv.reply->cache, rv.reply->n_cache, &bad)
                          : KOLO_ENOMEM;
        if (code) {
            if (code == 1)
                snprintf(err, errlen, "the rendezvous reply's response cache is malformed "
                         "(entry %zu)", bad);
            else
                snprintf(err, errlen, "out of memory loading the response cache");
            code = code == 1 ? KOLO_EPROTO : code;
            goto out;
        }
    }
    /* every rank's host: what a process set's placement is made from */
    free(c->peer_hosts);
    if ((c->peer_hosts = host_table(&rv, &t, c->size)) == NULL) {
        code = KOLO_ENOMEM;
        goto out;
    }
    /* Inside a host, shared memory; between hosts, the lanes (hier.c). One
     * host whose ranks are its segment's members in order: the segment
     * alone. Without segments (KOLO_DISABLE_SHM): every pair over TCP. */
    bool segments = !cfg->disable_shm && hosts_have_segments(&rv, &t);
    if (c->size > 1 && segments && t.nhosts == 1 && topology_contiguous(&t))
        code = host_segment(c, &rv, &t, &c->coll, err, errlen);
    else if (c->size > 1 && segments)
        code = connect_hier(c, &rv, &t, err, errlen);
    else
        code = connect_mesh(c, &rv, err, errlen);
out:
    topology_free(&t);
    if (rv.shm)
        rv.shm->ops->destroy(rv.shm);
    if (rv.listen_fd >= 0)
        close(rv.listen_fd);
    rdv_free(&rv);
    return code;
}

/* ---------------------------------------------------------------- negotiation */

/* Keeps a packed copy of a response that just arrived, and marks the
 * operations it answers (mu held): what a resume needs. */
static void hold_response(struct kolo_ctx *c, const Kolo__Response *x)
{
    for (size_t i = 0; i < x->n_names; i++) {
        struct op *op = ops_by_name(c, x->names[i]);
        if (op)
            op->answered = true;
    }
    struct held_resp *h = &c->history[x->index % WORKER_HISTORY];
    size_t len = kolo__response__get_packed_size(x);
    uint8_t *b = h->bytes && h->len >= len ? h->bytes : malloc(len ? len : 1);
    if (!b)
        return;
    if (b != h->bytes)
        free(h->bytes);
    kolo__response__pack(x, b);
    h->bytes = b;
    h->len = len;
    h->index = x->index;
}

/* This rank's response cache as a resume sends it (mu held): *out points
 * into one block, freed by the caller once the request is packed (names
 * and shapes are the cache's own); *hash is the hash of what is sent.
 * KOLO_FAULT_CACHE_SKEW renames the first tensor (a test's way to make the
 * ranks' tables disagree). NULL with *n 0: nothing to send, or no memory. */
static void *cache_table(struct kolo_ctx *c, Kolo__CacheEntry ***out, size_t *n, uint64_t *hash)
{
    *hash = tcache_hash(c->cache);
    void *block = resume_table_of(c->cache, out, n);
    Kolo__CacheEntry **ptrs = *out;
    size_t k = *n;
    if (k && settings_int(SET_FAULT_CACHE_SKEW, 0)) {
        ptrs[0]->tensor->name = "kolo.fault.skewed";
        struct tensor_cache *sent = tcache_new();
        size_t bad;
        if (sent && resume_table_load(sent, ptrs, k, &bad) == 0)
            *hash = tcache_hash(sent);
        tcache_free(sent);
        LOGW("kolo", "rank %d: KOLO_FAULT_CACHE_SKEW: resuming with cache id %u renamed",
             c->rank, ptrs[0]->id);
    }
    return block;
}

/* The coordinator restarted and lost this generation's negotiation: send
 * it the cursor, every operation in flight without a response (in full),
 * the responses we hold and, with readiness rounds, our response cache,
 * from which it rebuilds its id map (negotiation/resume.h) (mu held;
 * released around the send). */
static void resume_send(struct kolo_ctx *c)
{
    c->resume = false;
    /* Without readiness rounds, cache ids the old coordinator gave are
     * void, also in the responses that arrived before it died and have not
     * run yet. With them, the ranks keep their (identical) caches and the
     * new coordinator's ids start above ours (max_cache_id). */
    if (!c->fast) {
        ops_cache_clear(c);
        for (size_t i = 0; i < c->resp_cap; i++)
            for (size_t k = 0; c->resp[i] && k < c->resp[i]->n_cache_ids; k++)
                c->resp[i]->cache_ids[k] = 0;
        c->exec_stale = c->executing;
    }
    size_t nops = 0, nheld = 0;
    for (uint32_t s = 0; s < c->nslots; s++)
        nops += c->slots[s] && c->slots[s]->state != OP_DONE;
    Kolo__TensorRequest *reqs = calloc(nops + 1, sizeof(*reqs));
    Kolo__TensorRequest **ptrs = calloc(nops + 1, sizeof(*ptrs));
    ProtobufCBinaryData *held = calloc(WORKER_HISTORY, sizeof(*held));
    if (!reqs || !ptrs || !held) {
        free(reqs);
        free(ptrs);
        free(held);
        ctx_fail(c, KOLO_ENOMEM, "out of memory resuming the negotiation");
        return;
    }
    size_t nr = 0;
    for (uint32_t s = 0; s < c->nslots; s++) {
        struct op *o = c->slots[s];
        if (!o || o->state == OP_DONE)
            continue;
        if (o->fast)
            continue; /* the readiness rounds own it */
        o->cache_id = 0;
        if (o->state == OP_QUEUED) {
            o->state = OP_SENT;
            c->inflight++;
        }
        if (o->answered)
            continue;
        request_fill(&reqs[nr], o);
        ptrs[nr] = &reqs[nr];
        nr++;
    }
    c->q_head = c->q_tail = NULL;
    for (int i = 0; i < WORKER_HISTORY; i++) {
        struct held_resp *h = &c->history[i];
        if (h->bytes && h->index < c->cursor) {
            held[nheld].data = h->bytes;
            held[nheld].len = h->len;
            nheld++;
        }
    }
    Kolo__NegotiateRequest req = KOLO__NEGOTIATE_REQUEST__INIT;
    req.cursor = c->cursor;
    req.requests = ptrs;
    req.n_requests = nr;
    req.resume = true;
    req.session = c->session;
    req.process_set = c->process_set;
    req.rounds = c->fast;
    req.max_cache_id = c->fast ? tcache_top(c->cache) : 0;
    Kolo__CacheEntry **table = NULL;
    void *table_block = c->fast ? cache_table(c, &table, &req.n_cache, &req.cache_hash) : NULL;
    req.cache = table;
    req.executed = c->resp_base;
    req.held = held;
    req.n_held = nheld;
    req.wait_ms = WORKER_NEGOTIATE_WAIT_MS;
    req.reason = "";
    LOGI("kolo", "rank %d: the coordinator restarted; resuming at log index %llu with %zu "
         "operation(s) in flight", c->rank, (unsigned long long)c->cursor, nr);
    /* It waits for every rank to resume, so give it the resume window. */
    int code = negotiate_call(c, &req, 35000 + c->timeout_ms, NULL, reqs, ptrs, held);
    free(table_block); /* packed by now */
    if (code == KOLO_ENOMEM)
        ctx_fail(c, code, "out of memory resuming the negotiation");
    else if (code)
        c->resume = true; /* try again */
}

/* What one negotiation call carried: the operations negotiate_send moved
 * to OP_SENT, by handle (a stale handle finds nothing). */
struct negot_call {
    struct kolo_ctx *c;
    size_t n;
    kolo_handle ops[];
};

/* A call whose request never reached the coordinator's handler - it never
 * left this process (rpc.h: KOLO_ECONNREFUSED; under load the connection
 * can stay busy past the call's deadline), or the server kept refusing it
 * (KOLO_EBUSY) - puts the operations it carried back in the queue, to go
 * out with the next call. Nothing else would ever send them again: the
 * coordinator waits for this rank's request and the rank for the
 * coordinator's response (mu held). Calls that failed otherwise (no reply
 * in time, a broken connection) are not repeated: the coordinator may
 * hold their requests, and a second submission of a tensor is an error. */
static void negotiate_requeue(struct kolo_ctx *c, const struct negot_call *nc)
{
    size_t back = 0;
    for (size_t i = 0; nc && i < nc->n; i++) {
        struct op *o = ops_lookup(c, nc->ops[i]);
        if (!o || o->state != OP_SENT || o->answered || o->fast)
            continue;
        c->inflight--;
        ops_queue_slow(c, o);
        back++;
    }
    if (back)
        LOGD("kolo", "rank %d: %zu operation(s) go to the coordinator again", c->rank, back);
}

static void negotiate_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    struct negot_call *nc = arg;
    struct kolo_ctx *c = nc->c;
    bool interrupt = false;
    pthread_mutex_lock(&c->mu);
    c->calls--;
    if (code == 0) {
        Kolo__NegotiateReply *r = kolo__negotiate_reply__unpack(NULL, len, rep);
        if (!r) {
            ctx_fail(c, KOLO_EPROTO, "malformed negotiation reply from the coordinator");
        } else {
            for (size_t i = 0; i < r->n_responses; i++) {
                Kolo__Response *x = r->responses[i];
                if (!ctx_log_put(c, x))
                    continue;
                hold_response(c, x);
                if (x->shutdown && x->error_code != KOLO_ESHUTDOWN)
                    interrupt = true; /* the generation was closed under us */
            }
            if (r->resume) {
                c->resume = true;
                pthread_cond_signal(&c->watch_cv);
            }
            r->n_responses = 0;
            if (r->next_cursor > c->cursor) {
                c->cursor = r->next_cursor;
                fast_news(c); /* the rounds gate the log by the ranks' cursors */
            }
            c->update_ms = r->hosts_updated_ms;
            c->update_kind = (int)r->hosts_update_kind;
            if (r->timeline != c->timeline_heard) {
                c->timeline_heard = r->timeline;
                fast_news(c); /* the rounds report their spans (or stop) */
            }
            kolo__negotiate_reply__free_unpacked(r, NULL);
        }
    } else if (!c->stopping && code != KOLO_ETIMEDOUT && code != KOLO_ECONNREFUSED &&
               code != KOLO_EIO && code != KOLO_ECLOSED && code != KOLO_EBUSY) {
        /* The generation is over for us: stale, job ended, protocol. */
        ctx_fail(c, code == KOLO_ESHUTDOWN ? KOLO_ESHUTDOWN : code, err);
        interrupt = code == KOLO_ESTALE || code == KOLO_EPEER;
    } else if (!c->stopping) {
        LOGD("kolo", "rank %d: negotiation call failed (%s); retrying", c->rank, err);
        c->poll_retry_at = now_mono_ms() + 200; /* the long-poll backs off */
        if (!c->sticky && (code == KOLO_ECONNREFUSED || code == KOLO_EBUSY))
            negotiate_requeue(c, nc);
    }
    /* A collective running now with a peer that is gone or cut off would
     * wait for its data-plane deadline; the coordinator already knows, so
     * end it now. (Not when a rank merely left: the others may still be
     * finishing their last collective with each other.) */
    if (interrupt && c->executing && c->coll && c->coll->ops->interrupt) {
        LOGI("kolo", "rank %d: the generation was closed; interrupting the running collective",
             c->rank);
        c->coll->ops->interrupt(c->coll);
    }
    pthread_cond_signal(&c->wake);
    pthread_cond_broadcast(&c->done); /* a waiter may run the response itself */
    pthread_mutex_unlock(&c->mu);
    free(nc);
}

/* Sends the queued requests (mu held; released around the send). The
 * submitting thread calls it directly, so a new operation reaches the
 * coordinator without waking the background thread first. */
void ctx_send_queued(struct kolo_ctx *c)
{
    if (!c->sticky && !c->stopping && c->q_head)
        negotiate_send(c, false, NULL);
}

/* Packs req, frees the three arrays it borrowed, and sends it (mu held;
 * released around the send); nc (NULL: nothing to take back) says which
 * operations it carries, and goes with the call (freed here if it does
 * not start). 0, or the failure (calls is back as it was). */
static int negotiate_call(struct kolo_ctx *c, const Kolo__NegotiateRequest *req, int timeout_ms,
                          struct negot_call *nc, void *a1, void *a2, void *a3)
{
    size_t len = kolo__negotiate_request__get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    if (buf)
        kolo__negotiate_request__pack(req, buf);
    free(a1);
    free(a2);
    free(a3);
    if (!nc && (nc = calloc(1, sizeof(*nc))))
        nc->c = c;
    if (!buf || !nc) {
        free(buf);
        free(nc);
        return KOLO_ENOMEM;
    }
    c->calls++;
    pthread_mutex_unlock(&c->mu);
    int code = rpc_client_call_async(c->rpc, "WorkerService.Negotiate", buf, len, timeout_ms,
                                     negotiate_done, nc);
    free(buf);
    pthread_mutex_lock(&c->mu);
    if (code) {
        c->calls--;
        free(nc);
    }
    return code;
}

/* The wire form of an operation's request (borrowing its strings). */
static void request_fill(Kolo__TensorRequest *t, const struct op *o)
{
    kolo__tensor_request__init(t);
    t->name = o->name;
    t->coll = (uint32_t)o->req.coll;
    t->dtype = (uint32_t)o->req.dtype;
    t->n_shape = (size_t)o->req.ndim;
    t->shape = o->shape;
    t->op = (uint32_t)o->req.op;
    t->prescale = o->req.prescale;
    t->postscale = o->req.postscale;
    t->root = o->req.root;
    t->n_splits = o->splits ? (size_t)o->req.nsplits : 0;
    t->splits = o->splits;
    t->device = o->req.device;
    t->group = o->group;
    t->group_size = o->group_size;
}

static void negotiate_send(struct kolo_ctx *c, bool shutdown, const char *reason)
{
    if (c->solo) { /* nobody to tell or ask: the queue is answered here */
        if (!shutdown)
            solo_negotiate(c);
        return;
    }
    size_t nq = 0;
    for (struct op *o = c->q_head; o; o = o->next)
        nq++;
    Kolo__TensorRequest *reqs = calloc(nq + 1, sizeof(*reqs));
    Kolo__TensorRequest **ptrs = calloc(nq + 1, sizeof(*ptrs));
    uint32_t *cached = calloc(nq + 1, sizeof(*cached));
    struct negot_call *call = calloc(1, sizeof(*call) + nq * sizeof(call->ops[0]));
    if (!reqs || !ptrs || !cached || !call) {
        free(reqs);
        free(ptrs);
        free(cached);
        free(call);
        return;
    }
    call->c = c;
    size_t nr = 0, nc = 0;
    for (struct op *o = c->q_head; o; o = o->next) {
        o->state = OP_SENT;
        c->inflight++;
        call->ops[call->n++] = o->handle;
        if (o->cache_id) {
            cached[nc++] = o->cache_id;
            continue;
        }
        request_fill(&reqs[nr], o);
        ptrs[nr] = &reqs[nr];
        nr++;
    }
    c->q_head = c->q_tail = NULL;
    Kolo__NegotiateRequest req = KOLO__NEGOTIATE_REQUEST__INIT;
    req.cursor = c->cursor;
    req.session = c->session;
    req.process_set = c->process_set;
    req.requests = ptrs;
    req.n_requests = nr;
    req.cached = cached;
    req.n_cached = nc;
    req.rounds = c->fast;
    req.shutdown = shutdown;
    req.reason = (char *)(reason ? reason : "");
    req.wait_ms = shutdown ? 0 : WORKER_NEGOTIATE_WAIT_MS;
    /* With readiness rounds this call is often the only one, parked: if the
     * coordinator dies under it, give up on it soon (it is parked for
     * WORKER_NEGOTIATE_WAIT_MS at most), so the next one finds the new
     * coordinator and the resume starts. */
    int call_ms = c->fast ? WORKER_NEGOTIATE_WAIT_MS + 4000 : WORKER_NEGOTIATE_WAIT_MS + c->timeout_ms;
    int code = negotiate_call(c, &req, call_ms, call, reqs, ptrs, cached);
    if (code && code != KOLO_ENOMEM && !c->stopping)
        ctx_fail(c, code, "cannot send to the coordinator");
}

/*
 * ctx_try_execute runs the next response of the log if it has arrived and
 * nobody else is running one (mu held, released while it runs). Whoever
 * holds the token executes: the background thread, or a user thread
 * blocked in kolo_wait - which saves a thread hand-off on the path of
 * small operations. The token keeps log order. With readiness rounds,
 * now_us is fast_try's (fastpath.h).
 */
bool ctx_try_execute(struct kolo_ctx *c, uint64_t now_us)
{
    if (c->fast)
        return fast_try(c, now_us);
    if (c->executing || !c->resp_cap || !c->resp[0])
        return false;
    c->executing = true;
    ctx_run_log_entry(c);
    ctx_token_release(c);
    return true;
}

void ctx_token_release(struct kolo_ctx *c)
{
    c->executing = false;
    c->exec_since = 0;
    /* The next response may be waiting for the token, or a round sent
     * ops to the slow path (q_head) for the background thread to send.
     * Not otherwise when rounds run and a user thread waits: that thread
     * runs the next round (and the log with it), and waking the
     * background thread after every round would preempt it on a busy CPU
     * (~0.7 switches per op, 4 B p99 50-250 us); the background thread
     * looks again within BG_WATCH_MS anyway. */
    if (!c->fast || c->drivers == 0 || c->q_head)
        pthread_cond_signal(&c->wake);
    pthread_cond_broadcast(&c->done);
}

void ctx_run_log_entry(struct kolo_ctx *c)
{
    Kolo__Response *r = c->resp[0];
    memmove(c->resp, c->resp + 1, (c->resp_cap - 1) * sizeof(*c->resp));
    c->resp[c->resp_cap - 1] = NULL;
    c->resp_base++;
    /* An id this entry gives to a new name was evicted from its old one:
     * drop that here, where every rank runs the entry at the same point
     * (the name's own op binds the id once it completed, exec.c). */
    for (size_t i = 0; i < r->n_cache_ids && i < r->n_names; i++)
        if (r->cache_ids[i])
            fast_evict(c, r->cache_ids[i], r->names[i]);
    /* An entry that clears every rank's response cache is a cache
     * change too: made here, under the same lock, so that the executor
     * (exec.c, which skips the entry) never calls up into the rounds. */
    if (r->cache_reset && !r->shutdown)
        fast_cache_reset(c);
    c->exec_since = now_mono_ms();
    c->exec_stale = false;
    /* the timeline under readiness rounds: when this entry's op ended
     * here, for the coordinator to end its span (fastpath.c, trace_begin) */
    bool traced = c->fast && r->n_names && (c->timeline_heard || c->timeline_asked);
    uint64_t started_us = traced ? now_mono_us() : 0;
    pthread_mutex_unlock(&c->mu);
    exec_response(c, r);
    if (traced) {
        Kolo__TraceSpan span = KOLO__TRACE_SPAN__INIT;
        span.log_index = r->index;
        span.done_us = ops_done_since(started_us);
        report_trace(c, &span, 1);
    }
    kolo__response__free_unpacked(r, NULL);
    pthread_mutex_lock(&c->mu);
}

/* The longest the background thread sleeps when nothing is expected of
 * it (a safety net: everything it must act on signals c->wake). */
#define BG_NAP_MS 100
/* Rounds: the background thread takes over answering the peers once no
 * user thread has been in kolo_wait for BG_TAKEOVER_US. While one is, it
 * looks every BG_WATCH_MS whether the waiter has gone (kolo_wait does not
 * wake it on leaving: see there). A peer's round or a submission without
 * a wait may so sit for up to ~5.5 ms after a wait, and only then.
 * Once the rank has been driven for BG_WATCH_LONG_MS (since drivers last
 * fell to 0), it looks ever less often, a quarter of that time apart up
 * to BG_NAP_MS: the waiter that ends such a wait does wake it (ops.c,
 * kolo_wait). Every 5 ms for the whole
 * of a long wait was 200 wake-ups a second per rank: 512 ranks waiting
 * on the coordinator in one process (tests/worker/test_hosts.c) kept
 * hundreds of threads runnable on 2 CPUs, and nng's few threads, which
 * carry the negotiation calls, got so little of them that the calls
 * missed their deadlines (requests sat unsent for seconds). */
#define BG_TAKEOVER_US 500
#define BG_WATCH_MS 5

static void *bg_main(void *arg)
{
    thread_name("kolo-bg");
    struct kolo_ctx *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (c->leaving) {
            c->leaving = false;
            negotiate_send(c, true, c->leave_reason);
            continue;
        }
        if (c->stopping)
            break;
        /* With readiness rounds one long-poll stays parked all the time: it
         * brings log entries, host updates, the generation's close and a
         * restarted coordinator's call for a resume. It goes out before
         * any round, so that a stream of rounds cannot starve it (the
         * peers' rounds then wait on our log cursor). */
        if (c->fast && !c->sticky && !c->resume && c->calls == 0 &&
            now_mono_ms() >= c->poll_retry_at) {
            negotiate_send(c, false, NULL);
            continue;
        }
        if (ctx_try_execute(c, 0))
            continue;
        if (c->resume && c->calls == 0 && !c->sticky) {
            resume_send(c);
            continue;
        }
        /* Ask again only for operations that are still waiting for their
         * response: not while one is in hand or being executed. (Alone,
         * every op has its response from the moment it was queued.) */
        bool in_hand = c->executing || (c->resp_cap && c->resp[0]);
        if (!c->sticky && !c->resume &&
            (c->q_head || (!c->solo && c->inflight > 0 && c->calls == 0 && !in_hand))) {
            negotiate_send(c, false, NULL);
            continue;
        }
        if (c->fast && !c->sticky) {
            /* Answer the peers' rounds while no user thread waits. While one
             * does, it answers them, and this thread sleeps until it is
             * signalled (a reply, a leave), the long-poll may be retried or
             * it looks again whether the waiter has gone: never per
             * operation, since a wake-up here would preempt the rank's
             * own spinning waiter on a busy CPU (that was a 1.2 ms p99). */
            uint64_t now_us = now_mono_us();
            uint64_t takeover_at = c->undriven_since_us + BG_TAKEOVER_US;
            if (c->drivers == 0 && now_us >= takeover_at && fast_idle(c, 100, false))
                continue;
            uint64_t nap_us = (uint64_t)BG_NAP_MS * 1000;
            if (c->drivers > 0) {
                uint64_t driven_us =
                    now_us > c->undriven_since_us ? now_us - c->undriven_since_us : 0;
                nap_us = (uint64_t)BG_WATCH_MS * 1000;
                if (driven_us >= (uint64_t)BG_WATCH_LONG_MS * 1000)
                    nap_us = driven_us / 4 < (uint64_t)BG_NAP_MS * 1000 ? driven_us / 4
                                                                       : (uint64_t)BG_NAP_MS * 1000;
            } else if (now_us < takeover_at)
                nap_us = takeover_at - now_us;
            uint64_t now = now_us / 1000;
            if (c->poll_retry_at > now && (c->poll_retry_at - now) * 1000 < nap_us)
                nap_us = (c->poll_retry_at - now) * 1000;
            struct timespec ts;
            mono_deadline_us(&ts, nap_us);
            pthread_cond_timedwait(&c->wake, &c->mu, &ts);
            continue;
        }
        pthread_cond_wait(&c->wake, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

#define WATCH_PERIOD_MS 200

/* A rank that has slept on one peer for the stall limit (min(stall
 * warning / 2, 10 s), at least 1 s) says so, once per wait: in a round the
 * coordinator cannot see it (mu held). */
static void watch_waiting(struct kolo_ctx *c)
{
    if (!c->coll || !c->executing || c->sticky || c->fast_stall_ms < 0)
        return;
    int who = atomic_load_explicit(&c->coll->waiting_on, memory_order_acquire) - 1;
    uint64_t since = atomic_load_explicit(&c->coll->waiting_since_ms, memory_order_relaxed);
    uint64_t now = now_mono_ms(), limit = c->fast_stall_ms > 1000 ? (uint64_t)c->fast_stall_ms : 1000;
    if (who < 0 || since > now || now - since < limit || since == c->wait_reported)
        return;
    c->wait_reported = since;
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    time_t t = wall.tv_sec - (time_t)((now - since) / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    char at[32];
    strftime(at, sizeof(at), "%H:%M:%S UTC", &tm);
    LOGW("kolo", "rank %d: waiting on rank %d since %s (%.1f s) in %s", c->rank, who, at,
         (double)(now - since) / 1e3, c->round_busy ? "a readiness round" : "a collective");
}

static void *watch_main(void *arg)
{
    thread_name("kolo-watch");
    struct kolo_ctx *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        struct timespec ts;
        mono_deadline(&ts, WATCH_PERIOD_MS);
        pthread_cond_timedwait(&c->watch_cv, &c->mu, &ts);
        watch_waiting(c);
        if (c->stopping || c->sticky || !c->executing || c->calls > 0 ||
            now_mono_ms() - c->exec_since < WATCH_PERIOD_MS)
            continue;
        if (c->resume)
            resume_send(c);
        else
            negotiate_send(c, false, NULL);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---------------------------------------------------------------- lifecycle */

static void ctx_free(struct kolo_ctx *c)
{
    gpu_ctx_fini(c); /* first: it may still use the CPU data plane */
    /* An elastic rank keeps its host's segment for its next generation
     * (keep.h), unless the job is over. */
    bool keep = c->elastic && !c->process_set && c->sticky != KOLO_ESHUTDOWN && c->coll &&
                c->coll->ops->keep_segment && settings_int(SET_KEEP_SEGMENTS, 1);
    if (keep) {
        struct coll *seg = c->coll->ops->keep_segment(c->coll); /* the rest is gone */
        if (seg)
            keep_park(c->job, c->worker_id, seg);
    } else if (c->coll) {
        c->coll->ops->destroy(c->coll);
    }
    rpc_client_close(c->rpc);
    report_ctx_free(c); /* issue 6: the epoch/step report sender's state */
    snapshot_ctx_free(c);
    ops_free_all(c);
    for (size_t i = 0; i < c->resp_cap; i++)
        if (c->resp[i])
            kolo__response__free_unpacked(c->resp[i], NULL);
    free(c->resp);
    for (int i = 0; i < WORKER_HISTORY; i++)
        free(c->history[i].bytes);
    free(c->fusion);
    free(c->zeros);
    fast_free(c);
    tcache_free(c->carried); /* an init that failed before fast_init */
    free(c->peer_hosts); /* one block (host_table) */
    free(c->host_id);
    free(c->data_addr);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->watch_cv);
    free(c);
}

/*
 * Sessions. A process may leave a generation cleanly (kolo_fini) and join
 * it again (kolo_init), as Horovod programs do with shutdown() and
 * init(). Each join of the same (job, generation, rank) by this process is
 * one more session; the coordinator starts a fresh rendezvous and
 * negotiation for a higher session and refuses requests of a lower one,
 * so a rank still finishing the old session never mixes with the new.
 * Every rank runs the same init/shutdown sequence, so the numbers agree.
 */
static pthread_mutex_t sessions_mu = PTHREAD_MUTEX_INITIALIZER;
static struct session_rec {
    uint64_t job, generation;
    int rank;
    uint32_t next;
    struct session_rec *more;
} *sessions;

static uint32_t next_session(uint64_t job, uint64_t generation, int rank)
{
    pthread_mutex_lock(&sessions_mu);
    struct session_rec *s = sessions;
    while (s && !(s->job == job && s->rank == rank))
        s = s->more;
    if (!s && (s = calloc(1, sizeof(*s))) != NULL) {
        s->job = job;
        s->rank = rank;
        s->generation = generation;
        s->more = sessions;
        sessions = s;
    }
    uint32_t n = 0;
    if (s) {
        if (s->generation != generation) {
            s->generation = generation;
            s->next = 0;
        }
        n = s->next++;
    }
    pthread_mutex_unlock(&sessions_mu);
    return n;
}

/* Elastic: ask for a place, join that generation; when it is replaced
 * while we join (a member failed meanwhile), ask again. */
static int join_elastic(struct kolo_ctx *c, const kolo_config *given, char *err, size_t errlen)
{
    kolo_config cfg = *given;
    uint64_t budget = given->elastic_timeout_ms > 0 ? (uint64_t)given->elastic_timeout_ms : 600000;
    uint64_t deadline = now_mono_ms() + budget + 30000;
    for (int attempt = 0;; attempt++) {
        int code = ask_place(c, &cfg, deadline, err, errlen);
        if (code) {
            LOGE("kolo", "worker %llu: %s", (unsigned long long)cfg.worker_id, err);
            return code;
        }
        c->generation = cfg.generation;
        c->rank = cfg.rank;
        c->size = cfg.size;
        c->local_rank = cfg.local_rank;
        c->local_size = cfg.local_size > 0 ? cfg.local_size : 1;
        c->cross_rank = cfg.cross_rank;
        c->cross_size = cfg.cross_size > 0 ? cfg.cross_size : 1;
        c->session = next_session(c->job, c->generation, c->rank);
        char ident[64];
        snprintf(ident, sizeof(ident), "job%llu-rank%d", (unsigned long long)c->job, c->rank);
        rpc_client_set_identity(c->rpc, ident, c->job, c->generation, c->rank);
        code = setup_data_plane(c, &cfg, err, errlen);
        if (code == 0)
            return 0;
        bool again = code == KOLO_ESTALE || code == KOLO_EPEER || code == KOLO_ETIMEDOUT ||
                     code == KOLO_ECLOSED || code == KOLO_EIO || code == KOLO_ECONNREFUSED;
        if (!again || now_mono_ms() >= deadline) {
            LOGE("kolo", "rank %d: %s", c->rank, err);
            return code;
        }
        LOGI("kolo", "worker %llu: generation %llu did not form (%s); asking again",
             (unsigned long long)cfg.worker_id, (unsigned long long)cfg.generation, err);
        if (c->coll) {
            c->coll->ops->destroy(c->coll);
            c->coll = NULL;
        }
        (void)attempt;
    }
}

/* The detail of this thread's last failed kolo_init: kolo_last_error(NULL). */
static _Thread_local char init_error[1024];

/* A context for cfg's place, its fields set, nothing opened yet. */
static struct kolo_ctx *ctx_new(const kolo_config *cfg)
{
    struct kolo_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    pthread_mutex_init(&c->mu, NULL);
    cond_init_monotonic(&c->wake); /* its timed waits take mono_deadline */
    cond_init_monotonic(&c->done);
    cond_init_monotonic(&c->watch_cv);
    c->gpu_join_device = -1;
    c->job = cfg->job_id;
    c->generation = cfg->generation;
    c->rank = cfg->rank;
    c->size = cfg->size;
    c->local_rank = cfg->local_rank;
    c->local_size = cfg->local_size > 0 ? cfg->local_size : 1;
    c->cross_rank = cfg->cross_rank;
    c->cross_size = cfg->cross_size > 0 ? cfg->cross_size : 1;
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
    c->fusion_threshold = cfg->fusion_threshold ? cfg->fusion_threshold : DEFAULT_FUSION;
    c->process_set = cfg->process_set;
    c->elastic = cfg->worker_id != 0;
    c->worker_id = cfg->worker_id;
    c->disable_shm = cfg->disable_shm != 0;
    c->encrypt_data = cfg->encrypt_data != 0;
    c->host_id = cfg->host_id ? strdup(cfg->host_id) : NULL;
    c->data_addr = cfg->data_addr ? strdup(cfg->data_addr) : NULL;
    /* Horovod's stall inspector knobs, read here so kolo run passes them
     * through the environment like horovodrun does. */
    if (settings_int(SET_STALL_CHECK_DISABLE, 0))
        c->stall_warning_ms = -1;
    else
        c->stall_warning_ms = settings_int(SET_STALL_CHECK_TIME_SECONDS, 0) * 1000;
    c->stall_shutdown_ms = settings_int(SET_STALL_SHUTDOWN_TIME_SECONDS, 0) * 1000;
    return c;
}

/* Joins the job through the coordinator: its connection, the rendezvous
 * and the data plane (or an elastic generation's). */
static int join_job(struct kolo_ctx *c, const kolo_config *cfg, char *err, size_t errlen)
{
    int code;
    /* the job's credential when the agent gave one, else the cluster's */
    c->coord_token_job = cfg->job_token && cfg->job_token[0];
    const char *token = c->coord_token_job ? cfg->job_token
                        : cfg->token && cfg->token[0] ? cfg->token
                                                      : NULL;
    c->coord_url = strdup(cfg->coordinator);
    c->coord_token = token ? strdup(token) : NULL;
    if (!c->coord_url || (token && !c->coord_token))
        return KOLO_ENOMEM;
    if ((code = tls_files_from_env(&c->tls, err, errlen)) != 0) {
        LOGE("kolo", "rank %d: %s", c->rank, err);
        return code;
    }
    /* A job that asked for a sealed data plane never runs without one. */
    char why[512];
    if (c->encrypt_data && (code = seal_available(why, sizeof why)) != 0) {
        snprintf(err, errlen, "KOLO_DATA_ENCRYPT=1 but %s", why);
        LOGE("kolo", "rank %d: %s", c->rank, err);
        return code;
    }
    char ident[64];
    struct rpc_client_config rc;
    ctx_rpc_config(c, ident, sizeof ident, &rc);
    if ((code = rpc_client_open(&c->rpc, &rc)) != 0) {
        snprintf(err, errlen, "cannot open the coordinator connection %s", cfg->coordinator);
        LOGE("kolo", "rank %d: %s", c->rank, err);
        return code;
    }
    /* a process set's id is used once (kolo_process_set_init): session 0 */
    if (!cfg->worker_id && !c->process_set)
        c->session = next_session(c->job, c->generation, c->rank);
    if (cfg->worker_id)
        return join_elastic(c, cfg, err, errlen);
    if ((code = setup_data_plane(c, cfg, err, errlen)) != 0)
        LOGE("kolo", "rank %d: %s", c->rank, err);
    return code;
}

static int init_ctx(kolo_ctx **out, const kolo_config *given, char *err, size_t errlen)
{
    kolo_config env_cfg, solo_cfg;
    int code;
    if (!out)
        return KOLO_EINVAL;
    *out = NULL;
    const kolo_config *cfg = given;
    /* every knob of the environment parses, or the init fails naming it */
    if ((code = settings_check(err, errlen)) != 0) {
        LOGE("kolo", "%s", err);
        return code;
    }
    if (!cfg) {
        if ((code = config_from_env(&env_cfg, err, errlen)) != 0) {
            LOGE("kolo", "%s", err);
            return code;
        }
        cfg = &env_cfg;
    }
    bool solo = !cfg->coordinator || !cfg->coordinator[0];
    if (solo) {
        if ((code = solo_config(cfg, &solo_cfg, err, errlen)) != 0) {
            LOGE("kolo", "%s", err);
            return code;
        }
        cfg = &solo_cfg;
    } else if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size) {
        return KOLO_EINVAL;
    }
    struct kolo_ctx *c = ctx_new(cfg);
    if (!c)
        return KOLO_ENOMEM;
    c->solo = solo;
    c->telemetry = !solo && settings_int(SET_TELEMETRY, 1); /* alone, nobody is told */
    code = solo ? solo_setup(c) : join_job(c, cfg, err, errlen);
    if (code || (code = fast_init(c)) != 0) {
        ctx_free(c);
        return code;
    }
    if (pthread_create(&c->bg, NULL, bg_main, c) != 0) {
        ctx_free(c);
        return KOLO_ESYS;
    }
    c->bg_running = true;
    /* alone, no negotiation call ever waits behind a running response */
    if (!solo && pthread_create(&c->watch, NULL, watch_main, c) == 0)
        c->watch_running = true;
    if (solo)
        LOGI("kolo", "rank 0 of 1, alone: no coordinator (KOLO_COORDINATOR is not set)");
    else
        LOGI("kolo", "rank %d of %d joined job %llu generation %llu (%s, %s%s)", c->rank, c->size,
             (unsigned long long)c->job, (unsigned long long)c->generation, c->coll->ops->name,
             c->fast ? "readiness rounds" : "coordinator only",
             c->encrypt_data ? ", TCP sealed with AES-256-GCM" : "");
    timeline_ctx_init(c);
    *out = c;
    return 0;
}

int kolo_process_set_init(kolo_ctx *c, int set_id, const int *ranks, int nranks,
                          kolo_ctx **set)
{
    if (!set)
        return KOLO_EINVAL;
    *set = NULL;
    if (!c || c->process_set != 0 || set_id <= 0 || !ranks || nranks < 1 || nranks > c->size)
        return KOLO_EINVAL;
    if (c->elastic)
        return KOLO_ENOTSUP;
    int *sorted = malloc((size_t)nranks * sizeof(int));
    if (!sorted)
        return KOLO_ENOMEM;
    memcpy(sorted, ranks, (size_t)nranks * sizeof(int));
    for (int i = 1; i < nranks; i++) /* insertion sort: sets are small */
        for (int k = i; k > 0 && sorted[k - 1] > sorted[k]; k--) {
            int t = sorted[k];
            sorted[k] = sorted[k - 1];
            sorted[k - 1] = t;
        }
    int me = -1, code = 0;
    for (int i = 0; i < nranks && !code; i++) {
        if (sorted[i] < 0 || sorted[i] >= c->size || (i && sorted[i] == sorted[i - 1]))
            code = KOLO_EINVAL;
        if (sorted[i] == c->rank)
            me = i;
    }
    if (!code && me >= 0 && c->solo) { /* the one rank's set: alone too */
        free(sorted);
        kolo_config cfg = {.timeout_ms = c->timeout_ms,
                           .fusion_threshold = c->fusion_threshold,
                           .process_set = set_id};
        return kolo_init(set, &cfg);
    }
    if (code || me < 0 || !c->peer_hosts) {
        free(sorted);
        return code; /* not a member: nothing to join */
    }
    /* placement inside the set: members on this rank's host, and hosts */
    kolo_config cfg = {.coordinator = c->coord_url,
                       .token = c->coord_token_job ? NULL : c->coord_token,
                       .job_token = c->coord_token_job ? c->coord_token : NULL,
                       .job_id = c->job,
                       .generation = c->generation, .rank = me, .size = nranks,
                       .host_id = c->host_id, .data_addr = c->data_addr,
                       .timeout_ms = c->timeout_ms, .fusion_threshold = c->fusion_threshold,
                       .disable_shm = c->disable_shm, .process_set = set_id,
                       .encrypt_data = c->encrypt_data};
    const char *mine = c->peer_hosts[c->rank];
    int my_host_first = me;
    for (int i = 0; i < nranks; i++) {
        const char *h = c->peer_hosts[sorted[i]];
        if (strcmp(h, mine) == 0) {
            cfg.local_size++;
            if (i < me)
                cfg.local_rank++;
            if (i < my_host_first)
                my_host_first = i;
        }
    }
    for (int i = 0; i < nranks; i++) { /* hosts, in the order of their first member */
        const char *h = c->peer_hosts[sorted[i]];
        bool first = true;
        for (int k = 0; k < i && first; k++)
            first = strcmp(c->peer_hosts[sorted[k]], h) != 0;
        if (first) {
            cfg.cross_rank += i < my_host_first;
            cfg.cross_size++;
        }
    }
    free(sorted);
    return kolo_init(set, &cfg);
}

int kolo_process_set_id(const kolo_ctx *c)
{
    return c ? c->process_set : -1;
}

int kolo_solo(const kolo_ctx *c)
{
    return c ? c->solo : -1;
}

int kolo_abort(kolo_ctx *c, const char *reason)
{
    if (!c)
        return KOLO_EINVAL;
    pthread_mutex_lock(&c->mu);
    if (!c->sticky) {
        /* The background thread tells the coordinator, which tells the
         * other ranks; nothing here waits. */
        c->leaving = true;
        snprintf(c->leave_reason, sizeof(c->leave_reason), "%s",
                 reason && reason[0] ? reason : "kolo_abort");
        char msg[300];
        snprintf(msg, sizeof(msg), "aborted on this rank: %s", c->leave_reason);
        ctx_fail(c, KOLO_ESHUTDOWN, msg);
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* Tells the coordinator this rank leaves, so the others fail fast. */
static void send_leave(struct kolo_ctx *c, const char *reason, int timeout_ms)
{
    Kolo__NegotiateRequest req = KOLO__NEGOTIATE_REQUEST__INIT;
    char err[256];
    pthread_mutex_lock(&c->mu); /* a late negotiation reply may still land */
    req.cursor = c->cursor;
    pthread_mutex_unlock(&c->mu);
    req.session = c->session;
    req.process_set = c->process_set;
    req.shutdown = 1;
    req.rounds = c->fast;
    req.reason = (char *)reason;
    size_t len = kolo__negotiate_request__get_packed_size(&req);
    uint8_t *buf = malloc(len + 1);
    if (!buf)
        return;
    kolo__negotiate_request__pack(&req, buf);
    void *out = NULL;
    size_t olen;
    rpc_client_call(c->rpc, "WorkerService.Negotiate", buf, len, &out, &olen, timeout_ms, err,
                    sizeof(err));
    free(out);
    free(buf);
}

int kolo_fini(kolo_ctx *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    /* Always tell: the others fail fast if they still run collectives,
     * and a new session of this generation (init after shutdown) starts
     * once every rank left this one. After a failure the coordinator may
     * be gone: do not wait long for it. */
    int tell_ms = c->sticky && !c->leaving ? 300 : 1000;
    /* An elastic generation a peer's failure ended: the coordinator
     * already closed it (or learns it from the agent), and every survivor
     * is on its way to the next rendezvous, which waits for the slowest
     * of them. The goodbye is a courtesy there. */
    if (c->elastic && (c->sticky == KOLO_EPEER || c->sticky == KOLO_ESTALE) && !c->leaving)
        tell_ms = 100;
    char reason[200];
    snprintf(reason, sizeof(reason), "%s", c->leaving ? c->leave_reason : "kolo_fini");
    /* With rounds the peers hear it first from this rank itself (an
     * elastic leave at a commit is the coordinator's to announce) */
    if (!c->leaving)
        fast_leave(c, tell_ms);
    c->leaving = false;
    if (!c->sticky)
        ctx_fail(c, KOLO_ESHUTDOWN,
                 "Horovod has been shut down on this rank: the operation was pending when "
                 "kolo_fini was called.");
    c->stopping = true;
    pthread_cond_signal(&c->wake);
    pthread_cond_signal(&c->watch_cv);
    pthread_mutex_unlock(&c->mu);
    /* issue 6: the sender sends what is queued (at most 2 s) while the
     * goodbye below goes on the context's own connection */
    report_ctx_stop_begin(c);
    snapshot_ctx_stop(c);
    timeline_ctx_fini(c);
    if (c->bg_running)
        pthread_join(c->bg, NULL);
    if (c->watch_running)
        pthread_join(c->watch, NULL);
    if (!c->solo)
        send_leave(c, reason, tell_ms);
    report_ctx_stop(c);
    rpc_client_shutdown(c->rpc);
    ctx_free(c);
    return 0;
}

int kolo_rank(const kolo_ctx *c)
{
    return c ? c->rank : -1;
}

int kolo_size(const kolo_ctx *c)
{
    return c ? c->size : -1;
}

int kolo_local_rank(const kolo_ctx *c)
{
    return c ? c->local_rank : -1;
}

int kolo_local_size(const kolo_ctx *c)
{
    return c ? c->local_size : -1;
}

int kolo_cross_rank(const kolo_ctx *c)
{
    return c ? c->cross_rank : -1;
}

int kolo_cross_size(const kolo_ctx *c)
{
    return c ? c->cross_size : -1;
}

uint64_t kolo_generation(const kolo_ctx *c)
{
    return c ? c->generation : 0;
}

int kolo_hosts_updated(const kolo_ctx *c, uint64_t *stamp_ms, int *kind)
{
    if (!c || !stamp_ms || !kind)
        return KOLO_EINVAL;
    struct kolo_ctx *m = (struct kolo_ctx *)c;
    pthread_mutex_lock(&m->mu);
    *stamp_ms = m->update_ms;
    *kind = m->update_kind;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

int kolo_init(kolo_ctx **out, const kolo_config *given)
{
    char err[sizeof init_error] = "";
    int code = init_ctx(out, given, err, sizeof err);
    if (code)
        snprintf(init_error, sizeof init_error, "%s", err[0] ? err : kolo_strerror(code));
    else
        init_error[0] = '\0';
    return code;
}

const char *kolo_last_error(const kolo_ctx *c)
{
    return c ? c->last_error : init_error;
}
