/*
 * coord_writer.c - see coord_writer.h.
 *
 * The queue has its own lock, never held together with the state lock
 * except by coord_writer_submit (state lock, then the queue's), so the
 * order is fixed and the writer thread takes the state lock only with
 * the queue's released.
 */
#include "coord_writer.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "errors.h"
#include "util.h"

struct coord_writer {
    char name[32];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    size_t pending; /* queued or being written */
    struct writer_job *head, *tail;
    struct store *st;
    pthread_mutex_t *state_lock;
};

static void *writer_main(void *arg)
{
    thread_name("kolo-writer");
    struct coord_writer *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->stop && !w->head)
            pthread_cond_wait(&w->cv, &w->mu);
        struct writer_job *job = w->head;
        if (job) {
            w->head = job->next;
            if (!w->head)
                w->tail = NULL;
        }
        pthread_mutex_unlock(&w->mu);
        if (!job)
            break; /* stopping, and every queued job is written */
        int rc = job->write(job, w->st);
        void (*after)(struct writer_job *, struct store *) = job->after;
        pthread_mutex_lock(w->state_lock);
        job->done(job, rc); /* frees the job unless after() is set */
        pthread_mutex_unlock(w->state_lock);
        if (after)
            after(job, w->st);
        pthread_mutex_lock(&w->mu);
        w->pending--;
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

int coord_writer_start(struct coord_writer **out, const char *name, const char *db_path,
                       pthread_mutex_t *state_lock, char *err, size_t errlen)
{
    *out = NULL;
    struct coord_writer *w = calloc(1, sizeof(*w));
    if (!w)
        return KOLO_ENOMEM;
    str_copy(w->name, name, sizeof(w->name));
    w->state_lock = state_lock;
    int rv = store_open(&w->st, db_path, err, errlen);
    if (rv) {
        free(w);
        return rv;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        snprintf(err, errlen, "cannot start the %s writer thread", name);
        store_close(w->st);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return KOLO_ESYS;
    }
    *out = w;
    return 0;
}

void coord_writer_submit(struct coord_writer *w, struct writer_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->tail)
        w->tail->next = job;
    else
        w->head = job;
    w->tail = job;
    w->pending++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

size_t coord_writer_pending(struct coord_writer *w)
{
    pthread_mutex_lock(&w->mu);
    size_t n = w->pending;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void coord_writer_stop(struct coord_writer *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    store_close(w->st);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}
