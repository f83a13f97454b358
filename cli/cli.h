/*
 * cli.h - the user-facing subcommands of the kolo binary and the helpers
 * they share for talking to a coordinator.
 */
#ifndef KOLO_CLI_CLI_H
#define KOLO_CLI_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

#include "rpc.h"

int cmd_run(int argc, char **argv);
/* tune.c: hyperparameter search (python3 -m kolo.tune) */
int cmd_tune(int argc, char **argv);
/* ops.c: the operator's commands */
int cmd_status(int argc, char **argv);
int cmd_jobs(int argc, char **argv);
int cmd_hosts(int argc, char **argv);
int cmd_logs(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_stacks(int argc, char **argv);
int cmd_top(int argc, char **argv);
int cmd_drain(int argc, char **argv);
int cmd_undrain(int argc, char **argv);
int cmd_attach(int argc, char **argv);
/* dashboard.c: the dashboard of the runs kolo run kept */
int cmd_dashboard(int argc, char **argv);

/* cli_token loads the token from path (NULL/"" = none); 0 or an error. */
int cli_token(const char *path, char **token, char *err, size_t errlen);

/*
 * cli_connect opens a client of the coordinator at url as identity, over
 * TLS when tls asks for it (common/tls.h). 0, or a kolo error with the
 * reason in err (an address TLS cannot carry, missing TLS files, ...).
 * A TCP address where nothing listens is KOLO_ECONNREFUSED at once, not
 * the first call's timeout.
 */
int cli_connect(struct rpc_client **cli, const char *url, const char *token,
                const struct tls_files *tls, const char *identity, char *err, size_t errlen);

/*
 * cli_call packs req, calls method and unpacks the reply with rep_desc.
 * Returns 0 and *rep (free with protobuf_c_message_free_unpacked), or a
 * kolo error with a message in err.
 */
int cli_call(struct rpc_client *cli, const char *method, const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *rep_desc, ProtobufCMessage **rep, int timeout_ms,
             char *err, size_t errlen);

/* cli_transient: a call failed in a way that a coordinator restarting (or
 * busy) explains, so following a job should go on asking. */
bool cli_transient(int rv);

/* job_lines.c: a job's output lines for a person (see its DESIGN). */
/* cli_escape_wanted: control bytes are escaped on f (a terminal, no --raw). */
bool cli_escape_wanted(FILE *f, bool raw);
/* cli_write_text writes text to f, its control bytes and bytes that are
 * not UTF-8 as \xNN when escape is set, untouched otherwise. */
void cli_write_text(FILE *f, const void *text, size_t len, bool escape);
/* cli_print_job_line prints "[rank]<stream>:" (when prefix), the text and
 * a newline. */
void cli_print_job_line(FILE *f, int rank, bool err_stream, bool prefix, const void *text,
                        size_t len, bool escape);

/* cli_use_checkout_python puts the python/ folder of the checkout this
 * binary was built in (<repo>/build/bin/kolo -> <repo>/python) first on
 * PYTHONPATH, so the workers and tools import the package of this very
 * build; nothing when the binary is not in a checkout, or, with
 * unless_provided, when a PYTHONPATH entry already holds a kolo package
 * (the user's choice). */
void cli_use_checkout_python(bool unless_provided);

/* cli_state_dir returns $XDG_STATE_HOME/kolo or ~/.local/state/kolo (malloc'd). */
char *cli_state_dir(void);

#endif
