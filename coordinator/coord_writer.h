/*
 * coord_writer.h - a thread that runs the coordinator's slow store
 * transactions (the ones that fsync a lot of data) off the state lock.
 *
 * A writer has its own SQLite connection to the coordinator's file (WAL
 * lets the state lock's connection read meanwhile) and a FIFO of jobs.
 * For each job, in order: write() runs the transaction with no lock held;
 * then done() runs with the state lock held, to answer the call and
 * update memory; then after(), if set, runs with no lock again. Whichever
 * of done() and after() runs last frees the job: the job is the owner's
 * struct, with a struct writer_job inside it.
 */
#ifndef KOLO_COORDINATOR_COORD_WRITER_H
#define KOLO_COORDINATOR_COORD_WRITER_H

#include <pthread.h>
#include <stddef.h>

#include "store.h"

struct writer_job {
    struct writer_job *next; /* the writer's */
    int (*write)(struct writer_job *job, struct store *st);
    void (*done)(struct writer_job *job, int rc);
    void (*after)(struct writer_job *job, struct store *st);
};

struct coord_writer;

/* coord_writer_start opens a connection to db_path and starts the thread;
 * state_lock is the lock done() runs under. */
int coord_writer_start(struct coord_writer **out, const char *name, const char *db_path,
                       pthread_mutex_t *state_lock, char *err, size_t errlen);
/* coord_writer_submit queues job; it never fails. */
void coord_writer_submit(struct coord_writer *w, struct writer_job *job);
/* coord_writer_pending is the number of jobs queued or being written. */
size_t coord_writer_pending(struct coord_writer *w);
/* coord_writer_stop writes every queued job, then stops the thread and
 * closes the connection. Call it without the state lock. NULL is a no-op. */
void coord_writer_stop(struct coord_writer *w);

#endif
