/*
 * coord_hosts.h - hosts and their agents (core): registration, leases, reports.
 */
#ifndef KOLO_COORDINATOR_COORD_HOSTS_H
#define KOLO_COORDINATOR_COORD_HOSTS_H

#include "coord_model.h"

struct host *coord_host_find(struct coord *c, const char *id);
/* coord_host_named: the host with this id, else the first with this name. */
struct host *coord_host_named(struct coord *c, const char *id_or_name);
/* coord_host_drain drains h (no new work; elastic jobs leave it) or makes
 * it usable again, kept over restarts, with an event naming `via` (who
 * asked: "the REST API", "kolo drain"). leaving: the host's own agent is
 * shutting down, so its next registration undrains it; it never turns an
 * operator's drain into that. */
void coord_host_drain(struct coord *c, struct host *h, bool drain, bool leaving, const char *via);
/* coord_hosts_extend_leases gives every live host ms more (the coordinator
 * stood still that long: coord.c, coord_cron). */
void coord_hosts_extend_leases(struct coord *c, uint64_t ms);
struct host *coord_host_by_session(struct coord *c, const char *session);
int coord_host_slots_used(struct coord *c, const struct host *h);
void coord_hosts_cron(struct coord *c, uint64_t now);
void coord_host_persist(struct coord *c, struct host *h);
void coord_host_wake(struct coord *c, struct host *h);
/* coord_host_poke answers the host's parked heartbeat now, its worker set
 * unchanged: for what else a reply carries (a kolo stacks request). */
void coord_host_poke(struct coord *c, struct host *h);
void coord_rpc_agent_register(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_rpc_agent_heartbeat(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_rpc_agent_report(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_hosts_shutdown(struct coord *c);
void coord_hosts_free(struct coord *c);

#endif
