/*
 * coord_harness.h - for tests that drive a coordinator over its RPC
 * socket: a host registered as an agent would and a job submitted on it.
 * Include after test.h.
 */
#ifndef KOLO_TESTS_COORD_HARNESS_H
#define KOLO_TESTS_COORD_HARNESS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "coord.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "util.h"

/* harness_coord_start starts a coordinator with cfg or fails the test. */
static inline struct coord *harness_coord_start(const struct coord_config *cfg)
{
    struct coord *c = NULL;
    char err[512];
    int rv = coord_start(&c, cfg, err, sizeof err);
    if (rv)
        fprintf(stderr, "coord_start: %s\n", err);
    REQUIRE(rv == 0);
    return c;
}

/* A client speaking as rank `rank` of generation `gen` of job `job`. */
static inline struct rpc_client *harness_client(const char *url, uint64_t job, uint64_t gen,
                                                int rank)
{
    struct rpc_client *cli = NULL;
    struct rpc_client_config cc = {
        .url = url, .identity = "test", .job_id = job, .generation = gen, .rank = rank};
    REQUIRE(rpc_client_open(&cli, &cc) == 0);
    return cli;
}

static inline void harness_call(struct rpc_client *cli, const char *method,
                                const ProtobufCMessage *req, void **out, size_t *olen)
{
    uint8_t buf[1024];
    REQUIRE(protobuf_c_message_get_packed_size(req) <= sizeof buf);
    size_t len = protobuf_c_message_pack(req, buf);
    char err[512];
    int rv = rpc_client_call(cli, method, buf, len, out, olen, 3000, err, sizeof err);
    if (rv)
        fprintf(stderr, "%s: %s\n", method, err);
    REQUIRE(rv == 0);
}

/* Registers host_id with np slots and submits an np-rank job (`true`) on
 * it; returns the job's id. */
/* harness_submit_job_meta: harness_submit_job with metadata ("key=value"). */
static inline uint64_t harness_submit_job_meta(const char *url, const char *host_id, int np,
                                               char **meta, size_t nmeta)
{
    struct rpc_client *cli = harness_client(url, 0, 0, 0);
    char inst[32], hosts[160];
    random_hex(inst, 8);
    Kolo__RegisterRequest reg = KOLO__REGISTER_REQUEST__INIT;
    reg.host_id = (char *)host_id;
    reg.name = (char *)host_id;
    reg.hostname = (char *)host_id;
    reg.addr = "127.0.0.1";
    reg.slots = np;
    reg.agent_instance = inst;
    void *out;
    size_t olen;
    harness_call(cli, "AgentService.RegisterHost", &reg.base, &out, &olen);
    free(out);
    Kolo__SubmitJobRequest sub = KOLO__SUBMIT_JOB_REQUEST__INIT;
    char *argv[] = {"true"};
    sub.argv = argv;
    sub.n_argv = 1;
    sub.np = np;
    snprintf(hosts, sizeof hosts, "%s:%d", host_id, np);
    sub.hosts = hosts;
    sub.metadata = meta;
    sub.n_metadata = nmeta;
    harness_call(cli, "AdminService.SubmitJob", &sub.base, &out, &olen);
    Kolo__SubmitJobReply *rep = kolo__submit_job_reply__unpack(NULL, olen, out);
    REQUIRE(rep);
    uint64_t id = rep->job_id;
    kolo__submit_job_reply__free_unpacked(rep, NULL);
    free(out);
    rpc_client_close(cli);
    return id;
}

static inline uint64_t harness_submit_job(const char *url, const char *host_id, int np)
{
    return harness_submit_job_meta(url, host_id, np, NULL, 0);
}

/* harness_http_get GETs path from the coordinator's HTTP listener at
 * http_url ("http://127.0.0.1:PORT"); returns the body (caller frees) and
 * the status in *status if not NULL. A 3 s receive timeout. */
static inline char *harness_http_get(const char *http_url, const char *path, int *status)
{
    int port = atoi(strrchr(http_url, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    REQUIRE(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path);
    REQUIRE(write(fd, req, (size_t)n) == n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap)
            buf = realloc(buf, (cap *= 2) + 1);
        ssize_t k = read(fd, buf + len, cap - len);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    close(fd);
    buf[len] = '\0';
    if (status) {
        *status = 0;
        sscanf(buf, "HTTP/1.1 %d", status);
    }
    char *body = strstr(buf, "\r\n\r\n");
    char *res = strdup(body ? body + 4 : "");
    free(buf);
    return res;
}

/* harness_metric: the value of counter name in the coordinator's
 * /metrics at http_url, -1 if it has none. */
static inline double harness_metric(const char *http_url, const char *name)
{
    int status = 0;
    char *body = harness_http_get(http_url, "/metrics", &status);
    REQUIRE(body && status == 200);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(body, key);
    double v = at ? atof(at + strlen(key)) : -1;
    free(body);
    return v;
}

#endif
