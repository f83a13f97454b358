/*
 * cache.h - the response cache: which tensor, under which signature, each
 * cache id stands for. One table type serves the coordinator, which gives
 * the ids, and every rank, which keeps the ids its log entries gave.
 *
 * The ranks change their tables only at the same point of the same round
 * (worker/runtime/fastpath.c), so every rank holds the same table, and the same
 * tcache_hash. A restarted coordinator takes its table back from the
 * ranks' (coordinator/coord_negot.c, "resuming"), checked by that hash.
 *
 * Ids go from 1 to ROUND_MAX_ID (the readiness bitmaps cover no more).
 * An id holds one name and a name one id: binding either drops what held
 * it before. A signature that is replaced or dropped is retired, not
 * freed, because the coordinator lends it to the entries of tensors
 * submitted by id until they are answered; tcache_reap frees the retired
 * ones once nobody borrows them.
 */
#ifndef KOLO_NEGOTIATION_CACHE_H
#define KOLO_NEGOTIATION_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "mismatch.h"

struct tensor_cache;

struct tensor_cache *tcache_new(void);
void tcache_free(struct tensor_cache *tc);
/* tcache_clear forgets every id (retiring their signatures); tcache_top
 * starts again from 0. */
void tcache_clear(struct tensor_cache *tc);

/* The id name is cached under (0: none), whatever its signature. */
uint32_t tcache_id(const struct tensor_cache *tc, const char *name);
/* tcache_id_hashed: the same, for a caller that has str_hash(name)
 * already (the path of every cached op). */
uint32_t tcache_id_hashed(const struct tensor_cache *tc, const char *name, uint64_t hash);
/* What id stands for; NULL when no name holds it. */
const char *tcache_name(const struct tensor_cache *tc, uint32_t id);
const struct tensor_req *tcache_sig(const struct tensor_cache *tc, uint32_t id);
/* The largest id bound since the table was made or cleared (it does not
 * go down when that id is dropped: the ranks size their bitmaps by it). */
uint32_t tcache_top(const struct tensor_cache *tc);
/* How many ids hold a name. */
uint32_t tcache_count(const struct tensor_cache *tc);

/* tcache_bind gives id to name with a copy of sig (0; KOLO_EINVAL for an
 * id out of range or an empty name; KOLO_ENOMEM). What held id before, or
 * the id name had before, is dropped. An id that keeps its name keeps its
 * age; a new name makes it the youngest. */
int tcache_bind(struct tensor_cache *tc, uint32_t id, const char *name,
                const struct tensor_req *sig);
/* tcache_drop frees id (nothing if it holds no name). */
void tcache_drop(struct tensor_cache *tc, uint32_t id);
/* tcache_reap frees the signatures retired since the last reap. */
void tcache_reap(struct tensor_cache *tc);

/* tcache_oldest: of the ids 1..below-1, one no name holds, else the one
 * given longest ago, skipping those busy(arg, id) says are in use; 0 when
 * every one is. */
uint32_t tcache_oldest(const struct tensor_cache *tc, uint32_t below,
                       bool (*busy)(const void *arg, uint32_t id), const void *arg);

/* tcache_hash: a 64-bit FNV-1a over every bound id in ascending order with
 * its name and signature; equal tables hash equal on every rank. The
 * empty table hashes to the FNV offset basis. */
uint64_t tcache_hash(const struct tensor_cache *tc);

/* tensor_sig_equal: a and b are the same signature for the cache: the
 * collective, dtype, reduction, shape, scale factors and device (roots and
 * splits do not apply to an allreduce). */
bool tensor_sig_equal(const struct tensor_req *a, const struct tensor_req *b);
/* tensor_req_copy: a deep copy (NULL: out of memory); tensor_req_free
 * frees one (NULL is fine). */
struct tensor_req *tensor_req_copy(const struct tensor_req *t);
void tensor_req_free(struct tensor_req *t);

#endif
