/*
 * coord_rendezvous.c - the rendezvous of a job generation's ranks, its
 * sessions and process sets, and the relay of the GPU communicator's id.
 *
 * Rendezvous: each worker reports its data-plane addresses, pid and (for
 * the first rank of a host) its shared-memory segment; the call parks
 * until every rank of the generation reported, then all get the full
 * peer table (and, without a cluster token, the mesh key). Sessions: a
 * rank that calls init again after a clean shutdown joins the next
 * session, which starts once every rank left the current one. Process
 * sets: each has a negotiation of its own, made by its first member's
 * rendezvous. The negotiation itself is coord_negot.c's; the state both
 * share is coord_negot_int.h.
 */
#include "coord_negot_int.h"
#include "coord_core.h"
#include "coord_jobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "log.h"
#include "util.h"

/*
 * Process sets. A set's members run a context of their own (worker/runtime/ctx.c
 * kolo_process_set_init): frames carry their rank within the set, requests
 * the set's id. Each set has a negotiation of its own (names are per set),
 * made by the first member's rendezvous with its size, and ends with the
 * generation. The slot of a request: &j->negot for the job itself, the
 * set's otherwise; NULL when it cannot be (the call is answered).
 */
struct negot **negot_slot(struct coord *c, struct job *j, struct rpc_call *call, uint32_t set,
                          int size, enum coord_method m)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    struct negot **slot = NULL;
    if (set == 0) {
        slot = &j->negot;
    } else {
        for (int i = 0; i < j->nsets && !slot; i++)
            if (j->sets[i].id == set)
                slot = &j->sets[i].n;
        if (!slot && size > 0) { /* a rendezvous: the set begins */
            if (j->nsets >= NEGOT_MAX_SETS) {
                c->m.rpc_errors[m]++;
                rpc_call_error(call, KOLO_EBUSY, "more than %d process sets", NEGOT_MAX_SETS);
                return NULL;
            }
            if (j->el || size > j->nranks) {
                c->m.rpc_errors[m]++;
                rpc_call_error(call, j->el ? KOLO_ENOTSUP : KOLO_EINVAL,
                               j->el ? "elastic jobs have no process sets"
                                     : "process set %u of %d ranks in a job of %d",
                               set, size, j->nranks);
                return NULL;
            }
            struct job_set *grown = realloc(j->sets, (size_t)(j->nsets + 1) * sizeof(*grown));
            struct negot *n = grown ? negot_new(c, j, size, (int32_t)set) : NULL;
            if (grown)
                j->sets = grown;
            if (!n) {
                rpc_call_error(call, KOLO_ENOMEM, "out of memory");
                return NULL;
            }
            j->sets[j->nsets] = (struct job_set){.id = set, .n = n};
            slot = &j->sets[j->nsets++].n;
        }
        if (!slot) {
            c->m.rpc_errors[m]++;
            rpc_call_error(call, KOLO_ESTATE, "process set %u of generation %llu has no "
                           "rendezvous", set, (unsigned long long)j->generation);
            return NULL;
        }
    }
    if (f->rank >= (*slot)->size) {
        c->m.rpc_errors[m]++;
        rpc_call_error(call, KOLO_EINVAL, "rank %d out of range for process set %u of %d",
                       f->rank, set, (*slot)->size);
        return NULL;
    }
    return slot;
}

/* The reply's topology (negotiation/topology.h): made once from the peer
 * table after the rendezvous completed, by the rule every rank would
 * apply itself; a table it cannot be made from (a peer without a host
 * id, after a resume) sends none, and the ranks derive it. */
static void topo_fill(struct negot *n, Kolo__RendezvousReply *rep, Kolo__TopoHost **hosts,
                      Kolo__TopoHost ***ptrs)
{
    if (n->topo.size == 0) {
        const char **ids = calloc((size_t)n->size, sizeof(*ids));
        bool *leads = calloc((size_t)n->size, sizeof(*leads));
        char why[128];
        for (int r = 0; ids && leads && r < n->size; r++) {
            ids[r] = n->peers[r].host_id;
            leads[r] = n->peers[r].shm_name && n->peers[r].shm_name[0];
        }
        if (!ids || !leads || topology_derive(&n->topo, n->size, ids, leads, why, sizeof why))
            topology_free(&n->topo);
        free(ids);
        free(leads);
        if (n->topo.size == 0)
            return;
    }
    *hosts = calloc((size_t)n->topo.nhosts, sizeof(**hosts));
    *ptrs = calloc((size_t)n->topo.nhosts, sizeof(**ptrs));
    if (!*hosts || !*ptrs)
        return; /* the ranks derive it */
    for (int h = 0; h < n->topo.nhosts; h++) {
        Kolo__TopoHost *t = &(*hosts)[h];
        kolo__topo_host__init(t);
        t->host_id = n->peers[topology_rank(&n->topo, h, 0)].host_id;
        t->ranks = (int32_t *)&n->topo.ranks[n->topo.first[h]];
        t->n_ranks = (size_t)n->topo.count[h];
        (*ptrs)[h] = t;
    }
    rep->hosts = *ptrs;
    rep->n_hosts = (size_t)n->topo.nhosts;
}

/* The compact peer table (RendezvousRequest.compact_peers): the
 * topology's hosts, each with its ranks' address, ports, pids and kept
 * segments (only a host where one rank kept one lists them) and its
 * segment; those arrays in the returned block (freed by the caller). NULL when the generation cannot be put that way (a rank
 * without a tcp address, or a host whose ranks listen on different
 * addresses): the caller sends the peer table. */
static uint64_t *topo_compact(const struct negot *n, Kolo__TopoHost *hosts)
{
    for (int h = 0; h < n->topo.nhosts; h++) {
        const struct peer *lead = &n->peers[topology_rank(&n->topo, h, 0)];
        for (int i = 0; i < n->topo.count[h]; i++) {
            const struct peer *p = &n->peers[topology_rank(&n->topo, h, i)];
            if (!p->data_host || !lead->data_host || strcmp(p->data_host, lead->data_host))
                return NULL;
        }
    }
    /* the kept segments' codes first: 64-bit aligned */
    uint64_t *block = calloc((size_t)n->size * 2 + 1, sizeof(uint64_t));
    if (!block)
        return NULL;
    uint64_t *kept = block;
    int32_t *ports = (int32_t *)(block + n->size), *pids = ports + n->size;
    for (int h = 0; h < n->topo.nhosts; h++) {
        const struct peer *lead = &n->peers[topology_rank(&n->topo, h, 0)];
        hosts[h].data_host = lead->data_host;
        hosts[h].shm_name = lead->shm_name;
        hosts[h].machine = lead->machine;
        hosts[h].ports = ports;
        hosts[h].pids = pids;
        hosts[h].kept_segments = kept;
        hosts[h].n_ports = hosts[h].n_pids = (size_t)n->topo.count[h];
        bool any = false;
        for (int i = 0; i < n->topo.count[h]; i++) {
            const struct peer *p = &n->peers[topology_rank(&n->topo, h, i)];
            *ports++ = p->port;
            *pids++ = p->pid;
            *kept++ = p->kept_segment;
            any |= p->kept_segment != 0;
        }
        hosts[h].n_kept_segments = any ? (size_t)n->topo.count[h] : 0;
    }
    return block;
}

/* What a complete reply says changed: the topology and the packed
 * compact reply are made again when next needed. */
static void rendezvous_changed(struct negot *n)
{
    topology_free(&n->topo);
    if (n->compact_reply) /* it holds the data-plane key */
        explicit_bzero(n->compact_reply, n->compact_len);
    free(n->compact_reply);
    n->compact_reply = NULL;
    n->compact_len = 0;
}

void rendezvous_answer(struct negot *n, struct rpc_call *call)
{
    int rank = rpc_call_frame(call)->rank;
    bool wants_compact = rank >= 0 && rank < n->size && n->peers[rank].compact;
    if (n->complete && wants_compact && n->compact_reply) {
        /* the same bytes for every rank: packed once, not once a rank */
        rpc_call_reply(call, n->compact_reply, n->compact_len);
        return;
    }
    Kolo__RendezvousReply rep = KOLO__RENDEZVOUS_REPLY__INIT;
    rep.complete = n->complete;
    rep.joined = n->joined;
    Kolo__PeerInfo *infos = NULL, **ptrs = NULL;
    Kolo__TopoHost *hosts = NULL, **host_ptrs = NULL;
    uint64_t *compact = NULL;
    if (n->complete) {
        rep.fusion_threshold = n->fusion_threshold;
        rep.cache = n->carry;
        rep.n_cache = n->ncarry;
        topo_fill(n, &rep, &hosts, &host_ptrs);
        if (wants_compact && rep.n_hosts > 0)
            compact = topo_compact(n, hosts);
    }
    /* an older worker, or a generation the compact form cannot hold */
    bool table = n->complete && !compact;
    if (table) {
        infos = calloc((size_t)n->size, sizeof(*infos));
        ptrs = calloc((size_t)n->size, sizeof(*ptrs));
        if (!infos || !ptrs) {
            free(infos);
            free(ptrs);
            free(hosts);
            free(host_ptrs);
            rpc_call_error(call, KOLO_ENOMEM, "out of memory");
            return;
        }
        for (int r = 0; r < n->size; r++) {
            kolo__peer_info__init(&infos[r]);
            infos[r].rank = r;
            infos[r].host_id = n->peers[r].host_id;
            infos[r].data_addrs = n->peers[r].addrs;
            infos[r].n_data_addrs = (size_t)n->peers[r].naddrs;
            infos[r].pid = n->peers[r].pid;
            infos[r].shm_name = n->peers[r].shm_name;
            infos[r].machine = n->peers[r].machine;
            infos[r].kept_segment = n->peers[r].kept_segment;
            ptrs[r] = &infos[r];
        }
        rep.peers = ptrs;
        rep.n_peers = (size_t)n->size;
    }
    rep.nccl_id.data = n->nccl_id;
    rep.nccl_id.len = n->nccl_id_len;
    uint8_t key[CREDS_KEY_LEN];
    if (n->complete && n->job_cred[0]) {
        creds_data_key(n->job_cred, n->job_id, n->generation, n->session, n->set, key);
        rep.data_key.data = key;
        rep.data_key.len = sizeof key;
    }
    size_t len = compact ? kolo__rendezvous_reply__get_packed_size(&rep) : 0;
    uint8_t *packed = len ? malloc(len) : NULL;
    if (packed) { /* kept for the other ranks that ask for the compact form */
        kolo__rendezvous_reply__pack(&rep, packed);
        n->compact_reply = packed;
        n->compact_len = len;
        rpc_call_reply(call, packed, len);
    } else {
        coord_send_pb(call, &rep.base);
    }
    memset(key, 0, sizeof key);
    free(infos);
    free(ptrs);
    free(compact);
    free(hosts);
    free(host_ptrs);
}

/*
 * The GPU communicator's id (worker/runtime/nccl_exec.c). NCCL's ranks need one
 * ncclUniqueId, made by rank 0, before they can build a communicator.
 * Workers do that the first time a job touches a GPU tensor, after the
 * rendezvous: rank 0 posts its id here (the 128 bytes in nccl_id) and
 * the other ranks ask with a one-byte nccl_id, parked like a rendezvous
 * call until the id is there or wait_ms passed (then they ask again).
 * The id belongs to the generation: a new generation starts without one.
 */
static void nccl_relay(struct coord *c, struct negot *n, int rank,
                       const Kolo__RendezvousRequest *req, struct rpc_call *call)
{
    if (!n->complete) {
        c->m.rpc_errors[M_WORKER_RENDEZVOUS]++;
        rpc_call_error(call, KOLO_ESTATE, "the rendezvous of generation %llu is not complete",
                       (unsigned long long)n->generation);
        return;
    }
    struct peer *p = &n->peers[rank];
    if (p->parked) {
        rendezvous_answer(n, p->parked);
        p->parked = NULL;
    }
    if (rank == 0 && req->nccl_id.len > 1) {
        if (req->nccl_id.len > sizeof(n->nccl_id)) {
            c->m.rpc_errors[M_WORKER_RENDEZVOUS]++;
            rpc_call_error(call, KOLO_EINVAL, "nccl_id of %zu bytes; at most %zu",
                           req->nccl_id.len, sizeof(n->nccl_id));
            return;
        }
        memcpy(n->nccl_id, req->nccl_id.data, req->nccl_id.len);
        n->nccl_id_len = req->nccl_id.len;
        rendezvous_changed(n);
        for (int r = 0; r < n->size; r++) {
            if (n->peers[r].parked) {
                rendezvous_answer(n, n->peers[r].parked);
                n->peers[r].parked = NULL;
            }
        }
        rendezvous_answer(n, call);
        return;
    }
    uint32_t wait = req->wait_ms > NEGOT_MAX_WAIT_MS ? NEGOT_MAX_WAIT_MS : req->wait_ms;
    if (n->nccl_id_len || wait == 0) {
        rendezvous_answer(n, call);
    } else {
        p->parked = call;
        p->deadline = now_mono_ms() + wait;
    }
}

/* Ends every call parked on n with code and why (mu held). */
void negot_drop_parked(struct negot *n, int code, const char *why)
{
    resume_drop(n, code, why);
    for (int r = 0; r < n->size; r++) {
        if (n->peers[r].parked) {
            rpc_call_error(n->peers[r].parked, code, "%s", why);
            n->peers[r].parked = NULL;
        }
        if (n->parked[r]) {
            rpc_call_error(n->parked[r], code, "%s", why);
            n->parked[r] = NULL;
        }
        if (n->peers[r].next) {
            rpc_call_error(n->peers[r].next, code, "%s", why);
            n->peers[r].next = NULL;
        }
    }
}

/* "Not yet": a rendezvous reply that is not complete, so the worker asks
 * again (a join of the next session, parked until the current ends). */
void rendezvous_not_yet(struct rpc_call *call)
{
    Kolo__RendezvousReply rep = KOLO__RENDEZVOUS_REPLY__INIT;
    coord_send_pb(call, &rep.base);
}

/* The next session of the generation starts: its rendezvous and
 * negotiation start over (names may be reused); the ranks that asked to
 * join it are told to ask again, which reaches the new one. NULL when out
 * of memory (the old session stays). */
static struct negot *negot_next_session(struct coord *c, struct job *j, struct negot **slot,
                                        uint32_t session)
{
    struct negot *old = *slot;
    struct negot *n = negot_new(c, j, old->size, old->set);
    if (!n)
        return NULL;
    n->session = session;
    n->tl = old->tl;
    char why[160];
    snprintf(why, sizeof(why), "session %u of generation %llu started (the ranks called init "
             "after shutdown)", session, (unsigned long long)j->generation);
    for (int r = 0; r < old->size; r++) {
        if (old->peers[r].next) {
            rendezvous_not_yet(old->peers[r].next);
            old->peers[r].next = NULL;
        }
    }
    negot_drop_parked(old, KOLO_ESTALE, why);
    coord_negot_free(old);
    *slot = n;
    c->m.sessions++;
    LOGI("coord", "job %llu: %s", (unsigned long long)j->id, why);
    return n;
}

/* A rank asks to join a later session (it called init again after a
 * clean shutdown). The session it is in starts over once every rank has
 * left it: a slower rank may still be reading the old session's last
 * responses. Until then the call waits (up to wait_ms). true: go on with
 * the join in *slot; false: the call is parked or answered. */
static bool session_join(struct coord *c, struct job *j, struct negot **slot,
                         struct rpc_call *call, int rank, uint32_t session, uint32_t wait_ms)
{
    struct negot *n = *slot;
    if (!n->complete && n->joined == 0 && !n->res) {
        n->session = session; /* nothing happened in it yet (a restart) */
        return true;
    }
    if (n->nleft == n->size || !n->complete) {
        if (negot_next_session(c, j, slot, session))
            return true;
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return false;
    }
    struct peer *p = &n->peers[rank];
    if (p->next)
        rendezvous_not_yet(p->next);
    p->next = call;
    p->next_deadline = now_mono_ms() + wait_ms;
    return false;
}

/* Every rank left the session: if some already wait to join the next,
 * it starts now. */
void session_drained(struct coord *c, struct job *j, struct negot **slot)
{
    struct negot *n = *slot;
    uint32_t next = 0;
    for (int r = 0; r < n->size; r++)
        if (n->peers[r].next)
            next = n->session + 1;
    if (next)
        negot_next_session(c, j, slot, next);
}

/* Every member left a process set: it goes (its id is not used again). */
void set_drained(struct job *j, struct negot **slot)
{
    for (int i = 0; i < j->nsets; i++) {
        if (&j->sets[i].n != slot)
            continue;
        negot_drop_parked(j->sets[i].n, KOLO_ESHUTDOWN, "the process set was removed");
        coord_negot_free(j->sets[i].n);
        memmove(&j->sets[i], &j->sets[i + 1], (size_t)(j->nsets - i - 1) * sizeof(*j->sets));
        j->nsets--;
        return;
    }
}

void coord_rpc_rendezvous(struct coord *c, struct rpc_call *call)
{
    struct job *j = worker_job(c, call, M_WORKER_RENDEZVOUS);
    if (!j)
        return;
    const struct rpc_frame *f = rpc_call_frame(call);
    Kolo__RendezvousRequest *req = kolo__rendezvous_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_WORKER_RENDEZVOUS]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed RendezvousRequest");
        return;
    }
    struct negot **slot = negot_slot(c, j, call, req->process_set,
                                     req->nccl_id.len > 0 ? 0 : req->size, M_WORKER_RENDEZVOUS);
    if (!slot) {
        kolo__rendezvous_request__free_unpacked(req, NULL);
        return;
    }
    struct negot *n = *slot;
    if (req->size != n->size) {
        c->m.rpc_errors[M_WORKER_RENDEZVOUS]++;
        rpc_call_error(call, KOLO_EINVAL, "rank %d believes %s has %d ranks; it has %d",
                       f->rank, req->process_set ? "its process set" : "the job", req->size,
                       n->size);
        kolo__rendezvous_request__free_unpacked(req, NULL);
        return;
    }
    if (req->session != n->session) {
        if (req->session < n->session) {
            c->m.rpc_errors[M_WORKER_RENDEZVOUS]++;
            rpc_call_error(call, KOLO_ESTALE,
                           "rank %d joins session %u of generation %llu, which ended: the "
                           "ranks are in session %u",
                           f->rank, req->session, (unsigned long long)n->generation, n->session);
            kolo__rendezvous_request__free_unpacked(req, NULL);
            return;
        }
        if (req->nccl_id.len > 0) {
            c->m.rpc_errors[M_WORKER_RENDEZVOUS]++;
            rpc_call_error(call, KOLO_ESTATE, "session %u of generation %llu has not started",
                           req->session, (unsigned long long)n->generation);
            kolo__rendezvous_request__free_unpacked(req, NULL);
            return;
        }
        uint32_t wait = req->wait_ms > NEGOT_MAX_WAIT_MS ? NEGOT_MAX_WAIT_MS : req->wait_ms;
        if (!session_join(c, j, slot, call, f->rank, req->session, wait)) {
            kolo__rendezvous_request__free_unpacked(req, NULL);
            return;
        }
        n = *slot;
    }
    if (req->nccl_id.len > 0) { /* the GPU communicator's id, not a join */
        nccl_relay(c, n, f->rank, req, call);
        kolo__rendezvous_request__free_unpacked(req, NULL);
        return;
    }
    struct peer *p = &n->peers[f->rank];
    if (!p->joined) {
        p->joined = true;
        n->joined++;
        if (n == j->negot && f->rank < j->nranks)
            j->ranks[f->rank].unjoined_since = 0; /* see frozen_member */
    }
    free(p->host_id);
    for (int i = 0; i < p->naddrs; i++)
        free(p->addrs[i]);
    free(p->addrs);
    free(p->shm_name);
    free(p->machine);
    free(p->data_host);
    p->data_host = NULL;
    p->port = 0;
    p->host_id = strdup(req->host_id);
    rendezvous_changed(n); /* the topology is made again from the new peer table */
    p->addrs = calloc(req->n_data_addrs + 1, sizeof(char *));
    p->naddrs = 0;
    for (size_t i = 0; p->addrs && i < req->n_data_addrs && i < 16; i++)
        p->addrs[p->naddrs++] = strdup(req->data_addrs[i]);
    p->pid = req->pid;
    p->shm_name = strdup(req->shm_name);
    p->machine = strdup(req->machine);
    p->kept_segment = req->kept_segment;
    p->compact = req->compact_peers;
    char addr[256];
    if (p->naddrs > 0 && tcp_addr_parse(p->addrs[0], addr, sizeof addr, &p->port))
        p->data_host = strdup(addr);
    else
        p->port = 0;
    if (f->rank == 0) {
        if (req->fusion_threshold != 0)
            n->fusion_threshold = req->fusion_threshold;
        if (req->stall_warning_ms != 0)
            n->stall_warning_ms = req->stall_warning_ms;
        n->stall_shutdown_ms = req->stall_shutdown_ms;
    }
    uint32_t wait = req->wait_ms > NEGOT_MAX_WAIT_MS ? NEGOT_MAX_WAIT_MS : req->wait_ms;
    kolo__rendezvous_request__free_unpacked(req, NULL);

    if (p->parked) {
        rendezvous_answer(n, p->parked);
        p->parked = NULL;
    }
    if (!n->complete && n->joined == n->size) {
        n->complete = true;
        if (j->el && n == j->negot)
            j->el->fail_streak = 0; /* a generation ran: failures start over */
        if (j->el && n == j->negot && j->el->rec_mono && !j->el->rec_gen) {
            j->el->rec_gen = j->generation; /* its rank 0 reports the rest */
            j->el->rec_formed_ms = now_mono_ms() - j->el->rec_mono;
        }
        if (j->el && j->el->closed_mono) {
            coord_hist_observe(&c->m.reset_duration,
                               (double)(now_mono_ms() - j->el->closed_mono) / 1000.0);
            j->el->closed_mono = 0;
        }
        if (n == j->negot)
            LOGI("coord", "job %llu generation %llu: all %d rank(s) joined",
                 (unsigned long long)j->id, (unsigned long long)j->generation, n->size);
        else
            LOGI("coord", "job %llu generation %llu: all %d rank(s) of a process set joined",
                 (unsigned long long)j->id, (unsigned long long)j->generation, n->size);
        for (int r = 0; r < n->size; r++) {
            if (n->peers[r].parked) {
                rendezvous_answer(n, n->peers[r].parked);
                n->peers[r].parked = NULL;
            }
        }
    }
    if (n->complete || wait == 0) {
        rendezvous_answer(n, call);
    } else {
        p->parked = call;
        p->deadline = now_mono_ms() + wait;
    }
}

