/*
 * coord_harness.h - for tests that drive a coordinator over its RPC
 * socket: a host registered as an agent would and a job submitted on it.
 * Include after test.h.
 */
#ifndef KOLO_TESTS_COORD_HARNESS_H
#define KOLO_TESTS_COORD_HARNESS_H

#include <stdint.h>
#include <stdlib.h>

#include "kolo.pb-c.h"
#include "rpc.h"
#include "util.h"

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
static inline uint64_t harness_submit_job(const char *url, const char *host_id, int np)
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
    harness_call(cli, "AdminService.SubmitJob", &sub.base, &out, &olen);
    Kolo__SubmitJobReply *rep = kolo__submit_job_reply__unpack(NULL, olen, out);
    REQUIRE(rep);
    uint64_t id = rep->job_id;
    kolo__submit_job_reply__free_unpacked(rep, NULL);
    free(out);
    rpc_client_close(cli);
    return id;
}

#endif
