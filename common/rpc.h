/*
 * rpc.h - kolo's RPC: one request frame, one reply frame, over nng req/rep.
 *
 * Frame layout (all integers big-endian), the same for requests and replies:
 *
 *   off  size  field
 *     0     4  magic "KOLO"
 *     4     2  protocol version (KOLO_PROTO_VERSION)
 *     6     1  kind: 1 request, 2 reply
 *     7     1  flags: bit 0 = MAC present, bit 1 = MAC keyed with the
 *              credential of the job in the header (RPC_FLAG_JOB_KEY)
 *     8    32  MAC: HMAC-SHA256(token, frame with this field zeroed)
 *    40     8  timestamp, ms since the epoch (sender's clock)
 *    48    16  nonce (request: random; reply: the request's, echoed)
 *    64     8  job id          } caller identity (requests);
 *    72     8  generation      } zero for agents and admin clients
 *    80     4  rank (signed)   }
 *    84     4  status (replies: a kolo error code, 0 = ok)
 *    88     2  method length M  (requests: "Service.Method")
 *    90     2  identity length I (requests: host id or client name)
 *    92     4  body length B
 *    96     M  method, I identity, B body (a protobuf message, or for an
 *              error reply the error text)
 *
 * Authentication. With a cluster token configured, every request must carry
 * a MAC computed with the token, a timestamp within +-window of the
 * server's clock and a nonce not seen in that window; replies are MAC'd the
 * same way and bind to the request by echoing its nonce, so a client also
 * knows it talks to a coordinator holding the token. The token itself never
 * travels. A training process holds only its job's credential
 * (common/creds.h): its frames say so (RPC_FLAG_JOB_KEY), the server
 * derives that job's key from the token to check them, and the handler
 * learns the call is confined to that job (rpc_call_job_scoped). Without a token (loopback-only deployments) the MAC is absent
 * and a server without a token rejects frames that carry one (a
 * misconfiguration the operator should see).
 *
 * Server. The server keeps a pool of nng contexts receiving in parallel.
 * A valid request is handed to the handler as an rpc_call (on an nng
 * thread); the handler may answer at once or keep the call and answer
 * later from any thread ("parking": long polls, rendezvous). Until
 * answered, the call occupies one context, so the pool size bounds the
 * number of parked calls. Invalid frames (garbage, truncated, over the cap,
 * wrong version, bad MAC, replay) never reach the handler: the server
 * answers a typed error where it can and counts them in rpc_server_stats.
 *
 * Client. rpc_client_call is synchronous, thread-safe (one nng context per
 * call) and always bounded by its deadline.
 */
#ifndef KOLO_COMMON_RPC_H
#define KOLO_COMMON_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tls_files; /* tls.h */

#define KOLO_PROTO_VERSION  1
#define RPC_HEADER_LEN      96
#define RPC_NONCE_LEN       16
#define RPC_MAX_METHOD      64
#define RPC_MAX_IDENTITY    128
#define RPC_DEFAULT_MAX_MSG (16u << 20)
#define RPC_AUTH_WINDOW_MS  120000
/* Connection hygiene (rpc.c, pipe_cb and sweep_cb). Memory before
 * authentication is bounded by what nng may buffer per connection: a
 * server accepts request frames of at most RPC_MAX_REQUEST bytes and nng
 * refuses (closes the connection on) a larger length header before it
 * allocates anything; clients refuse to send more, so larger payloads
 * (snapshots) go in chunks below it. Replies are not bounded by it
 * (clients take RPC_DEFAULT_MAX_MSG). A connection must send a valid
 * request within RPC_HANDSHAKE_MS; at most RPC_MAX_UNPROVEN connections
 * that have not are held (the oldest goes; large enough for a thousand
 * ranks connecting at once). What those connections hold is counted with
 * the kernel's own figure (tcp_info's bytes received, past nng's
 * greeting): while more than RPC_UNPROVEN_BUDGET (128 MiB) sits on
 * unproven connections, the heaviest are closed, every sweep (250 ms).
 * An idle connection holds nothing and is never chosen; honest first
 * requests are small. So frames in progress before authentication hold
 * at most RPC_UNPROVEN_BUDGET plus what the link delivers in one sweep,
 * and never more than RPC_MAX_UNPROVEN x RPC_MAX_REQUEST. A
 * token-less server counts a connection proven only when its caller is
 * the server's own user or root (rpc_call_peer_uid): another local
 * user's connections stay under these bounds however many requests they
 * send. One connection holds at most RPC_MAX_PARKED_PER_CONN calls the
 * handler keeps, and one caller (rpc.c, caller_key: its address and user
 * as the kernel gives them, then its job for a job-credential holder, or
 * the name, job and rank its frame gives for others) at most a quarter of
 * the contexts, and at least 2 x RPC_MAX_PARKED_PER_CONN: KOLO_EBUSY
 * beyond, which clients opened with retry_busy retry. */
#define RPC_MAX_REQUEST         (1u << 20)
#define RPC_HANDSHAKE_MS        10000
#define RPC_MAX_UNPROVEN        1024
#define RPC_UNPROVEN_BUDGET     (128u << 20)
#define RPC_SWEEP_MS            250
#define RPC_MAX_PARKED_PER_CONN 64

enum rpc_kind { RPC_REQUEST = 1, RPC_REPLY = 2 };
#define RPC_FLAG_MAC     1
#define RPC_FLAG_JOB_KEY 2

/* A decoded frame; body points into the message it was decoded from. */
struct rpc_frame {
    uint16_t version;
    uint8_t kind;
    uint8_t flags;
    uint8_t mac[32];
    uint64_t ts_ms;
    uint8_t nonce[RPC_NONCE_LEN];
    uint64_t job_id;
    uint64_t generation;
    int32_t rank;
    int32_t status;
    char method[RPC_MAX_METHOD + 1];
    char identity[RPC_MAX_IDENTITY + 1];
    const uint8_t *body;
    size_t body_len;
};

/* rpc_frame_encode builds a frame into a malloc'd buffer (MAC'd when
 * token is non-NULL; f->flags may add RPC_FLAG_JOB_KEY then). */
int rpc_frame_encode(const struct rpc_frame *f, const char *token, uint8_t **out, size_t *out_len);
/* rpc_frame_decode parses and bounds-checks a frame; it does not check the
 * version or the MAC (see rpc_frame_verify) so callers can answer those
 * with specific errors. */
int rpc_frame_decode(const uint8_t *data, size_t len, struct rpc_frame *f);
/* rpc_frame_verify checks the MAC of an encoded frame against token. */
int rpc_frame_verify(const uint8_t *data, size_t len, const char *token);

/* ---- server ---- */

struct rpc_server;
struct rpc_call;

typedef void (*rpc_handler_fn)(struct rpc_call *call, void *arg);

struct rpc_server_config {
    const char *url;   /* e.g. "tcp://127.0.0.1:0", "inproc://x" */
    const char *token; /* NULL: no authentication (loopback only) */
    size_t max_msg;    /* request frame cap; 0 or over it = RPC_MAX_REQUEST */
    int contexts;      /* receive contexts = max parked calls; 0 = 256 */
    int handshake_ms;  /* 0 = RPC_HANDSHAKE_MS (tests shorten it) */
    int max_unproven;  /* 0 = RPC_MAX_UNPROVEN */
    size_t unproven_budget; /* 0 = RPC_UNPROVEN_BUDGET (tests lower it) */
    const struct tls_files *tls; /* NULL or off: plain tcp:// (tls.h) */
    /* Capacity kept for the calls that keep hosts alive: methods starting
     * with reserved_prefix (e.g. "AgentService.") may always be received,
     * because other calls the handler keeps (long polls) may hold at most
     * contexts - reserved contexts; beyond, other calls get KOLO_EBUSY.
     * NULL or 0: nothing reserved. */
    const char *reserved_prefix;
    int reserved;
    rpc_handler_fn handler;
    void *arg;
};

struct rpc_server_stats {
    uint64_t requests;  /* valid requests handed to the handler */
    uint64_t malformed; /* garbage or truncated frames */
    uint64_t too_big;
    uint64_t bad_version;
    uint64_t auth_failed; /* missing/wrong MAC, stale timestamp, replay */
    uint64_t replies_failed;
    uint64_t conns_evicted;   /* unproven connections closed for a newer one */
    uint64_t conns_timed_out; /* connections silent past RPC_HANDSHAKE_MS, and
                                 TLS connections whose handshake did not end
                                 within it */
    uint64_t busy_refused;    /* calls over RPC_MAX_PARKED_PER_CONN, over the
                                 caller's share, or over the unreserved
                                 capacity (reserved_prefix) */
};

int rpc_server_open(struct rpc_server **srv, const struct rpc_server_config *cfg);
/* rpc_server_url returns the bound URL, with the real port when 0 was
 * asked ("tcp://127.0.0.1:41234"). */
const char *rpc_server_url(const struct rpc_server *srv);
void rpc_server_get_stats(struct rpc_server *srv, struct rpc_server_stats *st);
/* rpc_server_close stops receiving and frees everything; no handler runs
 * after it returns. The owner must have answered (or forgotten) every
 * call it parked: calls still held are freed unanswered. nng's close has
 * no deadline: after 5 s it returns false, the server left as it is (its
 * callbacks may still run: the owner must keep what they use). */
bool rpc_server_close(struct rpc_server *srv);

/* The request, valid until the call is answered. */
const struct rpc_frame *rpc_call_frame(const struct rpc_call *call);
/* rpc_call_peer_uid: the uid owning the caller's end of the connection,
 * or -1 when it cannot be known (another host). The kernel answers once
 * per connection, at its first request: for TCP (IPv4 and IPv6) a
 * NETLINK_SOCK_DIAG query for exactly the peer's socket, for ipc:// the
 * socket's peer credentials; inproc:// callers are this process. Later
 * calls read the answer kept with the connection, so it is cheap enough
 * for every request. */
int rpc_call_peer_uid(const struct rpc_call *call);
/* rpc_call_job_scoped: the caller proved only the credential of the job
 * its frame names (a training process), not the cluster token. */
bool rpc_call_job_scoped(const struct rpc_call *call);
/* rpc_call_reply answers with status 0 and body; consumes the call. */
void rpc_call_reply(struct rpc_call *call, const void *body, size_t len);
/* rpc_call_error answers with an error code and a message; consumes it. */
void rpc_call_error(struct rpc_call *call, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- client ---- */

struct rpc_client;

struct rpc_client_config {
    const char *url;
    const char *token;    /* NULL: no authentication */
    bool token_is_job;    /* token is job_id's credential (creds.h) */
    const char *identity; /* host id or client name, may be NULL */
    uint64_t job_id;
    uint64_t generation;
    int32_t rank;
    size_t max_msg; /* reply cap; 0 = RPC_DEFAULT_MAX_MSG (requests: RPC_MAX_REQUEST) */
    const struct tls_files *tls; /* NULL or off: plain, unless the URL is tls+tcp:// */
    /* KOLO_EBUSY (the server holds all the calls it takes from us, or all
     * it has) is tried again with backoff until the call's deadline,
     * sync and async alike: what libkolo's calls want, since a training
     * job must not fail because someone else parks calls. */
    bool retry_busy;
    /* Closed with nothing in flight, the client is kept, connected, for
     * the next rpc_client_open of the same server with the same token,
     * TLS files, reply cap and retry mode (at most RPC_CLIENTS_KEPT in the
     * process), instead of its socket being closed: libkolo's init ->
     * shutdown -> init (test suites run hundreds) closed two sockets a
     * cycle, and nng 1.5's close of one now and then never returned; a
     * few dozen such closes left nothing in the process able to reach
     * the coordinator. */
    bool reuse;
};
#define RPC_CLIENTS_KEPT 4

int rpc_client_open(struct rpc_client **cli, const struct rpc_client_config *cfg);
/* rpc_client_shutdown makes every call in flight, and every later call,
 * fail at once with KOLO_ECLOSED; safe from any thread. The client must
 * still be closed (rpc_client_close) once no other thread uses it. */
void rpc_client_shutdown(struct rpc_client *cli);
/* rpc_client_close shuts the client down and closes its socket, waiting
 * for that at most rpc_close_wait_ms (default 3000): nng 1.5's close can
 * wait forever on a connection it never reaps (seen under load, with
 * every nng thread idle), and a caller must not hang with it. Past the
 * bound it logs a warning and returns; the close goes on, on a thread of
 * its own that frees the client if nng ever returns. Tests set
 * rpc_close_test_delay_ms to hold that thread back before the close. */
void rpc_client_close(struct rpc_client *cli);
extern int rpc_close_wait_ms;
extern int rpc_close_test_delay_ms;
/* rpc_client_set_identity changes the identity sent with later calls. */
void rpc_client_set_identity(struct rpc_client *cli, const char *identity, uint64_t job_id,
                             uint64_t generation, int32_t rank);
/*
 * rpc_client_call sends method(req) and waits at most timeout_ms for the
 * reply. On success returns 0 and *rep (malloc'd, may be NULL when empty).
 * On failure returns a kolo error code, with the server's message (or a
 * local one) in err. KOLO_ECONNREFUSED, and only it among the transport
 * failures, says the request never left this client: no connection took
 * it by the deadline (none was up, or the one up stayed busy with earlier
 * requests), so the server never saw it and it may be sent again.
 * KOLO_ETIMEDOUT (no reply in time) and KOLO_EIO (the connection broke)
 * leave open whether the server got it.
 */
int rpc_client_call(struct rpc_client *cli, const char *method, const void *req, size_t req_len,
                    void **rep, size_t *rep_len, int timeout_ms, char *err, size_t errlen);

/*
 * rpc_client_call_async starts the same call and returns at once; done
 * runs exactly once, on an nng thread, with the result: code 0 and the
 * reply body (valid only during the callback), or an error code and
 * message, the codes meaning what they do for rpc_client_call (a request
 * that never left ends with KOLO_ECONNREFUSED; with retry_busy, one the
 * server kept refusing ends with KOLO_EBUSY: its handler never saw it
 * either). rpc_client_close waits for outstanding async calls (they end
 * with KOLO_ECLOSED). Returns non-zero if the call could not start (then
 * done is not called).
 */
typedef void (*rpc_done_fn)(void *arg, int code, const void *rep, size_t rep_len,
                            const char *err);
int rpc_client_call_async(struct rpc_client *cli, const char *method, const void *req,
                          size_t req_len, int timeout_ms, rpc_done_fn done, void *arg);

#endif
