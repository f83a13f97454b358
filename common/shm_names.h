/*
 * shm_names.h - what kolo names its shared-memory segments, in one place
 * for the worker that creates them and the agent that sweeps up after a
 * job whose ranks died before the segment was unlinked.
 *
 *   /kolo-<job>-<generation>-<creator pid>-<16 random hex digits>
 *
 * The random part makes a name unguessable (creation is O_EXCL, mode
 * 0600); the creator's pid tells an agent whether anyone still owns it.
 * A name its members derive themselves (shm_names_derive) has the same
 * shape, its hex digits a keyed hash instead of random ones.
 */
#ifndef KOLO_COMMON_SHM_NAMES_H
#define KOLO_COMMON_SHM_NAMES_H

#include <stddef.h>
#include <stdint.h>

/* shm_names_make writes a new name for this process into out: 0 or
 * KOLO_EINVAL (out too small) / KOLO_ESYS (no random bytes). */
int shm_names_make(uint64_t job, uint64_t generation, char *out, size_t outlen);
/* shm_names_derive writes the name of a segment that creator_pid makes
 * for host after the rendezvous, which every member derives from the
 * generation's secret key (key, keylen) instead of being told it: the
 * random part is an HMAC of the job, generation, creator and host under
 * that key, as unguessable to anyone without the key (the host tells
 * apart simulated hosts whose leaders are threads of one process). 0 or
 * KOLO_EINVAL. */
int shm_names_derive(uint64_t job, uint64_t generation, int creator_pid, const char *host,
                     const void *key, size_t keylen, char *out, size_t outlen);
/* shm_names_sweep removes the segments of job whose creator no longer
 * runs (left behind when ranks died before they all attached); returns
 * how many it removed. */
int shm_names_sweep(uint64_t job);

#endif
