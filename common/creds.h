/*
 * creds.h - the secrets kolo derives from a cluster's token, and what
 * each one opens.
 *
 *   cluster token   everything: agents, admin clients, the coordinator.
 *                   Never given to a training process.
 *   job credential  HMAC(token, "kolo-job-credential" | job): what an agent
 *                   hands the workers of one job (KOLO_JOB_TOKEN). It
 *                   authenticates their RPCs for that job only (rpc.h,
 *                   RPC_FLAG_JOB_KEY) and is the root of the job's
 *                   data-plane keys.
 *   view key        HMAC(token, "kolo-dashboard-view"), 32 hex digits: what
 *                   reads a job's argv, cwd and output over HTTP (a
 *                   browser gets it once from the link kolo prints, as a
 *                   cookie; coordinator/coord_http.c). Opens no write.
 *   data key        HMAC(job credential, "kolo-data-plane" | job |
 *                   generation | session | process set): what the ranks of
 *                   one mesh prove to each other before any tensor byte
 *                   moves (worker/transport/transport_tcp.c). A rank of another job,
 *                   generation, session or process set holds another key.
 *
 * Every party derives what it needs from what it holds, so no derived
 * secret travels on the wire. A coordinator without a token (loopback
 * and its own user only, see coord.c) derives the same chain from a
 * random secret of its own and hands workers their data key in the
 * rendezvous reply.
 */
#ifndef KOLO_COMMON_CREDS_H
#define KOLO_COMMON_CREDS_H

#include <stdint.h>

/* 64 hex digits and a NUL */
#define CREDS_JOB_HEX 65
#define CREDS_KEY_LEN 32
/* 32 hex digits and a NUL */
#define CREDS_VIEW_HEX 33

void creds_job(const char *token, uint64_t job, char out[CREDS_JOB_HEX]);
void creds_view(const char *token, char out[CREDS_VIEW_HEX]);
void creds_data_key(const char *job_credential, uint64_t job, uint64_t generation,
                    uint32_t session, int32_t process_set, unsigned char out[CREDS_KEY_LEN]);

#endif
